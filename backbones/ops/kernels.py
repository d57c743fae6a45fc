"""Memory and speed kernels behind the model files' fast paths (``backbones.fast_paths``, ``table.fast_ops``).

Each kernel computes what the plain formulation in ``table`` computes, values and gradients
(``tests/test_fast_kernels_match_plain.py``); the model files reach them through ``table`` with fast paths on, and each
one checks that the modules it is handed are the kind it was written for, falling back to the plain
composition otherwise. Why each exists, and what it measured, is in docs/kernels.md.
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
        grad = torch.empty(ctx.shape, dtype=g0.dtype, device=g0.device, memory_format=torch.channels_last).zero_()
        for (lo, hi), g in zip(ctx.bounds, grads):
            if g is not None:
                grad[:, :, lo:hi] += g
        return grad, None


def row_halo(conv: nn.Module) -> int | None:
    """Rows of context that ``conv`` reads on each side of an output row, if it maps rows to the same rows
    (an nn.Conv2d with stride 1 and zero padding that keeps the height); None otherwise."""
    if not isinstance(conv, nn.Conv2d) or isinstance(conv.padding, str) or conv.padding_mode != "zeros":
        return None
    (k, _), (s, _), (p, _), (d, _) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
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
        [fn(piece)[:, :, start - lo : stop - lo] for piece, (start, stop), (lo, _) in zip(pieces, rows, bounds)], 2
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


# --- STViT's ConvFFN -------------------------------------------------------------------------------------
def _conv_args(conv: nn.Conv2d) -> tuple:
    return conv.stride, conv.padding, conv.dilation, conv.groups


# --- x + depthwise conv(x) as one convolution ------------------------------------------------------------------
def _identity_tap(weight: torch.Tensor, conv_args: tuple) -> tuple[int, int] | None:
    """The kernel position that reads each output pixel's own input pixel, when ``conv2d(x, weight, *conv_args)``
    is depthwise (one input channel per output channel), of stride 1, and keeps the size with an odd kernel
    centred by its padding: then x + conv(x) is one convolution with 1 added to the kernel there. None
    otherwise."""
    stride, padding, dilation, groups = conv_args
    if isinstance(padding, str) or tuple(stride) != (1, 1) or weight.shape[1] != 1 or weight.shape[0] != groups:
        return None
    if any(k % 2 == 0 or 2 * p != d * (k - 1) for k, p, d in zip(weight.shape[2:], padding, dilation)):
        return None
    return (weight.shape[2] // 2, weight.shape[3] // 2)


def _residual_conv(x, weight, bias, conv_args, tap) -> torch.Tensor:
    """x + conv2d(x, weight, bias, *conv_args); with ``tap`` (``_identity_tap``) as one convolution whose kernel
    has 1 added at the tap: one pass over the map instead of a convolution and an addition, and in backward no
    sum of x's two gradients. The same values up to rounding, and the same gradients (the 1 is a constant)."""
    if tap is None:
        return x + F.conv2d(x, weight, bias, *conv_args)
    identity = torch.zeros_like(weight)
    identity[:, :, tap[0], tap[1]] = 1
    return F.conv2d(x, weight + identity, bias, *conv_args)


def residual_dwconv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x + conv(x)`` (``table.residual_dwconv``, STViT's ResDWC): one convolution when ``conv`` is an nn.Conv2d
    that ``_identity_tap`` accepts, with zero padding; else the plain sum."""
    if not isinstance(conv, nn.Conv2d) or conv.padding_mode != "zeros":
        return x + conv(x)
    args = _conv_args(conv)
    return _residual_conv(x, conv.weight, conv.bias, args, _identity_tap(conv.weight, args))


def _gelu_resdwc(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_args: tuple) -> torch.Tensor:
    """r = g + dwconv(g), g = GELU(h), with the depthwise conv's own stride / padding / dilation / groups (one
    convolution where ``_identity_tap`` allows)."""
    return _residual_conv(gelu(h), weight, bias, conv_args, _identity_tap(weight, conv_args))


def _pointwise_conv_backward(dy, x, weight, has_bias, need_x, need_w, need_b):
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
        grad_r, grad_w, grad_b = _pointwise_conv_backward(
            dy, r.detach(), weight, ctx.has_bias, bool(wanted), need_w, need_b and ctx.has_bias
        )
        grads = iter(torch.autograd.grad(r, wanted, grad_r) if wanted else ())
        leaf_grads = [next(grads) if t is not None and t.requires_grad else None for t in leaves]
        return (*leaf_grads, grad_w, grad_b, None)


def _is_exact_gelu(act: nn.Module) -> bool:
    return isinstance(act, nn.GELU) and act.approximate == "none"


def _is_pointwise_conv(conv: nn.Module) -> bool:
    """A 1x1 nn.Conv2d with stride 1, no padding, dilation 1 and groups 1: what _MlpTail's backward assumes."""
    return (
        isinstance(conv, nn.Conv2d)
        and conv.kernel_size == (1, 1)
        and conv.stride == (1, 1)
        and conv.padding == (0, 0)
        and conv.dilation == (1, 1)
        and conv.groups == 1
    )


