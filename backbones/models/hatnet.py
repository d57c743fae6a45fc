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
import re
from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..families import Classifier, Family, OfficialCode, PaperFigures, register
from ..ops import table as ops
from .attention_maps import global_record, window_record
from .base import (
    NUM_STAGES,
    DropPath,
    Probe,
    StagedBackbone,
    check_arch_lengths,
    check_input,
    drop_path_rates,
    nchw,
    nhwc,
    pad_to_multiple,
    resolve_arch,
    shape_dependent_branches_traced,
)
from .hatnet_ops import inverted_residual
from .heads import LinearHead

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
# Not a released variant (no weights): the shrunk HAT-Net of the CPU tests, the demo configs and the measuring
# tools' smoke runs. Its one definition: HATNet('shrunk'), arch='shrunk' in configs, --arch shrunk in tools.
SHRUNK = dict(
    dims=[32, 64, 128, 256],
    head_dim=32,
    expansions=[4, 4, 4, 4],
    depths=[1, 1, 2, 1],
    kernel_sizes=[3, 3, 3, 3],
    **_GRIDS,
)
_REQUIRED = ("dims", "head_dim", "expansions", "grid_sizes", "ds_ratios", "depths", "kernel_sizes")

SKIPPED_KEY_PATTERNS = (r"^classifier\.",)


def _gn(dim: int) -> nn.GroupNorm:
    return nn.GroupNorm(1, dim, eps=1e-6)


