#!/usr/bin/env python
"""Training curves of one or more runs of tools/train.py, overlaid, as one PNG.

  python tools/plot_curves.py work_dirs/run_a [work_dirs/run_b ...] --out curves.png [--keys 'train/loss*' bbox_mAP]

Reads the CSV logs that tools/train.py writes (Lightning's CSVLogger: WORK_DIR/logs/version_*/metrics.csv;
the versions of a resumed run are joined in order) and plots every logged value against the optimizer step,
in subplots: the loss terms, the learning rate, the validation metrics, and any other training values (e.g.
the classification accuracy). Each run keeps its line style and is labelled by its work dir; each key keeps
its colour. --keys selects columns by name or shell pattern. mmdet's -1 ("no object of that size in the
ground truth", e.g. bbox_mAP_l) is not a value and is left out.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import math
import re
from pathlib import Path

from perf.report import save_figure

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
        raise SystemExit(
            f"{work_dir}: no CSV log found; expected {work_dir}/logs/version_*/metrics.csv "
            "(tools/train.py writes it with Lightning's CSVLogger; pass the --work-dir of a run)"
        )
    series: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or "step" not in reader.fieldnames:
                raise SystemExit(f"{path}: not a Lightning CSV log (no 'step' column)")
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
        raise SystemExit(f"--keys {' '.join(patterns)} matches none of the logged keys: {', '.join(sorted(keys))}")
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
    save_figure(fig, out)
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work_dirs", nargs="+", metavar="WORK_DIR", help="work dirs of tools/train.py runs")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--keys", nargs="+", help="columns to plot: names or shell patterns (default: all)")
    args = p.parse_args(argv)
    fig = plot_curves(args.work_dirs, args.out, args.keys)
    lines = sum(len(ax.get_lines()) for ax in fig.axes)
    print(f"wrote {args.out}: {lines} curves of {len(args.work_dirs)} run(s) in {len(fig.axes)} panels")


if __name__ == "__main__":
    main()
