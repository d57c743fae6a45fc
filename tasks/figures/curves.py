"""Training curves of tools/train.py runs read from their CSV logs (Lightning's CSVLogger:
WORK_DIR/logs/version_*/metrics.csv, the versions of a resumed run joined in order), drawn overlaid as one PNG,
and the runs' training-time statistics as mmdet's ``analyze_logs.py cal_train_time`` gives them."""

from __future__ import annotations

import csv
import fnmatch
import math
import re
import statistics
from pathlib import Path

from backbones.checkpoints.atomic import atomic_write

from .errors import FigureError

GROUPS = ("losses", "learning rate", "validation metrics", "other training values")
LINESTYLES = ("-", "--", ":", "-.")


def group_of(key: str) -> str:
    if key.startswith("train/"):
        name = key[len("train/") :]
        if "loss" in name:
            return "losses"
        return "learning rate" if name == "lr" or name.startswith("lr") else "other training values"
    return "validation metrics"


def read_run(work_dir) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} of every logged value of the run in ``work_dir``, in step order."""
    work_dir = Path(work_dir)
    files = sorted(
        work_dir.glob("logs/version_*/metrics.csv"), key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0)
    )
    if not files:
        raise FigureError(
            f"{work_dir}: no CSV log found; expected {work_dir}/logs/version_*/metrics.csv "
            "(tools/train.py writes it with Lightning's CSVLogger; pass the --work-dir of a run)"
        )
    series: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or "step" not in reader.fieldnames:
                raise FigureError(f"{path}: not a Lightning CSV log (no 'step' column)")
            for row in reader:
                step = int(float(row["step"]))
                for key, text in row.items():
                    if key in ("step", "epoch") or text in ("", None):
                        continue
                    value = float(text)
                    if math.isfinite(value) and not (value == -1.0 and group_of(key) == "validation metrics"):
                        series.setdefault(key, []).append((step, value))
    for points in series.values():
        points.sort(key=lambda p: p[0])
    return series


def select(keys, patterns) -> list[str]:
    if not patterns:
        return sorted(keys)
    chosen = sorted(k for k in keys if any(fnmatch.fnmatchcase(k, p) for p in patterns))
    if not chosen:
        raise FigureError(f"--keys {' '.join(patterns)} matches none of the logged keys: {', '.join(sorted(keys))}")
    return chosen


def plot_curves(work_dirs, out, keys=None):
    """Draw the runs' curves into ``out`` (PNG) and return the figure: one axes per non-empty group, one line
    per (run, key), labelled ``'RUN: KEY'`` where RUN is the work dir as given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {str(d): read_run(d) for d in work_dirs}
    all_keys = set().union(*runs.values())
    chosen = select(all_keys, keys)
    groups = [g for g in GROUPS if any(group_of(k) == g for k in chosen)]
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.2 * len(groups)), squeeze=False, sharex=True)
    colours = {k: f"C{i % 10}" for i, k in enumerate(chosen)}
    for ax, group in zip(axes[:, 0], groups):
        for r, (run, series) in enumerate(runs.items()):
            for key in (k for k in chosen if group_of(k) == group and k in series):
                steps, values = zip(*series[key])
                ax.plot(
                    steps,
                    values,
                    LINESTYLES[r % len(LINESTYLES)],
                    color=colours[key],
                    marker="o" if len(steps) < 20 else None,
                    markersize=3,
                    label=f"{run}: {key}",
                )
        ax.set_title(group)
        ax.set_xlabel("step")
        ax.tick_params(labelbottom=True)  # shared x axis, but every panel keeps its step numbers
        if group == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=90))  # a cut-short run leaves no half PNG
    return fig


