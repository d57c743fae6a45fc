"""STViT's own operations, each a plain formulation (the official code's) and a fast kernel behind the switch of
``backbones.fast_paths`` (``table.switched``): the 3x3 super-token neighbourhoods of the super-token attention
(``unfold3x3`` / ``fold3x3``), the residual depthwise convolution ``ResDWC`` (``residual_dwconv``) and the ConvFFN
(``conv_ffn``). The fast kernels compute the same values and gradients (``tests/test_fast_kernels_match_plain.py``);
why each exists, and what it measured, is in docs/kernels.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import kernels
from ..ops.kernels import conv_args, is_pointwise_conv, pointwise_conv_backward
from ..ops.table import switched

if TYPE_CHECKING:
    from ..ops.limits import Limits


# --- the 3x3 super-token neighbourhoods --------------------------------------------------------------------------
# Padded slices instead of the official identity-kernel convolutions (whose strided layout made ``bmm`` fall
# back to a per-batch loop): stacked contiguous in an NHWC layout whose matrices feed ``bmm`` without copies.
# The two are adjoint linear maps, so each one's backward is the other's forward. Autograd's own backward of the
# slices allocated and zero-filled a full-size gradient per slice: nine per call (docs/kernels.md).
def _unfold3x3(x: torch.Tensor) -> torch.Tensor:
    B, h, w, C = x.shape
    xp = F.pad(x, (0, 0, 1, 1, 1, 1))
    return torch.stack([xp[:, i : i + h, j : j + w] for i in range(3) for j in range(3)], dim=3).reshape(B, h * w, 9, C)


def _fold3x3(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    B, _, _, C = x.shape
    x = x.reshape(B, h, w, 9, C)
    out = x.new_zeros(B, h + 2, w + 2, C)
    for k in range(9):
        i, j = divmod(k, 3)
        out[:, i : i + h, j : j + w] += x[:, :, :, k]
    return out[:, 1 : h + 1, 1 : w + 1]


class _Unfold3x3(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.hw = x.shape[1:3]
        return _unfold3x3(x)

    @staticmethod
    def backward(ctx, grad):
        return _fold3x3(grad, *ctx.hw)


class _Fold3x3(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h, w):
        return _fold3x3(x, h, w)

    @staticmethod
    def backward(ctx, grad):
        return _unfold3x3(grad), None, None


def _fast_unfold3x3(x: torch.Tensor, *, limits: Limits) -> torch.Tensor:
    """As padded slices; its backward is ``fold3x3``'s forward."""
    return _Unfold3x3.apply(x) if torch.is_grad_enabled() and x.requires_grad else _unfold3x3(x)


def _fast_fold3x3(x: torch.Tensor, h: int, w: int, *, limits: Limits) -> torch.Tensor:
    """As nine shifted slice additions; its backward is ``unfold3x3``'s forward."""
    return _Fold3x3.apply(x, h, w) if torch.is_grad_enabled() and x.requires_grad else _fold3x3(x, h, w)


def _identity_kernel(x: torch.Tensor) -> torch.Tensor:
    return torch.eye(9, dtype=x.dtype, device=x.device).reshape(9, 1, 3, 3)


@switched(_fast_unfold3x3)
def unfold3x3(x: torch.Tensor) -> torch.Tensor:
    """(B, h, w, C) -> (B, h*w, 9, C): each grid cell's 3x3 neighbourhood (zeros outside the grid), neighbour
    k = 3 i + j of cell (y, x) being cell (y + i - 1, x + j - 1). Plain: the official Unfold, an identity-kernel
    convolution."""
    B, h, w, C = x.shape
    out = F.conv2d(x.permute(0, 3, 1, 2).reshape(B * C, 1, h, w), _identity_kernel(x), padding=1)
    return out.reshape(B, C, 9, h * w).permute(0, 3, 2, 1)


