"""Memory and speed kernels shared by the fast paths (``backbones.fast_paths``, ``table.fast_ops``): row chunks,
layout changes, GELU on channels_last maps, and the pieces the families' own fused blocks (``models/*_ops.py``)
are built from.

Each kernel computes what the plain formulation computes, values and gradients
(``tests/test_fast_kernels_match_plain.py``); each one checks that the modules it is handed are the kind it was
written for, falling back to the plain composition otherwise. Why each exists, and what it measured, is in
docs/kernels.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from .limits import Limits


# --- row chunks -------------------------------------------------------------------------------------------
# The widest activations (the MLP / inverted-residual hidden layers at stride 4 and 8) are computed in row
# chunks of about Limits.row_chunk_bytes, which the allocator recycles, instead of one tensor large enough
# to be served by fresh, page-faulting memory maps (docs/kernels.md, "Row chunks"). Exact: each chunk
# carries `halo` rows of context for the convolutions, cropped after them.
class _OverlappingRows(torch.autograd.Function):
    """Row slices [lo, hi) of x (views). Backward adds each slice's gradient into one buffer; autograd's own
    slice backward would allocate, zero and add a full-size tensor per slice."""

    @staticmethod
    def forward(ctx, x, bounds):
        ctx.bounds, ctx.shape = bounds, x.shape
        return tuple(x[:, :, lo:hi] for lo, hi in bounds)

    @staticmethod
    def backward(ctx, *grads):
        g0 = grads[0]
        grad = torch.empty(
            ctx.shape,
            dtype=g0.dtype,
            device=g0.device,
            memory_format=torch.channels_last,
        ).zero_()
        for (lo, hi), g in zip(ctx.bounds, grads):
            if g is not None:
                grad[:, :, lo:hi] += g
        return grad, None


def row_halo(conv: nn.Module) -> int | None:
    """Rows of context that ``conv`` reads on each side of an output row, if it maps rows to the same rows
    (an nn.Conv2d with stride 1 and zero padding that keeps the height); None otherwise."""
    if not isinstance(conv, nn.Conv2d) or isinstance(conv.padding, str) or conv.padding_mode != "zeros":
        return None
    (k, _), (s, _), (p, _), (d, _) = (
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
    )
    return p if s == 1 and 2 * p == d * (k - 1) else None


def row_chunked(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    convs: Sequence[nn.Module],
    hidden_channels: int,
    *,
    limits: Limits,
) -> torch.Tensor:
    """``fn(x)``, computed over row chunks of x when fn's widest intermediate (``hidden_channels`` at x's
    resolution) is above 2 * limits.row_chunk_bytes on CPU. ``convs`` are the convolutions fn applies one
    after another; everything else in fn must be pointwise. Computed whole when a conv is not row-local."""
    halos = [row_halo(c) for c in convs]
    hidden_bytes = hidden_channels * x.numel() // x.shape[1] * x.element_size()
    n_rows = x.shape[2]
    chunks = min(n_rows, -(-hidden_bytes // limits.row_chunk_bytes))
    if None in halos or x.device.type != "cpu" or hidden_bytes <= 2 * limits.row_chunk_bytes or chunks < 2:
        return fn(x)
    halo, step = sum(halos), -(-n_rows // chunks)
    rows = [(start, min(start + step, n_rows)) for start in range(0, n_rows, step)]
    bounds = [(max(start - halo, 0), min(stop + halo, n_rows)) for start, stop in rows]
    pieces = (
        _OverlappingRows.apply(x, bounds)
        if torch.is_grad_enabled() and x.requires_grad
        else [x[:, :, lo:hi] for lo, hi in bounds]
    )
    return torch.cat(
        [fn(piece)[:, :, start - lo : stop - lo] for piece, (start, stop), (lo, _) in zip(pieces, rows, bounds)],
        2,
    )


# --- layout changes whose gradient keeps the source's layout ----------------------------------------------------
class _ToNCHW(torch.autograd.Function):
    """x.contiguous(), whose gradient goes back channels_last when x was: autograd's own would hand the NCHW
    gradient on, and every later gradient accumulation in x's blocks would mix layouts (2-4x slower additions
    on CPU)."""

    @staticmethod
    def forward(ctx, x):
        ctx.channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
        return x.contiguous()

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous(memory_format=torch.channels_last) if ctx.channels_last else grad


def to_nchw(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous()`` (NCHW); in training, its gradient in x's own layout (``_ToNCHW``)."""
    return _ToNCHW.apply(x) if torch.is_grad_enabled() and x.requires_grad else x.contiguous()


# --- GELU on channels_last maps ------------------------------------------------------------------------------
def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``F.gelu``, on a channels_last map through its NHWC view (the same memory seen as a contiguous tensor; the
    result is the same channels_last NCHW view): ATen's CPU GELU kernels ran 1.4x (forward) and 1.6x (backward)
    slower on the channels_last 4-D tensor than on that view (docs/kernels.md). Views only, so harmless on
    other devices."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return F.gelu(x.permute(0, 2, 3, 1), approximate=approximate).permute(0, 3, 1, 2)
    return F.gelu(x, approximate=approximate)


# --- pieces of the fused blocks in the family files ------------------------------------------------------------
def conv_args(conv: nn.Conv2d) -> tuple:
    """(stride, padding, dilation, groups) of a convolution, as ``F.conv2d`` takes them after the bias."""
    return conv.stride, conv.padding, conv.dilation, conv.groups


def is_pointwise_conv(conv: nn.Module) -> bool:
    """A 1x1 nn.Conv2d with stride 1, no padding, dilation 1 and groups 1: what ``pointwise_conv_backward``
    assumes."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.kernel_size == (1, 1)
        and conv.stride == (1, 1)
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
    )


def recomputes(hidden_numel: int, dwconv: nn.Module, limits: Limits) -> bool:
    """Whether a fused block recomputes its hidden layers in backward around the depthwise conv ``dwconv``: at
    least limits.mlp_recompute_numel hidden elements, in training without autocast, and ``dwconv`` a zero-padded
    nn.Conv2d (what the recomputing kernels assume; each family's kernel adds its own checks)."""
    return (
        hidden_numel >= limits.mlp_recompute_numel
        and torch.is_grad_enabled()
        and not torch.is_autocast_enabled()
        and isinstance(dwconv, nn.Conv2d)
        and not isinstance(dwconv.padding, str)
        and dwconv.padding_mode == "zeros"
    )


def pointwise_conv_backward(dy, x, weight, has_bias, need_x, need_w, need_b):
    """(grad_x, grad_weight, grad_bias) of y = conv1x1(x, weight[, bias]) (stride 1, groups 1), by the
    convolution's own backward kernel (the one autograd would call)."""
    return torch.ops.aten.convolution_backward(
        dy.contiguous(memory_format=torch.channels_last),
        x,
        weight,
        [weight.shape[0]] if has_bias else None,
        [1, 1],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        1,
        [need_x, need_w, need_b],
    )
