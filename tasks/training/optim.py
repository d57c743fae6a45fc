"""Optimizer and LR schedules from the mm config, handed to Lightning.

The optimizer (with ``paramwise_cfg``: no decay on norms / biases / custom keys) is built by mmengine's
``build_optim_wrapper``; Lightning gets the wrapped ``torch.optim.Optimizer`` and does the stepping,
AMP and clipping itself. ``param_scheduler`` entries are built by mmengine's ``PARAM_SCHEDULERS`` and
stepped by Lightning through ``LightningModule.lr_scheduler_step``: per optimizer step when
``by_epoch=False`` (mmengine's ParamSchedulerHook.after_train_iter), per epoch otherwise.

``auto_scale_lr = dict(base_batch_size=N, enable=...)`` (mmdet's bases define it, e.g. 16 for COCO; enabled
by ``tools/train.py --auto-scale-lr``): mmengine's linear scaling rule, every parameter group's lr times
(devices x nodes x ``train_dataloader.batch_size`` x gradient accumulation) / N, applied before the schedules
record their ``initial_lr``. Unlike mmdet's ``Runner.scale_lr``, which ignores ``accumulative_counts``, the total
batch counts accumulation: one optimizer step averages the gradients of that many images, so 4 GPUs x 2 images
x 2 accumulation take the lr of the paper's 8 x 2 (see docs/training.md).
"""

from __future__ import annotations

import copy
import math
from typing import Callable

from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS
from torch import nn
from torch.optim import Optimizer

from ..runtime.rank_zero import rank_zero_info

# OptimWrapper keys that Lightning handles (see tasks/training/trainer.py), dropped before mmengine builds it.
_LIGHTNING_OWNED = ("clip_grad", "accumulative_counts", "loss_scale", "dtype", "use_fsdp")


def build_optimizer(model: nn.Module, optim_wrapper_cfg: dict) -> Optimizer:
    """The ``torch.optim.Optimizer`` that mmengine builds from ``optim_wrapper`` (``paramwise_cfg`` and
    ``constructor`` included); the wrapper keys Lightning handles (clipping, accumulation, AMP) are dropped (see
    tasks/training/trainer.py)."""
    cfg = copy.deepcopy(dict(optim_wrapper_cfg))
    # AmpOptimWrapper asserts CUDA at construction; mixed precision is Lightning's (tasks/training/trainer.py turns
    # the type into trainer.precision).
    cfg["type"] = "OptimWrapper"
    for key in _LIGHTNING_OWNED:
        cfg.pop(key, None)
    return build_optim_wrapper(model, cfg).optimizer


def enable_auto_scale_lr(cfg: Config, config_path: str) -> None:
    """``--auto-scale-lr``: turn the config's ``auto_scale_lr`` on; a config without a base batch size is an
    error that says what to add."""
    auto = cfg.get("auto_scale_lr") or {}
    base = auto.get("base_batch_size")
    if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
        raise ValueError(
            f"--auto-scale-lr: {config_path} has no auto_scale_lr.base_batch_size (got auto_scale_lr={auto or None}). "
            "It is the total batch size (GPUs x images per GPU x accumulation) the config's lr was set for, e.g. "
            "16 for mmdet's COCO schedules: add auto_scale_lr = dict(base_batch_size=16) to the config or pass "
            "--cfg-options auto_scale_lr.base_batch_size=16."
        )
    cfg.merge_from_dict({"auto_scale_lr.enable": True})


def scale_lr(
    optimizer: Optimizer,
    auto_scale_lr_cfg: dict | None,
    *,
    num_devices: int,
    num_nodes: int,
    batch_size: int,
    accumulation: int = 1,
) -> None:
    """mmengine's ``Runner.scale_lr``: when ``auto_scale_lr.enable``, multiply every parameter group's lr
    (and ``initial_lr``, which the schedules start from and checkpoints record) by the ratio of the real
    total batch size (devices x nodes x batch_size x accumulation: the images of one optimizer step) to
    ``auto_scale_lr.base_batch_size``. Logs one line with the values."""
    if not auto_scale_lr_cfg or not auto_scale_lr_cfg.get("enable", False):
        return
    base = auto_scale_lr_cfg["base_batch_size"]
    total = num_devices * num_nodes * batch_size * accumulation
    old = optimizer.param_groups[0]["lr"]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * total / base
        group["initial_lr"] = group["lr"]
    rank_zero_info(
        f"auto_scale_lr: total batch {total} = devices {num_devices} x nodes {num_nodes} x batch_size "
        f"{batch_size} x accumulation {accumulation}; lr {old:.6g} -> {optimizer.param_groups[0]['lr']:.6g} "
        f"= {old:.6g} x {total} / base_batch_size {base}"
    )


