"""HAT-Net (Vision Transformers with Hierarchical Attention, Liu et al.) as a dense-prediction backbone.

Parameter names follow the official ``yun-liu/HAT-Net`` classification model, so its released ImageNet
checkpoints load unchanged. Each stage's output is the output of its last block, before the ``ds{i}``
downsample that starts the next stage.

Sizes. The official model only runs when every stage's height and width divide by its grid (window)
size. Here a stage whose size does not divide is handled without changing any value at sizes that do:
windows at the right/bottom border are partial (zero-padded, and the padded positions are masked out
of the window attention), and the pooled keys/values of the global attention average a partial border
cell over its valid pixels (``ceil_mode``). So every valid output position depends on valid positions
only; the only effect of padding is that border windows hold fewer pixels than ``grid_size**2``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import _fast_paths
from ._attention import attention
from ._common import (
    NUM_STAGES,
    DropPath,
    StagedBackbone,
    check_arch_lengths,
    check_input,
    check_out_indices,
    drop_path_rates,
    internal_layout,
    nchw,
    nhwc,
    resolve_arch,
    shape_dependent_branches_traced,
)
from ._kernels import row_chunked
from .attention_maps import attention_probs, recorder_for
from .pretrained import load_pretrained

_GRIDS = dict(grid_sizes=[8, 7, 7, 1], ds_ratios=[8, 4, 2, 1])
# The released variants (official ``HAT_Net_tiny/small/medium/large``).
ARCHS = {
    "tiny": dict(
        dims=[48, 96, 240, 384],
        head_dim=48,
        expansions=[8, 8, 4, 4],
        depths=[2, 2, 6, 3],
        kernel_sizes=[3, 3, 3, 3],
        **_GRIDS,
    ),
    "small": dict(
        dims=[64, 128, 320, 512],
        head_dim=64,
        expansions=[8, 8, 4, 4],
        depths=[2, 3, 8, 3],
        kernel_sizes=[3, 3, 3, 3],
        **_GRIDS,
    ),
    "medium": dict(
        dims=[64, 128, 320, 512],
        head_dim=64,
        expansions=[8, 8, 4, 4],
        depths=[3, 6, 18, 3],
        kernel_sizes=[5, 3, 5, 3],
        **_GRIDS,
    ),
    "large": dict(
        dims=[64, 128, 320, 640],
        head_dim=64,
        expansions=[8, 8, 4, 4],
        depths=[3, 8, 27, 3],
        kernel_sizes=[3, 3, 3, 3],
        **_GRIDS,
    ),
}
_REQUIRED = ("dims", "head_dim", "expansions", "grid_sizes", "ds_ratios", "depths", "kernel_sizes")

SKIPPED_KEY_PATTERNS = (r"^classifier\.",)


def _gn(dim: int) -> nn.GroupNorm:
    return nn.GroupNorm(1, dim, eps=1e-6)


class InvertedResidual(nn.Module):
    def __init__(self, dim: int, hidden: int, kernel_size: int):
        super().__init__()
        self.conv1 = nn.Sequential(_gn(dim), nn.Conv2d(dim, hidden, 1, bias=False), nn.SiLU())
        self.conv2 = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel_size, padding=(kernel_size - 1) // 2, groups=hidden, bias=False), nn.SiLU()
        )
        self.conv3 = nn.Sequential(nn.Conv2d(hidden, dim, 1, bias=False), _gn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fast_paths.enabled():
            # the GroupNorms see whole maps; what lies between them is row-local and computed in row chunks
            convs = (self.conv1[1], self.conv2[0], self.conv3[0])
            return self.conv3[1](row_chunked(self._between_norms, self.conv1[0](x), convs, self.conv1[1].out_channels))
        return self.conv3(self.conv2(self.conv1(x)))

    def _between_norms(self, x: torch.Tensor) -> torch.Tensor:  # 1x1 conv, SiLU, depthwise conv, SiLU, 1x1 conv
        return self.conv3[0](self.conv2(self.conv1[2](self.conv1[1](x))))


class Attention(nn.Module):
    """Hierarchical multi-head self-attention: attention inside grid_size x grid_size windows, then
    global attention from every position to the ds_ratio-pooled map; grid_size 1 = plain global MHSA."""

    def __init__(self, dim: int, head_dim: int, grid_size: int, ds_ratio: int):
        super().__init__()
        self.num_heads, self.head_dim = dim // head_dim, head_dim
        self.scale = head_dim**-0.5
        self.grid_size, self.ds_ratio = grid_size, ds_ratio
        self.norm = _gn(dim)
        self.qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)
        # Defined but never used in the official forward; kept so official checkpoints load 1:1, and
        # frozen so that DDP does not wait for gradients that never come.
        self.proj_norm = _gn(dim)
        self.proj_norm.requires_grad_(False)
        if grid_size > 1:
            self.grid_norm = _gn(dim)
            self.ds_norm = _gn(dim)
            self.q = nn.Conv2d(dim, dim, 1)
            self.kv = nn.Conv2d(dim, dim * 2, 1)

    def _window_attention(self, qkv: torch.Tensor) -> torch.Tensor:
        # channel = (q|k|v, head, head_dim) as official; with fast paths on, qkv is channels_last and its NHWC
        # view contiguous.
        B, _, H, W = qkv.shape
        g, nh, hd = self.grid_size, self.num_heads, self.head_dim
        pad_b, pad_r = (-H) % g, (-W) % g
        qkv = nhwc(qkv)
        general = bool(pad_b or pad_r) or shape_dependent_branches_traced()
        if general:
            qkv = F.pad(qkv, (0, 0, 0, pad_r, 0, pad_b))
        gh, gw = (H + pad_b) // g, (W + pad_r) // g
        qkv = qkv.reshape(B, gh, g, gw, g, 3, nh, hd).permute(5, 0, 6, 1, 3, 2, 4, 7)
        q, k, v = qkv.reshape(3, B * nh, gh * gw, g * g, hd).unbind(0)
        mask = None
        if general:  # keys in the padding must not receive attention
            valid = (torch.arange(gh * g, device=qkv.device) < H)[:, None] & (
                torch.arange(gw * g, device=qkv.device) < W
            )[None, :]
            mask = valid.reshape(gh, g, gw, g).permute(0, 2, 1, 3).reshape(1, gh * gw, 1, g * g)
        record = recorder_for(self)  # None unless a backbones.attention_maps.record_attention block watches
        if record is not None:
            probs = attention_probs(q, k, self.scale, mask)  # (B * heads, windows, g * g, g * g)
            record(
                kind="hat",
                window_probs=probs.reshape(B, nh, gh * gw, g * g, g * g),
                windows=(gh, gw),
                grid_size=g,
                size=(H, W),
            )
        out = attention(q, k, v, self.scale, mask)
        out = out.reshape(B, nh, gh, gw, g, g, hd).permute(0, 2, 4, 3, 5, 1, 6)
        return internal_layout(nchw(out.reshape(B, gh * g, gw * g, nh * hd)[:, :H, :W]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # With fast paths on, channels_last throughout (see _common): the 1x1 convs are oneDNN NHWC convolutions,
        # and every q/k/v below is a (B, heads, N, head_dim) view with contiguous head_dim, as SDPA wants.
        B, C, H, W = x.shape
        nh, hd = self.num_heads, self.head_dim
        qkv = self.qkv(self.norm(x))
        if self.grid_size > 1:
            grid_x = self.grid_norm(x + self._window_attention(qkv))
            q = nhwc(self.q(grid_x)).reshape(B, H * W, nh, hd).transpose(1, 2)
            # ceil_mode: a partial border cell is averaged over its valid pixels (no effect when divisible)
            pooled = F.avg_pool2d(grid_x, self.ds_ratio, self.ds_ratio, ceil_mode=True)
            k, v = nhwc(self.kv(self.ds_norm(pooled))).reshape(B, -1, 2, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = nhwc(qkv).reshape(B, H * W, 3, nh, hd).permute(2, 0, 3, 1, 4).unbind(0)
        record = recorder_for(self)
        if record is not None:
            record(
                kind="hat",
                global_probs=attention_probs(q, k, self.scale).reshape(B, nh, H * W, -1),
                size=(H, W),
                pooled=tuple(pooled.shape[-2:]) if self.grid_size > 1 else (H, W),
                ds_ratio=self.ds_ratio if self.grid_size > 1 else 1,
            )
        out = internal_layout(nchw(attention(q, k, v, self.scale).transpose(1, 2).reshape(B, H, W, C)))
        if self.grid_size > 1:
            out = out + grid_x
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, dim, head_dim, grid_size, ds_ratio, expansion, drop_path, kernel_size):
        super().__init__()
        self.attn = Attention(dim, head_dim, grid_size, ds_ratio)
        self.conv = InvertedResidual(dim, dim * expansion, kernel_size)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x):
        x = x + self.drop_path(self.attn(x))
        return x + self.drop_path(self.conv(x))


class Downsample(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, stride=2)
        self.norm = _gn(cout)

    def forward(self, x):
        return self.norm(self.conv(x))


class HATNet(StagedBackbone):
    """HAT-Net feature extractor returning the stride 4/8/16/32 stage outputs selected by ``out_indices``.

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large' or a dict with keys dims, head_dim, expansions,
            grid_sizes, ds_ratios, depths, kernel_sizes.
        out_indices: the stages (0-3, strides 4/8/16/32) whose outputs ``forward`` returns, in order.
        drop_path_rate: the largest stochastic-depth rate, reached by the last block (linear rule of the paper).
        with_cp: activation checkpointing of every block in training (less memory, one more forward).
        frozen_stages: -1 freezes nothing; 0 the stem; k the stem and stages 0..k-1 (eval mode, no gradients).
        norm_eval: HAT-Net has GroupNorms only, so this has no effect (kept for mm config compatibility).
        pretrained: a checkpoint path or a loaded checkpoint object, loaded strictly by ``load_pretrained``.
        norm_out: add a GroupNorm to each output (not in the official model; new, untrained weights).
    """

    family = "hatnet"
    archs = ARCHS
    skipped_key_patterns = SKIPPED_KEY_PATTERNS

    def __init__(
        self,
        arch: str | dict = "small",
        out_indices: Sequence[int] = (0, 1, 2, 3),
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        pretrained: str | os.PathLike | Mapping | None = None,
        norm_out: bool = False,
    ):
        super().__init__()
        arch = resolve_arch(arch, ARCHS, "HAT-Net", _REQUIRED, {})
        check_arch_lengths(arch, ("dims", "expansions", "grid_sizes", "ds_ratios", "depths", "kernel_sizes"), "HAT-Net")
        bad = [d for d in arch["dims"] if d % arch["head_dim"]]
        if bad:
            raise ValueError(f"HAT-Net arch: dims {bad} are not divisible by head_dim {arch['head_dim']}")
        self.arch = arch
        self.out_indices = check_out_indices(out_indices)
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp
        dims = arch["dims"]

        self.patch_embed = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, stride=2), _gn(16), nn.SiLU(), nn.Conv2d(16, dims[0], 3, padding=1, stride=2)
        )
        dpr = drop_path_rates(drop_path_rate, arch["depths"])
        self.blocks = nn.ModuleList(
            [
                nn.ModuleList(
                    [
                        Block(
                            dims[i],
                            arch["head_dim"],
                            arch["grid_sizes"][i],
                            arch["ds_ratios"][i],
                            arch["expansions"][i],
                            dpr[i][j],
                            arch["kernel_sizes"][i],
                        )
                        for j in range(arch["depths"][i])
                    ]
                )
                for i in range(NUM_STAGES)
            ]
        )
        self.ds2 = Downsample(dims[0], dims[1])
        self.ds3 = Downsample(dims[1], dims[2])
        self.ds4 = Downsample(dims[2], dims[3])
        self.norm_out = norm_out
        if norm_out:
            self.out_norms = nn.ModuleList(
                [_gn(dims[i]) if i in self.out_indices else nn.Identity() for i in range(NUM_STAGES)]
            )
        depths = arch["depths"]
        self._setup_outputs(
            dims,
            [
                f"out_norms.{i}"
                if norm_out and i in self.out_indices
                else f"blocks.{i}.{depths[i] - 1}"
                if depths[i]
                else f"ds{i + 1}"
                if i
                else "patch_embed"
                for i in range(NUM_STAGES)
            ],
        )
        self.apply(self._init_weights)
        self._freeze()
        if pretrained is not None:
            load_pretrained(self, pretrained)

    @staticmethod
    def _init_weights(m):  # the official initialisation
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def _downsamples(self):
        return [None, self.ds2, self.ds3, self.ds4]

    def stem_modules(self):
        return [self.patch_embed]

    def stage_modules(self, i):
        return ([self._downsamples()[i]] if i > 0 else []) + [self.blocks[i]]

    def forward(self, x):
        check_input(x, "HATNet")
        x = self.patch_embed(internal_layout(x))  # channels_last with fast paths on (see _common)
        outs = []
        for i, ds in enumerate(self._downsamples()):
            if ds is not None:
                x = ds(x)
            x = self._run_blocks(self.blocks[i], x)
            if i in self.out_indices:
                # contiguous NCHW outputs: mmcv's RoIAlign misreads channels_last maps (see STViT)
                outs.append((self.out_norms[i](x) if self.norm_out else x).contiguous())
        return tuple(outs)
