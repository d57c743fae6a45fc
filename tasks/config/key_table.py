"""The key table: what this project does with each key of an mmdet / mmseg config (data only; the check and the
rendering are tasks/config/keys.py's).

One ``Key`` per key: its section (``""`` for the top level), its status and what it maps to or why. ``quiet``
holds the values that pass without a word for an *ignored* or *refused* key: mm's own defaults and the values
the mmdet 3.3 / mmseg 1.2 base configs give it, so that inheriting a base config is silent (``ANY``: every
value; a callable: a test of the value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .variables import BASE_VARIABLES, FAMILY_VARIABLES, OUR_VARIABLES

HONOURED = "honoured"
REFUSED = "refused"
IGNORED = "ignored on purpose"
VARIABLE = "config variable"
ANY = "any value"


@dataclass(frozen=True)
class Key:
    """One config key.

    Attributes:
        name: the key (``'*'``: every other argument of the entry's class).
        section: ``''`` (top level), ``'train_cfg'``, ``'default_hooks'``, ``'env_cfg'``, ``'randomness'``,
            ``'auto_scale_lr'``, ``'optim_wrapper'``, ``'param_scheduler'`` (each entry's keys) or ``'*'`` (every
            section).
        status: ``HONOURED``, ``REFUSED``, ``IGNORED`` or ``VARIABLE``.
        note: what it maps to (honoured), the alternative (refused), why (ignored), what reads it (variable).
        quiet: for refused / ignored keys, the values that pass silently (a tuple of values, ``ANY`` or a
            callable taking the value).
    """

    name: str
    section: str
    status: str
    note: str
    quiet: tuple | str | Callable[[Any], bool] = ()


def _only(*fields: str) -> Callable[[Any], bool]:
    """A hook entry that sets nothing but ``fields`` (what mm's bases set; ``type`` / ``_scope_`` always), or None
    (the hook switched off)."""
    return lambda value: value is None or (isinstance(value, dict) and set(value) <= {"type", "_scope_", *fields})


KEYS: tuple[Key, ...] = (
    # ---- top level: mm's keys ------------------------------------------------------------------------------
    Key("model", "", HONOURED, "the detector / segmentor, built by mmdet's / mmseg's `MODELS`"),
    Key("default_scope", "", HONOURED, "`mmdet` or `mmseg`: picks the task and the registries"),
    Key("custom_imports", "", HONOURED, "imported by mmengine's `Config` when the file is read"),
    Key("train_dataloader", "", HONOURED, "the train loader of `MMDataModule` (dataset, sampler, batch sampler)"),
    Key("val_dataloader", "", HONOURED, "the validation loader of `MMDataModule`"),
    Key("test_dataloader", "", HONOURED, "the loader of `tools/test.py`"),
    Key(
        "train_cfg",
        "",
        HONOURED,
        "the schedule length and validation interval (keys below), unless the trainer section sets `max_epochs` / "
        "`max_steps`: then one log line names each `train_cfg` value that differs from the trainer's",
    ),
    Key(
        "val_cfg",
        "",
        IGNORED,
        "Lightning runs validation; mm's `ValLoop` has nothing else to set",
        ({"type": "ValLoop"},),
    ),
    Key(
        "test_cfg",
        "",
        IGNORED,
        "Lightning runs `tools/test.py`; mm's `TestLoop` has nothing else to set",
        ({"type": "TestLoop"},),
    ),
    Key(
        "val_evaluator",
        "",
        HONOURED,
        "the named mm metric is computed on validation (None: the project's torchmetrics evaluator)",
    ),
    Key("test_evaluator", "", HONOURED, "the same for `tools/test.py`"),
    Key("optim_wrapper", "", HONOURED, "the optimizer, built by mmengine's `build_optim_wrapper` (keys below)"),
    Key("param_scheduler", "", HONOURED, "mmengine's schedulers, stepped by Lightning (keys below)"),
    Key("auto_scale_lr", "", HONOURED, "`tools/train.py --auto-scale-lr` or `enable=True`: the linear lr rule"),
    Key("default_hooks", "", HONOURED, "per hook, below"),
    Key(
        "custom_hooks",
        "",
        HONOURED,
        "an `EMAHook` keeps the averaged weights; `NumClassCheckHook`, `SyncNormHook`, `SyncBuffersHook` pass (their "
        "checks run anyway); other hook types are refused with what to do instead",
    ),
    Key("env_cfg", "", HONOURED, "per key, below"),
    Key("load_from", "", HONOURED, "whole-model weights loaded before the first step; `--resume` wins"),
    Key(
        "resume",
        "",
        REFUSED,
        "`True` is refused: a config is not a job, and a work dir's resolved config would "
        "resume every later run from it. `tools/train.py --resume auto` is mm's `resume=True` (latest "
        "checkpoint of the work dir, or a fresh start); `--resume CKPT` resumes from a file",
        (False, None),
    ),
    Key("work_dir", "", HONOURED, "the work dir when `--work-dir` is not given"),
    Key("randomness", "", HONOURED, "per key, below"),
    Key("tta_model", "", HONOURED, "`tools/test.py --tta` wraps the model in it"),
    Key("visualizer", "", HONOURED, "`tools/infer.py` draws with it (mm's inferencers)"),
    Key("log_level", "", IGNORED, "mm's INFO reports go to `WORK_DIR/mm.log`, warnings to the console", ("INFO",)),
    Key(
        "log_processor",
        "",
        IGNORED,
        "Lightning's loggers smooth and write the logs (`loggers`)",
        (
            {"type": "LogProcessor", "window_size": 50, "by_epoch": True},
            {"by_epoch": False},
            {"type": "LogProcessor", "window_size": 50, "by_epoch": False},  # mmdet's iteration-based Mask2Former
        ),
    ),
    Key(
        "compile",
        "",
        HONOURED,
        "`True` or `torch.compile` arguments: the backbone and neck are compiled "
        "for training (docs/measuring.md#torchcompile)",
    ),
    Key(
        "launcher",
        "",
        REFUSED,
        "Lightning launches: `trainer.strategy`, `trainer.devices`, torchrun / srun",
        ("none", None),
    ),
    Key("model_wrapper_cfg", "", REFUSED, "the DDP / FSDP options are `trainer.strategy=dict(type='ddp', ...)`"),
    Key(
        "find_unused_parameters",
        "",
        REFUSED,
        "`True`: set `trainer.strategy='ddp_find_unused_parameters_true'`",
        (False, None),
    ),
    Key("experiment_name", "", IGNORED, "runs are named by their work dir (`--work-dir`)"),
    Key(
        "cudnn_benchmark",
        "",
        IGNORED,
        "mmdet 2's name, read by nothing in mmengine either (`env_cfg.cudnn_benchmark` is the key)",
        ANY,
    ),
    # ---- top level: this project's keys ---------------------------------------------------------------------
    Key("trainer", "", HONOURED, "`lightning.Trainer` arguments (unknown ones are refused)"),
    Key("checkpoint_callback", "", HONOURED, "`ModelCheckpoint` arguments (unknown ones are refused)"),
    Key("checkpoint_every_n_steps", "", HONOURED, "`last.ckpt` every N optimizer steps"),
    Key("requeue_signal", "", HONOURED, "the signal that stops training with a checkpoint and requeues"),
    Key("nonfinite_loss", "", HONOURED, "`'raise'` or `'skip'` a step whose loss is NaN / inf"),
    Key("data_errors", "", HONOURED, "`'raise'` or `'skip'` a training sample that fails to load"),
    Key("data_errors_max", "", HONOURED, "with `data_errors='skip'`: the fraction of training samples that may fail"),
    Key("loggers", "", HONOURED, "Lightning logger classes (experiment trackers)"),
    *(Key(name, "", VARIABLE, "a variable of mm's base configs, read by the config itself") for name in BASE_VARIABLES),
    *(
        Key(name, "", VARIABLE, "a variable of this project's configs, read by the config itself")
        for name in OUR_VARIABLES
    ),
    Key(
        FAMILY_VARIABLES,
        "",
        VARIABLE,
        "a variable of a backbone family's configs, read by the config itself: any name that starts with a "
        "registered family's name and `_` (`stvit_s_backbone`, `hatnet_backbone_keys`; `newnet_s_backbone` once "
        "`newnet` is registered)",
    ),
    # ---- every section ------------------------------------------------------------------------------------
    Key("_scope_", "*", HONOURED, "mmengine's scope of a section inherited through `mmdet::` / `mmseg::`"),
    # ---- train_cfg ----------------------------------------------------------------------------------------
    Key(
        "type",
        "train_cfg",
        HONOURED,
        "`EpochBasedTrainLoop` (`max_epochs`) or `IterBasedTrainLoop` (`max_steps`); other loops are refused",
    ),
    Key("max_epochs", "train_cfg", HONOURED, "`trainer.max_epochs` unless the trainer section sets a length"),
    Key("max_iters", "train_cfg", HONOURED, "`trainer.max_steps` (optimizer steps) and `max_epochs=-1`"),
    Key(
        "val_interval", "train_cfg", HONOURED, "`check_val_every_n_epoch` (epochs) or `val_check_interval` (iterations)"
    ),
    Key("val_begin", "train_cfg", IGNORED, "Lightning validates from the first interval on", (1,)),
    Key(
        "dynamic_intervals",
        "train_cfg",
        REFUSED,
        "set `trainer.val_check_interval` / `check_val_every_n_epoch` (one interval per run)",
        (None,),
    ),
    # ---- default_hooks ------------------------------------------------------------------------------------
    Key("timer", "default_hooks", IGNORED, "Lightning's progress bar times the steps", _only()),
    Key(
        "logger",
        "default_hooks",
        HONOURED,
        "`interval` is `trainer.log_every_n_steps` unless the trainer "
        "section sets it (then one log line when they differ and it is not mm's 50); other `LoggerHook` options are "
        "the loggers' (`loggers`)",
    ),
    Key("param_scheduler", "default_hooks", HONOURED, "Lightning steps the schedulers (per step or epoch)"),
    Key(
        "checkpoint",
        "default_hooks",
        IGNORED,
        "`checkpoint_callback` (best / last at each validation) and "
        "`checkpoint_every_n_steps` save instead; other `CheckpointHook` options (`max_keep_ckpts`, "
        "`save_best`...) are `checkpoint_callback`'s (`save_top_k`, `monitor`...)",
        _only("interval", "by_epoch"),
    ),
    Key("sampler_seed", "default_hooks", HONOURED, "the train sampler's order is a function of (seed, epoch)"),
    Key("visualization", "default_hooks", IGNORED, "`tools/test.py --show-dir` draws the predictions", _only()),
    # ---- env_cfg ------------------------------------------------------------------------------------------
    Key("cudnn_benchmark", "env_cfg", HONOURED, "`trainer.benchmark` unless the trainer section sets it"),
    Key(
        "mp_cfg",
        "env_cfg",
        IGNORED,
        "loader workers start as torch's DataLoader starts them",
        ({"mp_start_method": "fork", "opencv_num_threads": 0},),
    ),
    Key(
        "dist_cfg",
        "env_cfg",
        REFUSED,
        "the backend and timeout are `trainer.strategy=dict(type='ddp', process_group_backend=..., timeout=SECONDS)`",
        ({"backend": "nccl"},),
    ),
    # ---- randomness ---------------------------------------------------------------------------------------
    Key(
        "seed",
        "randomness",
        HONOURED,
        "the data order and augmentation seed and `seed_everything` (absent or None: 0, not mm's random seed)",
    ),
    Key(
        "deterministic",
        "randomness",
        HONOURED,
        "`trainer.deterministic` unless the trainer section sets it (and, as in mm, no `env_cfg.cudnn_benchmark`)",
    ),
    Key(
        "diff_rank_seed",
        "randomness",
        IGNORED,
        "every sample's augmentation is seeded by (seed, epoch, index) and each rank loads its own samples, so "
        "the ranks already draw differently; the model starts from the same weights on every rank",
        (False,),
    ),
    # ---- auto_scale_lr ------------------------------------------------------------------------------------
    Key("enable", "auto_scale_lr", HONOURED, "scale the lr (also `tools/train.py --auto-scale-lr`)"),
    Key("base_batch_size", "auto_scale_lr", HONOURED, "the total batch size the config's lr was set for"),
    # ---- optim_wrapper ------------------------------------------------------------------------------------
    Key(
        "type",
        "optim_wrapper",
        HONOURED,
        "`OptimWrapper`; `AmpOptimWrapper` sets `trainer.precision` "
        "(`16-mixed`, `bf16-mixed` with `dtype='bfloat16'` or on the CPU) unless the trainer section sets it",
    ),
    Key("optimizer", "optim_wrapper", HONOURED, "the `torch.optim` optimizer, built by mmengine"),
    Key("paramwise_cfg", "optim_wrapper", HONOURED, "per-parameter options, applied by mmengine's constructor"),
    Key("constructor", "optim_wrapper", HONOURED, "the optimizer-wrapper constructor mmengine builds with"),
    Key("clip_grad", "optim_wrapper", HONOURED, "`trainer.gradient_clip_val` / `gradient_clip_algorithm`"),
    Key("accumulative_counts", "optim_wrapper", HONOURED, "`trainer.accumulate_grad_batches`"),
    Key("dtype", "optim_wrapper", HONOURED, "`AmpOptimWrapper`: `bfloat16` or the CPU: `bf16-mixed`, else `16-mixed`"),
    Key(
        "loss_scale", "optim_wrapper", IGNORED, "Lightning's `16-mixed` scales the loss dynamically", ("dynamic", None)
    ),
    Key("use_fsdp", "optim_wrapper", IGNORED, "FSDP is `trainer.strategy='fsdp'`, which handles the scaler", (False,)),
    # ---- param_scheduler (each entry) ---------------------------------------------------------------------
    Key("type", "param_scheduler", HONOURED, "the mmengine / mmdet / mmseg scheduler class"),
    Key("begin", "param_scheduler", HONOURED, "first epoch / optimizer step"),
    Key("end", "param_scheduler", HONOURED, "last epoch / optimizer step (default: the run's length)"),
    Key("by_epoch", "param_scheduler", HONOURED, "per epoch (pass over the train loader) or optimizer step"),
    Key("convert_to_iter_based", "param_scheduler", HONOURED, "epochs converted to optimizer steps"),
    Key(
        "*",
        "param_scheduler",
        HONOURED,
        "the scheduler's own arguments (`eta_min`, `power`, `milestones`, "
        "`gamma`, `start_factor`...), as its class takes them",
    ),
)
