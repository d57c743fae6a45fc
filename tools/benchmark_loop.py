#!/usr/bin/env python
"""Our training loop (tools/train.py, Lightning) against mmengine's Runner on the same config and data.

    python tools/benchmark_loop.py [CONFIG] [--data data/tiny_coco] [--epochs 1 4] [--rounds 3]
                                   [--warmup 1] [--same-seed] [--threads N] [--cfg-options KEY=VALUE ...]
                                   [--work-dir DIR] [--json OUT]

Trains CONFIG (default: the demo detection config) for the long number of epochs under both loops, each
run a whole process that marks the end of every epoch, the two loops alternating which goes first from round
to round. Prints every run, then per loop the time per optimizer step (the slope between the marks after the
short and the long number of epochs, so that start-up cancels; wall and CPU time) and the peak memory, and the
lightning / runner ratios per round (median, min .. max). What both loops are made to do alike is in
perf/training/loop.py; docs/benchmarks/loop-vs-runner-2026-12-05.md has the figures. The data is written by
``python tools/make_tiny_data.py --out data``.
"""

from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import tempfile

from perf.child import ROOT
from perf.training.loop import LOOPS, compare, spread
from tasks.runtime.cli import command_line

DEMO_CFG = str(ROOT / "configs" / "demo" / "mask-rcnn_stvit-demo_fpn_tiny-coco.py")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default=DEMO_CFG, help="the config both loops train (default: the demo's)")
    p.add_argument("--data", default="data/tiny_coco", help="dataset folder for every dataloader section")
    p.add_argument(
        "--epochs",
        nargs=2,
        type=int,
        default=(1, 4),
        metavar=("SHORT", "LONG"),
        help="the per-step time is measured between the ends of these epochs, default 1 4",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of one run of each loop, default 3")
    p.add_argument(
        "--same-seed",
        action="store_true",
        help="every round with the config's seed (default: round r with randomness.seed=r; see perf/training/loop.py)",
    )
    p.add_argument("--warmup", type=int, default=1, help="unmeasured short runs of each loop first, default 1")
    p.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1),
        help="OMP_NUM_THREADS / MKL_NUM_THREADS of every run (default: $OMP_NUM_THREADS, else the CPU count)",
    )
    p.add_argument(
        "--cfg-options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for both loops, e.g. trainer.log_every_n_steps=1 (the Runner's log interval follows)",
    )
    p.add_argument("--work-dir", help="where the runs' work dirs go (default: a temporary folder, removed)")
    p.add_argument("--json", help="also write the report (every run, per-round figures) to this file")
    args = p.parse_args(argv)
    if not 0 < args.epochs[0] < args.epochs[1]:
        p.error(f"--epochs SHORT LONG needs 0 < SHORT < LONG, got {args.epochs[0]} {args.epochs[1]}")
    if args.rounds < 1 or args.threads < 1 or args.warmup < 0:
        p.error("--rounds and --threads must be at least 1, --warmup at least 0")
    if not osp.isdir(args.data):
        p.error(f"--data {args.data} does not exist; write the tiny data: `python tools/make_tiny_data.py --out data`")
    return args


@command_line
def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="benchmark_loop_") as tmp:
        report = compare(
            args.config,
            args.data,
            args.work_dir or tmp,
            tuple(args.epochs),
            args.rounds,
            args.threads,
            cfg_options=args.cfg_options,
            warmup=args.warmup,
            seed_per_round=not args.same_seed,
        )
    for loop in LOOPS:
        peaks = [r["peak_gib"] for r in report["runs"][loop]]
        print(
            f"{loop:9s} per step: wall {spread(report['per_step_s'][loop], 3)} s, "
            f"CPU {spread(report['per_step_cpu_s'][loop], 3)} s; peak {spread(peaks)} GiB"
        )
    ratios = report["ratios"]
    print(
        f"lightning / runner ({args.rounds} rounds, {args.threads} threads): per-step time {spread(ratios['time'])}, "
        f"per-step CPU time {spread(ratios['cpu_time'])}, peak memory {spread(ratios['peak_memory'])}"
    )
    if args.json:
        from backbones.checkpoints.atomic import atomic_write

        atomic_write(args.json, lambda f: f.write(json.dumps(report, indent=1).encode()))
    return report


if __name__ == "__main__":
    main()
