"""Test-time augmentation (``tools/test.py --tta``), built in one place, as mmengine's Runner does it: the config's
``tta_model`` (mmseg ``SegTTAModel``, mmdet ``DetTTAModel``) wraps the task's model as its ``module``, and the
test data come from the config's ``tta_pipeline`` (mm's ``TestTimeAug``: each batch holds one list per view)."""

from __future__ import annotations

from mmengine.config import Config
from torch import nn

from ..config.keys import ConfigError
from ..config.load import build_from_registry


class TTAPredictor:
    """Predicts a batch of ``TestTimeAug`` views with the TTA model: ``BaseTTAModel.test_step`` splits the batch
    into one batch per view, runs the wrapped model's own ``test_step`` (data_preprocessor + predict) on each and
    merges the views of every image.

    A plain object, not a submodule of the task: the TTA model holds the task's model as its child, so
    registering it would add every weight a second time (``tta.module.*``) to the state dict and to checkpoint
    loading.

    Args:
        tta_model: the built ``tta_model`` around the task's model.
    """

    def __init__(self, tta_model: nn.Module) -> None:
        self.tta_model = tta_model

    def __call__(self, batch: dict) -> list:
        return self.tta_model.test_step(batch)


def enable_tta(cfg: Config, module, config_path: str = "the config") -> None:
    """Make ``module`` (an ``MMTaskModule``) predict with the config's ``tta_model`` and the config's test data
    come from its ``tta_pipeline``. Refused with a ``ConfigError`` (the tools print it as ``error: ...``) when the
    config defines neither, or when the task cannot merge its model's predictions (``module.check_tta``, e.g.
    mmdet's box-only ``DetTTAModel`` around a Mask R-CNN)."""
    missing = [key for key in ("tta_model", "tta_pipeline") if cfg.get(key) is None]
    if missing:
        raise ConfigError(
            f"--tta: {config_path} defines no {' / '.join(missing)}. Inherit them from an mmseg "
            'ADE20K base or define them as mmdet does (docs/evaluation.md, "Evaluation protocols")'
        )
    tta = build_from_registry(module.models_registry(), dict(cfg.tta_model, module=module.model), "tta_model")
    module.check_tta(tta)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    module.tta = TTAPredictor(tta)
