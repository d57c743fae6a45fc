"""What a training step with a NaN / inf loss does: the config's top-level ``nonfinite_loss`` key.

``'raise'`` (default) stops training with a ``FloatingPointError`` naming the step and the non-finite loss
terms; the checkpoints on disk are from before that step. ``'skip'`` skips the optimizer step (no update, no
momentum or weight decay, no clipping; BatchNorm running statistics are put back as they were before the step),
warns, and counts the skipped steps. The skipped step still counts towards ``max_steps`` and the LR schedule
advances; with gradient accumulation the window's step is skipped.

Under DDP the ranks agree (one all-reduce of a flag per step), so all skip or all stop together. A skipped step
backpropagates a zero loss on every rank, so that DDP's gradient all-reduce runs as on any other step (Lightning
refuses a ``None`` step under DDP).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger(__name__)
MODES = ("raise", "skip")


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class NonFiniteLossPolicy:
    """The ``nonfinite_loss`` policy of one training run, with its own state (the count of skipped steps, and
    whether the step in flight is to be skipped).

    Use, in a training step::

        with policy.guard(model) as step:
            losses = model(...)
        loss, log_vars = model.parse_losses(losses)
        if step.nonfinite(loss):
            return step.skip(log_vars, where, params)  # raises under 'raise'

    and in ``optimizer_step``, after the closure ran: ``if policy.take_skip(): return``.

    Args:
        mode: ``'raise'`` or ``'skip'`` (None: ``'raise'``).
    """

    def __init__(self, mode: str | None = "raise") -> None:
        mode = mode or "raise"
        if mode not in MODES:
            raise ValueError(f"nonfinite_loss must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.skipped = 0  # steps skipped so far (checkpointed)
        self._skip_pending = False

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

    def state_dict(self) -> dict:
        return {"skipped_nonfinite": self.skipped}

    def load_state_dict(self, state: Mapping) -> None:
        self.skipped = int(state.get("skipped_nonfinite", 0))


class _Step:
    """One training step under a ``NonFiniteLossPolicy`` (made by ``guard``)."""

    def __init__(self, policy: NonFiniteLossPolicy, model: nn.Module, buffers: list[torch.Tensor] | None) -> None:
        self.policy, self.model, self.buffers = policy, model, buffers

    def nonfinite(self, loss: torch.Tensor) -> bool:
        """Whether the loss is NaN / inf on this rank or on any other (every rank must take the same branch, or
        DDP's gradient all-reduce desyncs)."""
        flag = (~torch.isfinite(loss.detach())).any().float().reshape(1)
        if _world_size() > 1:
            dist.all_reduce(flag)
        return bool(flag.item())

    def skip(self, log_vars: Mapping, where: str, parameters: Iterator[nn.Parameter]) -> torch.Tensor:
        """Under 'raise': a ``FloatingPointError`` naming ``where`` and the non-finite terms of ``log_vars``.
        Under 'skip': restore the buffers, count and warn, mark the optimizer step to be skipped, and return a
        zero loss that reaches every trainable parameter (its backward gives each a zero gradient on every rank,
        which DDP all-reduces as usual, whatever the non-finite activations held)."""
        vals = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}
        bad = {k: v for k, v in vals.items() if not math.isfinite(v)}
        terms = (
            ", ".join(f"{k}={v}" for k, v in bad.items())
            if bad
            else "all terms finite on this rank; non-finite on another rank"
        )
        policy = self.policy
        if policy.mode == "raise":
            raise FloatingPointError(
                f"non-finite loss at {where}: {terms} (all terms: "
                f"{', '.join(f'{k}={v:.4g}' for k, v in vals.items())}). Training stopped; the "
                "checkpoints on disk are from earlier steps. Lower the learning rate / enable gradient "
                "clipping, or set nonfinite_loss='skip' in the config to skip such steps."
            )
        with torch.no_grad():
            for b, before in zip(self.model.buffers(), self.buffers or [], strict=True):
                b.copy_(before)
        policy.skipped += 1
        policy._skip_pending = True
        log.warning("skipping non-finite loss at %s: %s (%d skipped so far)", where, terms, policy.skipped)
        return sum(p.sum() for p in parameters if p.requires_grad) * 0.0
