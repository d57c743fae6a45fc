"""The COCO evaluator against mmdet's ``CocoMetric`` at val2017 scale (tools/benchmark_eval.py): the synthetic
set (``data``), the comparison (``compare``), mmdet's metric as it runs there (``mmdet_metric``) and the DDP
gather's peak (``gather``)."""
