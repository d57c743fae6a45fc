"""The shared operations the model files call where a fast kernel exists beside the plain formulation.

    from ..ops import table as ops   # in a model file
    out = ops.attention(q, k, v, scale)     # softmax(q k^T * scale) v

Each function below forwards to the active ``OpSet``: ``PLAIN`` (the formulation of the paper and the
official code, to read, export and count FLOPs on) or ``fast_ops(limits)`` (the kernels of ``kernels.py`` and
``attention_kernels.py``, same values and gradients). ``backbones.set_fast_paths`` / ``backbones.fast_paths``
pick the set when the switch changes, so the model files hold no switch checks. ``run_with(ops_, fn, ...)`` runs
fn under a captured set: activation checkpointing recomputes a block with the set its forward used, whatever
the switch says by the time backward runs.

The table holds what any family may use. An operation of one family's own (a fused block of its layers) lives
in a file named after the family (``models/<family>_ops.py``), made an op by ``switched``: the same switch and
the same ``Limits``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import attention_kernels, kernels
from .limits import Limits


@dataclasses.dataclass(frozen=True)
class OpSet:
    """One implementation of every op below (their docstrings say what each computes)."""

    fast: bool
    limits: Limits
    to_internal: Callable
    attention: Callable
    gelu: Callable


# --- the plain formulation ---------------------------------------------------------------------------------
def _plain_attention(q, k, v, scale, mask=None, weights=None):
    logits = (q * scale) @ k.transpose(-2, -1)  # the attention matrix, materialised
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = logits.softmax(-1)
    return (probs if weights is None else weights(probs)) @ v


PLAIN = OpSet(
    fast=False,
    limits=Limits(),
    to_internal=lambda x: x.contiguous(),
    attention=_plain_attention,
    gelu=F.gelu,
)


def fast_ops(limits: Limits) -> OpSet:
    """The fast kernels, engaging from the sizes in ``limits``."""
    return OpSet(
        fast=True,
        limits=limits,
        to_internal=lambda x: x.contiguous(memory_format=torch.channels_last),
        attention=functools.partial(attention_kernels.attention, limits=limits),
        gelu=kernels.gelu,
    )


def select(fast: bool, limits: Limits) -> OpSet:
    return fast_ops(limits) if fast else dataclasses.replace(PLAIN, limits=limits)


_ACTIVE = [select(True, Limits())]


def active() -> OpSet:
    """The op set the model files call now."""
    return _ACTIVE[0]


def activate(ops_: OpSet) -> OpSet:
    """Make ``ops_`` the active set; returns the previous one."""
    previous, _ACTIVE[0] = _ACTIVE[0], ops_
    return previous


def switched(fast: Callable) -> Callable[[Callable], Callable]:
    """Decorator: the plain formulation ``plain(*args)`` made an op of a family's own, which calls
    ``fast(*args, limits=...)`` (the active ``Limits``) instead while the fast paths are on.

        @switched(_fast_conv_ffn)
        def conv_ffn(x, fc1, act, res, fc2):  # the plain formulation, and the op's documentation
            return fc2(res(act(fc1(x))))
    """

    def decorate(plain: Callable) -> Callable:
        @functools.wraps(plain)
        def op(*args):
            ops_ = _ACTIVE[0]
            return fast(*args, limits=ops_.limits) if ops_.fast else plain(*args)

        return op

    return decorate


def run_with(ops_: OpSet, fn: Callable, *args):
    """``fn(*args)`` with ``ops_`` active (the set restored after)."""
    if _ACTIVE[0] is ops_:
        return fn(*args)
    previous = activate(ops_)
    try:
        return fn(*args)
    finally:
        activate(previous)


# --- the ops the model files call ---------------------------------------------------------------------------
def in_float32(method: Callable) -> Callable:
    """Decorator: ``method(self, x, ...)`` runs on x in float32 with autocast off (on both paths); its tensor
    results go back to x's dtype, or under autocast stay float32 (autocast casts them for the next op)."""

    @functools.wraps(method)
    def wrapper(self, x, *args):
        with torch.autocast(x.device.type, enabled=False):
            results = method(self, x.float(), *args)
        return results if torch.is_autocast_enabled() else tuple(t.to(x.dtype) for t in results)

    return wrapper


def to_internal(x: torch.Tensor) -> torch.Tensor:
    """x in the memory layout the backbones compute in (a no-op when it is in it already): fast, channels_last
    (oneDNN's NHWC convolutions measured faster on CPU, the channel LayerNorms need no permute copies, the
    attention's q/k/v reshapes are views with a contiguous head dim: docs/kernels.md); plain, the official
    contiguous NCHW. Same values either way."""
    return _ACTIVE[0].to_internal(x)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    weights: nn.Module | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v over (..., N, head_dim) tensors; ``mask`` (boolean, broadcast to (..., N_q, N_k))
    marks the keys each query may attend to. ``weights``: a probe module (``base.Probe``) that the plain
    formulation passes the attention weights through (fused kernels never form them; recording forces plain)."""
    return _ACTIVE[0].attention(q, k, v, scale, mask, weights)


def dense_conv(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for ``fn`` a stem or downsampling of dense (not depthwise) convolutions, ``x`` in any layout (the
    input image, or a map in the internal one), the result in the internal layout; fast, with
    ``Limits.dense_conv_nchw`` on a CPU tensor: computed in contiguous NCHW (no copy of an NCHW image). Same
    values either way."""
    ops_ = _ACTIVE[0]
    if ops_.fast and ops_.limits.dense_conv_nchw and x.device.type == "cpu":
        return ops_.to_internal(fn(kernels.to_nchw(x)))
    return fn(ops_.to_internal(x))


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``F.gelu``; fast: a channels_last map through its NHWC view (``kernels.gelu``)."""
    return _ACTIVE[0].gelu(x, approximate=approximate)
