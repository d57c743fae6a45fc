"""Start-up of the training set at COCO train2017 scale (tools/benchmark_startup.py): a synthetic annotation file
the size of instances_train2017.json, and the train set built from it in a fresh process, mmdet's plain way or
the project's."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from backbones.checkpoints.atomic import atomic_write

from ..child import ROOT, last_json, run_module
from ..memory import peak_rss_gib

PAPER_CFG = ROOT / "configs" / "stvit" / "mask-rcnn_stvit-s_fpn_1x_coco.py"
# COCO's 80 category ids (1..90 with gaps), in the order of mmdet's CocoDataset classes.
COCO_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]
SIDES = ((640, 480), (640, 427), (500, 375), (640, 640), (612, 612))  # (long, short) sides seen in COCO


def write_annotations(path: Path, n_images: int, n_anns: int, seed: int = 0) -> None:
    """A COCO instances file of ``n_images`` images (about 1/5 with width < height) and ``n_anns`` polygon
    annotations (6 to 23 points each, 2-decimal coordinates as in COCO), streamed to the file, written atomically."""
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

    def write(f) -> None:
        f.write((json.dumps(head, separators=(",", ":"))[:-1] + ',"annotations":[').encode())
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
            f.write((("," if first else "") + json.dumps(chunk, separators=(",", ":"))[1:-1]).encode())
        f.write(b"]}")

    atomic_write(path, write)


def child(kind: str, config: str, data_root: str) -> None:
    """In a fresh process: build the train set one way; print time and peak memory as JSON."""
    from tasks.config.load import load_config
    from tasks.config.scopes import register_scope
    from tasks.data.module import MMDataModule

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
    """``child(kind, config, data_root)`` in a fresh process (``python -m perf.training.startup``): its JSON line."""
    return last_json(run_module("perf.training.startup", kind, config, data_root))


if __name__ == "__main__":
    child(*sys.argv[1:4])