class InvertedResidual(nn.Module):
    """GroupNorm, 1x1 conv, SiLU, depthwise conv, SiLU, 1x1 conv, GroupNorm, in the official three Sequentials
    (their keys: ``conv1.0`` ... ``conv3.1``)."""

    def __init__(self, dim: int, hidden: int, kernel_size: int):
        super().__init__()
        self.conv1 = nn.Sequential(_gn(dim), nn.Conv2d(dim, hidden, 1, bias=False), nn.SiLU())
        self.conv2 = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel_size, padding=(kernel_size - 1) // 2, groups=hidden, bias=False), nn.SiLU()
        )
        self.conv3 = nn.Sequential(nn.Conv2d(hidden, dim, 1, bias=False), _gn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm1, expand, act1 = self.conv1
        dwconv, act2 = self.conv2
        project, norm2 = self.conv3
        return norm2(inverted_residual(norm1(x), expand, act1, dwconv, act2, project))


def _heads(t: torch.Tensor, parts: int, num_heads: int) -> tuple[torch.Tensor, ...]:
    """(B, parts * C, H, W) with channels (part, head, head_dim) -> ``parts`` tensors (B, heads, H*W, head_dim)
    (views with a contiguous head_dim on a channels_last map)."""
    B, C, H, W = t.shape
    # no -1: it is ambiguous for an empty batch
    return nhwc(t).reshape(B, H * W, parts, num_heads, C // (parts * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)


def _merge_heads(t: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(B, heads, H*W, head_dim) -> (B, heads * head_dim, H, W) in the internal layout."""
    return ops.to_internal(nchw(t.transpose(1, 2).reshape(t.shape[0], H, W, t.shape[1] * t.shape[3])))


def _window_padding_mask(size: tuple[int, int], windows: tuple[int, int], g: int, device) -> torch.Tensor | None:
    """(1, windows, 1, g*g) boolean: the keys of each g x g window (``windows`` (gh, gw) of them, row-major)
    inside the map of ``size`` (H, W); None when the windows tile the map (except while tracing: the export
    keeps the general branch)."""
    (H, W), (gh, gw) = size, windows
    if not (shape_dependent_branches_traced() or H % g or W % g):
        return None
    valid = (torch.arange(gh * g, device=device) < H)[:, None] & (torch.arange(gw * g, device=device) < W)[None, :]
    return valid.reshape(gh, g, gw, g).permute(0, 2, 1, 3).reshape(1, gh * gw, 1, g * g)


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
        # the global attention weights (B, heads, H*W, keys): over the pooled map, or all positions
        self.global_weights = Probe()
        if grid_size > 1:
            self.grid_norm = _gn(dim)
            self.ds_norm = _gn(dim)
            self.q = nn.Conv2d(dim, dim, 1)
            self.kv = nn.Conv2d(dim, dim * 2, 1)
            self.window_weights = Probe()  # (B * heads, windows, g*g, g*g): the attention inside each window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        qkv = self.qkv(self.norm(x))
        if self.grid_size > 1:
            # local: attention inside each grid_size x grid_size window
            grid_x = self.grid_norm(x + self._window_attention(qkv))
            # global: every position attends to the ds_ratio-pooled map (ceil_mode: a partial border cell is
            # averaged over its valid pixels; no effect when the size divides)
            (q,) = _heads(self.q(grid_x), 1, self.num_heads)
            pooled = F.avg_pool2d(grid_x, self.ds_ratio, self.ds_ratio, ceil_mode=True)
            k, v = _heads(self.kv(self.ds_norm(pooled)), 2, self.num_heads)
        else:
            q, k, v = _heads(qkv, 3, self.num_heads)
        out = _merge_heads(ops.attention(q, k, v, self.scale, weights=self.global_weights), H, W)
        if self.grid_size > 1:
            out = out + grid_x
        return self.proj(out)

    def _window_attention(self, qkv: torch.Tensor) -> torch.Tensor:
        # channel = (q|k|v, head, head_dim) as official
        B, _, H, W = qkv.shape
        g, nh, hd = self.grid_size, self.num_heads, self.head_dim
        windows = pad_to_multiple(nhwc(qkv), (g, g), dims=(1, 2))  # partial border windows zero-padded
        gh, gw = windows.shape[1] // g, windows.shape[2] // g
        windows = windows.reshape(B, gh, g, gw, g, 3, nh, hd).permute(5, 0, 6, 1, 3, 2, 4, 7)
        q, k, v = windows.reshape(3, B * nh, gh * gw, g * g, hd).unbind(0)
        mask = _window_padding_mask((H, W), (gh, gw), g, qkv.device)  # keys in the padding receive no attention
        out = ops.attention(q, k, v, self.scale, mask, weights=self.window_weights)
        out = out.reshape(B, nh, gh, gw, g, g, hd).permute(0, 2, 4, 3, 5, 1, 6)
        return ops.to_internal(nchw(out.reshape(B, gh * g, gw * g, nh * hd)[:, :H, :W]))


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
        return self.norm(ops.dense_conv(self.conv, x))


class HATNet(StagedBackbone):
    """HAT-Net feature extractor returning the stride 4/8/16/32 stage outputs selected by ``out_indices``.

    Args:
        arch: 'tiny' | 'small' | 'medium' | 'large' | 'shrunk' (tests and demos) or a dict with keys dims,
            head_dim, expansions, grid_sizes, ds_ratios, depths, kernel_sizes.
        norm_eval: HAT-Net has GroupNorms only, so this has no effect (kept for mm config compatibility).
        out_indices, drop_path_rate, with_cp, frozen_stages, pretrained, norm_out: as in ``StagedBackbone``
            (the output norm is a GroupNorm).
    """

    family = "hatnet"
    archs = ARCHS
    skipped_key_patterns = SKIPPED_KEY_PATTERNS

    def __init__(
        self,
        arch: str | dict = "small",
        out_indices: Sequence[int] = (0, 1, 2, 3),
        drop_path_rate: float = 0.0,
        with_cp: bool | Sequence[bool] = False,
        frozen_stages: int = -1,
        norm_eval: bool = False,
        pretrained: str | os.PathLike | Mapping | None = None,
        norm_out: bool = False,
    ):
        super().__init__()
        arch = resolve_arch(arch, {**ARCHS, "shrunk": SHRUNK}, "HAT-Net", _REQUIRED, {})
        check_arch_lengths(arch, ("dims", "expansions", "grid_sizes", "ds_ratios", "depths", "kernel_sizes"), "HAT-Net")
        bad = [d for d in arch["dims"] if d % arch["head_dim"]]
        if bad:
            raise ValueError(f"HAT-Net arch: dims {bad} are not divisible by head_dim {arch['head_dim']}")
        self._setup_options(arch, out_indices, frozen_stages, norm_eval, with_cp)
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
        self._setup_outputs(dims, "blocks.{stage}.{block}", ["patch_embed", "ds2", "ds3", "ds4"], norm_out, _gn)
        self.apply(self._init_weights)
        self._finish(pretrained)

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

    def plain_size_problem(self, height: int, width: int) -> str | None:
        # the literal formulation, like the official code, has no partial border windows
        strides = [4 * 2**i for i in range(NUM_STAGES)]
        grids, maps = self.arch["grid_sizes"], [(-(-height // s), -(-width // s)) for s in strides]
        if any(h % g or w % g for (h, w), g in zip(maps, grids)):
            return f"stage maps not divisible by the grids {grids}"
        return None

    def stage_modules(self, i):
        return ([self._downsamples()[i]] if i > 0 else []) + [self.blocks[i]]

    def forward(self, x):
        return self.forward_stages(x, self.out_indices)

    def forward_stages(self, x, indices: Sequence[int], until: int = NUM_STAGES - 1) -> tuple[torch.Tensor, ...]:
        """The outputs of the stages ``indices`` (sorted), running stages 0..``until`` only."""
        check_input(x, "HATNet", self._stem_dtype())
        x = ops.dense_conv(self.patch_embed, x)  # channels_last with fast paths on (see backbones/ops/table.py)
        outs = []
        for i, ds in enumerate(self._downsamples()[: until + 1]):
            if ds is not None:
                x = ds(x)
            x = self._run_blocks(self.blocks[i], x, i)
            if i in indices:
                outs.append(self._output(i, x))
        return tuple(outs)


# --- the family record (backbones.families) -------------------------------------------------------------
def _attention_modules(model: HATNet) -> dict:
    return {(i, j): blk.attn for i, stage in enumerate(model.blocks) for j, blk in enumerate(stage)}


def _official_stages(model, x):
    return model.patch_embed(x), list(zip(model.blocks, (model.ds2, model.ds3, model.ds4, None)))


def _head_cost(channels: int) -> tuple[int, int]:
    """A linear layer to 1000 classes."""
    return channels * 1000 + 1000, channels * 1000


FAMILY = register(
    Family(
        name="hatnet",
        cls=HATNet,
        type_name="HATNet",
        title="HAT-Net",
        sizes={**ARCHS, "shrunk": SHRUNK},
        released=tuple(ARCHS),
        key_pattern=re.compile(r"^blocks\.\d+\.\d+\.|^ds[234]\.conv\."),
        signature_keys=("blocks.{}.0.attn.proj.weight", r"^blocks\.{}\.(\d+)\."),
        attention_modules=_attention_modules,
        probes={"window_weights": window_record, "global_weights": global_record},
        picture="hat",
        official=OfficialCode(
            repo="yun-liu/HAT-Net (HAT_Net.py)",
            classes=("HAT_Net",),
            prefix="HAT_Net_",
            build=lambda builder, options: builder(),
            stages=_official_stages,
        ),
        head_cost=_head_cost,
        classifier=Classifier(
            first_conv="patch_embed.0",
            head=LinearHead,
            official_keys={"classifier.1.": "head.fc."},
            drop_rate=0.2,
            weights={
                v: f"https://github.com/yun-liu/HAT-Net/releases/download/v2.0/HAT-Net_{v.title()}.pth" for v in ARCHS
            },
            origin_url="https://github.com/yun-liu/HAT-Net",
            paper_ids="arXiv:2106.03180",
        ),
        report_variant="small",
        paper={  # arXiv:2106.03180: parameters and GMACs of the classification models
            "tiny": PaperFigures(12.7, 2.0),
            "small": PaperFigures(25.7, 4.3),
            "medium": PaperFigures(42.9, 8.3),
            "large": PaperFigures(63.1, 11.5),
        },
    )
)
