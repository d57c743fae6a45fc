"""What a training step with a NaN / inf loss does: the config's top-level ``nonfinite_loss`` key.

``'raise'`` (default) stops training with a ``FloatingPointError`` naming the step and the non-finite loss
terms; the checkpoints on disk are from before that step. The check costs no device sync per step: each step's
loss flag and terms stay on the device, and before every optimizer step the gradients are zeroed on the device
when their norm is not finite (so a NaN / inf never reaches the weights). The flags are read once per logging
interval (``log_every_n_steps``, where Lightning reads the logged values anyway), before every validation and
before every checkpoint is written, and at the end of training: the run stops there, naming the first bad step.

``'skip'`` skips the optimizer step (no update, no momentum or weight decay, no clipping; BatchNorm running
statistics are put back as they were before the step), warns, and counts the skipped steps. The skipped step
still counts towards ``max_steps`` and the LR schedule advances; with gradient accumulation the window's step is
skipped. Skipping must be decided on the host before the optimizer runs, so this mode reads the flag every step
(one device sync per step, one all-reduce of the flag under DDP, so that all ranks skip together). A skipped step
backpropagates a zero loss on every rank, so that DDP's gradient all-reduce runs as on any other step (Lightning
refuses a ``None`` step under DDP).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)
MODES = ("raise", "skip")
_ADVICE = (
    "Training stopped; the checkpoints on disk are from earlier steps. Lower the learning rate / enable gradient "
    "clipping, or set nonfinite_loss='skip' in the config to skip such steps."
)


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _terms(log_vars: Mapping) -> dict[str, float]:
    return {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}


def _describe(vals: Mapping[str, float]) -> str:
    bad = {k: v for k, v in vals.items() if not math.isfinite(v)}
    if not bad:
        return "all terms finite on this rank; non-finite on another rank"
    return ", ".join(f"{k}={v}" for k, v in bad.items())


class _Record(NamedTuple):
    """A step not yet read on the host (``'raise'``): ``finite`` and ``terms`` are device tensors."""

    where: str
    kind: str  # 'loss' or 'gradient'
    names: tuple[str, ...]
    terms: torch.Tensor | None  # the loss terms (kind 'loss')
    finite: torch.Tensor  # 0-dim bool


class NonFiniteLossPolicy:
    """The ``nonfinite_loss`` policy of one training run, with its own state (the count of skipped steps, the
    steps not yet checked, and whether the step in flight is to be skipped).

    Use, in a training step::

        with policy.guard(model) as step:
            losses = model(...)
        loss, log_vars = model.parse_losses(losses)
        loss, skipped = step.finish(loss, log_vars, where, model.parameters)  # 'skip' may raise / skip here

    in ``on_before_optimizer_step``: ``policy.zero_nonfinite_grads(model.parameters(), where)``; in
    ``optimizer_step``, after the closure ran: ``if policy.take_skip(): return``; and ``policy.check()`` at the
    logging interval, before validation, before a checkpoint is written and at the end of training.

    Args:
        mode: ``'raise'`` or ``'skip'`` (None: ``'raise'``).
    """

    def __init__(self, mode: str | None = "raise") -> None:
        mode = mode or "raise"
        if mode not in MODES:
            raise ValueError(f"nonfinite_loss must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.skipped = 0  # steps skipped so far (checkpointed)
        self.host_reads = 0  # device flags read on the host ('raise': once per check with steps pending)
        self._skip_pending = False
        self._pending: list[_Record] = []

    @contextlib.contextmanager
    def guard(self, model: nn.Module) -> Iterator[_Step]:
        """Around a training forward: under 'skip', the model's buffers are snapshot before it, so that a step
        found non-finite leaves no trace (its forward would otherwise have moved BatchNorm running statistics,
        to NaN for a batch of NaN images)."""
        buffers = [b.clone() for b in model.buffers()] if self.mode == "skip" else None
        yield _Step(self, model, buffers)

    def take_skip(self) -> bool:
        """True once after a step was skipped: the optimizer step (and clipping, the AMP scaler) must not run."""
        pending, self._skip_pending = self._skip_pending, False
        return pending

    # ---- 'raise': flags kept on the device, read at check points ------------------------------------------
    def record_loss(self, loss: torch.Tensor, log_vars: Mapping, where: str) -> None:
        """Keeps whether ``loss`` is finite and its terms, on the device, until the next ``check``."""
        loss = loss.detach()
        terms = [torch.as_tensor(v, device=loss.device).detach().float().reshape(()) for v in log_vars.values()]
        stacked = torch.stack(terms) if terms else None
        self._pending.append(_Record(where, "loss", tuple(log_vars), stacked, torch.isfinite(loss).all()))

    def zero_nonfinite_grads(self, parameters: Iterable[nn.Parameter], where: str) -> None:
        """Before an optimizer step: every gradient set to zero, on the device, when their total norm is not
        finite (a NaN / inf anywhere, on this rank or, through DDP's all-reduce, on another), so that the update
        cannot carry a non-finite value into the weights; the flag is kept for ``check``. Finite gradients are
        left as they are."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        finite = torch.isfinite(torch.nn.utils.get_total_norm(grads, foreach=None))
        bad = ~finite
        for g in grads:
            g.masked_fill_(bad, 0.0)  # a 0-dim mask: every element, or none, without reading it on the host
        self._pending.append(_Record(where, "gradient", (), None, finite))

    def check(self, collective: bool = True) -> None:
        """Reads the flags of the steps since the last check (one device sync) and raises ``FloatingPointError``
        naming the first non-finite one. ``collective``: under DDP, all-reduce the flags so that every rank
        stops at the same step; only where every rank calls it at the same point (not from a hook that may run
        on one rank only)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        bad = (~torch.stack([r.finite for r in pending])).float()
        if collective and _world_size() > 1:
            dist.all_reduce(bad)
        self.host_reads += 1
        flags = bad.tolist()
        if not any(flags):
            return
        first = pending[next(i for i, f in enumerate(flags) if f)]
        if first.kind == "gradient":
            raise FloatingPointError(
                f"non-finite gradient at {first.where}: the loss was finite but a gradient held NaN / inf (that "
                f"step's update was zeroed). {_ADVICE}"
            )
        vals = dict(zip(first.names, first.terms.tolist() if first.terms is not None else [], strict=True))
        raise FloatingPointError(
            f"non-finite loss at {first.where}: {_describe(vals)} (all terms: "
            f"{', '.join(f'{k}={v:.4g}' for k, v in vals.items())}). {_ADVICE}"
        )

    def state_dict(self) -> dict:
        return {"skipped_nonfinite": self.skipped}

    def load_state_dict(self, state: Mapping) -> None:
        self.skipped = int(state.get("skipped_nonfinite", 0))


class _Step:
    """One training step under a ``NonFiniteLossPolicy`` (made by ``guard``)."""

    def __init__(self, policy: NonFiniteLossPolicy, model: nn.Module, buffers: list[torch.Tensor] | None) -> None:
        self.policy, self.model, self.buffers = policy, model, buffers

    def finish(
        self,
        loss: torch.Tensor,
        log_vars: Mapping,
        where: str,
        parameters: Callable[[], Iterator[nn.Parameter]],
    ) -> tuple[torch.Tensor, bool]:
        """The loss to backpropagate and whether the step was skipped. Under 'raise' the loss's flag is recorded
        for the next ``check`` (no sync); under 'skip' a non-finite loss (on any rank) is skipped here."""
        if self.policy.mode == "raise":
            self.policy.record_loss(loss, log_vars, where)
            return loss, False
        if self.nonfinite(loss):
            return self.skip(log_vars, where, parameters()), True
        return loss, False

    def nonfinite(self, loss: torch.Tensor) -> bool:
        """Whether the loss is NaN / inf on this rank or on any other (every rank must take the same branch, or
        DDP's gradient all-reduce desyncs). Reads the flag on the host."""
        flag = (~torch.isfinite(loss.detach())).any().float().reshape(1)
        if _world_size() > 1:
            dist.all_reduce(flag)
        self.policy.host_reads += 1
        return bool(flag.item())

    def skip(self, log_vars: Mapping, where: str, parameters: Iterator[nn.Parameter]) -> torch.Tensor:
        """'skip' mode's skipped step (``finish`` calls it; 'raise' never skips): restore the buffers, count and
        warn, mark the optimizer step to be skipped, and return a zero loss that reaches every trainable
        parameter (its backward gives each a zero gradient on every rank, which DDP all-reduces as usual, whatever
        the non-finite activations held)."""
        vals = _terms(log_vars)
        policy = self.policy
        with torch.no_grad():
            for b, before in zip(self.model.buffers(), self.buffers or [], strict=True):
                b.copy_(before)
        policy.skipped += 1
        policy._skip_pending = True
        log.warning("skipping non-finite loss at %s: %s (%d skipped so far)", where, _describe(vals), policy.skipped)
        return sum(p.sum() for p in parameters if p.requires_grad) * 0.0
