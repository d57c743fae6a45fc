#!/usr/bin/env python
"""Time and measure the project's COCO evaluator against mmdet's ``CocoMetric`` on the same synthetic predictions.

    python tools/benchmark_eval.py [--images 5000] [--dets 100] [--repeats 2] [--batch 8] [--seed 0]

A val2017-like set (``perf.coco_eval``: 640x480-ish images, about 7 polygon objects of 80 classes each, some
crowd regions, ``--dets`` bool mask predictions at image size per image, seeded). Each evaluator runs in its
own child process, fed the same samples batch by batch: ``tasks.metrics.DetectionEvaluator`` with per-class
results, and ``CocoMetric(metric=['bbox', 'segm'], classwise=True)`` fed as mmengine's Evaluator feeds it.
Sample generation is not timed. The children alternate (ours, mmdet, then mmdet, ours, ...) for ``--repeats``
rounds; the ratio ours / mmdet is taken per round.

Prints per child: update, compute and total seconds, peak RSS and RSS growth over the updates (GiB; both
children hold the same generated batch); per quantity the median ratio and its spread; and the largest
difference of any metric (the 9 flat ones and the per-class table) between the two. mmdet rounds its results
to 3 decimals, so differences up to 5e-4 are rounding. Measured figures: docs/evaluation.md ("Evaluation speed").
"""

import argparse

from perf import coco_eval


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000, help="number of synthetic images (val2017: 5000)")
    parser.add_argument("--dets", type=int, default=100, help="mask predictions per image")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (ours, mmdet) runs")
    parser.add_argument("--batch", type=int, default=8, help="images per update call")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic set")
    args = parser.parse_args(argv)
    for name in ("images", "dets", "repeats", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    return coco_eval.run(
        args.images, args.dets, args.repeats, args.batch, args.seed, log=lambda s: print(s, flush=True)
    )


if __name__ == "__main__":
    main()