def step_times(work_dir) -> dict[int, list[float]]:
    """{epoch: [seconds of each iteration, in step order]} from the ``train/time`` column of a run's CSV logs; a
    step logged again after a resume keeps its last value."""
    by_step: dict[int, tuple[int, float]] = {}
    for path in sorted(
        Path(work_dir).glob("logs/version_*/metrics.csv"), key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0)
    ):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("train/time") not in ("", None):
                    by_step[int(float(row["step"]))] = (int(float(row["epoch"])), float(row["train/time"]))
    epochs: dict[int, list[float]] = {}
    for _, (epoch, seconds) in sorted(by_step.items()):
        epochs.setdefault(epoch, []).append(seconds)
    return epochs


def train_time(work_dir, include_outliers: bool = False) -> dict:
    """Training-time statistics of the run in ``work_dir`` (as mmdet's ``analyze_logs.py cal_train_time``).

    Args:
        work_dir: a tools/train.py work dir (its CSV logs hold ``train/time`` per iteration).
        include_outliers: keep each epoch's first iteration (the loader's start-up) in the means.

    Returns:
        dict of ``iterations`` (timed), ``mean`` (s/iter, the mean of the epochs' means as in mmdet),
        ``slowest_epoch`` / ``fastest_epoch`` (epoch, mean s/iter), ``epoch_std`` (std of the epochs' means),
        ``slowest_iter`` / ``fastest_iter`` (s),
        ``epoch_time`` (mean seconds per epoch, every iteration counted) and ``epochs`` (how many).
    """
    read_run(work_dir)  # the missing-log error
    epochs = step_times(work_dir)
    if not epochs:
        raise FigureError(
            f"{work_dir}: its CSV logs have no train/time column (the iteration times the training loop logs); "
            "tools/train.py logs them with its CSV logger"
        )
    kept = {e: (t if include_outliers or len(t) == 1 else t[1:]) for e, t in epochs.items()}
    means = {e: statistics.fmean(t) for e, t in kept.items()}
    every = [s for t in kept.values() for s in t]
    slow, fast = max(means, key=means.get), min(means, key=means.get)
    return dict(
        iterations=len(every),
        mean=statistics.fmean(means.values()),  # mmdet's: the mean of the epochs' means
        slowest_epoch=(slow, means[slow]),
        fastest_epoch=(fast, means[fast]),
        epoch_std=statistics.pstdev(means.values()),
        slowest_iter=max(every),
        fastest_iter=min(every),
        epoch_time=statistics.fmean(sum(t) for t in epochs.values()),
        epochs=len(epochs),
    )


def format_train_time(run: str, t: dict) -> str:
    """``train_time``'s statistics as lines of text, mmdet's wording (epochs counted from 1)."""
    return "\n".join(
        [
            f"-----Analyze train time of {run}-----",
            f"slowest epoch {t['slowest_epoch'][0] + 1}, average time is {t['slowest_epoch'][1]:.4f} s/iter",
            f"fastest epoch {t['fastest_epoch'][0] + 1}, average time is {t['fastest_epoch'][1]:.4f} s/iter",
            f"time std over epochs is {t['epoch_std']:.4f}",
            f"average iter time: {t['mean']:.4f} s/iter ({t['iterations']} iterations)",
            f"slowest iter {t['slowest_iter']:.4f} s, fastest iter {t['fastest_iter']:.4f} s",
            f"time per epoch: {t['epoch_time']:.1f} s ({t['epochs']} epochs)",
        ]
    )


def plot_runs(work_dirs, out=None, keys=None, times: bool = False, include_outliers: bool = False) -> list[str]:
    """What tools/plot_curves.py does, as the lines it prints: each run's ``train_time`` statistics (``times``,
    ``include_outliers``: its ``--train-time`` / ``--include-outliers``), then the curves of ``keys`` drawn into the
    PNG ``out`` (when given) and what it holds."""
    lines = [format_train_time(d, train_time(d, include_outliers)) for d in work_dirs] if times else []
    if out:
        fig = plot_curves(work_dirs, out, keys)
        curves = sum(len(ax.get_lines()) for ax in fig.axes)
        lines.append(f"wrote {out}: {curves} curves of {len(work_dirs)} run(s) in {len(fig.axes)} panels")
    return lines
