"""Evaluation: torchmetrics evaluators equal to mmdet's / mmseg's metrics, fed with their data samples.

``coco`` (box / mask mAP over faster-coco-eval), ``packed`` (the COCO evaluator's per-image state in large
blocks, bounded in memory at val2017 scale), ``segmentation`` (mIoU / aAcc / mAcc from one confusion matrix) and
``tta`` (mm's test-time augmentation models around a trained one).
"""