def conv_ffn(x: torch.Tensor, fc1: nn.Module, act: nn.Module, res: nn.Module, fc2: nn.Module, *, limits: Limits):
    """``fc2(res(act(fc1(x))))`` (STViT's ConvFFN, ``res`` its residual depthwise conv ``t + res.conv(t)``), in
    row chunks on large CPU maps and, for hidden activations of at least limits.mlp_recompute_numel elements in
    training (fp32, no autocast), with the GELU and the depthwise conv recomputed in backward (``_MlpTail``).
    Only for a ``res`` whose own class declares ``fusable = True`` (STViT's ResDWC: another module, or a
    subclass with another forward, takes the plain composition); the recomputation applies only to the exact
    GELU and 1x1 fc2 it was written for."""
    if not type(res).__dict__.get("fusable", False):
        return fc2(res(act(fc1(x))))
    dwconv = res.conv
    hidden_channels = dwconv.in_channels
    hidden_numel = hidden_channels * x.numel() // x.shape[1]
    recompute = (
        hidden_numel >= limits.mlp_recompute_numel
        and torch.is_grad_enabled()
        and not torch.is_autocast_enabled()
        and _is_exact_gelu(act)
        and _is_pointwise_conv(fc2)
        and isinstance(dwconv, nn.Conv2d)
        and not isinstance(dwconv.padding, str)
        and dwconv.padding_mode == "zeros"
    )

    def row_local(t: torch.Tensor) -> torch.Tensor:
        h = fc1(t)
        if recompute:
            return _MlpTail.apply(h, dwconv.weight, dwconv.bias, fc2.weight, fc2.bias, _conv_args(dwconv))
        return fc2(res(act(h)))

    return row_chunked(row_local, x, (fc1, dwconv, fc2), hidden_channels, limits=limits)


# --- HAT-Net's inverted residual -----------------------------------------------------------------------------
def _silu_dwconv_silu(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_args: tuple):
    """SiLU(dwconv(SiLU(h))), with the depthwise conv's own stride / padding / dilation / groups."""
    return F.silu(F.conv2d(F.silu(h), weight, bias, *conv_args))


class _InvertedResidualTail(torch.autograd.Function):
    """y = conv3(SiLU(dwconv(SiLU(h)))), h = conv1(x): HAT-Net's inverted residual after its first 1x1 conv,
    saving only h for backward.

    Plain autograd keeps four hidden-width (8 x dim at strides 4 and 8) tensors per block until backward (h,
    SiLU(h), the depthwise conv's output and its SiLU); this keeps h and recomputes the two SiLUs and the
    depthwise conv in backward (no GEMM is recomputed). Same values and gradients; at 800x1344 that is 1.3 GiB
    (stages 0 and 1) less kept for HAT-Net-S's backward (docs/kernels.md)."""

    @staticmethod
    def forward(ctx, h, dw_weight, dw_bias, weight, dw_args):
        s = _silu_dwconv_silu(h, dw_weight, dw_bias, dw_args)
        ctx.save_for_backward(h, dw_weight, dw_bias, weight)
        ctx.dw_args = dw_args
        return F.conv2d(s, weight)

    @staticmethod
    def backward(ctx, dy):
        h, dw_weight, dw_bias, weight = ctx.saved_tensors
        need_h, need_dww, need_dwb, need_w, _ = ctx.needs_input_grad
        leaves = [
            t.detach().requires_grad_(n) if t is not None else None
            for t, n in ((h, need_h), (dw_weight, need_dww), (dw_bias, need_dwb))
        ]
        with torch.enable_grad():
            s = _silu_dwconv_silu(*leaves, ctx.dw_args)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grad_s, grad_w, _ = _pointwise_conv_backward(dy, s.detach(), weight, False, bool(wanted), need_w, False)
        grads = iter(torch.autograd.grad(s, wanted, grad_s) if wanted else ())
        leaf_grads = [next(grads) if t is not None and t.requires_grad else None for t in leaves]
        return (*leaf_grads, grad_w, None)


def inverted_residual(
    x: torch.Tensor,
    conv1: nn.Module,
    act1: nn.Module,
    dwconv: nn.Module,
    act2: nn.Module,
    conv3: nn.Module,
    *,
    limits: Limits,
) -> torch.Tensor:
    """``conv3(act2(dwconv(act1(conv1(x)))))`` (``table.inverted_residual``), in row chunks on large CPU maps and,
    for hidden activations of at least limits.mlp_recompute_numel elements in training (no autocast), with the
    activations and the depthwise conv recomputed in backward (``_InvertedResidualTail``). The recomputation
    applies only to the SiLUs, depthwise conv and bias-free 1x1 conv3 it was written for; other modules take
    the plain composition (in row chunks)."""
    hidden_numel = conv1.out_channels * x.numel() // x.shape[1]
    recompute = (
        hidden_numel >= limits.mlp_recompute_numel
        and torch.is_grad_enabled()
        and not torch.is_autocast_enabled()
        and type(act1) is nn.SiLU
        and type(act2) is nn.SiLU
        and _is_pointwise_conv(conv3)
        and conv3.bias is None
        and isinstance(dwconv, nn.Conv2d)
        and not isinstance(dwconv.padding, str)
        and dwconv.padding_mode == "zeros"
    )

    def row_local(t: torch.Tensor) -> torch.Tensor:
        h = conv1(t)
        if recompute:
            return _InvertedResidualTail.apply(h, dwconv.weight, dwconv.bias, conv3.weight, _conv_args(dwconv))
        return conv3(act2(dwconv(act1(h))))

    return row_chunked(row_local, x, (conv1, dwconv, conv3), conv1.out_channels, limits=limits)


# --- STViT's 3x3 super-token neighbourhoods -----------------------------------------------------------------
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


def unfold3x3(x: torch.Tensor) -> torch.Tensor:
    """``table.unfold3x3``: (B, h, w, C) -> (B, h*w, 9, C), as padded slices; its backward is ``fold3x3``."""
    return _Unfold3x3.apply(x) if torch.is_grad_enabled() and x.requires_grad else _unfold3x3(x)


def fold3x3(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``table.fold3x3``: (B, h*w, 9, C) -> (B, h, w, C), as nine shifted slice additions; its backward is
    ``unfold3x3``."""
    return _Fold3x3.apply(x, h, w) if torch.is_grad_enabled() and x.requires_grad else _fold3x3(x, h, w)
