"""Lightning tasks (modules, data, metrics) for mmdet / mmseg models.

``build_task(cfg)`` picks the module for the config's ``default_scope`` (mmdet: ``DetectionModule``,
mmseg: ``SegmentationModule``) and pairs it with an ``MMDataModule`` over the config's dataloader sections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import packages
from .runtime import quiet

quiet.install()  # before any config is loaded or trainer built (tasks/runtime/quiet.py says what and why)
packages.install()  # mmdet:: / mmseg:: paths: each package's model index read once per process

if TYPE_CHECKING:
    import lightning as L
    from mmengine.config import Config


def build_task(cfg: Config, init_weights: bool = True) -> tuple[L.LightningModule, L.LightningDataModule]:
    """Return ``(LightningModule, LightningDataModule)`` for an mmengine config (see tasks/config/load.py).

    Args:
        cfg: the loaded config (``tasks.config.load.load_config``); its ``default_scope`` picks the task.
        init_weights: run the model's ``init_weights()`` (pretrained backbone included); False when a
            checkpoint will overwrite every weight.
    """
    from .data.module import MMDataModule

    scope = cfg.get("default_scope")
    if scope == "mmdet":
        from .training.detection import DetectionModule as Module
    elif scope == "mmseg":
        from .training.segmentation import SegmentationModule as Module
    else:
        raise ValueError(f"default_scope must be 'mmdet' or 'mmseg', got {scope!r}")
    return Module(cfg, init_weights=init_weights), MMDataModule(cfg, scope)
