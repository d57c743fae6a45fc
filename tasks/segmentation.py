"""Semantic segmentation task: an mmseg segmentor (e.g. EncoderDecoder + UPerHead) from ``cfg.model``."""

from __future__ import annotations

from torch import nn

from .base import MMTaskModule
from .metrics import SegmentationEvaluator


class SegmentationModule(MMTaskModule):
    scope = 'mmseg'

    @staticmethod
    def models_registry():
        from mmseg.registry import MODELS
        return MODELS

    def build_evaluator(self) -> SegmentationEvaluator:
        head = self.model.decode_head
        if isinstance(head, nn.ModuleList):  # CascadeEncoderDecoder: the last head predicts
            head = head[-1]
        return SegmentationEvaluator(num_classes=head.num_classes, ignore_index=head.ignore_index)
