"""Detection / instance segmentation task: an mmdet detector built from ``cfg.model``."""

from __future__ import annotations

from mmengine.registry import Registry

from .base import MMTaskModule
from .metrics import DetectionEvaluator


class DetectionModule(MMTaskModule):
    """An mmdet detector (Mask R-CNN, RetinaNet...) evaluated with COCO box (and mask) mAP.

    Args:
        cfg: the mmdet config (``default_scope='mmdet'``); see ``MMTaskModule``.
        init_weights: run the detector's ``init_weights()``; see ``MMTaskModule``.
    """

    scope = 'mmdet'

    @staticmethod
    def models_registry() -> Registry:
        from mmdet.registry import MODELS
        return MODELS

    def build_evaluator(self) -> DetectionEvaluator:
        # Mask mAP when the model predicts masks (Mask R-CNN & co.), as CocoMetric(metric=['bbox', 'segm']).
        return DetectionEvaluator(with_masks=getattr(self.model, 'with_mask', False))
