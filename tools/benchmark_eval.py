#!/usr/bin/env python
"""Time the project's COCO evaluator against mmdet's ``CocoMetric`` on the same synthetic predictions.

    python tools/benchmark_eval.py [--images 500] [--dets 100] [--repeats 2] [--batch 8] [--seed 0]

Generates a COCO-like validation set (640x480-ish images, 1-14 polygon objects each of 80 classes, a few
crowd regions, an instances json for mmdet) and ``--dets`` mask predictions per image (jittered copies of the
objects and random false positives, each a random polygon rasterised to an (H, W) bool mask), as mmdet
``DetDataSample``s, deterministically from ``--seed``. Each evaluator runs in its own child process (so that
its peak memory is its own), fed the same samples batch by batch: ``tasks.metrics.DetectionEvaluator`` with
per-class results, and ``CocoMetric(metric=['bbox', 'segm'], classwise=True)`` fed as mmengine's Evaluator
feeds it (``to_dict()`` of each sample). Sample generation is not timed. The children alternate
(ours, mmdet, ours, mmdet, ...) for ``--repeats`` rounds; the ratio ours / mmdet is taken per round.

Prints per child: update, compute and total seconds and peak RSS (GiB, including the ~constant memory of the
generated batch); per round the ratio; and the largest difference of any metric (the 9 flat ones and the
per-class table) between the two. mmdet rounds its results to 3 decimals, so differences up to 5e-4 are
rounding. Measured figures are in docs/evaluation.md ("Evaluation speed").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # run from a checkout, uninstalled

import numpy as np  # noqa: E402

NUM_CLASSES = 80
CLASSES = tuple(f"class{i}" for i in range(NUM_CLASSES))
SIZES = ((480, 640), (427, 640), (640, 480), (640, 427), (512, 640), (480, 640))  # (H, W), COCO-like
FLAT = [
    "bbox_mAP",
    "bbox_mAP_50",
    "bbox_mAP_75",
    "bbox_mAP_s",
    "bbox_mAP_m",
    "bbox_mAP_l",
    "segm_mAP",
    "segm_mAP_50",
    "segm_mAP_75",
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=500, help="number of synthetic images (val2017: 5000)")
    parser.add_argument("--dets", type=int, default=100, help="mask predictions per image")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (ours, mmdet) runs")
    parser.add_argument("--batch", type=int, default=8, help="images per update call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", choices=["ours", "mmdet"], help=argparse.SUPPRESS)
    parser.add_argument("--ann-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("images", "dets", "repeats", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


# ---- synthetic data -------------------------------------------------------------------------------------
def _polygon(rng, cx: float, cy: float, rx: float, ry: float, h: int, w: int) -> list[float]:
    """A random star-shaped polygon (8-14 vertices) around (cx, cy), clipped to the image, as COCO's flat list."""
    n = int(rng.integers(8, 15))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(0.55, 1.0, n)
    xs = np.clip(cx + rx * radii * np.cos(angles), 0, w)
    ys = np.clip(cy + ry * radii * np.sin(angles), 0, h)
    return np.stack([xs, ys], 1).reshape(-1).round(2).tolist()


def image_ground_truth(seed: int, index: int) -> dict:
    """Image ``index``: size and objects ``[(label, polygon or None, crowd RLE or None)]``."""
    rng = np.random.default_rng([seed, index, 0])
    h, w = SIZES[int(rng.integers(len(SIZES)))]
    objects = []
    for _ in range(int(rng.integers(1, 15))):
        side = float(np.exp(rng.uniform(np.log(10), np.log(400))))  # small / medium / large
        rx, ry = side / 2 * rng.uniform(0.6, 1.4, 2)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        objects.append((int(rng.integers(NUM_CLASSES)), _polygon(rng, cx, cy, rx, ry, h, w), None))
    if rng.random() < 0.05:  # a crowd region (iscrowd=1, RLE), as COCO has on ~1% of its objects
        crowd = np.zeros((h, w), np.uint8)
        y, x = int(rng.integers(0, h - 100)), int(rng.integers(0, w - 150))
        crowd[y : y + 100, x : x + 150] = rng.random((100, 150)) < 0.6
        objects.append((int(rng.integers(NUM_CLASSES)), None, crowd))
    return dict(height=h, width=w, objects=objects)


