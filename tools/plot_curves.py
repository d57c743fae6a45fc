#!/usr/bin/env python
"""Training curves of one or more runs of tools/train.py, overlaid, as one PNG.

  python tools/plot_curves.py work_dirs/run_a [work_dirs/run_b ...] --out curves.png [--keys 'train/loss*' bbox_mAP]
  python tools/plot_curves.py work_dirs/run_a [...] --train-time [--include-outliers]

Reads the CSV logs that tools/train.py writes (Lightning's CSVLogger: WORK_DIR/logs/version_*/metrics.csv;
the versions of a resumed run are joined in order) and plots every logged value against the optimizer step,
in subplots: the loss terms, the learning rate, the validation metrics, and any other training values (e.g.
the classification accuracy). Each run keeps its line style and is labelled by its work dir; each key keeps
its colour. --keys selects columns by name or shell pattern. mmdet's -1 ("no object of that size in the
ground truth", e.g. bbox_mAP_l) is not a value and is left out.

--train-time prints each run's training-time statistics as mmdet's ``analyze_logs.py cal_train_time`` does, from
the iteration times the training loop logs (``train/time``: data loading included): the mean seconds per
iteration, the slowest and fastest epoch by their mean and the std of the epochs' means, the slowest and fastest
iteration, and the time per epoch. The first iteration of each epoch (loader start-up) is left out of the means
unless --include-outliers, as in mmdet (an epoch of one iteration keeps it).
"""

from __future__ import annotations

import argparse

from backbones.checkpoints.atomic import check_writable
from tasks.figures.curves import plot_runs
from tasks.runtime.cli import command_line


@command_line
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work_dirs", nargs="+", metavar="WORK_DIR", help="work dirs of tools/train.py runs")
    p.add_argument("--out", help="the PNG to write (required unless --train-time)")
    p.add_argument("--keys", nargs="+", help="columns to plot: names or shell patterns (default: all)")
    p.add_argument("--train-time", action="store_true", help="print the training-time statistics of each run")
    p.add_argument("--include-outliers", action="store_true", help="--train-time: keep each epoch's first iteration")
    args = p.parse_args(argv)
    if not args.out and not args.train_time:
        p.error("give --out (the curves' PNG), --train-time, or both")
    if args.out:
        check_writable(args.out)
    for line in plot_runs(args.work_dirs, args.out, args.keys, args.train_time, args.include_outliers):
        print(line)


if __name__ == "__main__":
    main()
