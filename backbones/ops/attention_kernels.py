"""The fast kernels of softmax attention, ``softmax(q k^T * scale) v`` (``table.attention``; the plain
formulation, the attention matrix materialised, is in ``table``).

SDPA, or on CPU in fp32 for attention over a few hundred keys or more (STViT's global stage, HAT-Net's global
attention to the pooled map) a kernel that runs every GEMM through oneDNN, whose GEMMs measured faster than
the MKL ones inside SDPA's CPU kernel (docs/kernels.md). The two GEMMs that contract over queries (dK,
dV) read the probabilities transposed in place. Keeping the probabilities holds a (batch x heads, N_q, N_k)
float32 tensor, so that kernel is used only up to ``Limits.attention_max_probs_bytes``; larger inputs (e.g.
STViT's stage 3 at 800x1344, 350 MiB per block) take a chunked variant that keeps nothing of size N^2 and
recomputes each query chunk's probabilities in backward, as flash attention does. CUDA, reduced precision,
masked attention and torch.compile graphs use SDPA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .limits import Limits

_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _per_head(*tensors: torch.Tensor):
    """(..., N, d) -> (batch x heads, N, d) each, views where the strides allow."""
    return tuple(t.reshape(-1, *t.shape[-2:]) for t in tensors)


def _mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T for 2-D tensors, as one oneDNN GEMM (b is the 'weight' of a linear layer)."""
    return _onednn_linear(a.contiguous(), b.contiguous(), None, "none", [], "")


def _mm_tn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a.T @ b for 2-D tensors with a common first dim, as one oneDNN GEMM.

    b goes in as the linear layer's weight b.T, a transposed view that oneDNN's matmul reads in place
    (faster than torch.mm's MKL GEMM on the attention's dK/dV shapes, and than copying b.T first: docs/kernels.md).
    """
    return _onednn_linear(a.t().contiguous(), b.t(), None, "none", [], "")


class _OneDnnAttention(torch.autograd.Function):
    """Keeps the probabilities for backward (no recomputation); fused row-wise softmax and its backward."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        q3, k3, v3 = _per_head(q, k, v)
        probs = q3.new_empty(q3.shape[0], q3.shape[1], k3.shape[1])
        out = q3.new_empty(q3.shape[0], q3.shape[1], v3.shape[2])
        for i in range(q3.shape[0]):  # per (batch, head): oneDNN has no batched GEMM entry point here
            torch.softmax(_mm_nt(q3[i] * scale, k3[i]), -1, out=probs[i])
            out[i] = _mm_nt(probs[i], v3[i].t())
        ctx.save_for_backward(q3, k3, v3, probs)
        ctx.scale, ctx.shapes = scale, (q.shape, k.shape, v.shape)
        return out.reshape(q.shape[:-1] + out.shape[-1:])

    @staticmethod
    def backward(ctx, grad_out):
        q3, k3, v3, probs = ctx.saved_tensors
        grad_out = grad_out.reshape(*probs.shape[:2], -1)
        dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        for i in range(q3.shape[0]):
            do = grad_out[i].contiguous()
            dv[i] = _mm_tn(do, probs[i]).t()
            ds = torch._softmax_backward_data(_mm_nt(do, v3[i]), probs[i], -1, torch.float32)
            dq[i] = _mm_nt(ds, k3[i].t()).mul_(ctx.scale)
            dk[i] = _mm_tn(q3[i] * ctx.scale, ds).t()
        qs, ks, vs = ctx.shapes
        return dq.reshape(qs), dk.reshape(ks), dv.reshape(vs), None


