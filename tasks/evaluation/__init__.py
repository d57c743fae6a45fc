"""Evaluation: torchmetrics evaluators equal to mmdet's / mmseg's metrics, fed with their data samples.

``coco`` (box / mask mAP over faster-coco-eval), ``packed`` (the COCO evaluator's per-image state in large
blocks, bounded in memory at val2017 scale), ``segmentation`` (mIoU / aAcc / mAcc from one confusion matrix),
``tta`` (mm's test-time augmentation models around a trained one), ``dump`` (the raw test predictions in the files
mm's analysis tools read) and ``analysis`` (the glue that runs those tools on our configs).
"""
