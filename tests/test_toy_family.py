"""A new family is one file plus one registration line: the toy family (tests/data/toy.py) dropped into a copy of
``backbones/`` as its own file, with the line that imports it next to the other families' and nothing else
changed, goes through every tool: training and testing a demo config with the toy type, the backbone export in
every format and the model export, FLOPs, the benchmark, the GPU report's CPU run, the attention figure, the
printed config and timm's registry. The tools run in one child process (tests/_toy_driver.py) with the copy on
PYTHONPATH, so that no other test sees the toy family."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from backbones import FAMILIES
from tests._tools import REPO, SEG_CFG, report_number, report_tables

TOY = Path(REPO) / "tests" / "data" / "toy.py"
# what the copy holds besides backbones/: the other packages, the tools, the configs and the driver, as links
LINKED = ("tasks", "perf", "tools", "configs", "tests")


def add_registration_line(package: Path, folder: Path, family_modules: list[str]) -> Path:
    """Where the package imports its family files (the ``__init__.py`` whose ``from .`` lines name them), the toy
    family's import after the last of them; returns that file."""
    for init in sorted(package.rglob("__init__.py")):
        lines = init.read_text().splitlines(keepends=True)
        names = re.compile(rf"\b({'|'.join(family_modules)})\b")
        found = [i for i, line in enumerate(lines) if line.startswith("from .") and names.search(line)]
        if found:
            where = ".".join(folder.relative_to(init.parent).parts)
            lines.insert(max(found) + 1, f"from .{where} import toy  # noqa: F401\n")
            init.write_text("".join(lines))
            return init
    raise AssertionError(f"no __init__.py under {package} imports the family files {family_modules}")


def repository_with_toy(root: Path) -> Path:
    """A copy of the repository (backbones/ copied, the rest linked) with the toy family added as a contributor
    adds one: its file next to the other families' files, and one import line."""
    shutil.copytree(Path(REPO) / "backbones", root / "backbones", ignore=shutil.ignore_patterns("__pycache__"))
    for name in LINKED:
        (root / name).symlink_to(Path(REPO) / name)
    modules = [sys.modules[f.cls.__module__] for f in FAMILIES.values()]
    folder = root / Path(modules[0].__file__).parent.relative_to(REPO)
    shutil.copy(TOY, folder / "toy.py")
    before = {p.relative_to(root): p.read_text() for p in (root / "backbones").rglob("*.py")}
    init = add_registration_line(root / "backbones", folder, [m.__name__.rpartition(".")[2] for m in modules])
    after = {p.relative_to(root): p.read_text() for p in (root / "backbones").rglob("*.py")}
    changed = [p for p in after if before.get(p) != after[p]]
    assert changed == [init.relative_to(root)]  # one line in one file: nothing else
    return root


TOY_CHANNELS = [8, 16, 32, 64]  # the stage channels of tests/data/toy.py's 'shrunk' preset


def toy_config(root: Path) -> Path:
    """The segmentation demo with the toy backbone: the demo config inherited, the backbone and the channels its
    heads take changed."""
    base = root / "configs" / Path(SEG_CFG).relative_to(Path(REPO) / "configs")
    path = root / "upernet_toy-demo_tiny-ade20k.py"
    path.write_text(
        f"_base_ = {str(base)!r}\n"
        "model = dict(\n"
        "    backbone=dict(_delete_=True, type='ToyNet', arch='shrunk', init_cfg=None),\n"
        f"    decode_head=dict(in_channels={TOY_CHANNELS}),\n"
        f"    auxiliary_head=dict(in_channels={TOY_CHANNELS[2]}),\n"
        ")\n"
    )
    return path


