"""Iteration times in the training logs, and tools/plot_curves.py --train-time's statistics against mmdet's
``analyze_logs.py cal_train_time`` on the same times."""

import ast
import contextlib
import csv
import io
import random
import types
from pathlib import Path

import mmdet
import numpy as np
import pytest

from tasks.figures.errors import FigureError
from tests._tools import load_tool

ANALYZE_LOGS = Path(mmdet.__file__).parent / ".mim" / "tools" / "analysis_tools" / "analyze_logs.py"


def mmdet_cal_train_time(epochs: dict, include_outliers: bool) -> str:
    """What mmdet's own ``cal_train_time`` prints for ``{epoch: [seconds, ...]}`` (its function alone, taken from
    the installed script: the script's module imports seaborn, which this environment does not have)."""
    tree = ast.parse(ANALYZE_LOGS.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cal_train_time"]
    scope = {"np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(ANALYZE_LOGS), "exec"), scope)
    args = types.SimpleNamespace(json_logs=["run"], include_outliers=include_outliers)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope["cal_train_time"]([{e + 1: {"time": t} for e, t in epochs.items()}], args)
    return out.getvalue()


def test_training_logs_iteration_times(det_run):
    from tasks.figures import curves as plot_curves

    with open(next(Path(det_run.work_dir).glob("logs/version_*/metrics.csv")), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    assert len(rows) == 2  # the run's two training steps, each with its time
    for r in rows:
        assert 0 <= float(r["train/data_time"]) < float(r["train/time"])
    times = [float(r["train/time"]) for r in rows]
    assert plot_curves.step_times(det_run.work_dir) == {0: times}
    stats = plot_curves.train_time(det_run.work_dir, include_outliers=True)
    assert stats["iterations"] == 2 and stats["epochs"] == 1
    assert stats["slowest_iter"] == max(times) and stats["fastest_iter"] == min(times)
    assert abs(stats["epoch_time"] - sum(times)) < 1e-9
    assert plot_curves.train_time(det_run.work_dir)["iterations"] == 1  # the epoch's first iteration left out


def test_train_time_matches_mmdet(tmp_path, capsys):
    rng = random.Random(0)
    epochs = {e: [rng.uniform(0.2, 2.0) for _ in range(5 + e)] for e in range(3)}
    log = tmp_path / "logs" / "version_0" / "metrics.csv"
    log.parent.mkdir(parents=True)
    with open(log, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "step", "train/loss", "train/time", "bbox_mAP"])
        step = 0
        for e, times in epochs.items():
            for t in times:
                w.writerow([e, step, 1.0, repr(t), ""])
                step += 1
            w.writerow([e, step - 1, "", "", 0.5])  # the validation row of the epoch
    for outliers in (False, True):
        load_tool("plot_curves").main([str(tmp_path), "--train-time", *(["--include-outliers"] if outliers else [])])
        ours = capsys.readouterr().out.splitlines()
        theirs = mmdet_cal_train_time(epochs, outliers).splitlines()
        # the same header, slowest / fastest epoch, std and average lines (ours adds the iteration count)
        assert ours[:4] == [line.replace("run", str(tmp_path)) for line in theirs[:4]]
        assert ours[4].startswith(theirs[4])
        every = [t for times in epochs.values() for t in (times if outliers else times[1:])]
        assert f"slowest iter {max(every):.4f} s, fastest iter {min(every):.4f} s" in ours
        assert f"time per epoch: {np.mean([sum(t) for t in epochs.values()]):.1f} s (3 epochs)" in ours


def test_train_time_without_times(tmp_path):
    log = tmp_path / "logs" / "version_0" / "metrics.csv"
    log.parent.mkdir(parents=True)
    log.write_text("epoch,step,train/loss\n0,0,1.0\n")
    with pytest.raises(FigureError, match="no train/time column"):
        load_tool("plot_curves").main([str(tmp_path), "--train-time"])
