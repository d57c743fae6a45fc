"""Model EMA from the config's ``custom_hooks = [dict(type='EMAHook', ...)]``, with mmengine's ``EMAHook`` semantics,
as a Lightning callback (``build_trainer`` adds it).

The averaging itself is mm's: the averaged model is mmengine's ``ExponentialMovingAverage`` or mmdet's
``ExpMomentumEMA`` (built with the arguments of the hook), so ``momentum`` (averaged = (1 - m) * averaged + m *
source), ``interval``, ``gamma`` and ``update_buffers`` mean exactly what they mean there. This file is the hook's
glue, counted in Lightning's terms:

* one update per optimizer step (with gradient accumulation, once per N batches; mmengine updates after every
  batch), before any checkpoint of that step is written; before ``begin_iter`` optimizer steps (or before epoch
  ``begin_epoch``, 1-based as mm counts it) the average is a copy of the model instead, as in mm;
* validation and test epochs run on the averaged weights (swapped in and back out), training on the raw ones;
* checkpoints are laid out as mmengine's EMAHook writes them: ``state_dict`` holds the averaged weights (what
  ``tools/test.py``, ``tools/infer.py`` and the exports read by default) and ``ema_state_dict`` the raw ones under
  ``module.<mm key>`` plus the update counter ``steps``; resuming swaps them back, so a resumed run continues both
  exactly.

Why not Lightning's ``WeightAveraging`` / ``EMAWeightAveraging``: its average is torch's ``AveragedModel`` (decay
convention, no ``interval`` counted in mm's way, no ExpMomentumEMA warm-up, buffers not copied when not averaged),
it copies the average into the model at the end of training (mm keeps the raw weights in the model), and its
checkpoint layout (``current_model_state`` / ``averaging_state``) is not the one mm's tools read. Overriding all of
that would leave nothing of it.
"""

from __future__ import annotations

import inspect
import itertools

import lightning as L
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_info
from lightning.pytorch.strategies import FSDPStrategy
from mmengine.runner.priority import Priority, get_priority

SUPPORTED_HOOKS = ("EMAHook",)
# mm hooks whose work is done here without them: accepted, with one log line saying where.
DONE_ANYWAY = {
    "NumClassCheckHook": "the detection task checks every head's num_classes against the dataset's classes before "
    "training and each evaluation",
    "SyncNormHook": "the BN statistics are averaged over the DDP ranks before each evaluation (SyncBuffers)",
    "SyncBuffersHook": "the BN statistics are averaged over the DDP ranks before each evaluation (SyncBuffers)",
}
# What to do instead of the other hooks mm configs commonly carry.
ALTERNATIVES = {
    "CheckInvalidLossHook": "nonfinite_loss='raise' (the default) stops at the first NaN / inf loss, naming the step "
    "and the loss terms; remove the hook",
    "PipelineSwitchHook": "one train pipeline per run: train the last epochs as a second run with the switched "
    "pipeline and load_from=<the first run's last.ckpt>",
    "YOLOXModeSwitchHook": "one train pipeline per run: train the last epochs as a second run with the switched "
    "pipeline and load_from=<the first run's last.ckpt>",
    "MeanTeacherHook": "semi-supervised teacher-student training (mmdet's SemiBaseDetector) is not supported here",
    "SetEpochInfoHook": "the model's set_epoch is not called here, so detectors whose training depends on the epoch "
    "are not supported",
}
# The hook's own arguments (mmengine.hooks.EMAHook); the others go to the averaged model.
HOOK_ARGS = ("type", "ema_type", "strict_load", "begin_iter", "begin_epoch", "priority")
PREFIX = "model."  # MMTaskModule keeps the mm model in ``self.model``


def ema_types() -> dict[str, type]:
    """The averaged-model classes an ``EMAHook``'s ``ema_type`` may name."""
    from mmdet.models.layers import ExpMomentumEMA
    from mmengine.model import ExponentialMovingAverage

    return {"ExponentialMovingAverage": ExponentialMovingAverage, "ExpMomentumEMA": ExpMomentumEMA}


def _averaging_args(cls: type) -> set[str]:
    # the averaged model's own arguments; ``model`` is ours, ``device`` Lightning's (the training device)
    return set(inspect.signature(cls.__init__).parameters) - {"self", "model", "device"}


def _check_averaging(averaging: dict) -> None:
    # mm checks these with asserts when the averaged model is built, i.e. only once training starts
    momentum, interval, gamma = (averaging.get(k) for k in ("momentum", "interval", "gamma"))
    if momentum is not None and not (isinstance(momentum, (int, float)) and 0 < momentum < 1):
        raise ValueError(f"custom_hooks EMAHook: momentum must be in (0, 1) (mm's convention), got {momentum!r}")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
        raise ValueError(f"custom_hooks EMAHook: interval must be an integer >= 1, got {interval!r}")
    if gamma is not None and not (isinstance(gamma, (int, float)) and gamma > 0):
        raise ValueError(f"custom_hooks EMAHook: gamma must be > 0, got {gamma!r}")