def build_schedulers(
    optimizer: Optimizer,
    scheduler_cfgs: dict | list[dict] | None,
    *,
    max_epochs: int | None,
    max_steps: int,
    epoch_length: Callable[[], int],
) -> list[dict]:
    """Return Lightning ``lr_scheduler`` config dicts, one per mm scheduler, in config order.

    An epoch scheduler in a run limited by ``max_steps`` steps after each pass over the train loader, with one log
    line (mmengine's IterBasedTrainLoop never steps it). ``end`` defaults to the run length as in mmengine's Runner
    (for an iteration scheduler of an epoch-based run, ``max_epochs`` x ``epoch_length()``);
    ``convert_to_iter_based=True`` needs the number of optimizer steps per epoch too, computed only when needed.
    """
    if scheduler_cfgs is None:
        return []
    if isinstance(scheduler_cfgs, dict):
        scheduler_cfgs = [scheduler_cfgs]
    configs = []
    iteration_based = max_steps > 0 and (max_epochs is None or max_epochs < 0)  # Lightning's -1: no epoch limit
    for i, cfg in enumerate(scheduler_cfgs):
        cfg = copy.deepcopy(dict(cfg))
        by_epoch = cfg.get("by_epoch", True)
        if by_epoch and iteration_based and not cfg.get("convert_to_iter_based", False):
            rank_zero_info(
                f"param_scheduler[{i}] ({cfg.get('type')}): by_epoch=True in a run of max_steps={max_steps}: it "
                "steps after each pass over the train loader (mmengine's IterBasedTrainLoop would never step it); "
                "for a schedule in iterations set by_epoch=False, or convert_to_iter_based=True"
            )
        if "end" not in cfg:
            if by_epoch and max_epochs is not None and max_epochs > 0:
                cfg["end"] = max_epochs
            elif not by_epoch and max_steps > 0:
                cfg["end"] = max_steps
            elif not by_epoch and max_epochs is not None and max_epochs > 0:
                # an epoch-based run: mm's max_iters is max_epochs x the iterations of an epoch
                cfg["end"] = max_epochs * epoch_length()
        default_args = dict(optimizer=optimizer)
        if cfg.get("convert_to_iter_based", False):
            default_args["epoch_length"] = epoch_length()
        scheduler = PARAM_SCHEDULERS.build(cfg, default_args=default_args)
        configs.append(
            dict(
                scheduler=scheduler,
                interval="epoch" if scheduler.by_epoch else "step",
                frequency=1,
                name=f"{type(scheduler).__name__}-{len(configs)}",
            )
        )
    return configs


def configure_optimizers(model: nn.Module, cfg: Config, trainer) -> tuple[list[Optimizer], list[dict]]:
    """``LightningModule.configure_optimizers`` for an mm config: the optimizer of ``optim_wrapper``, its lr scaled
    by ``auto_scale_lr`` for the trainer's devices, nodes and accumulation, and the ``param_scheduler`` entries
    over the trainer's length (an epoch: the train loader's optimizer steps)."""

    def steps_per_epoch() -> int:
        trainer.estimated_stepping_batches  # noqa: B018  (sets up the train loader: num_training_batches)
        return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))

    optimizer = build_optimizer(model, cfg.optim_wrapper)
    scale_lr(
        optimizer,
        cfg.get("auto_scale_lr"),
        num_devices=trainer.num_devices,
        num_nodes=trainer.num_nodes,
        batch_size=cfg.train_dataloader.batch_size,
        accumulation=trainer.accumulate_grad_batches,
    )
    schedulers = build_schedulers(
        optimizer,
        cfg.get("param_scheduler"),
        max_epochs=trainer.max_epochs,
        max_steps=trainer.max_steps,
        epoch_length=steps_per_epoch,
    )
    return [optimizer], schedulers
