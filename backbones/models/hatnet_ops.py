"""HAT-Net's own operation, a plain formulation (the official code's) and a fast kernel behind the switch of
``backbones.fast_paths`` (``table.switched``): the inverted residual between the block's GroupNorms
(``inverted_residual``). The fast kernel computes the same values and gradients
(``tests/test_fast_kernels_match_plain.py``); why it exists, and what it measured, is in docs/kernels.md.
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


def _silu_dwconv_silu(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dw_args: tuple):
    """SiLU(dwconv(SiLU(h))), with the depthwise conv's own stride / padding / dilation / groups."""
    return F.silu(F.conv2d(F.silu(h), weight, bias, *dw_args))


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
        grad_s, grad_w, _ = pointwise_conv_backward(dy, s.detach(), weight, False, bool(wanted), need_w, False)
        grads = iter(torch.autograd.grad(s, wanted, grad_s) if wanted else ())
        leaf_grads = [next(grads) if t is not None and t.requires_grad else None for t in leaves]
        return (*leaf_grads, grad_w, None)


def _fast_inverted_residual(x, conv1, act1, dwconv, act2, conv3, *, limits: Limits) -> torch.Tensor:
    """In row chunks on large CPU maps and, for hidden activations of at least limits.mlp_recompute_numel
    elements in training (no autocast), with the activations and the depthwise conv recomputed in backward
    (``_InvertedResidualTail``). The recomputation applies only to the SiLUs, depthwise conv and bias-free 1x1
    conv3 it was written for; other modules take the plain composition (in row chunks)."""
    hidden_numel = conv1.out_channels * x.numel() // x.shape[1]
    recompute = (
        kernels.recomputes(hidden_numel, dwconv, limits)
        and type(act1) is nn.SiLU
        and type(act2) is nn.SiLU
        and is_pointwise_conv(conv3)
        and conv3.bias is None
    )

    def row_local(t: torch.Tensor) -> torch.Tensor:
        h = conv1(t)
        if recompute:
            return _InvertedResidualTail.apply(h, dwconv.weight, dwconv.bias, conv3.weight, conv_args(dwconv))
        return conv3(act2(dwconv(act1(h))))

    return kernels.row_chunked(row_local, x, (conv1, dwconv, conv3), conv1.out_channels, limits=limits)


@switched(_fast_inverted_residual)
def inverted_residual(
    x: torch.Tensor,
    conv1: nn.Module,
    act1: nn.Module,
    dwconv: nn.Module,
    act2: nn.Module,
    conv3: nn.Module,
) -> torch.Tensor:
    """``conv3(act2(dwconv(act1(conv1(x)))))``, the inverted residual between the block's GroupNorms; fast: in row
    chunks on large CPU maps, large hidden layers recomputed in backward (``_InvertedResidualTail``)."""
    return conv3(act2(dwconv(act1(conv1(x)))))