class ModelEMA(L.Callback):
    """mmengine's ``EMAHook`` as a Lightning callback: an averaged copy of ``pl_module.model`` updated after every
    optimizer step, evaluated in validation and test, saved and resumed in mm's checkpoint layout.

    Args:
        ema_type: ``'ExponentialMovingAverage'`` (mmengine) or ``'ExpMomentumEMA'`` (mmdet: momentum warm-up).
        strict_load: resuming requires the checkpoint's averaged weights to match the model key for key.
        begin_iter: the optimizer step from which the average is updated (before: a copy of the model).
        begin_epoch: the same in epochs (1-based, as mm counts it); not together with ``begin_iter``.
        priority: mm's hook priority; accepted and checked, it orders custom hooks among themselves, and there
            is only one (this callback runs after the tools' callbacks and before the project's own state
            callbacks and Lightning's checkpoints).
        averaging: the averaged model's arguments (``momentum``, ``interval``, ``update_buffers``, ExpMomentumEMA's
            ``gamma``), with mm's defaults when absent.
    """

    def __init__(
        self,
        ema_type: str = "ExponentialMovingAverage",
        strict_load: bool = False,
        begin_iter: int = 0,
        begin_epoch: int = 0,
        priority: int | str = "NORMAL",
        **averaging,
    ) -> None:
        types = ema_types()
        if ema_type not in types:
            raise ValueError(f"custom_hooks EMAHook: ema_type={ema_type!r} is not supported; use one of {list(types)}")
        unknown = sorted(set(averaging) - _averaging_args(types[ema_type]))
        if unknown:
            valid = sorted(_averaging_args(types[ema_type]) | set(HOOK_ARGS))
            raise ValueError(
                f"custom_hooks EMAHook: unknown argument(s) {unknown} for ema_type={ema_type!r}; valid: {valid}"
            )
        for name, value in (("begin_iter", begin_iter), ("begin_epoch", begin_epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"custom_hooks EMAHook: {name} must be an integer >= 0, got {value!r}")
        if begin_iter and begin_epoch:
            raise ValueError("custom_hooks EMAHook: set begin_iter or begin_epoch, not both (mm's rule)")
        _check_averaging(averaging)
        try:
            self.priority = get_priority(priority)
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"custom_hooks EMAHook: priority={priority!r} is not an integer in 0..100 or one of mm's names "
                f"{[p.name for p in Priority]}"
            ) from None
        self.ema_cls = types[ema_type]
        self.averaging = averaging
        self.strict_load = strict_load
        self.begin_iter, self.begin_epoch = begin_iter, begin_epoch
        self.ema: torch.nn.Module | None = None  # the mm averaged model, built when fitting starts
        self._last_step = 0

    # ---- building and counting ------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.ema is not None:
            return
        if isinstance(trainer.strategy, FSDPStrategy):
            raise ValueError("custom_hooks EMAHook needs the whole model on every rank: it cannot run under FSDP")
        # Built on the training device here (the model is not moved yet): mm's averaged model keeps references
        # to its tensors, which a later .to() would replace.
        self.ema = self.ema_cls(pl_module.model, device=trainer.strategy.root_device, **self.averaging)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.begin_epoch and trainer.max_epochs not in (None, -1) and self.begin_epoch > trainer.max_epochs:
            raise ValueError(
                f"custom_hooks EMAHook: begin_epoch={self.begin_epoch} is after the last epoch ({trainer.max_epochs})"
            )
        if self.begin_iter and trainer.max_steps not in (None, -1) and self.begin_iter > trainer.max_steps:
            raise ValueError(
                f"custom_hooks EMAHook: begin_iter={self.begin_iter} is after the last step ({trainer.max_steps})"
            )
        self._last_step = trainer.global_step  # the restored one when resuming

    def _started(self, trainer: L.Trainer) -> bool:
        # mm's _ema_started, with runner.iter + 1 = the optimizer steps taken
        if self.begin_epoch:
            return trainer.current_epoch + 1 >= self.begin_epoch
        return trainer.global_step >= self.begin_iter

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._last_step:
            return  # no optimizer step in this batch (gradient accumulation)
        self._last_step = trainer.global_step
        if self._started(trainer):
            self.ema.update_parameters(pl_module.model)
        else:  # mm: until the start, the average follows the model
            source = pl_module.model.state_dict()
            for key, value in self.ema.module.state_dict().items():
                value.copy_(source[key])

    # ---- evaluation on the averaged weights -----------------------------------------------------------------
    def _swap(self, pl_module: L.LightningModule) -> None:
        """mm's ``_swap_ema_parameters``: parameters (and buffers when they are averaged) trade places."""
        ema, src = self.ema.module, pl_module.model
        if self.ema.update_buffers:
            averaged, source = (
                itertools.chain(ema.parameters(), ema.buffers()),
                itertools.chain(src.parameters(), src.buffers()),
            )
        else:
            averaged, source = ema.parameters(), src.parameters()
        for p_avg, p_src in zip(averaged, source):
            tmp = p_avg.data.clone()
            p_avg.data.copy_(p_src.data)
            p_src.data.copy_(tmp)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.ema is not None:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.ema is not None:
            self._swap(pl_module)

    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end

    # ---- checkpoints in mm's layout -------------------------------------------------------------------------
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """``state_dict`` gets the averaged weights, ``ema_state_dict`` the raw ones (mm's
        ``before_save_checkpoint``: the entries trade places, no tensor is copied)."""
        if self.ema is None:
            return
        model_state, raw = checkpoint["state_dict"], {}
        for key, value in self.ema.state_dict().items():
            if key.startswith("module."):
                name = PREFIX + key[len("module.") :]
                raw[key], model_state[name] = model_state[name], value
            else:
                raw[key] = value  # the update counter 'steps'
        checkpoint["ema_state_dict"] = raw

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Resuming: Lightning has loaded ``state_dict`` (the averaged weights) into the model; the raw ones go back
        into the model and the averaged ones into the average (mm's ``after_load_checkpoint``)."""
        if self.ema is None:
            return
        averaged = {k[len(PREFIX) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(PREFIX)}
        saved = checkpoint.get("ema_state_dict")
        if saved is None:
            rank_zero_info("The checkpoint holds no ema_state_dict: the model EMA starts as a copy of its weights.")
            self.ema.module.load_state_dict(averaged, strict=self.strict_load)
            return
        raw = {k[len("module.") :]: v for k, v in saved.items() if k.startswith("module.")}
        unexpected = pl_module.model.load_state_dict(raw, strict=False).unexpected_keys
        if unexpected:
            raise KeyError(
                f"the checkpoint's ema_state_dict holds weights the model does not have: {unexpected[:5]}; "
                "resume with the config the run was trained with"
            )
        state = {"module." + k: v for k, v in averaged.items()}
        state.update({k: v for k, v in saved.items() if not k.startswith("module.")})
        self.ema.load_state_dict(state, strict=self.strict_load)


def build_custom_hooks(cfg) -> list[L.Callback]:
    """The Lightning callbacks of the config's ``custom_hooks`` (mm's list of hook dicts): ``EMAHook`` only; the
    hooks of ``DONE_ANYWAY`` pass with a log line (their work is done without them).

    Args:
        cfg: the mmengine config; ``custom_hooks`` absent or empty gives no callback.

    Raises ``ValueError`` for any other hook type (listing the supported ones, with ``ALTERNATIVES``' advice), a
    wrong argument (naming it) or more than one EMAHook.
    """
    hooks = cfg.get("custom_hooks") or []
    if not isinstance(hooks, (list, tuple)):
        raise ValueError(f"custom_hooks must be a list of dict(type=...), got {type(hooks).__name__}")
    callbacks = []
    for i, hook in enumerate(hooks):
        if not isinstance(hook, dict) or "type" not in hook:
            raise ValueError(f"custom_hooks[{i}] must be a dict(type=..., ...), got {hook!r}")
        kind = str(hook["type"]).rpartition(".")[2]  # 'mmengine.EMAHook' names the same hook
        if kind in DONE_ANYWAY:
            rank_zero_info(f"custom_hooks[{i}]: {hook['type']}: done without a hook here: {DONE_ANYWAY[kind]}")
            continue
        if kind not in SUPPORTED_HOOKS:
            instead = ALTERNATIVES.get(
                kind,
                "Lightning runs the loop here: remove the hook from custom_hooks, or write it as a Lightning callback",
            )
            raise ValueError(
                f"custom_hooks[{i}]: type={hook['type']!r} is not supported; supported: {list(SUPPORTED_HOOKS)}, "
                f"and {list(DONE_ANYWAY)} (done without a hook). Instead: {instead}"
            )
        callbacks.append(ModelEMA(**{k: v for k, v in hook.items() if k != "type"}))
    if len(callbacks) > 1:
        raise ValueError(f"custom_hooks: {len(callbacks)} EMAHook entries; one model EMA at most")
    return sorted(callbacks, key=lambda c: c.priority)
