"""Detection / instance segmentation task: an mmdet detector built from ``cfg.model``."""

from __future__ import annotations

from .base import MMTaskModule
from .metrics import DetectionEvaluator


class DetectionModule(MMTaskModule):
    scope = 'mmdet'

    @staticmethod
    def models_registry():
        from mmdet.registry import MODELS
        return MODELS

    def build_evaluator(self) -> DetectionEvaluator:
        # Mask mAP when the model predicts masks (Mask R-CNN & co.), as CocoMetric(metric=['bbox', 'segm']).
        return DetectionEvaluator(with_masks=getattr(self.model, 'with_mask', False))
