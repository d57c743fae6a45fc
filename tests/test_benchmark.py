"""tools/benchmark.py and the perf modules it calls: what its tables print is computed from the models it names,
on small inputs."""

import dataclasses
import json
import math

import pytest

import backbones
from perf.backbone import scaling, speed, variants
from perf.memory import peak_memory_gib
from perf.models import BASELINES, Setting, model_and_input
from perf.timing import compiled

from ._tools import load_tool

benchmark = load_tool("benchmark")


def _setting(**changes):
    return Setting(repeat=1, warmup=0, **changes)


def test_defaults_follow_the_mode():
    plain, throughput = benchmark.parse_args([]), benchmark.parse_args(["--throughput"])
    assert (plain.size, plain.batch) == ((448, 672), 1)
    assert (throughput.size, throughput.batch) == ((224, 224), 64)
    setting = Setting.of(benchmark.parse_args(["--size", "64x96", "--stoken-size", "8,4,2,1", "--threads", "1"]))
    assert (setting.size, setting.options, setting.threads) == ((64, 96), {"stoken_size": [8, 4, 2, 1]}, 1)
    assert Setting.of(benchmark.parse_args(["--family", "hatnet"])).options == {}
    with pytest.raises(SystemExit, match=r"--stoken-size: HAT-Net takes no option stoken_size"):
        Setting.of(benchmark.parse_args(["--family", "hatnet", "--stoken-size", "8,4,2,1"]))


@pytest.mark.parametrize("size", ["64", "64x", "axb", "0x64"])
def test_a_misspelt_size_is_a_usage_error(size, capsys):
    # "--size 64" failed inside the whole-model benchmark with "not enough values to unpack"
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--size", size])
    assert exit_info.value.code == 2
    assert f"argument --size: {size!r}" in capsys.readouterr().err


def test_compare_times_every_baseline_and_counts_the_model_math():
    # 256x256: STViT's stage 3 has 256 tokens, so its attention takes the oneDNN kernel that the flop
    # counter cannot see (7 % of the MACs at this size); the count, on the plain path, must still equal the
    # reference's (the same backbone on its plain path).
    rows = {r["model"]: r for r in speed.run(_setting(size=(256, 256)), compare=True, memory=False)}
    assert set(rows) == {"ours", *BASELINES}
    ours, ref = rows["ours"], rows["reference"]
    assert ours["gmacs"] == ref["gmacs"]
    assert ours["params_m"] == ref["params_m"]
    assert ours["gmacs"] > 4.31 * (256 / 224) ** 2 * 0.9  # at least the 224x224 backbone count, scaled
    assert all(r["seconds"] > 0 for r in rows.values())
    assert ours["speedup_vs_reference"] == pytest.approx(ref["seconds"] / ours["seconds"])
    # train mode: the forward and the backward timed apart, the backward also against Swin-T's alone
    assert all(
        0 < r["forward_seconds"] < r["seconds"] and 0 < r["backward_seconds"] < r["seconds"] for r in rows.values()
    )
    swin = rows["swin-t"]
    assert ours["backward_speedup_vs_swin-t"] == pytest.approx(swin["backward_seconds"] / ours["backward_seconds"])
    assert rows["swin-t"]["params_m"] == pytest.approx(27.5, abs=0.5)  # mmdet's Swin-T backbone
    # counting switched the CPU-only kernels off only while counting
    assert backbones.fast_paths_enabled()


def test_peak_memory_is_measured_in_a_child_process():
    peak = peak_memory_gib("ours", _setting(arch="shrunk", size=(64, 64)))  # the child's work is not the test
    assert 0.1 < peak < 24


def test_throughput_table_has_every_variant_and_the_paper_figures_only_at_224():
    lines = variants.throughput_table(_setting(batch=2, size=(64, 64))).splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert [c[0] for c in cells] == ["stvit-small", "stvit-base", "stvit-large"]
    assert all(float(c[5]) > 0 and c[6] == "n/a" for c in cells)


