"""``tools/test.py --show-dir``: PNG overlays of the predictions drawn by the libraries' visualizers.

Each rank draws the images of its own batches (the eval sampler gives every image to exactly one rank),
so no gathering is needed. Detection: boxes, masks and class names (mmdet ``DetLocalVisualizer``).
Segmentation: the image beside its colour-coded, labelled prediction (mmseg ``SegLocalVisualizer``).
"""

from __future__ import annotations

import os
import os.path as osp

import lightning as L
import mmcv
import numpy as np
import torch


class PredictionWriter(L.Callback):
    """Writes one PNG per test image with its predictions drawn.

    Args:
        out_dir: the folder for the images (created).
        scope: ``'mmdet'`` or ``'mmseg'``: which library's visualizer draws.
        score_thr: detections below this score are not drawn (detection only).
    """

    def __init__(self, out_dir: str, scope: str, score_thr: float = 0.3) -> None:
        self.out_dir = out_dir
        self.scope = scope
        self.score_thr = score_thr
        self.visualizer = None

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        self.make_visualizer(trainer.datamodule.dataset("test").metainfo, f"show-rank{trainer.global_rank}")

    def make_visualizer(self, meta: dict, name: str = "show") -> None:
        """Build the library's visualizer for the dataset's ``meta`` (classes, palette) under the instance ``name``
        (mmengine keeps one visualizer per name)."""
        if self.scope == "mmdet":
            from mmdet.visualization import DetLocalVisualizer

            self.visualizer = DetLocalVisualizer(name=name)
        else:
            from mmseg.visualization import SegLocalVisualizer

            self.visualizer = SegLocalVisualizer(name=name, alpha=1.0)  # alpha 1: the map, not a blend
        self.visualizer.dataset_meta = meta

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: list,
        batch: dict,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        for sample in outputs:
            self.draw(sample.cpu())

    def draw(self, sample) -> str:
        """Write the PNG of one predicted data sample (its ``img_path`` is read); return its path."""
        image = mmcv.imread(sample.img_path, channel_order="rgb")
        stem = osp.splitext(osp.basename(sample.img_path))[0]
        out_file = osp.join(self.out_dir, f"{stem}.png")
        if self.scope == "mmdet":
            self.visualizer.add_datasample(
                stem,
                image,
                drawable_detections(sample, image.shape[:2], self.score_thr, self.visualizer.line_width),
                draw_gt=False,
                out_file=out_file,
                pred_score_thr=self.score_thr,
            )
        else:
            # out_file=None: add_datasample leaves the drawing in the visualizer (no backends set)
            self.visualizer.add_datasample(stem, image, drawable_segmentation(sample), draw_gt=False, with_labels=True)
            panel = np.concatenate([image, self.visualizer.get_image()], axis=1)
            mmcv.imwrite(mmcv.rgb2bgr(panel), out_file)
        return out_file


def drawable_detections(sample, shape: tuple[int, int], score_thr: float, line_width: int):
    """A new ``DetDataSample`` holding ``sample``'s detections above ``score_thr`` with their boxes moved inside
    the last pixel row and column of an image of ``shape`` (H, W), and the labels' corners inside the image.

    Boxes are continuous coordinates: a box clipped to the image reaches x = W, y = H, which mmengine's
    ``draw_bboxes`` / ``draw_texts`` call out of bounds (they take pixel indices < W, < H) with a warning per image;
    mmdet writes each class label at the box's corner + ``line_width``. ``sample`` is not changed: other readers
    (``--dump``, ``--out-dir``, the JSON of tools/infer.py) keep the predictions as they are.
    """
    from mmdet.structures import DetDataSample

    pred = sample.pred_instances
    pred = pred[pred.scores > score_thr]  # indexing copies
    if len(pred):
        h, w = shape
        boxes = pred.bboxes.clone()
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, max(w - 1, 0))
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, max(h - 1, 0))
        boxes[:, 0] = boxes[:, 0].clamp(max=max(w - 1 - line_width, 0))
        boxes[:, 1] = boxes[:, 1].clamp(max=max(h - 1 - line_width, 0))
        pred.bboxes = boxes
    return DetDataSample(metainfo=sample.metainfo, pred_instances=pred)


def drawable_segmentation(sample):
    """A new ``SegDataSample`` with ``sample``'s metainfo and its ``pred_sem_seg`` as a numpy array.

    mmseg's visualizer paints each class with ``mask[sem_seg[0] == label] = color`` on a numpy image: a torch
    comparison of one element (a 1x1 image's map) acts there as the integer index 1 (an IndexError), where a
    numpy boolean mask selects the pixel as meant. ``sample`` is not changed."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    label_map = sample.pred_sem_seg.data
    if isinstance(label_map, torch.Tensor):
        label_map = label_map.cpu().numpy()
    return SegDataSample(metainfo=sample.metainfo, pred_sem_seg=PixelData(data=label_map))
