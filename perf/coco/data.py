"""The synthetic val2017-like set of the COCO evaluation benchmark (``perf.coco.compare``).

COCO-sized images (640x480-ish, both orientations), 1-14 polygon objects each of 80 classes (about 7 on average,
as val2017), a few crowd regions (RLE), an instances json for mmdet (``coco_json``), and ``dets`` mask
predictions per image (jittered copies of the objects and random false positives, each a filled ellipse at
image size, as mmdet's ``predict`` returns them) as mmdet ``DetDataSample``s (``make_samples``), all
deterministic from the seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NUM_CLASSES = 80
CLASSES = tuple(f"class{i}" for i in range(NUM_CLASSES))
SIZES = ((480, 640), (427, 640), (640, 480), (640, 427), (512, 640), (480, 640))  # (H, W), COCO-like


def _polygon(rng, cx: float, cy: float, rx: float, ry: float, h: int, w: int) -> list[float]:
    """A random star-shaped polygon (8-14 vertices) around (cx, cy), clipped to the image, as COCO's flat list."""
    n = int(rng.integers(8, 15))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(0.55, 1.0, n)
    xs = np.clip(cx + rx * radii * np.cos(angles), 0, w)
    ys = np.clip(cy + ry * radii * np.sin(angles), 0, h)
    return np.stack([xs, ys], 1).reshape(-1).round(2).tolist()


def image_ground_truth(seed: int, index: int) -> dict:
    """Image ``index``: size and objects ``[(label, polygon or None, crowd mask or None)]``."""
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


def _object_rle(polygon: list[float] | None, crowd: np.ndarray | None, h: int, w: int) -> dict:
    from pycocotools import mask as mask_utils

    return mask_utils.frPyObjects([polygon], h, w)[0] if crowd is None else mask_utils.encode(np.asfortranarray(crowd))


def coco_json(seed: int, images: int) -> dict:
    """The instances json of the synthetic set (what mmdet's CocoMetric reads as ``ann_file``)."""
    from pycocotools import mask as mask_utils

    out = dict(images=[], annotations=[], categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])
    for index in range(images):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        out["images"].append(dict(id=index + 1, height=h, width=w, file_name=f"{index + 1:012d}.jpg"))
        for label, polygon, crowd in gt["objects"]:
            rle = _object_rle(polygon, crowd, h, w)
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


def _ellipse_masks(ellipses: list[tuple[float, float, float, float]], h: int, w: int) -> tuple[Any, np.ndarray]:
    """An (N, H, W) bool tensor of filled ellipses ``(cx, cy, rx, ry)`` (pixel centres inside), allocated as
    mmdet's mask head allocates its output (``torch.zeros``, then pasted box by box), and their (N, 4) xyxy
    boxes (exclusive; zeros for an empty mask). Only each ellipse's box is computed, so a 100-mask image takes
    milliseconds where rasterising polygons with pycocotools takes far longer."""
    import torch

    masks = torch.zeros((len(ellipses), h, w), dtype=torch.bool)
    pixels = masks.numpy()
    boxes = np.zeros((len(ellipses), 4), np.float32)
    for k, (cx, cy, rx, ry) in enumerate(ellipses):
        x0, x1 = max(int(cx - rx), 0), min(int(np.ceil(cx + rx)) + 1, w)
        y0, y1 = max(int(cy - ry), 0), min(int(np.ceil(cy + ry)) + 1, h)
        if x1 <= x0 or y1 <= y0:
            continue
        xx = ((np.arange(x0, x1) + 0.5 - cx) / rx) ** 2
        yy = ((np.arange(y0, y1) + 0.5 - cy) / ry) ** 2
        inside = yy[:, None] + xx[None, :] <= 1
        pixels[k, y0:y1, x0:x1] = inside
        cols, rows = np.flatnonzero(inside.any(0)), np.flatnonzero(inside.any(1))
        if len(cols):
            boxes[k] = (x0 + cols[0], y0 + rows[0], x0 + cols[-1] + 1, y0 + rows[-1] + 1)
    return masks, boxes


def make_samples(seed: int, start: int, stop: int, dets: int) -> list:
    """mmdet ``DetDataSample``s of images [start, stop): predictions and ground truth at original scale."""
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    from pycocotools import mask as mask_utils

    samples = []
    for index in range(start, stop):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        rng = np.random.default_rng([seed, index, 1])
        parts = {0: [], 1: []}  # iscrowd -> [(label, rle)]
        for label, polygon, crowd in gt["objects"]:
            parts[int(crowd is not None)].append((label, _object_rle(polygon, crowd, h, w)))
        # predictions: ellipses on the objects, jittered (mostly the right class), then random false positives
        ellipses, labels = [], []
        for label, rle in parts[0] + parts[1]:
            x, y, bw, bh = mask_utils.toBbox(rle).tolist()
            if bw == 0 or bh == 0:
                continue
            for _ in range(int(rng.integers(1, 4))):
                jitter = rng.normal(0, 0.1, 4)
                cx, cy = x + bw * (0.5 + jitter[0]), y + bh * (0.5 + jitter[1])
                ellipses.append((cx, cy, max(bw / 2 * (1 + jitter[2]), 1.0), max(bh / 2 * (1 + jitter[3]), 1.0)))
                labels.append(label if rng.random() < 0.8 else int(rng.integers(NUM_CLASSES)))
        while len(ellipses) < dets:
            side = float(np.exp(rng.uniform(np.log(8), np.log(300))))
            rx, ry = side / 2 * rng.uniform(0.6, 1.4, 2)
            ellipses.append((rng.uniform(0, w), rng.uniform(0, h), rx, ry))
            labels.append(int(rng.integers(NUM_CLASSES)))
        masks, boxes = _ellipse_masks(ellipses[:dets], h, w)
        boxes += rng.normal(0, 1.0, boxes.shape).astype(np.float32)  # box and mask heads disagree a little

        sample = DetDataSample(metainfo=dict(img_id=index + 1, ori_shape=(h, w), img_shape=(h, w)))
        sample.pred_instances = InstanceData(
            bboxes=torch.from_numpy(boxes),
            labels=torch.tensor(labels[:dets], dtype=torch.long),
            scores=torch.from_numpy(rng.random(len(boxes)).astype(np.float32)),
            masks=masks,
        )
        for field, part in (("gt_instances", parts[0]), ("ignored_instances", parts[1])):
            rles = [rle for _, rle in part]
            msk = mask_utils.decode(rles).transpose(2, 0, 1) if rles else np.zeros((0, h, w), np.uint8)
            bxs = mask_utils.toBbox(rles).reshape(-1, 4) if rles else np.zeros((0, 4))
            bxs[:, 2:] += bxs[:, :2]
            sample.set_field(
                InstanceData(
                    bboxes=HorizontalBoxes(torch.from_numpy(bxs.astype(np.float32))),
                    labels=torch.tensor([label for label, _ in part], dtype=torch.long),
                    masks=BitmapMasks(np.ascontiguousarray(msk), h, w),
                ),
                field,
            )
        samples.append(sample)
    return samples