@switched(_fast_fold3x3)
def fold3x3(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The adjoint of ``unfold3x3``: (B, h*w, 9, C) -> (B, h, w, C), each cell summing its neighbours' shares.
    Plain: the official Fold, the transposed identity-kernel convolution."""
    B, _, _, C = x.shape
    out = F.conv_transpose2d(x.permute(0, 3, 2, 1).reshape(B * C, 9, h, w), _identity_kernel(x), padding=1)
    return out.reshape(B, C, h, w).permute(0, 2, 3, 1)


# --- ResDWC: x + depthwise conv(x) as one convolution ----------------------------------------------------
def _identity_tap(weight: torch.Tensor, dw_args: tuple) -> tuple[int, int] | None:
    """The kernel position that reads each output pixel's own input pixel, when ``conv2d(x, weight, *dw_args)``
    is depthwise (one input channel per output channel), of stride 1, and keeps the size with an odd kernel
    centred by its padding: then x + conv(x) is one convolution with 1 added to the kernel there. None
    otherwise."""
    stride, padding, dilation, groups = dw_args
    if isinstance(padding, str) or tuple(stride) != (1, 1) or weight.shape[1] != 1 or weight.shape[0] != groups:
        return None
    if any(k % 2 == 0 or 2 * p != d * (k - 1) for k, p, d in zip(weight.shape[2:], padding, dilation)):
        return None
    return (weight.shape[2] // 2, weight.shape[3] // 2)


def _residual_conv(x, weight, bias, dw_args, tap) -> torch.Tensor:
    """x + conv2d(x, weight, bias, *dw_args); with ``tap`` (``_identity_tap``) as one convolution whose kernel
    has 1 added at the tap: one pass over the map instead of a convolution and an addition, and in backward no
    sum of x's two gradients. The same values up to rounding, and the same gradients (the 1 is a constant)."""
    if tap is None:
        return x + F.conv2d(x, weight, bias, *dw_args)
    identity = torch.zeros_like(weight)
    identity[:, :, tap[0], tap[1]] = 1
    return F.conv2d(x, weight + identity, bias, *dw_args)


def _fast_residual_dwconv(conv: nn.Module, x: torch.Tensor, *, limits: Limits) -> torch.Tensor:
    """``x + conv(x)``: one convolution when ``conv`` is an nn.Conv2d that ``_identity_tap`` accepts, with zero
    padding; else the plain sum."""
    if not isinstance(conv, nn.Conv2d) or conv.padding_mode != "zeros":
        return x + conv(x)
    args = conv_args(conv)
    return _residual_conv(x, conv.weight, conv.bias, args, _identity_tap(conv.weight, args))


@switched(_fast_residual_dwconv)
def residual_dwconv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x + conv(x)`` for ``conv`` a depthwise convolution that keeps the size (``ResDWC``); fast: one
    convolution, its kernel with 1 added at the centre."""
    return x + conv(x)


# --- the ConvFFN ---------------------------------------------------------------------------------------------


def _gelu_resdwc(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dw_args: tuple) -> torch.Tensor:
    """r = g + dwconv(g), g = GELU(h), with the depthwise conv's own stride / padding / dilation / groups (one
    convolution where ``_identity_tap`` allows)."""
    return _residual_conv(kernels.gelu(h), weight, bias, dw_args, _identity_tap(weight, dw_args))


class _MlpTail(torch.autograd.Function):
    """y = fc2(r), r = GELU(h) + dwconv(GELU(h)): the MLP after fc1, saving only h for backward.

    Plain autograd keeps three hidden-width (4 x dim) tensors per block alive until backward (h, GELU(h),
    r); this keeps h and recomputes GELU and the depthwise conv in backward (no GEMM is recomputed).
    Same values and gradients, less activation memory for one more GELU + depthwise-conv forward per block
    (docs/kernels.md)."""

    @staticmethod
    def forward(ctx, h, dw_weight, dw_bias, weight, bias, dw_args):
        r = _gelu_resdwc(h, dw_weight, dw_bias, dw_args)
        ctx.save_for_backward(h, dw_weight, dw_bias, weight)
        ctx.has_bias, ctx.dw_args = bias is not None, dw_args
        return F.conv2d(r, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        h, dw_weight, dw_bias, weight = ctx.saved_tensors
        need_h, need_dww, need_dwb, need_w, need_b, _ = ctx.needs_input_grad
        leaves = [
            t.detach().requires_grad_(n) if t is not None else None
            for t, n in ((h, need_h), (dw_weight, need_dww), (dw_bias, need_dwb))
        ]
        with torch.enable_grad():
            r = _gelu_resdwc(*leaves, ctx.dw_args)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grad_r, grad_w, grad_b = pointwise_conv_backward(
            dy,
            r.detach(),
            weight,
            ctx.has_bias,
            bool(wanted),
            need_w,
            need_b and ctx.has_bias,
        )
        grads = iter(torch.autograd.grad(r, wanted, grad_r) if wanted else ())
        leaf_grads = [next(grads) if t is not None and t.requires_grad else None for t in leaves]
        return (*leaf_grads, grad_w, grad_b, None)


def _is_exact_gelu(act: nn.Module) -> bool:
    return isinstance(act, nn.GELU) and act.approximate == "none"


def _fast_conv_ffn(x, fc1: nn.Module, act: nn.Module, res: nn.Module, fc2: nn.Module, *, limits: Limits):
    """``fc2(res(act(fc1(x))))`` in row chunks on large CPU maps and, for hidden activations of at least
    limits.mlp_recompute_numel elements in training (fp32, no autocast), with the GELU and the depthwise conv
    recomputed in backward (``_MlpTail``). Only for a ``res`` whose own class declares ``fusable = True``
    (``ResDWC``: another module, or a subclass with another forward, takes the plain composition); the
    recomputation applies only to the exact GELU and 1x1 fc2 it was written for."""
    if not type(res).__dict__.get("fusable", False):
        return fc2(res(act(fc1(x))))
    dwconv = res.conv
    hidden_channels = dwconv.in_channels
    hidden_numel = hidden_channels * x.numel() // x.shape[1]
    recompute = kernels.recomputes(hidden_numel, dwconv, limits) and _is_exact_gelu(act) and is_pointwise_conv(fc2)

    def row_local(t: torch.Tensor) -> torch.Tensor:
        h = fc1(t)
        if recompute:
            return _MlpTail.apply(h, dwconv.weight, dwconv.bias, fc2.weight, fc2.bias, conv_args(dwconv))
        return fc2(res(act(h)))

    return kernels.row_chunked(row_local, x, (fc1, dwconv, fc2), hidden_channels, limits=limits)


@switched(_fast_conv_ffn)
def conv_ffn(x: torch.Tensor, fc1: nn.Module, act: nn.Module, res: nn.Module, fc2: nn.Module) -> torch.Tensor:
    """``fc2(res(act(fc1(x))))``, the ConvFFN with the residual depthwise conv ``res``; fast: in row chunks on
    large CPU maps, large hidden layers recomputed in backward (``_MlpTail``)."""
    return fc2(res(act(fc1(x))))
