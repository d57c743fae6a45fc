"""Detection / instance segmentation task: an mmdet detector built from ``cfg.model``."""

from __future__ import annotations

from .base import MMTaskModule
from .metrics import DetectionEvaluator


def _contiguous_outputs(module, args, outputs):
    return tuple(o.contiguous() for o in outputs)


class DetectionModule(MMTaskModule):
    scope = 'mmdet'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # mmcv's RoIAlign (CPU kernel at least) indexes its input as NCHW-contiguous memory and silently
        # returns wrong features for channels_last maps, which a backbone may return (convolutions then
        # keep that layout through the FPN). Contiguous maps cost nothing when they already are.
        self.model.backbone.register_forward_hook(_contiguous_outputs)

    @staticmethod
    def models_registry():
        from mmdet.registry import MODELS
        return MODELS

    def build_evaluator(self) -> DetectionEvaluator:
        # Mask mAP when the model predicts masks (Mask R-CNN & co.), as CocoMetric(metric=['bbox', 'segm']).
        return DetectionEvaluator(with_masks=getattr(self.model, 'with_mask', False))
