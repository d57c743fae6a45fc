"""Detection / instance segmentation task: an mmdet detector built from ``cfg.model``."""

from __future__ import annotations

import torch
from mmengine.registry import Registry

from ..config.keys import ConfigError
from ..evaluation.coco import DetectionEvaluator
from .module import MMTaskModule


class DetectionModule(MMTaskModule):
    """An mmdet detector (Mask R-CNN, RetinaNet...) evaluated with COCO box (and mask) mAP.

    Args:
        cfg: the mmdet config (``default_scope='mmdet'``); see ``MMTaskModule``.
        init_weights: run the detector's ``init_weights()``; see ``MMTaskModule``.
    """

    scope = "mmdet"

    @staticmethod
    def models_registry() -> Registry:
        from mmdet.registry import MODELS

        return MODELS

    def predicts_masks(self) -> bool:
        """Mask R-CNN & co. have a mask head (``with_mask``); MaskFormer / Mask2Former predict instance masks when
        their ``test_cfg.instance_on`` (mmdet's instance-segmentation configs; its panoptic fusion head holds the
        model's ``test_cfg``)."""
        if getattr(self.model, "with_mask", False):
            return True
        fusion = getattr(self.model, "panoptic_fusion_head", None)
        return bool((getattr(fusion, "test_cfg", None) or {}).get("instance_on", False))

    def build_evaluator(self, with_masks: bool | None = None) -> DetectionEvaluator:
        """``DetectionEvaluator``: box mAP, and mask mAP when ``with_masks`` (default: when the model predicts
        masks, as ``CocoMetric(metric=['bbox', 'segm'])`` for Mask R-CNN & co.)."""
        if with_masks is None:
            with_masks = self.predicts_masks()
        return DetectionEvaluator(with_masks=with_masks)

    def check_classes(self, dataset, split: str) -> None:
        """mmdet's ``NumClassCheckHook`` as an error naming the config keys: every head's ``num_classes`` (the RPN's
        and the modules the hook skips excepted) must be the number of the dataset's ``metainfo['classes']``. With
        fewer, mmdet trains the last classes as background without a word.

        Args:
            dataset: the built mmdet dataset.
            split: ``'train'``, ``'val'`` or ``'test'``, for the message.
        """
        classes = (getattr(dataset, "metainfo", None) or {}).get("classes")
        if classes is None:
            return
        from mmcv.cnn import VGG
        from mmdet.models.roi_heads.mask_heads import FusedSemanticHead

        wrong = [
            f"model.{name}.num_classes={module.num_classes}"
            for name, module in self.model.named_modules()
            if hasattr(module, "num_classes")
            and not name.endswith("rpn_head")
            and not isinstance(module, (VGG, FusedSemanticHead))
            and module.num_classes != len(classes)
        ]
        if wrong:
            raise ValueError(
                f"{split}_dataloader: the dataset has {len(classes)} classes {tuple(classes)}, but "
                f"{', '.join(wrong)}: set them to {len(classes)} (or the dataloaders' dataset.metainfo.classes to "
                "the classes the heads predict); mmdet would train the extra classes as background"
            )

    def check_tta(self, tta: torch.nn.Module) -> None:
        from mmdet.models import DetTTAModel

        if isinstance(tta, DetTTAModel) and self.with_masks:
            raise ConfigError(
                f"--tta: mmdet's DetTTAModel merges boxes only (no instance masks), so it cannot test "
                f"{type(self.model).__name__}, which predicts instance masks. Use --tta with box-only detectors "
                "(the RetinaNet configs), or test this config without --tta."
            )
