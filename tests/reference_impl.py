"""Plain reference implementations: a literal transcription of the papers' equations, written the way the
official classification code computes them (explicit N x N attention matrices, identity-kernel convolutions
for the 3x3 unfold/fold, no memory-saving tricks). Used by tests and by ``tools/benchmark.py --compare`` as
the baseline, on the very same weights as the fast modules: ``as_reference(model)`` returns a deep copy
whose attention modules run these forwards."""
from __future__ import annotations

import copy
import types

import torch
import torch.nn.functional as F

from backbones import hatnet, stvit


def _mhsa(q, k, v, scale):
    """softmax(q k^T * scale) v with the attention matrix materialised; q, k, v: (..., N, d)."""
    return ((q * scale) @ k.transpose(-2, -1)).softmax(-1) @ v


# ---- STViT ----------------------------------------------------------------------------------------------
def _stvit_attention(self, x):
    B, C, H, W = x.shape
    q, k, v = self.qkv(x).reshape(B, self.num_heads, 3 * C // self.num_heads, H * W).chunk(3, dim=2)
    attn = ((k.transpose(-1, -2) @ q) * self.scale).softmax(dim=-2)  # (B, heads, N_keys, N_queries)
    return self.proj((v @ attn).reshape(B, C, H, W))


_EYE = torch.eye(9).reshape(9, 1, 3, 3)


def _unfold(x):  # identity-kernel convolution, as the official Unfold
    b, c, h, w = x.shape
    return F.conv2d(x.reshape(b * c, 1, h, w), _EYE.to(x), padding=1).reshape(b, c * 9, h * w)


def _fold(x):  # transposed identity-kernel convolution, as the official Fold
    return F.conv_transpose2d(x, _EYE.to(x), padding=1)


def _stvit_stoken_forward(self, x):
    B, C, H0, W0 = x.shape
    h, w = self.stoken_size
    pad_r, pad_b = (w - W0 % w) % w, (h - H0 % h) % h
    if pad_r or pad_b:
        x = F.pad(x, (0, pad_r, 0, pad_b))
    _, _, H, W = x.shape
    hh, ww = H // h, W // w
    stoken = F.adaptive_avg_pool2d(x, (hh, ww))
    pixel = x.reshape(B, C, hh, h, ww, w).permute(0, 2, 4, 3, 5, 1).reshape(B, hh * ww, h * w, C)
    with torch.no_grad():
        for idx in range(self.n_iter):
            stoken = _unfold(stoken).transpose(1, 2).reshape(B, hh * ww, C, 9)
            affinity = (pixel @ stoken * self.scale).softmax(-1)
            affinity_sum = _fold(affinity.sum(2).transpose(1, 2).reshape(B, 9, hh, ww))
            if idx < self.n_iter - 1:
                stoken = pixel.transpose(-1, -2) @ affinity
                stoken = _fold(stoken.permute(0, 2, 3, 1).reshape(B * C, 9, hh, ww)).reshape(B, C, hh, ww)
                stoken = stoken / (affinity_sum + 1e-12)
    stoken = pixel.transpose(-1, -2) @ affinity
    stoken = _fold(stoken.permute(0, 2, 3, 1).reshape(B * C, 9, hh, ww)).reshape(B, C, hh, ww)
    stoken = self.stoken_refine(stoken / (affinity_sum.detach() + 1e-12))
    stoken = _unfold(stoken).transpose(1, 2).reshape(B, hh * ww, C, 9)
    pixel = (stoken @ affinity.transpose(-1, -2)).reshape(B, hh, ww, C, h, w)
    pixel = pixel.permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)
    return pixel[:, :, :H0, :W0]


def _stvit_mlp(self, x):  # 1x1 convolutions as nn.Conv2d on NCHW maps, no recomputation
    return self.fc2(self.conv(self.act1(self.fc1(x))))


