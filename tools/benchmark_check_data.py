#!/usr/bin/env python
"""The data scan's speed at COCO's image size: ``tools/check_data.py`` as a whole command on a generated set.

    python tools/benchmark_check_data.py [--images 3000] [--workers 2] [--repeats 3] [--cache DIR]

Writes (once, kept in ``--cache``, default ``$TMPDIR/check_data_bench``) a COCO-layout train2017 set: an instances
file with COCO's categories and 7 polygons per image on average, and one JPEG per image at COCO's sizes (640x480,
640x427, 500x375...; a smooth random field with noise, about 140 KiB each). Then times ``tools/check_data.py`` on the
STViT-S Mask R-CNN paper config's train split, in a child process, ``--repeats`` times: wall time from start to exit
(imports, the dataset build and every image decoded), images per second, the CPU time of the tool and its workers
(steadier on a shared machine: files / (CPU seconds / workers) is the rate the cores would give were they the
tool's alone) and the machine's load. Images without
objects are not training samples (mmdet's ``filter_empty_gt``) and are not read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from perf.training.data_scan import make_coco_set, time_check_data
from tasks.runtime.cli import command_line


@command_line
def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tools/check_data.py --workers")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "check_data_bench"))
    args = p.parse_args(argv)
    root = Path(args.cache) / f"coco_{args.images}"
    print(f"set: {make_coco_set(root, args.images)} in {root}")
    runs = []
    for i in range(args.repeats):
        runs.append(time_check_data(root, args.workers))
        print(f"run {i + 1}: {runs[-1]}")
    for key in ("images_per_second", "images_per_second_by_cpu"):
        rates = [r[key] for r in runs]
        print(f"{key}: median {statistics.median(rates)}, min {min(rates)}, max {max(rates)}")
    return runs


if __name__ == "__main__":
    main()
