#!/usr/bin/env python
"""Start-up of the training set at COCO train2017 scale: the project's set-up against mmdet's plain build.

    python tools/benchmark_startup.py [--repeats 3] [--images 118287] [--anns 828000] [--cache DIR]
    python tools/benchmark_startup.py --imports BASELINE [--repeats 3]

Writes (once, cached in ``--cache``, default ``$TMPDIR/stvit_startup_bench``) a synthetic COCO annotation
file the size of instances_train2017.json: 118,287 images of both orientations, 80 categories with COCO's
ids and names, 828k polygon annotations, 277 MiB (271 MiB in the real file). Then, each in a fresh child
process and one at a time, round-robin (alternating which goes first), it measures the wall time of

* ``mmdet``: ``DATASETS.build(cfg.train_dataloader.dataset)``, mmdet's ``CocoDataset`` as mmengine's runner
  builds it;
* ``project``: what ``tools/train.py`` does before the first step, ``MMDataModule(cfg).train_dataloader()``
  (dataset build with the category checks, the data module's wrappers, sampler and batch sampler),

its CPU time (less disturbed than wall time on a shared machine), and the child's peak resident memory
(VmHWM, imports included: the same libraries in both). Both use the train dataset of ``--config`` (default:
the STViT-S Mask R-CNN paper config) pointed at the generated file. Prints each run, then the project / mmdet
ratios of wall time, CPU time and peak memory per round (median, min, max).

``--imports BASELINE`` measures the start-up itself instead: ``python -c "import backbones"`` and
``python tools/train.py --help`` in fresh processes, in this checkout and in the checkout ``BASELINE`` (e.g. a
worktree of another commit), round-robin, and prints this / baseline ratios of wall and CPU time per round
(``perf/training/imports.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from perf.training import imports
from perf.training.startup import PAPER_CFG, run_child, write_annotations
from tasks.runtime.cli import command_line


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def compare_imports(baseline: Path, rounds: int) -> dict:
    if not (baseline / "backbones" / "__init__.py").is_file():
        raise SystemExit(f"error: {baseline} is not a checkout of this project (no backbones/__init__.py)")
    runs = imports.compare(baseline, rounds)
    for command, by in runs.items():
        for k, what in ((0, "wall"), (1, "CPU")):
            ratios = [t[k] / b[k] for t, b in zip(by["this"], by["baseline"])]
            print(
                f"{command:24s} {what:4s}: this {spread([t[k] for t in by['this']])} s, baseline "
                f"{spread([b[k] for b in by['baseline']])} s, this / baseline {spread(ratios)}"
            )
    return runs


@command_line
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="rounds of (mmdet, project), default 3")
    p.add_argument("--images", type=int, default=118_287)
    p.add_argument("--anns", type=int, default=828_000)
    p.add_argument("--config", default=str(PAPER_CFG), help="config whose train dataset is built")
    p.add_argument(
        "--cache",
        default=os.path.join(tempfile.gettempdir(), "stvit_startup_bench"),
        help="where the generated annotation file is kept between runs",
    )
    p.add_argument("--imports", metavar="BASELINE", help="the start-up of this checkout against the checkout BASELINE")
    args = p.parse_args(argv)
    if args.imports:
        return compare_imports(Path(args.imports), args.repeats)

    root = Path(args.cache) / f"coco_v2_{args.images}_{args.anns}"
    ann_file = root / "annotations" / "instances_train2017.json"
    if not ann_file.exists():
        start = time.perf_counter()
        write_annotations(ann_file, args.images, args.anns)
        print(f"wrote {ann_file} in {time.perf_counter() - start:.0f} s")
    for split in ("train2017", "val2017"):  # image folders must exist (the data module checks the paths)
        (root / split).mkdir(exist_ok=True)
    val = root / "annotations" / "instances_val2017.json"
    if not val.exists():
        write_annotations(val, 50, 300, seed=1)
    print(f"{ann_file}: {ann_file.stat().st_size / 2**20:.0f} MiB, {args.images} images, {args.anns} annotations")

    runs: dict = {"mmdet": [], "project": []}
    for r in range(args.repeats):
        for kind in ("mmdet", "project") if r % 2 == 0 else ("project", "mmdet"):
            res = run_child(kind, args.config, f"{root}/")
            runs[kind].append(res)
            print(
                f"round {r}: {kind:8s} {res['seconds']:6.1f} s (CPU {res['cpu_seconds']:5.1f} s)  "
                f"peak {res['peak_gib']:.2f} GiB  "
                f"({res['images']} images kept)",
                flush=True,
            )
    ratios = {
        key: [p[key] / m[key] for m, p in zip(runs["mmdet"], runs["project"])]
        for key in ("seconds", "cpu_seconds", "peak_gib")
    }
    for kind in runs:
        print(
            f"{kind:8s} wall {spread([r['seconds'] for r in runs[kind]])} s, "
            f"CPU {spread([r['cpu_seconds'] for r in runs[kind]])} s, "
            f"peak {spread([r['peak_gib'] for r in runs[kind]])} GiB"
        )
    print(
        f"project / mmdet ({args.repeats} rounds): wall time {spread(ratios['seconds'])}, "
        f"CPU time {spread(ratios['cpu_seconds'])}, peak memory {spread(ratios['peak_gib'])}"
    )
    return {"runs": runs, "ratios": ratios}


if __name__ == "__main__":
    main()