def _layer_norm_2d(self, x):  # permute -> LayerNorm -> permute with the official copies
    return F.layer_norm(x.permute(0, 2, 3, 1).contiguous(), self.normalized_shape, self.weight, self.bias,
                        self.eps).permute(0, 3, 1, 2).contiguous()


def _nchw_stem(self, x):  # the official NCHW layout instead of our channels_last
    return torch.nn.Sequential.forward(self, x.contiguous())


# ---- HAT-Net --------------------------------------------------------------------------------------------
def _hatnet_attention(self, x):
    B, C, H, W = x.shape
    nh, hd, g = self.num_heads, self.head_dim, self.grid_size
    qkv = self.qkv(self.norm(x))
    if g > 1:  # sizes must divide by the grid, as in the official code
        gh, gw = H // g, W // g
        qkv = qkv.reshape(B, 3, nh, hd, gh, g, gw, g).permute(1, 0, 2, 4, 6, 5, 7, 3).reshape(3, -1, g * g, hd)
        grid_x = _mhsa(qkv[0], qkv[1], qkv[2], self.scale).reshape(B, nh, gh, gw, g, g, hd)
        grid_x = self.grid_norm(x + grid_x.permute(0, 1, 6, 2, 4, 3, 5).reshape(B, C, H, W))
        q = self.q(grid_x).reshape(B, nh, hd, -1).transpose(-2, -1)
        kv = self.kv(self.ds_norm(F.avg_pool2d(grid_x, self.ds_ratio, self.ds_ratio)))
        k, v = kv.reshape(B, 2, nh, hd, -1).permute(1, 0, 2, 4, 3)
    else:
        q, k, v = qkv.reshape(B, 3, nh, hd, -1).permute(1, 0, 2, 4, 3)
    out = _mhsa(q, k, v, self.scale).transpose(-2, -1).reshape(B, C, H, W)
    return self.proj(out + grid_x if g > 1 else out)


def _hatnet_inverted_residual(self, x):  # the official nn.Sequential chain on the whole map
    return self.conv3(self.conv2(self.conv1(x)))


def as_reference(model):
    """A deep copy of an STViT / HATNet that computes the way the official code does: the literal attention
    above, NCHW maps, and for STViT an MLP without recomputation and permute-copy LayerNorms; no row chunks."""
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(m, stvit.Mlp):
            m.forward = types.MethodType(_stvit_mlp, m)
        elif isinstance(m, stvit.LayerNorm2d):
            m.forward = types.MethodType(_layer_norm_2d, m)
        elif isinstance(m, stvit.PatchEmbed):
            m.proj.forward = types.MethodType(_nchw_stem, m.proj)
        elif isinstance(m, stvit.Attention):
            m.forward = types.MethodType(_stvit_attention, m)
        elif isinstance(m, stvit.StokenAttention):
            m.stoken_forward = types.MethodType(_stvit_stoken_forward, m)
        elif isinstance(m, hatnet.Attention):
            m.forward = types.MethodType(_hatnet_attention, m)
        elif isinstance(m, hatnet.InvertedResidual):
            m.forward = types.MethodType(_hatnet_inverted_residual, m)
    if isinstance(ref, hatnet.HATNet):
        ref.patch_embed.forward = types.MethodType(_nchw_stem, ref.patch_embed)
    return ref


def outputs_and_grads(model, ref, x):
    """Run ``model`` and its reference on x and backpropagate the same random weighting of their outputs
    (with a plain sum some gradients are analytically zero, e.g. through HAT-Net's last GroupNorm, and
    comparing rounding noise relative to its own scale is meaningless). Returns the two output tuples and
    (name, grad, reference grad) for every parameter of ``model``."""
    outs, ref_outs = model(x), ref(x)
    weights = [torch.randn_like(o) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    sum((o * w).sum() for o, w in zip(ref_outs, weights)).backward()
    grads = [(n, p.grad, q.grad) for (n, p), q in zip(model.named_parameters(), ref.parameters())]
    return outs, ref_outs, grads