def test_variants_table_matches_the_papers_parameter_counts():
    lines = variants.variants_table().splitlines()[2:]
    assert len(lines) == sum(len(f.released) for f in backbones.FAMILIES.values())
    for line in lines:
        name, _, _, ours_with_head, paper = [c.strip() for c in line.strip("|").split("|")]
        family, _, arch = name.partition("-")
        assert (paper == "n/a") == (arch not in backbones.FAMILIES[family].paper), name
        if paper == "n/a":
            continue
        params, gmacs = map(float, ours_with_head.split(" / "))
        paper_params, paper_gmacs = map(float, paper.split(" / "))
        assert math.isclose(params, paper_params, rel_tol=0.03), name
        assert math.isclose(gmacs, paper_gmacs, rel_tol=0.1), name


def test_compiled_backbone_matches_eager():
    # What --compile depends on in our code: TorchDynamo traces the backbone (no error, no wrong guard) and
    # the traced graph, through AOTAutograd, computes what eager does. The backend here is aot_eager, the
    # traced graph run by eager kernels: inductor's C++ code generation is PyTorch's and takes 50-90 s per
    # model on a CPU (docs/benchmarks/backbone-speed-2026-12-02.md has --compile's figures). HAT-Net's backbone
    # is traced the same way, and trained, by tests/test_config_keys.py's compiled run.
    import torch

    model, x = model_and_input("ours", _setting(family="stvit", arch="shrunk", size=(64, 64)))
    with torch.no_grad():
        eager = model.eval()(x)
        outs = compiled(model, x, "infer", "fp32", backend="aot_eager")[0](x)
    for a, b in zip(outs, eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_scaling_times_every_model_at_every_size_and_plots_each_curve(tmp_path):
    sizes = ("64x96", "224x224")
    import torch

    args = benchmark.parse_args(["--scaling", "--sizes", *sizes, "--arch", "shrunk"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 12 short steps: two threads' barriers cost more than they share on a busy machine
    try:
        setting = dataclasses.replace(Setting.of(args), repeat=1, warmup=0)
        rows = scaling.scaling(setting, args.sizes, memory=False)
    finally:
        torch.set_num_threads(threads)
    labels = [label for label, *_ in scaling.scaling_models("shrunk")]
    # the registry's rows, in its order: each family's measured variant and named settings, Swin-T, the references
    assert labels == [
        "HAT-Net-S [shrunk]",
        "STViT-S [shrunk]",
        "STViT-S dense [shrunk]",
        "Swin-T (mmdet)",
        "reference HAT-Net-S [shrunk]",
        "reference STViT-S [shrunk]",
    ]
    assert [(r["model"], r["size"]) for r in rows] == [(m, s) for s in sizes for m in labels]
    # the plain formulation runs at any size (HAT-Net's border windows padded and masked, unlike the official code)
    assert all(r["seconds"] > 0 and not r["note"] for r in rows)
    table = scaling.scaling_tables(rows).splitlines()
    assert table[0] == "| s/iter (train step) | 64x96 | 224x224 |"
    for label in labels:
        cells = next(line for line in table if line.startswith(f"| {label} |")).strip("|").split("|")
        assert all(float(c) > 0 for c in cells[1:]), label
    fig = scaling.scaling_plot(rows, tmp_path / "scaling.png")
    time_axes, memory_axes = fig.axes
    points = {line.get_label(): len(line.get_xdata()) for line in time_axes.get_lines()}
    assert {label: points[label] for label in labels} == {label: len(sizes) for label in labels}
    assert time_axes.get_xscale() == time_axes.get_yscale() == "log"
    assert not memory_axes.get_lines()  # --no-memory: nothing drawn there
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_prints_the_rows_and_writes_them_as_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--arch", "shrunk", "--size", "64x64", "--no-memory", "--repeat", "1", "--warmup", "0"]
    benchmark.main([*argv, "--threads", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["model"] == "ours" and row["size"] == "64x64" and row["seconds"] > 0 and row["gmacs"] > 0
    assert row["peak_gib"] is None  # --no-memory: NaN, written as JSON's null
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:3] == ["model", "arch", "size"] and printed[1].split()[0] == "ours"
    # the step's halves printed beside it (train mode), as written to the JSON
    columns = dict(zip(printed[0].replace("fwd s", "fwd_s").replace("bwd s", "bwd_s").split(), printed[1].split()))
    assert (columns["fwd_s"], columns["bwd_s"]) == (f"{row['forward_seconds']:.2f}", f"{row['backward_seconds']:.2f}")