def _rasterise(polygons: list[list[float]], h: int, w: int) -> np.ndarray:
    """(N, H, W) uint8 masks of COCO polygons, as mmdet's ``PolygonMasks.to_ndarray`` rasterises them."""
    from pycocotools import mask as mask_utils

    if not polygons:
        return np.zeros((0, h, w), np.uint8)
    masks = mask_utils.decode(mask_utils.frPyObjects(polygons, h, w))  # (H, W, N)
    return np.ascontiguousarray(masks.transpose(2, 0, 1))


def coco_json(seed: int, images: int) -> dict:
    """The instances json of the synthetic set (what mmdet's CocoMetric reads as ``ann_file``)."""
    from pycocotools import mask as mask_utils

    out = dict(images=[], annotations=[], categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])
    for index in range(images):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        out["images"].append(dict(id=index + 1, height=h, width=w, file_name=f"{index + 1:012d}.jpg"))
        for label, polygon, crowd in gt["objects"]:
            rle = (
                mask_utils.frPyObjects([polygon], h, w)[0]
                if crowd is None
                else mask_utils.encode(np.asfortranarray(crowd))
            )
            x, y, bw, bh = mask_utils.toBbox(rle).tolist()
            if crowd is None:
                segmentation = [polygon]
            else:
                segmentation = dict(size=rle["size"], counts=rle["counts"].decode())
            # area: the pixel count of the rasterised segmentation (what BitmapMasks give our evaluator), so
            # that both evaluators bin small / medium / large identically
            out["annotations"].append(
                dict(
                    id=len(out["annotations"]) + 1,
                    image_id=index + 1,
                    category_id=label + 1,
                    bbox=[x, y, bw, bh],
                    area=float(mask_utils.area(rle)),
                    iscrowd=int(crowd is not None),
                    segmentation=segmentation,
                )
            )
    return out


