#!/usr/bin/env python
"""Time and measure the project's COCO evaluator against mmdet's ``CocoMetric`` on the same synthetic predictions.

    python tools/benchmark_eval.py [--images 5000] [--dets 100] [--repeats 2] [--batch 8] [--seed 0]
        [--only ours|mmdet] [--mmap-threshold BYTES]

A val2017-like set (``perf.coco.compare``: 640x480-ish images, about 7 polygon objects of 80 classes each, some
crowd regions, ``--dets`` bool mask predictions at image size per image, seeded). Each evaluator runs in its
own child process, fed the same samples batch by batch: ``tasks.evaluation.coco.DetectionEvaluator`` with per-class
results, and ``CocoMetric(metric=['bbox', 'segm'], classwise=True)`` fed as mmengine's Evaluator feeds it.
Sample generation is not timed. The children alternate (ours, mmdet, then mmdet, ours, ...) for ``--repeats``
rounds; the ratio ours / mmdet is taken per round.

Prints per child: update, compute and total seconds, peak RSS and RSS growth over the updates (GiB; both
children hold the same generated batch); per quantity the median ratio and its spread; and the largest
difference of any metric (the 9 flat ones and the per-class table) between the two. mmdet rounds its results
to 3 decimals, so differences up to 5e-4 are rounding. Measured figures: docs/evaluation.md ("Evaluation speed").
"""

import argparse

from backbones.checkpoints.atomic import write_json
from perf.coco import compare as coco_eval
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000, help="number of synthetic images (val2017: 5000)")
    parser.add_argument("--dets", type=int, default=100, help="mask predictions per image")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (ours, mmdet) runs")
    parser.add_argument("--batch", type=int, default=8, help="images per update call")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic set")
    parser.add_argument("--json", metavar="PATH", help="also write every child's results (RSS traces, metrics) there")
    parser.add_argument("--only", choices=coco_eval.EVALUATORS, help="run one evaluator's children only (no ratios)")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        metavar="BYTES",
        help="run the children with glibc's MALLOC_MMAP_THRESHOLD_=BYTES (e.g. 131072): what mmdet's CocoMetric "
        "needs at full size on these samples, whose heap it fragments otherwise; ours needs no setting",
    )
    args = parser.parse_args(argv)
    for name in ("images", "dets", "repeats", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.mmap_threshold is not None and not 0 < args.mmap_threshold <= 32 << 20:
        parser.error(f"--mmap-threshold must be in 1..{32 << 20} bytes (glibc's range), got {args.mmap_threshold}")
    return args


@command_line
def main(argv=None) -> dict:
    args = parse_args(argv)
    result = coco_eval.run(
        args.images,
        args.dets,
        args.repeats,
        args.batch,
        args.seed,
        log=lambda s: print(s, flush=True),
        evaluators=(args.only,) if args.only else coco_eval.EVALUATORS,
        mmap_threshold=args.mmap_threshold,
    )
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