class _OneDnnChunkedAttention(torch.autograd.Function):
    """The same GEMMs over query chunks, keeping no probabilities (as flash attention does): backward
    recomputes each chunk's softmax. For attention too large to keep (N^2 memory)."""

    @staticmethod
    def _chunks(n_q: int, n_k: int, chunk_bytes: int):
        size = max(64, (chunk_bytes // (4 * n_k)) // 64 * 64)
        return [(s, min(s + size, n_q)) for s in range(0, n_q, size)]

    @staticmethod
    def forward(ctx, q, k, v, scale, chunk_bytes):
        q3, k3, v3 = _per_head(q, k, v)
        out = q3.new_empty(q3.shape[0], q3.shape[1], v3.shape[2])
        chunks = _OneDnnChunkedAttention._chunks(q3.shape[1], k3.shape[1], chunk_bytes)
        for i in range(q3.shape[0]):
            qi, ki, vti = q3[i] * scale, k3[i].contiguous(), v3[i].t().contiguous()
            for a, b in chunks:
                out[i, a:b] = _mm_nt(torch.softmax(_mm_nt(qi[a:b], ki), -1), vti)
        ctx.save_for_backward(q3, k3, v3)
        ctx.scale, ctx.shapes, ctx.chunks = scale, (q.shape, k.shape, v.shape), chunks
        return out.reshape(q.shape[:-1] + out.shape[-1:])

    @staticmethod
    def backward(ctx, grad_out):
        q3, k3, v3 = ctx.saved_tensors
        grad_out = grad_out.reshape(*q3.shape[:2], -1)
        chunks = ctx.chunks
        dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        # dK and dV are summed over query chunks, transposed: (head_dim, N_k) rows stay contiguous.
        dkt, dvt = k3.new_empty(k3.shape[2], k3.shape[1]), v3.new_empty(v3.shape[2], v3.shape[1])
        for i in range(q3.shape[0]):
            qs_i = q3[i] * ctx.scale
            ki, vi, kti = k3[i].contiguous(), v3[i].contiguous(), k3[i].t().contiguous()
            do_i = grad_out[i].contiguous()
            dkt.zero_(), dvt.zero_()
            for a, b in chunks:
                p = torch.softmax(_mm_nt(qs_i[a:b], ki), -1)  # recomputed: the forward's exact values
                do = do_i[a:b]
                dvt += _mm_tn(do, p)
                ds = torch._softmax_backward_data(_mm_nt(do, vi), p, -1, torch.float32)
                dq[i, a:b] = _mm_nt(ds, kti).mul_(ctx.scale)
                dkt += _mm_tn(qs_i[a:b], ds)
            dk[i], dv[i] = dkt.t(), dvt.t()
        qs, ks, vs = ctx.shapes
        return dq.reshape(qs), dk.reshape(ks), dv.reshape(vs), None, None


def _onednn_kernel(q: torch.Tensor, k: torch.Tensor, limits: Limits):
    """The oneDNN kernel for these inputs, or None for SDPA."""
    if _onednn_linear is None or q.device.type != "cpu":
        return None
    if q.dtype != torch.float32 or k.dtype != torch.float32:
        return None
    if torch.compiler.is_compiling():  # inductor fails to lower mkldnn._linear_pointwise on fused inputs
        return None
    n_k, query_rows = k.shape[-2], q.numel() // q.shape[-1]  # query_rows = batch x heads x N_q
    if n_k < limits.attention_min_keys or query_rows // q.shape[-2] > limits.attention_max_calls:
        return None
    return _OneDnnAttention if query_rows * n_k * 4 <= limits.attention_max_probs_bytes else _OneDnnChunkedAttention


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    weights=None,
    *,
    limits: Limits,
) -> torch.Tensor:
    """softmax(q @ k^T * scale) @ v over (..., N, head_dim) tensors (``table.attention``), by the oneDNN kernels
    where ``limits`` say so, else SDPA. ``weights`` (a probe) is never called: no kernel forms the weights."""
    kernel = _onednn_kernel(q, k, limits) if mask is None else None
    if kernel is _OneDnnAttention:
        return kernel.apply(q, k, v, scale)
    if kernel is _OneDnnChunkedAttention:
        return kernel.apply(q, k, v, scale, limits.attention_chunk_bytes)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
