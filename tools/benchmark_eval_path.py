#!/usr/bin/env python
"""Process memory (and time) of the evaluation paths a user runs, against mmdet's / mmseg's metrics.

    python tools/benchmark_eval_path.py test [--task det|seg] [--images 2000] [--rounds 2] [--format-only]
    python tools/benchmark_eval_path.py val [--images 300] [--epochs 3]
    python tools/benchmark_eval_path.py seg-evaluator [--images 2000] [--rounds 2]

``test``: ``tools/test.py`` on generated images (``tools/make_tiny_data.py``) with the demo config at its
initial weights (det: Mask R-CNN keeping 100 detections, masks at image size, per image), once with our
evaluator (with ``--format-only``: our ``--format-only --out-dir`` writers) and once with mmdet's
``CocoMetric`` / mmseg's ``IoUMetric`` (format-only mode) in its place, alternating, each in its own process.
``val``: ``tools/train.py`` with a validation after each short epoch; the RSS after each validation.
``seg-evaluator``: our segmentation evaluator against ``IoUMetric`` at ADE20K scale (2000 images of
512x683, 150 classes) on the same synthetic predictions. See ``perf/eval/path.py`` / ``perf/eval/seg.py``
for what is measured; the figures are in docs/benchmarks/evaluation-2026-12-03.md.
"""

from __future__ import annotations

import argparse
import json
import os.path as osp
import statistics
import tempfile

from perf.eval import path as eval_path
from perf.eval import seg as eval_seg
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["test", "val", "seg-evaluator"])
    parser.add_argument("--task", choices=["det", "seg"], default="det", help="test: which demo config")
    parser.add_argument("--images", type=int, help="images (default: test 2000, val 300, seg-evaluator 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (ours, mm) runs")
    parser.add_argument("--epochs", type=int, default=3, help="val: training epochs, each followed by validation")
    parser.add_argument("--format-only", action="store_true", help="test: the submission writers, no metrics")
    parser.add_argument("--limit-gib", type=float, default=3.5, help="stop a run whose RSS passes this (GiB)")
    parser.add_argument("--work-dir", help="data, checkpoints and logs (default: a temporary directory)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    args.images = args.images or {"val": 300}.get(args.what, 2000)
    for name in ("images", "rounds", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def mib(gib: float) -> str:
    return f"{gib * 1024:8.1f}"


def print_runs(runs: list[dict]) -> None:
    print(f"{'run':<24} {'images':>6} {'loop MiB':>8} {'peak MiB':>8} {'end MiB':>8} {'peak GiB':>8} {'time s':>7}")
    for run in runs:
        if "loop_growth" not in run:
            print(f"{run.get('label', run.get('impl')):<24} stopped: {run['error']}")
            continue
        growth = [mib(run[k]) for k in ("loop_growth", "peak_growth")] + [mib(run.get("end_growth", float("nan")))]
        print(
            f"{run.get('label', run['impl']):<24} {run['images']:>6} {' '.join(growth)} "
            f"{run['peak']:8.2f} {run['total_s']:7.1f}"
        )
    by_round: dict = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["impl"]] = run
    for key in ("loop_growth", "peak_growth", "total_s"):
        ratios = [
            r["ours"][key] / r["mm"][key]
            for r in by_round.values()
            if key in r.get("ours", {}) and key in r.get("mm", {}) and r["mm"][key] > 0
        ]
        if ratios:
            spread = f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)})" if len(ratios) > 1 else ""
            print(f"ours / mm {key}: {statistics.median(ratios):.2f}{spread}")
    for run in runs:
        print(f"{run.get('label', run['impl'])} metrics: {run.get('metrics')}")


@command_line
def main(argv=None) -> dict | list:
    args = parse_args(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="eval-path-")
    if args.what == "test":
        result = eval_path.measure_test(args.task, args.images, args.rounds, work, args.format_only, args.limit_gib)
        print_runs(result)
    elif args.what == "seg-evaluator":
        result = eval_seg.measure(args.images, args.rounds)
        print_runs(result)
    else:
        result = eval_path.measure_validation(args.images, args.epochs, work, args.limit_gib)
        for k, epoch in enumerate(result["epochs"], start=1):
            print(
                f"validation {k}: {epoch['images']} images, RSS after {result['after_validation'][k - 1]:.3f} GiB, "
                f"loop growth {mib(epoch['loop_growth'])} MiB, peak growth {mib(epoch['peak_growth'])} MiB"
            )
        print(f"RSS after the last validation / after the first: {result['ratio_last_first']:.3f}")
        if result["error"]:
            print(f"stopped: {result['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"work dir: {osp.abspath(work)}")
    return result


if __name__ == "__main__":
    main()
