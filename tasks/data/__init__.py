"""Data: ``module.MMDataModule`` over the config's mm dataloader sections, with ``checks`` (paths, corrupt images,
annotations named before training starts), ``scan`` (every sample read once before a run, ``file_checks`` in
worker processes), ``skipping`` (``data_errors='skip'``), ``sampling`` (resumable, sharded, aspect-ratio-grouped
batches) and ``tiny`` (the embedded tiny COCO / ADE20K datasets of the demo and the tests).
"""
