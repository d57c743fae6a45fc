"""Semantic segmentation task: an mmseg segmentor (e.g. EncoderDecoder + UPerHead) from ``cfg.model``."""

from __future__ import annotations

from mmengine.registry import Registry
from torch import nn

from ..evaluation.segmentation import SegmentationEvaluator
from .module import MMTaskModule


class SegmentationModule(MMTaskModule):
    """An mmseg segmentor (EncoderDecoder + UPerHead...) evaluated with mIoU, aAcc and mAcc.

    Args:
        cfg: the mmseg config (``default_scope='mmseg'``); see ``MMTaskModule``.
        init_weights: run the segmentor's ``init_weights()``; see ``MMTaskModule``.
    """

    scope = "mmseg"

    @staticmethod
    def models_registry() -> Registry:
        from mmseg.registry import MODELS

        return MODELS

    def build_evaluator(self, ignore_index: int | None = None) -> SegmentationEvaluator:
        """``SegmentationEvaluator`` over the decode head's classes; ``ignore_index`` (``IoUMetric``'s) defaults
        to the head's."""
        head = self.model.decode_head
        if isinstance(head, nn.ModuleList):  # CascadeEncoderDecoder: the last head predicts
            head = head[-1]
        ignore = head.ignore_index if ignore_index is None else ignore_index
        return SegmentationEvaluator(num_classes=head.num_classes, ignore_index=ignore)
