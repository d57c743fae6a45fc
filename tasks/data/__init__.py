"""Data: ``module.MMDataModule`` over the config's mm dataloader sections, with ``checks`` (paths, corrupt images,
annotations named before training starts), ``sampling`` (resumable, sharded, aspect-ratio-grouped batches) and
``tiny`` (the embedded tiny COCO / ADE20K datasets of the demo and the tests).
"""
