"""Evaluation: torchmetrics evaluators equal to mmdet's / mmseg's metrics, fed with their data samples.

``coco`` (box / mask mAP over faster-coco-eval), ``packed`` (the COCO evaluator's per-image state in large
blocks, bounded in memory at val2017 scale), ``segmentation`` (mIoU / aAcc / mAcc from one confusion matrix),
``select`` (ours or mm's metric classes, as the config's ``val_evaluator`` / ``test_evaluator`` ask), ``mm_metric``
(mm's metric classes driven through mmengine's ``Evaluator``), ``tta`` (mm's test-time augmentation models
around a trained one), ``dump`` (the raw test predictions in the files mm's analysis tools read) and ``analysis``
(the glue that runs those tools on our configs).
"""
