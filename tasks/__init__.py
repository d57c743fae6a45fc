"""Lightning tasks (modules, data, metrics) for mmdet / mmseg models.

``build_task(cfg)`` picks the module for the config's ``default_scope`` (mmdet: ``DetectionModule``,
mmseg: ``SegmentationModule``) and pairs it with an ``MMDataModule`` over the config's dataloader sections.
"""


def build_task(cfg, init_weights: bool = True):
    """Return ``(LightningModule, LightningDataModule)`` for an mmengine config (see tasks/config.py)."""
    from .data import MMDataModule

    scope = cfg.get('default_scope')
    if scope == 'mmdet':
        from .detection import DetectionModule as Module
    elif scope == 'mmseg':
        from .segmentation import SegmentationModule as Module
    else:
        raise ValueError(f"default_scope must be 'mmdet' or 'mmseg', got {scope!r}")
    return Module(cfg, init_weights=init_weights), MMDataModule(cfg, scope)