@pytest.fixture(scope="module")
def steps(tiny_data, run_once):
    """{step: outcome} of tests/_toy_driver.py, run once per session (the test workers share it) on a repository
    copy holding the toy family."""

    def make(folder):
        root, out = folder / "repo", folder / "out"
        root.mkdir()
        out.mkdir()
        config = toy_config(repository_with_toy(root))
        proc = subprocess.run(
            [sys.executable, "-m", "tests._toy_driver", str(config), str(tiny_data / "tiny_ade20k"), str(out)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-5000:]
        return json.loads((out / "steps.json").read_text())

    return run_once("toy_family", make)


def _ok(steps, name):
    step = steps["steps"][name]
    assert "error" not in step, f"{name}: {step['error']}\n{step['traceback']}"
    return step["ok"]


# Only the first test is marked slow, so it starts the tools' run among the first tests; the others come after
# every slow test and read the finished run instead of holding a second worker waiting for it (run_once).
@pytest.mark.slow
def test_toy_family_trains_tests_and_exports_in_every_format(steps):
    assert steps["family"] == "Toy"
    assert "type='ToyNet'" in _ok(steps, "print_config")
    metrics = _ok(steps, "train")
    assert {"mIoU", "aAcc", "mAcc"} <= set(metrics) and 0 <= metrics["mIoU"] <= 1
    assert _ok(steps, "test")["mIoU"] == pytest.approx(metrics["mIoU"])  # the same weights on the same images

    assert {"pth", "safetensors", "official", "onnx", "timm"} <= set(steps["formats"])
    for fmt in steps["formats"]:  # every format export_backbone offers (backbones.checkpoints.export.FORMATS)
        export = _ok(steps, f"export_backbone {fmt}")
        assert (export["family"], export["format"]) == ("toy", fmt)
        # loaded back (load_pretrained, onnxruntime, timm), it computes what the first export (pth) computes
        assert export["difference"] < 1e-5
    release = _ok(steps, "export_backbone release")  # an official release, to timm with its head
    assert (release["family"], release["variant"]) == ("toy", "one") and release["difference"] < 1e-6
    model = _ok(steps, "export_model")
    assert model["classes"] == ["wall", "floor", "windowpane", "plant", "ball"] and model["difference"] == 0.0

    flops = _ok(steps, "get_flops")
    assert flops["shape"] == [64, 64] and flops["parts"]["backbone"] > 0 and flops["params_parts_m"]["backbone"] > 0
    timm_model = _ok(steps, "timm")
    assert timm_model["names"] == ["toy_one"] and timm_model["logits"] == [1, 3]


def test_toy_family_is_benchmarked(steps):
    (row,) = _ok(steps, "benchmark")
    assert (row["family"], row["arch"], row["model"]) == ("toy", "shrunk", "ours")
    assert row["seconds"] > 0 and row["gmacs"] > 0


def test_toy_family_is_in_the_gpu_report(steps):
    report = _ok(steps, "gpu_report")
    assert "## Errors" not in report, report
    # the toy's rows of each section
    tables = {title.split(" (")[0]: rows for title, rows in report_tables(report).items()}
    toy = {title: [r for r in rows if r[0].startswith(("Toy ", "toy-"))] for title, rows in tables.items()}
    exact = toy["Exactness"]  # its three sizes, each row's status column
    assert len(exact) == 3 and {r[-1] for r in exact} == {"ok"}, report
    training = toy["Training step"]
    assert len(training) == 3 and all(r[-1].startswith("yes") for r in training), report
    (throughput,) = toy["Throughput"]
    assert report_number(throughput[1]) > 0, report
    (compiled,) = toy["torch.compile"]
    assert compiled[-1].endswith("x") and report_number(compiled[-1]) > 0, report  # its speed-up measured


def test_toy_family_attention_is_drawn(steps):
    """A family without a picture kind of its own gets the generic picture of what its probe records hold."""
    from PIL import Image

    (picture,) = _ok(steps, "visualize_attention")
    assert "toy" in Path(picture).name
    with Image.open(picture) as image:
        assert image.format == "PNG" and min(image.size) > 64
