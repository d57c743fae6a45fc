"""Build the ``lightning.Trainer`` from the config's ``trainer`` / ``checkpoint_callback`` / ``loggers`` sections.

``trainer = dict(...)`` holds ``lightning.Trainer`` keyword arguments only (unknown keys are rejected,
listing the valid ones). Defaults come from the mm sections when the trainer section is silent:
``train_cfg`` (epochs / iterations, validation interval), ``optim_wrapper.clip_grad`` (gradient
clipping), ``optim_wrapper.accumulative_counts`` (gradient accumulation), ``optim_wrapper.type='AmpOptimWrapper'``
(precision), ``randomness.deterministic``, ``default_hooks.logger.interval`` and ``env_cfg.cudnn_benchmark``
(docs/config_keys.md).
``loggers = [dict(type=...), ...]`` holds Lightning logger classes (experiment trackers: tasks/training/trackers.py).

Gradient accumulation (``optim_wrapper.accumulative_counts = N``, mm's key, or ``trainer.accumulate_grad_batches
= N``): one optimizer step per N batches, on the mean of their gradients (Lightning divides each batch's loss by
N). Every step count of the config counts optimizer steps, so that a run with accumulation follows the same
curves per image seen as one with N times the GPUs: ``max_steps`` / ``train_cfg.max_iters``, the schedules'
iterations (``by_epoch=False``; Lightning steps them per optimizer step), ``checkpoint_every_n_steps`` and an
integer ``val_check_interval`` (multiplied by N here, as Lightning counts it in batches). mmengine instead counts
``max_iters`` and iteration-based schedules in batches.

Top-level reliability keys (besides ``nonfinite_loss``, see tasks/training/nonfinite.py):

* ``checkpoint_every_n_steps = N``: also write ``last.ckpt`` every N optimizer steps (a second
  ModelCheckpoint, independent of ``checkpoint_callback.monitor``), so that a killed job resumes with
  ``--resume`` from at most N steps back, mid-epoch included, and repeats the uninterrupted run exactly.
* ``requeue_signal = 'SIGUSR1'``: the cluster's warning signal before it stops the job (SLURM's
  ``--signal=USR1@120``); on it, or on SIGTERM, training stops at the next optimizer step with a checkpoint
  and the SLURM job is requeued (tasks/training/restart.py).
* ``trainer.strategy = dict(type='ddp', timeout=SECONDS)``: the process-group timeout (a number of seconds
  is turned into a ``timedelta``): how long a rank waits in a collective for a peer that died.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from collections.abc import Iterable, Iterator

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar
from lightning.pytorch.strategies import FSDPStrategy
from mmengine.config import Config

from ..config.keys import ConfigError
from ..data.skipping import data_error_callbacks
from .callbacks import FiniteWeightsGuard, RNGStates, SyncBuffers
from .checkpoint_io import AtomicCheckpointIO
from .disk_space import DiskSpaceCheck
from .ema import build_custom_hooks
from .progress import is_iteration_based, step_progress_bar
from .restart import ElasticDDPStrategy, Preemption
from .step_limit import StepLimitResume
from .step_time import StepTime
from .summary import ParamsSummary
from .trackers import RunReport, build_loggers
from .work_dir_checkpoint import WorkDirCheckpoint

TRAINER_KEYS = frozenset(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
CHECKPOINT_KEYS = frozenset(inspect.signature(ModelCheckpoint.__init__).parameters) - {"self"}
# Set here from the work dir / CLI; objects cannot come from a config file anyway.
_MANAGED = frozenset({"callbacks", "plugins", "default_root_dir"})


def _check_keys(section: str, given, valid) -> None:
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}. Valid keys: {', '.join(sorted(valid))}")


def _strategy(spec):
    """'ddp' / dict(type='ddp', ...) -> DDPStrategy whose buffers are not broadcast before each forward
    (``forward_sync_buffers=False``, torch's name for mmengine's default ``broadcast_buffers=False``, deprecated in
    torch 2.13): BN statistics stay per rank unless sync_batchnorm, as in MMDistributedDataParallel, and
    evaluation runs no collective per batch. Unlike ``broadcast_buffers=False`` the buffers are synced once when
    DDP wraps the model; every rank holds the same ones then (the same initialisation or checkpoint).
    dict(type='fsdp', ...) -> FSDPStrategy(...). Other strings go to Lightning unchanged."""
    kwargs = {}
    if isinstance(spec, dict):
        kwargs = dict(spec)
        spec = kwargs.pop("type")
        if isinstance(kwargs.get("timeout"), (int, float)):
            kwargs["timeout"] = datetime.timedelta(seconds=kwargs["timeout"])
    if spec in ("ddp", "ddp_find_unused_parameters_true"):
        kwargs.setdefault("find_unused_parameters", spec.endswith("_true"))
        if "broadcast_buffers" not in kwargs:  # a config that still names the old key gets torch's own notice
            kwargs.setdefault("forward_sync_buffers", False)
        return ElasticDDPStrategy(**kwargs)  # a DDPStrategy that also rejoins after a torchrun restart
    if spec == "fsdp" and kwargs:
        return FSDPStrategy(**kwargs)
    if kwargs:
        raise ValueError(f"trainer.strategy dict form supports type='ddp' or 'fsdp', got {spec!r}")
    return spec


def _accumulation(kwargs: dict, optim_cfg: dict) -> int:
    """Batches per optimizer step: ``trainer.accumulate_grad_batches`` or mm's ``optim_wrapper.accumulative_counts``
    (either; both only when equal)."""
    given = {
        key: value
        for key, value in (
            ("trainer.accumulate_grad_batches", kwargs.get("accumulate_grad_batches")),
            ("optim_wrapper.accumulative_counts", optim_cfg.get("accumulative_counts")),
        )
        if value is not None
    }
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer (batches per optimizer step), got {value!r}")
    if len(set(given.values())) > 1:
        raise ValueError(
            f"gradient accumulation given twice with different values: {given}; set one of them "
            "(e.g. --cfg-options optim_wrapper.accumulative_counts=N) or both to the same N"
        )
    return next(iter(given.values()), 1)


def _mm_defaults(cfg: Config, kwargs: dict, optim_cfg: dict) -> None:
    """Trainer arguments that mm sections imply when the trainer section is silent (docs/config_keys.md):
    ``randomness.deterministic`` -> ``deterministic``, ``default_hooks.logger.interval`` -> ``log_every_n_steps``,
    ``env_cfg.cudnn_benchmark`` -> ``benchmark`` (not with ``deterministic``, as in mmengine's Runner),
    ``optim_wrapper.type='AmpOptimWrapper'`` -> ``precision`` (``bf16-mixed`` for ``dtype='bfloat16'`` or on the
    CPU, else ``16-mixed``, whose loss scaling is dynamic like mm's default)."""
    deterministic = (cfg.get("randomness") or {}).get("deterministic")
    if deterministic is not None:
        kwargs.setdefault("deterministic", bool(deterministic))
    interval = ((cfg.get("default_hooks") or {}).get("logger") or {}).get("interval")
    if interval is not None:
        kwargs.setdefault("log_every_n_steps", interval)
    benchmark = (cfg.get("env_cfg") or {}).get("cudnn_benchmark")
    if benchmark is not None and not kwargs.get("deterministic"):  # deterministic wins, as in mmengine's Runner
        kwargs.setdefault("benchmark", bool(benchmark))
    if optim_cfg.get("type") == "AmpOptimWrapper":
        # fp16 AMP does not run on the CPU: Lightning would swap in bf16 itself, with a warning at every run
        bf16 = str(optim_cfg.get("dtype")) in ("bfloat16", "torch.bfloat16")
        bf16 = bf16 or not _uses_gpu(kwargs.get("accelerator", "auto"))
        kwargs.setdefault("precision", "bf16-mixed" if bf16 else "16-mixed")


def _uses_gpu(accelerator) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def trainer_kwargs(cfg: Config) -> dict:
    """Resolved ``lightning.Trainer`` kwargs from the config (no callbacks / loggers / plugins)."""
    kwargs = dict(cfg.get("trainer") or {})
    _check_keys("trainer", kwargs, TRAINER_KEYS)
    managed = sorted(_MANAGED & set(kwargs))
    if managed:
        raise ValueError(f"trainer: {managed} are set by the tools (use --work-dir / checkpoint_callback)")

    train_cfg = cfg.get("train_cfg") or {}
    if "max_epochs" not in kwargs and "max_steps" not in kwargs:
        if "max_iters" in train_cfg:  # mm IterBasedTrainLoop
            kwargs.update(max_steps=train_cfg["max_iters"], max_epochs=-1)
            if train_cfg.get("val_interval"):
                kwargs.setdefault("val_check_interval", train_cfg["val_interval"])
                kwargs.setdefault("check_val_every_n_epoch", None)  # count the interval in global steps
        elif "max_epochs" in train_cfg:  # mm EpochBasedTrainLoop
            kwargs["max_epochs"] = train_cfg["max_epochs"]
            kwargs.setdefault("check_val_every_n_epoch", train_cfg.get("val_interval", 1))

    optim_cfg = cfg.get("optim_wrapper") or {}
    _mm_defaults(cfg, kwargs, optim_cfg)
    clip = dict(optim_cfg.get("clip_grad") or {})
    if clip and "gradient_clip_val" not in kwargs:
        algorithm = clip.pop("type", "norm")
        if algorithm == "norm":
            if clip.get("norm_type", 2) != 2:
                raise ValueError("optim_wrapper.clip_grad.norm_type must be 2 (Lightning clips the 2-norm)")
            kwargs.update(gradient_clip_val=clip["max_norm"], gradient_clip_algorithm="norm")
        else:
            kwargs.update(gradient_clip_val=clip["clip_value"], gradient_clip_algorithm="value")
    accumulation = _accumulation(kwargs, optim_cfg)
    if accumulation > 1:
        kwargs["accumulate_grad_batches"] = accumulation
        if isinstance(kwargs.get("val_check_interval"), int):  # counted in optimizer steps, like max_steps
            kwargs["val_check_interval"] *= accumulation

    if "strategy" in kwargs:
        kwargs["strategy"] = _strategy(kwargs["strategy"])
    if kwargs.get("use_distributed_sampler"):
        raise ValueError(
            "trainer.use_distributed_sampler=True: the data module shards every split itself "
            "(tasks/data/module.py); Lightning would replace the train batch sampler and its resumable order"
        )
    kwargs["use_distributed_sampler"] = False
    # mm configs ask for synchronised BN with norm_cfg type 'SyncBN', ours with sync_batchnorm=True: honoured where
    # it can run. torch's SyncBatchNorm has GPU kernels only (DDP refuses it on CPU): there BN stays per process.
    asked = kwargs.get("sync_batchnorm", "SyncBN" in str(cfg.model))
    kwargs["sync_batchnorm"] = bool(asked) and _uses_gpu(kwargs.get("accelerator", "auto"))
    return kwargs


def checkpoint_callback(cfg: Config, work_dir: str) -> ModelCheckpoint:
    """The ``ModelCheckpoint`` of the config's ``checkpoint_callback`` section, writing into ``work_dir``:
    always ``last.ckpt`` (what ``--resume`` reads), and the best ones by ``monitor`` when it is set."""
    kwargs = dict(cfg.get("checkpoint_callback") or {})
    _check_keys("checkpoint_callback", kwargs, CHECKPOINT_KEYS)
    kwargs.setdefault("dirpath", work_dir)
    kwargs.setdefault("save_last", True)
    kwargs.setdefault("enable_version_counter", False)  # last.ckpt is always the file --resume reads
    if kwargs.get("monitor"):
        kwargs.setdefault("mode", "max")
        kwargs.setdefault("filename", "best_" + kwargs["monitor"].replace("/", "_") + "_{epoch}_{step}")
        kwargs.setdefault("auto_insert_metric_name", False)
    else:
        kwargs.setdefault("save_top_k", 0)  # nothing to rank by: only last.ckpt
    return WorkDirCheckpoint(**kwargs)


def build_trainer(
    cfg: Config, work_dir: str, callbacks: Iterable[L.Callback] = (), for_test: bool = False, **overrides
) -> L.Trainer:
    """Trainer with the config's loggers (tasks/training/trackers.py: CSV + TensorBoard by default) and atomic
    checkpoints in ``work_dir``.

    Args:
        cfg: the mmengine config (``trainer``, ``checkpoint_callback``, ``checkpoint_every_n_steps``...).
        work_dir: where checkpoints and logs go.
        callbacks: extra Lightning callbacks, run before the ones added here.
        for_test: a trainer for ``trainer.test`` only: no loggers (unless ``logger`` is overridden), no
            checkpoints, no training-state callbacks.
        overrides: ``lightning.Trainer`` keyword arguments that win over the config's.

    Besides the checkpoint callbacks (and ``DiskSpaceCheck``) it adds the state that does not belong to the task
    module (tasks/training/callbacks.py): ``SyncBuffers`` always; ``RNGStates`` and ``FiniteWeightsGuard`` for
    training; and for training the config's ``custom_hooks`` (model EMA, tasks/training/ema.py; a test reads the
    averaged weights from the checkpoint's ``state_dict`` without it). ``StepTime`` logs each iteration's seconds.
    """
    kwargs = trainer_kwargs(cfg)
    kwargs.update(overrides)
    custom_hooks = build_custom_hooks(cfg)  # checked for tests too
    callbacks = [*callbacks, *([] if for_test else custom_hooks), SyncBuffers()]
    if for_test:
        kwargs.setdefault("logger", False)
        kwargs["enable_checkpointing"] = False
    else:
        callbacks += [
            RNGStates(),
            FiniteWeightsGuard(),
            Preemption(os.path.join(work_dir, "last.ckpt"), cfg.get("requeue_signal") or "SIGUSR1"),
            StepLimitResume(),
            *data_error_callbacks(cfg, work_dir),  # data_errors='skip': the left-out samples, counted
        ]
        if kwargs.get("enable_checkpointing", True):
            callbacks += [checkpoint_callback(cfg, work_dir), DiskSpaceCheck(work_dir)]
            every = cfg.get("checkpoint_every_n_steps")
            if every:
                last_only = dict(save_last=True, save_top_k=0, enable_version_counter=False)
                callbacks.append(WorkDirCheckpoint(dirpath=work_dir, every_n_train_steps=int(every), **last_only))
        if kwargs.get("enable_model_summary", True) and not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(ParamsSummary())
            kwargs["enable_model_summary"] = False  # Lightning adds none of its own then (and says nothing of it)
        if kwargs.get("logger", True) is True:
            kwargs["logger"] = build_loggers(cfg, work_dir)
            callbacks += [RunReport(cfg, trainer_kwargs(cfg)), StepTime()]
        if (
            is_iteration_based(kwargs)
            and kwargs.get("enable_progress_bar", True)
            and not any(isinstance(c, ProgressBar) for c in callbacks)
        ):
            callbacks.append(step_progress_bar())  # counts iterations, not epochs of an endless loop
    plugins = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect() and not TorchElasticEnvironment.detect():
        # Lightning's SLURM ranks and nodes, without its own requeue handler (tasks/training/restart.py says why).
        plugins.append(SLURMEnvironment(auto_requeue=False))
    os.makedirs(work_dir, exist_ok=True)
    try:
        return L.Trainer(default_root_dir=work_dir, callbacks=callbacks, plugins=plugins, **kwargs)
    except (MisconfigurationException, TypeError, ValueError) as e:  # Lightning's checks of its arguments
        raise ConfigError(
            f"the trainer section: {e} (the Lightning Trainer got "
            f"{', '.join(f'{k}={v!r}' for k, v in sorted(kwargs.items()) if k != 'logger')}); fix the trainer.* key"
        ) from e


def _process_group_exists() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def releasing_process_group() -> Iterator[None]:
    """Destroys, on the way out, the process group that the run inside created (Lightning's DDP strategy creates
    one, even for one device, and leaves it to an ``atexit`` handler). A tool's ``main`` called in a process that
    lives on (a notebook, a test session) must not leave it behind: the next model run there would find a
    "distributed" job of one rank, and its SyncBatchNorm layers would then refuse CPU inputs."""
    existed = _process_group_exists()
    try:
        yield
    finally:
        if not existed and _process_group_exists():
            dist.destroy_process_group()
