"""tools/gpu_report.py: the CPU smoke run of the GPU report writes every section's rows with measured numbers,
on a Python where the mm packages cannot be imported (the GPU machine has none)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from ._tools import REPO, load_tool, report_number, report_tables

# Imported first by every Python started with this directory on PYTHONPATH (the report and its compile
# child): any import of an mm package raises ImportError, as on the GPU machine.
BLOCK_MM = "import sys\nsys.modules.update(dict.fromkeys(['mmengine', 'mmcv', 'mmdet', 'mmseg']))\n"


def _run_report(tmp_path, *argv):
    blocker = tmp_path / "no_mm"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_MM)
    out = tmp_path / "report.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), REPO])}
    proc = subprocess.run(
        [sys.executable, "tools/gpu_report.py", "--device", "cpu", "--quick", "--out", str(out), *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out.read_text()
    assert report.strip() == proc.stdout.strip()  # printed and written alike
    return report


@pytest.mark.slow
def test_quick_cpu_report_has_every_row_measured_without_mm_packages(tmp_path):
    report = _run_report(tmp_path, "--budget-s", "900")  # a busy test machine must not skip rows
    assert "mmengine" not in report and "## Errors" not in report, report
    for field in (
        "- date: ",
        "- device: CPU",
        f"- torch {torch.__version__}",
        "- command: `python tools/gpu_report.py --device cpu --quick --out",
    ):
        assert field in report
    tables = report_tables(report)
    by_title = {title.split(" (")[0]: rows for title, rows in tables.items()}
    assert set(by_title) == {"Exactness", "Training step", "Throughput", "torch.compile"}

    exact = by_title["Exactness"]
    # the registry's rows, in its order: each family's measured variant, then its named settings
    models = ["HAT-Net-S (shrunk)", "STViT-S (shrunk)", "STViT-S dense (shrunk) 8,4,2,1"]
    assert [(r[0], r[1]) for r in exact] == [(m, s) for m in models for s in ("64x96", "224x224", "72x100")]
    for model, size, _, plain, _, status in exact:
        if model.startswith("HAT-Net") and size != "224x224":  # the plain HAT-Net needs divisible sizes
            assert plain.startswith("n/a: stage maps not divisible") and status == "n/a"
        else:  # fast paths against the plain formulation: the same numbers
            assert report_number(plain) < 1e-4 and status == "ok", (model, size, plain)

    train = by_title["Training step"]
    assert [(r[0], r[1]) for r in train] == [
        (m, p) for m in models + ["Swin-T (shrunk)"] for p in ("bf16", "fp16", "fp32")
    ]
    for model, precision, seconds, _, vs_swin, finite in train:
        assert report_number(seconds) > 0 and report_number(vs_swin) > 0, (model, precision)
        assert finite.startswith("yes"), (model, precision, finite)
        assert ("scale" in finite) == (precision == "fp16")  # the GradScaler ran in the fp16 rows only

    throughput = by_title["Throughput"]
    assert [r[0] for r in throughput] == ["hatnet-shrunk", "stvit-shrunk", "Swin-T (shrunk)"]
    assert all(report_number(r[1]) > 0 and report_number(r[2]) > 0 and r[3] == "n/a" for r in throughput)

    (compiled,) = by_title["torch.compile"]
    assert compiled[0] == "STViT-S dense (shrunk) 8,4,2,1"
    assert compiled[4] not in ("n/a", "") and not compiled[4].startswith(("skipped", "failed")), report
    compile_s, eager, fast, speedup = map(report_number, compiled[1:])
    # the speed-up comes from unrounded times: it lies within what the printed (rounded) times allow
    half_eager, half_fast = (_half_last_digit(c) for c in compiled[2:4])
    low, high = (eager - half_eager) / (fast + half_fast), (eager + half_eager) / max(fast - half_fast, 1e-12)
    assert low - 0.01 <= speedup <= high + 0.01, (speedup, low, high)
    assert compile_s > 0


def test_rows_past_the_time_budget_are_skipped_and_the_report_completes(tmp_path, capsys):
    # in this process (no row runs, so no process of its own is needed; the mm-free run is the test above)
    out = tmp_path / "report.md"
    threads = torch.get_num_threads()
    try:  # --quick on the CPU sets torch's threads to 1
        assert load_tool("gpu_report").main(["--device", "cpu", "--quick", "--budget-s", "0", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    report = out.read_text()
    assert report.strip() == capsys.readouterr().out.strip()  # printed and written alike
    tables = report_tables(report)
    rows = [row for rows in tables.values() for row in rows]
    assert len(rows) == 9 + 12 + 3 + 1
    assert all(any(c.startswith("skipped: past the 0 s time budget") for c in row) for row in rows)


def test_bad_arguments_are_named(capsys):
    gpu_report = load_tool("gpu_report")
    with pytest.raises(SystemExit):
        gpu_report.parse_args(["--device", "cpu", "--official", "no/such/stvit.py"])
    assert "no/such/stvit.py: no such file" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            gpu_report.parse_args(["--device", "cuda"])
        assert "torch sees no CUDA device here" in capsys.readouterr().err


def _half_last_digit(cell: str) -> float:
    """Half a unit of the last printed digit of a number cell ("0.029" -> 0.0005, "2.5e-05" -> 5e-07)."""
    match = re.match(r"\d+(?:\.(\d+))?(?:e([-+]?\d+))?", cell)
    return 0.5 * 10.0 ** (int(match.group(2) or 0) - len(match.group(1) or ""))
