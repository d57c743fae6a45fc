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
        meta = trainer.datamodule.dataset("test").metainfo
        name = f"show-rank{trainer.global_rank}"
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
            sample = sample.cpu()
            image = mmcv.imread(sample.img_path, channel_order="rgb")
            stem = osp.splitext(osp.basename(sample.img_path))[0]
            out_file = osp.join(self.out_dir, f"{stem}.png")
            if self.scope == "mmdet":
                self.visualizer.add_datasample(
                    stem, image, sample, draw_gt=False, out_file=out_file, pred_score_thr=self.score_thr
                )
            else:
                # out_file=None: add_datasample leaves the drawing in the visualizer (no backends set)
                self.visualizer.add_datasample(stem, image, sample, draw_gt=False, with_labels=True)
                panel = np.concatenate([image, self.visualizer.get_image()], axis=1)
                mmcv.imwrite(mmcv.rgb2bgr(panel), out_file)