def make_samples(seed: int, start: int, stop: int, dets: int) -> list:
    """mmdet ``DetDataSample``s of images [start, stop): predictions and ground truth at original scale."""
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    samples = []
    for index in range(start, stop):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        rng = np.random.default_rng([seed, index, 1])
        parts = {0: [], 1: []}  # iscrowd -> [(label, mask)]
        for label, polygon, crowd in gt["objects"]:
            mask = _rasterise([polygon], h, w)[0] if crowd is None else crowd
            parts[int(crowd is not None)].append((label, mask))
        # predictions: jittered copies of the objects (mostly the right class), then random false positives
        polygons, labels = [], []
        for label, mask in parts[0] + parts[1]:
            ys, xs = np.nonzero(mask)
            if len(xs) == 0:
                continue
            cx, cy = (xs.min() + xs.max() + 1) / 2, (ys.min() + ys.max() + 1) / 2
            rx, ry = max(xs.max() + 1 - xs.min(), 2) / 2, max(ys.max() + 1 - ys.min(), 2) / 2
            for _ in range(int(rng.integers(1, 4))):
                jitter = rng.normal(0, 0.1, 4)
                polygons.append(
                    _polygon(
                        rng,
                        cx + jitter[0] * rx * 2,
                        cy + jitter[1] * ry * 2,
                        rx * (1 + jitter[2]),
                        ry * (1 + jitter[3]),
                        h,
                        w,
                    )
                )
                labels.append(label if rng.random() < 0.8 else int(rng.integers(NUM_CLASSES)))
        while len(polygons) < dets:
            side = float(np.exp(rng.uniform(np.log(8), np.log(300))))
            polygons.append(_polygon(rng, rng.uniform(0, w), rng.uniform(0, h), side / 2, side / 2, h, w))
            labels.append(int(rng.integers(NUM_CLASSES)))
        polygons, labels = polygons[:dets], labels[:dets]
        masks = _rasterise(polygons, h, w).astype(bool)
        boxes = np.array(
            [
                [*m.any(0).nonzero()[0][[0, -1]], *m.any(1).nonzero()[0][[0, -1]]] if m.any() else [0, 0, 0, 0]
                for m in masks
            ],
            np.float32,
        ).reshape(-1, 4)[:, [0, 2, 1, 3]]
        boxes[:, 2:] += 1  # xyxy, exclusive
        boxes += rng.normal(0, 1.0, boxes.shape).astype(np.float32)  # box and mask heads disagree a little

        sample = DetDataSample(metainfo=dict(img_id=index + 1, ori_shape=(h, w), img_shape=(h, w)))
        sample.pred_instances = InstanceData(
            bboxes=torch.from_numpy(boxes),
            labels=torch.tensor(labels, dtype=torch.long),
            scores=torch.from_numpy(rng.random(len(labels)).astype(np.float32)),
            masks=torch.from_numpy(masks),
        )
        for field, part in (("gt_instances", parts[0]), ("ignored_instances", parts[1])):
            lbs = [label for label, _ in part]
            msk = np.array([m for _, m in part], np.uint8).reshape(-1, h, w)
            bxs = [
                [*m.any(0).nonzero()[0][[0, -1]] + [0, 1], *m.any(1).nonzero()[0][[0, -1]] + [0, 1]]
                if m.any()
                else [0, 0, 0, 0]
                for m in msk
            ]
            bxs = np.array(bxs, np.float32).reshape(-1, 4)[:, [0, 2, 1, 3]]
            sample.set_field(
                InstanceData(
                    bboxes=HorizontalBoxes(torch.from_numpy(bxs)),
                    labels=torch.tensor(lbs, dtype=torch.long),
                    masks=BitmapMasks(msk, h, w),
                ),
                field,
            )
        samples.append(sample)
    return samples


# ---- mmdet's classwise table ----------------------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def classwise_tables(messages: list[str]) -> list[dict]:
    """mmdet's logged classwise AsciiTables (one per iou_type, in order) -> ``{column: {class: float | None}}``
    (None where mmdet prints nan)."""
    tables = []
    for message in messages:
        rows = [
            [c.strip() for c in line.strip("|").split("|")] for line in message.splitlines() if line.startswith("|")
        ]
        if rows and rows[0][:2] == ["category", "mAP"]:
            tables.append(
                {
                    col: {row[0]: (None if row[i] == "nan" else float(row[i])) for row in rows[1:]}
                    for i, col in enumerate(rows[0])
                    if i
                }
            )
    return tables


def run_coco_metric(metric, n_samples: int) -> dict:
    """``metric.evaluate`` with its classwise tables captured: flat results + ``per_class`` in our names."""
    from mmengine.logging import MMLogger

    logger, handler = MMLogger.get_current_instance(), _Records()
    logger.addHandler(handler)
    try:
        out = {k.split("/")[-1]: v for k, v in metric.evaluate(n_samples).items()}
    finally:
        logger.removeHandler(handler)
    tables = classwise_tables(handler.messages)
    out = {k: v for k, v in out.items() if k in FLAT}
    out["per_class"] = {
        f"{iou_type}_AP{col.removeprefix('mAP')}": values
        for iou_type, table in zip(metric.metrics, tables, strict=True)
        for col, values in table.items()
    }
    return out


