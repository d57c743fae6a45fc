"""The one place where the dependencies' console noise is silenced, each by its exact message and the module
that emits it (no blanket filter: any other warning still prints, and the tests turn it into an error).

``install()`` runs when ``tasks`` is imported, so every tool and every test process has it before it loads a
config or builds a trainer. Our own warnings are fixed at their cause, never filtered here.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

# (message regex matched at the start, category, emitting module regex, why it does not concern a user)
WARNING_FILTERS: tuple[tuple[str, type[Warning], str, str], ...] = (
    (
        r"pkg_resources is deprecated as an API",
        UserWarning,
        r"mmengine\.utils\.package_utils|importlib",
        "mmengine 0.10 imports (and reloads) setuptools' pkg_resources to find mmdet's / mmseg's base configs",
    ),
    (
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        Warning,
        r"lightning\.pytorch\.utilities\._pytree",
        "Lightning 2.6's pytree helper on torch 2.14's deprecated LeafSpec",
    ),
    (
        r"Checkpoint directory .* exists and is not empty",
        UserWarning,
        r"lightning\.pytorch\.callbacks\.model_checkpoint",
        "the work dir holds the run's config copy and mm.log before the first checkpoint, and last.ckpt is "
        "where --resume looks (docs/training.md), so a non-empty work dir is the normal case",
    ),
    (
        r"`reduce_zero_label` will be deprecated",
        UserWarning,
        r"mmseg\.datasets\.transforms\.loading",
        "mmseg 1.2's own ADE20K base pipelines pass LoadAnnotations(reduce_zero_label=True); the configs keep them",
    ),
    (
        r"``build_loss`` would be deprecated soon",
        UserWarning,
        r"mmseg\.models\.builder",
        "mmseg 1.2 builds its decode heads' losses through its own deprecated helper",
    ),
    (
        r"Default ``avg_non_ignore`` is False",
        UserWarning,
        r"mmseg\.models\.losses\.cross_entropy_loss",
        "mmseg 1.2's CrossEntropyLoss notes a default the paper recipes keep",
    ),
    (
        r"The shape of value will convert from",
        UserWarning,
        r"mmengine\.structures\.pixel_data",
        "mmseg 1.2's SegTTAModel (tools/test.py --tta) stores each merged (H, W) prediction in a PixelData, which "
        "adds the channel dimension as every (1, H, W) prediction has it, and warns once per image size",
    ),
    (
        r"Grad strides do not match bucket view strides",
        UserWarning,
        r"torch\.autograd\.graph",
        "torch's DDP compares the strides of size-1 dimensions too: the gradients of depthwise (C, 1, 3, 3) and "
        "1x1 (C, K, 1, 1) convolution weights come in the weights' memory order with other strides there, which "
        "autograd's own layout check accepts; DDP copies them into its buckets as it copies any gradient",
    ),
    (
        r"torch\.meshgrid: in an upcoming release, it will be required to pass the indexing argument",
        UserWarning,
        r"torch\.functional",
        "mmdet 3.3's deformable-attention encoder and DINO's proposal grid (DINO, Mask2Former's pixel decoder) call "
        "torch.meshgrid without `indexing`, relying on the 'ij' default",
    ),
)


class _DropLightningTips(logging.Filter):
    """Lightning's advertisement for its cloud logger, printed at every trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


_TIPS = _DropLightningTips()


class _DropFrozenParameterNotes(logging.Filter):
    """mmengine's optimizer constructor notes every parameter it leaves out because it is frozen (HAT-Net's
    non-affine attention norms, ``frozen_stages``): a WARNING per tensor for what the model asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).endswith("is skipped since its requires_grad=False")


_FROZEN = _DropFrozenParameterNotes()


class _DropMetricPrefixNotes(logging.Filter):
    """mmengine's ``BaseMetric`` logs a WARNING whenever a metric class without a default prefix is built without
    ``prefix`` (mmseg's ``IoUMetric``, as mmseg's own configs build it): its names are then mmseg's own (``mIoU``,
    ``mDice``), which is what the config asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("The prefix is not set in metric class")


_PREFIX = _DropMetricPrefixNotes()


@contextlib.contextmanager
def no_metric_prefix_notes() -> Iterator[None]:
    """Build mm's metric classes inside this without the note above (dropped on mmengine's current logger, where
    ``BaseMetric`` logs it; any other message still prints)."""
    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()
    logger.addFilter(_PREFIX)
    try:
        yield
    finally:
        logger.removeFilter(_PREFIX)


def quiet_mm_console(handler: logging.Handler) -> None:
    """Keep the frozen-parameter notes off the console handler of an ``MMLogger`` (the work dir's mm.log still
    has them); mmengine's loggers live outside ``logging``'s tree, so the tools call this when they make one."""
    handler.addFilter(_FROZEN)


def install() -> None:
    """Add the filters above (idempotent: ``warnings.filterwarnings`` and ``addFilter`` skip duplicates)."""
    for message, category, module, _why in WARNING_FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_TIPS)
