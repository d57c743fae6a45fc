"""The segmentation evaluator at ADE20K scale against mmseg's ``IoUMetric``, on the same synthetic predictions.

ADE20K's validation set: 2000 images, 150 classes, typically 512x683. Each image here is a label map of
rectangular regions of random classes (ignore-index 255 on a few of them) and a prediction that agrees with
it on most regions, both ``(1, H, W)`` int64 tensors as mmseg's ``PackSegInputs`` and ``EncoderDecoder.predict``
give them, generated deterministically per image from ``(seed, index)``, batch by batch (the generation is
not timed; its memory, one batch, is the same in both runs).

Each evaluator runs in its own child process (``python -m perf.eval.seg --child ours|mm``):
``tasks.evaluation.segmentation.SegmentationEvaluator.update`` per batch then ``compute()``, or
``IoUMetric.process`` on the
``to_dict()`` of every sample (as mmengine's ``Evaluator`` feeds it) then ``evaluate``. The child reports its
RSS at the start (after the first batch is generated), at the end of the update loop and its peak, and the
update / compute times.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from ..child import last_json, run_module
from ..memory import anon_rss_gib, peak_rss_gib, rss_gib

NUM_CLASSES = 150
HEIGHT, WIDTH = 512, 683
IGNORE = 255


def label_maps(seed: int, index: int, height: int = HEIGHT, width: int = WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """(ground truth, prediction) int64 ``(1, H, W)`` maps of image ``index``: a grid of regions (8-32 px
    cells) of random classes, 5 % of them ignored in the ground truth, 20 % predicted as another class."""
    rng = np.random.default_rng([seed, index])
    cell = int(rng.integers(8, 33))
    gh, gw = -(-height // cell), -(-width // cell)
    gt_cells = rng.integers(0, NUM_CLASSES, (gh, gw))
    pred_cells = np.where(rng.random((gh, gw)) < 0.2, rng.integers(0, NUM_CLASSES, (gh, gw)), gt_cells)
    gt_cells = np.where(rng.random((gh, gw)) < 0.05, IGNORE, gt_cells)

    def expand(cells: np.ndarray) -> np.ndarray:
        full = np.repeat(np.repeat(cells, cell, axis=0), cell, axis=1)[:height, :width]
        return np.ascontiguousarray(full, dtype=np.int64)[None]

    return expand(gt_cells), expand(pred_cells)


def make_samples(seed: int, start: int, stop: int) -> list:
    """mmseg ``SegDataSample``s of images [start, stop)."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    samples = []
    for index in range(start, stop):
        gt, pred = label_maps(seed, index)
        sample = SegDataSample(metainfo=dict(img_path=f"{index:08d}.jpg", ori_shape=(HEIGHT, WIDTH)))
        sample.gt_sem_seg = PixelData(data=torch.from_numpy(gt))
        sample.pred_sem_seg = PixelData(data=torch.from_numpy(pred))
        samples.append(sample)
    return samples


def run_evaluator(impl: str, images: int, batch: int, seed: int) -> dict:
    """Feed ``images`` images to our evaluator (``impl='ours'``) or mmseg's ``IoUMetric`` (``'mm'``) in this
    process; returns RSS (GiB) and times (s) and the metrics (fractions). ``loop_growth`` is the growth of the
    anonymous memory over the updates (``perf.memory.anon_rss_gib``), the peak's growth that of the whole RSS."""
    classes = tuple(f"class{i}" for i in range(NUM_CLASSES))
    if impl == "ours":
        from tasks.evaluation.segmentation import SegmentationEvaluator

        metric = SegmentationEvaluator(NUM_CLASSES, ignore_index=IGNORE, class_names=classes)
    else:
        from mmseg.evaluation import IoUMetric

        metric = IoUMetric(ignore_index=IGNORE, iou_metrics=["mIoU"])
        metric.dataset_meta = dict(classes=classes)
    samples = make_samples(seed, 0, min(batch, images))
    start, start_anon = rss_gib(), anon_rss_gib()
    update_s = 0.0
    for first in range(0, images, batch):
        if first:
            samples = make_samples(seed, first, min(first + batch, images))
        t0 = time.perf_counter()
        if impl == "ours":
            metric.update(samples)
        else:
            metric.process({}, [s.to_dict() for s in samples])
        update_s += time.perf_counter() - t0
    del samples
    loop_growth = anon_rss_gib() - start_anon
    t0 = time.perf_counter()
    if impl == "ours":
        result = metric.compute()
        metrics = {k: float(result[k]) for k in ("mIoU", "aAcc", "mAcc")}
    else:
        result = metric.evaluate(images)
        metrics = {k: float(result[k]) / 100 for k in ("mIoU", "aAcc", "mAcc")}
    compute_s = time.perf_counter() - t0
    return dict(
        impl=impl,
        images=images,
        start=start,
        loop_growth=loop_growth,
        peak_growth=peak_rss_gib() - start,
        peak=peak_rss_gib(),
        update_s=update_s,
        compute_s=compute_s,
        total_s=update_s + compute_s,
        metrics=metrics,
    )


def measure(
    images: int = 2000, rounds: int = 2, batch: int = 4, seed: int = 0, impls: tuple[str, ...] = ("ours", "mm")
) -> list[dict]:
    """``impls`` (ours and mmseg's) alternating, each in a fresh child process, for ``rounds`` rounds."""
    runs = []
    for r in range(rounds):
        for impl in impls:
            args = ("--child", impl, str(images), str(batch), str(seed))
            runs.append(dict(last_json(run_module("perf.eval.seg", *args)), round=r))
    return runs


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        impl, n, b, s = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(run_evaluator(impl, n, b, s)))