# ---- one child: one evaluator ---------------------------------------------------------------------------
def run_child(args) -> dict:
    import torch

    torch.set_num_threads(1)
    if args.child == "ours":
        from tasks.metrics import DetectionEvaluator

        evaluator = DetectionEvaluator(with_masks=True, class_names=CLASSES)

        def update(samples):
            evaluator.update(samples)

        def compute():
            return evaluator.compute()
    else:
        from mmdet.evaluation import CocoMetric
        from mmengine.logging import MMLogger

        MMLogger.get_instance("mmengine", log_level="WARNING")
        metric = CocoMetric(ann_file=args.ann_file, metric=["bbox", "segm"], classwise=True)
        metric.dataset_meta = dict(classes=CLASSES)

        def update(samples):
            metric.process({}, [s.to_dict() for s in samples])  # as mmengine's Evaluator.process does

        def compute():
            return run_coco_metric(metric, args.images)

    t_update = 0.0
    for start in range(0, args.images, args.batch):
        samples = make_samples(args.seed, start, min(start + args.batch, args.images), args.dets)
        t0 = time.perf_counter()
        update(samples)
        t_update += time.perf_counter() - t0
        del samples
    t0 = time.perf_counter()
    metrics = compute()
    t_compute = time.perf_counter() - t0
    from perf.memory import peak_rss_gib

    return dict(
        update_s=t_update, compute_s=t_compute, total_s=t_update + t_compute, peak_gib=peak_rss_gib(), metrics=metrics
    )


def max_difference(ours: dict, ref: dict) -> tuple[float, str]:
    """Largest |ours - ref| over the flat metrics and the per-class table (None must meet None)."""
    worst, where = 0.0, ""
    pairs = [(k, ours[k], ref[k]) for k in FLAT]
    pairs += [
        (f"{m}[{c}]", ours["per_class"][m][c], v) for m, values in ref["per_class"].items() for c, v in values.items()
    ]
    for name, a, b in pairs:
        diff = float("inf") if (a is None) != (b is None) else 0.0 if a is None else abs(a - b)
        if diff > worst:
            worst, where = diff, name
    return worst, where


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)))
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        ann_file = osp.join(tmp, "instances.json")
        with open(ann_file, "w") as f:
            json.dump(coco_json(args.seed, args.images), f)
        cmd = [
            sys.executable,
            osp.abspath(__file__),
            "--images",
            str(args.images),
            "--dets",
            str(args.dets),
            "--batch",
            str(args.batch),
            "--seed",
            str(args.seed),
            "--ann-file",
            ann_file,
        ]
        env = {**os.environ, "PYTHONPATH": osp.dirname(osp.dirname(osp.abspath(__file__)))}
        runs: dict[str, list] = {"ours": [], "mmdet": []}
        print(f"{args.images} images, {args.dets} mask predictions each, {args.repeats} round(s)")
        print(f"{'round':>5}  {'evaluator':<9} {'update s':>9} {'compute s':>9} {'total s':>9} {'peak GiB':>8}")
        for r in range(args.repeats):
            for name in ("ours", "mmdet") if r % 2 == 0 else ("mmdet", "ours"):
                proc = subprocess.run([*cmd, "--child", name], env=env, capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"{name} child failed:\n{proc.stderr[-4000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[name].append(res)
                print(
                    f"{r:>5}  {name:<9} {res['update_s']:>9.2f} {res['compute_s']:>9.2f} {res['total_s']:>9.2f} "
                    f"{res['peak_gib']:>8.2f}",
                    flush=True,
                )
    ratios = {
        k: [o[k] / m[k] for o, m in zip(runs["ours"], runs["mmdet"], strict=True)]
        for k in ("update_s", "compute_s", "total_s")
    }
    diff, where = max_difference(runs["ours"][0]["metrics"], runs["mmdet"][0]["metrics"])
    for k, values in ratios.items():
        spread = f" (min {min(values):.3f}, max {max(values):.3f})" if len(values) > 1 else ""
        print(f"ours / mmdet {k[:-2]:<8} median {statistics.median(values):.3f}{spread}")
    print(
        f"max |ours - mmdet| over {len(FLAT)} metrics and the per-class table: {diff:.2e} ({where}); "
        "mmdet rounds to 3 decimals"
    )
    return dict(runs=runs, ratios=ratios, max_diff=diff)


if __name__ == "__main__":
    main()
