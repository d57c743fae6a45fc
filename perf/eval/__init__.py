"""The memory of the whole evaluation path a user runs (tools/benchmark_eval_path.py): ``tools/test.py`` and
validation inside training (``path``, with its Lightning ``callbacks``) and the segmentation evaluator at ADE20K
scale (``seg``)."""
