#!/usr/bin/env python
"""Start-up of the training set at COCO train2017 scale: the project's set-up against mmdet's plain build.

    python tools/benchmark_startup.py [--repeats 3] [--images 118287] [--anns 828000] [--cache DIR]

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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PAPER_CFG = ROOT / "configs" / "stvit" / "mask-rcnn_stvit-s_fpn_1x_coco.py"
# COCO's 80 category ids (1..90 with gaps), in the order of mmdet's CocoDataset classes.
COCO_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]
SIDES = ((640, 480), (640, 427), (500, 375), (640, 640), (612, 612))  # (long, short) sides seen in COCO


def write_annotations(path: Path, n_images: int, n_anns: int, seed: int = 0) -> None:
    """A COCO instances file of ``n_images`` images (about 1/5 with width < height) and ``n_anns`` polygon
    annotations (6 to 23 points each, 2-decimal coordinates as in COCO), streamed to a temp file and renamed."""
    from mmdet.datasets import CocoDataset

    rng = np.random.default_rng(seed)
    long, short = np.array(SIDES).T[:, rng.integers(len(SIDES), size=n_images)]
    portrait = rng.random(n_images) < 1 / 3
    width, height = np.where(portrait, short, long), np.where(portrait, long, short)
    img_ids = np.sort(rng.choice(np.arange(1, 600_000), n_images, replace=False))
    images = [
        {
            "license": 1,
            "file_name": f"{i:012d}.jpg",
            "coco_url": "",
            "height": h,
            "width": w,
            "date_captured": "2013-11-14 17:02:52",
            "flickr_url": "",
            "id": i,
        }
        for i, w, h in zip(img_ids.tolist(), width.tolist(), height.tolist())
    ]
    owner = rng.integers(n_images, size=n_anns)  # image of each annotation; some images get none
    cats = np.asarray(COCO_IDS)[rng.integers(len(COCO_IDS), size=n_anns)].tolist()
    n_points = rng.integers(6, 24, size=n_anns)
    w, h = width[owner], height[owner]
    bw, bh = rng.uniform(0.05, 0.6, n_anns) * w, rng.uniform(0.05, 0.6, n_anns) * h
    x0, y0 = rng.uniform(0, 1, n_anns) * (w - bw), rng.uniform(0, 1, n_anns) * (h - bh)
    of_point = np.repeat(np.arange(n_anns), n_points)  # polygon points inside each box
    xy = (
        np.round(
            rng.uniform(0, 1, (len(of_point), 2)) * np.stack([bw, bh], 1)[of_point] + np.stack([x0, y0], 1)[of_point], 2
        )
        .ravel()
        .tolist()
    )
    ends = (2 * np.cumsum(n_points)).tolist()
    boxes = np.round(np.stack([x0, y0, bw, bh], 1), 2).tolist()
    areas = np.round(bw * bh / 2, 4).tolist()
    image_of = img_ids[owner].tolist()
    categories = [
        {"supercategory": "object", "id": i, "name": n} for i, n in zip(COCO_IDS, CocoDataset.METAINFO["classes"])
    ]
    head = {
        "info": {"description": "synthetic train2017-sized file (tools/benchmark_startup.py)"},
        "licenses": [{"id": 1, "name": "CC BY 4.0", "url": ""}],
        "images": images,
        "categories": categories,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(head, separators=(",", ":"))[:-1] + ',"annotations":[')
        for first in range(0, n_anns, 50_000):  # in chunks: the whole list as Python objects would take GiBs
            chunk = [
                {
                    "segmentation": [xy[ends[k] - 2 * int(n_points[k]) : ends[k]]],
                    "area": areas[k],
                    "iscrowd": 0,
                    "image_id": image_of[k],
                    "bbox": boxes[k],
                    "category_id": cats[k],
                    "id": k + 1,
                }
                for k in range(first, min(first + 50_000, n_anns))
            ]
            f.write(("," if first else "") + json.dumps(chunk, separators=(",", ":"))[1:-1])
        f.write("]}")
    os.replace(tmp, path)


def peak_rss_gib() -> float:
    """This process's peak resident memory (Linux VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(kind: str, config: str, data_root: str) -> None:
    """In a fresh process: build the train set one way; print time and peak memory as JSON."""
    sys.path.insert(0, str(ROOT))
    from tasks.config import load_config, register_scope
    from tasks.data import MMDataModule

    cfg = load_config(config, {f"{s}_dataloader.dataset.data_root": data_root for s in ("train", "val", "test")})
    register_scope(cfg.default_scope)
    from mmengine.registry import DATASETS

    start, cpu_start = time.perf_counter(), time.process_time()
    if kind == "mmdet":
        n = len(DATASETS.build(cfg.train_dataloader.dataset))
    else:
        dm = MMDataModule(cfg, cfg.default_scope)
        dm.train_dataloader()
        n = len(dm.dataset("train"))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        json.dumps(
            {"kind": kind, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_gib": peak_rss_gib(), "images": n}
        )
    )


def run_child(kind: str, config: str, data_root: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--config", config, "--data-root", data_root],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


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
    p.add_argument("--child", choices=("mmdet", "project"), help=argparse.SUPPRESS)
    p.add_argument("--data-root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child, args.config, args.data_root)

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
