"""STViT (Super Token Vision Transformer, Huang et al., CVPR 2023) as a dense-prediction backbone.

Parameter names follow the official ``hhb072/STViT`` classification model, so its released ImageNet
checkpoints load unchanged (see ``checkpoint_filter``). Each stage's output is the output of its last
block, before the PatchMerging that starts the next stage: the same tensor the official model computes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..families import Classifier, Family, OfficialCode, PaperFigures, register
from ..ops import table as ops
from .attention_maps import stoken_record
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
)
from .heads import LinearHead, global_pool
from .stvit_ops import conv_ffn, fold3x3, residual_dwconv, unfold3x3

# The released variants (official ``stvit_small/base/large``).
ARCHS = {
    "small": dict(
        embed_dims=[64, 128, 320, 512],
        depths=[3, 5, 9, 3],
        num_heads=[1, 2, 5, 8],
        n_iter=[1, 1, 1, 1],
        stoken_size=[8, 4, 1, 1],
        layerscale=[False] * 4,
        init_values=1e-5,
    ),
    "base": dict(
        embed_dims=[96, 192, 384, 512],
        depths=[4, 6, 14, 6],
        num_heads=[2, 3, 6, 8],
        n_iter=[1, 1, 1, 1],
        stoken_size=[8, 4, 1, 1],
        layerscale=[False, False, True, True],
        init_values=1e-6,
    ),
    "large": dict(
        embed_dims=[96, 192, 448, 640],
        depths=[4, 7, 19, 8],
        num_heads=[2, 3, 7, 10],
        n_iter=[1, 1, 1, 1],
        stoken_size=[8, 4, 1, 1],
        layerscale=[False, False, True, True],
        init_values=1e-6,
    ),
}
# Not a released variant (no weights): the shrunk STViT of the CPU tests, the demo configs and the measuring
# tools' smoke runs. Its one definition: STViT('shrunk'), arch='shrunk' in configs, --arch shrunk in tools.
SHRUNK = dict(
    embed_dims=[32, 64, 128, 256],
    depths=[1, 1, 2, 1],
    num_heads=[1, 2, 4, 8],
    n_iter=[1, 1, 1, 1],
    stoken_size=[8, 4, 1, 1],
    layerscale=[False] * 4,
    init_values=1e-5,
)
_REQUIRED = ("embed_dims", "depths", "num_heads", "n_iter", "stoken_size", "layerscale", "init_values")
_DEFAULTS = dict(mlp_ratio=4, qkv_bias=True)

# Official keys that have no counterpart here: the classification head (proj -> BN -> swish -> head)
# and the constant identity kernels of the conv-based unfold/fold.
SKIPPED_KEY_PATTERNS = (r"^head\.", r"^proj\.", r"^norm\.", r"\.unfold\.weights$", r"\.fold\.weights$")


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over channels of an NCHW tensor (official: permute -> LN(eps=1e-6) -> permute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # On a channels_last map (fast paths) both permutes are free views; else the official copies.
        return ops.to_internal(nchw(F.layer_norm(nhwc(x), self.normalized_shape, self.weight, self.bias, self.eps)))


class GELU(nn.GELU):
    """nn.GELU through ``ops.gelu`` (on the fast paths a channels_last map goes through its NHWC view)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gelu(x, approximate=self.approximate)


class _LayerNorm2dWrapper(nn.Module):
    # Keeps the official key layout ``norm1.norm.weight``.
    def __init__(self, dim: int):
        super().__init__()
        self.norm = LayerNorm2d(dim, eps=1e-6)

    def forward(self, x):
        return self.norm(x)


class ResDWC(nn.Module):
    """x + depthwise 3x3 conv(x): STViT's convolutional position encoding."""

    fusable = True  # conv_ffn may fuse this forward into the MLP's kernels (this class only, not subclasses)

    def __init__(self, dim: int, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size, 1, kernel_size // 2, groups=dim)

    def forward(self, x):
        return residual_dwconv(self.conv, x)  # x + conv(x)


class Mlp(nn.Module):
    """STViT's ConvFFN: 1x1 conv, GELU, residual depthwise conv (``ResDWC``), 1x1 conv."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act1 = GELU()
        self.conv = ResDWC(hidden, 3)
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_ffn(x, self.fc1, self.act1, self.conv, self.fc2)  # fc2(conv(act1(fc1(x))))


class Attention(nn.Module):
    """Multi-head self-attention over all positions of an NCHW map (official qkv channel layout: heads,
    [q|k|v], head_dim)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"STViT: embed dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=qkv_bias)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.attn_weights = Probe()  # the attention weights softmax(q k^T * scale) (B, heads, N, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        nh = self.num_heads
        # (B, heads, H*W, head_dim) each; views with a contiguous head_dim on a channels_last map
        q, k, v = nhwc(self.qkv(x)).reshape(B, H * W, nh, 3, C // nh).permute(3, 0, 2, 1, 4).unbind(0)
        out = ops.attention(q, k, v, self.scale, weights=self.attn_weights)
        return self.proj(ops.to_internal(nchw(out.transpose(1, 2).reshape(B, H, W, C))))


class StokenAttention(nn.Module):
    """Super token attention: sparse pixel-to-super-token association, self-attention among super
    tokens, and upsampling back to pixels: the paper's three steps, super token sampling (STS), super token
    attention (STA) and token upsampling (TU) (official ``StokenAttention``)."""

    def __init__(self, dim: int, stoken_size: Sequence[int], n_iter: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.n_iter = n_iter
        self.stoken_size = tuple(stoken_size)
        self.scale = dim**-0.5
        self.stoken_refine = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.association = Probe()  # Q (B, hh*ww, h*w, 9): each pixel's softmax over its 9 nearest super tokens

    def forward(self, x):
        if self.stoken_size[0] > 1 or self.stoken_size[1] > 1:
            return self.stoken_forward(x)
        return self.stoken_refine(x)

    def stoken_forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H0, W0 = x.shape
        h, w = self.stoken_size
        x = pad_to_multiple(x, (h, w))  # zero-pad right/bottom to whole super tokens, cropped at the end
        H, W = x.shape[-2:]
        hh, ww = H // h, W // w
        # STS: the association Q and the super tokens S = column-normalised Q^T X
        affinity, stokens = self.sample(x, hh, ww)
        # STA: multi-head self-attention among the super tokens
        stokens = self.stoken_refine(ops.to_internal(nchw(stokens)))
        # TU: token upsampling X = Q S, each pixel a mix of the 9 super tokens around its grid cell
        pixels = affinity @ unfold3x3(nhwc(stokens))  # (B, hh*ww, h*w, C)
        pixels = nchw(pixels.reshape(B, hh, ww, h, w, C).transpose(2, 3).reshape(B, H, W, C))
        return ops.to_internal(pixels[:, :, :H0, :W0])

    @ops.in_float32  # the association normaliser affinity_sum + 1e-12 underflows in float16
    def sample(self, x: torch.Tensor, hh: int, ww: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Super token sampling: the association Q (B, hh*ww, h*w, 9) of every pixel of x (B, C, hh*h, ww*w)
        with the 9 super tokens around its grid cell, and the super tokens S (B, hh, ww, C) of the last
        iteration, each the affinity-weighted mean of the pixels of its 3x3 neighbourhood of grid cells."""
        B, C, _, _ = x.shape
        h, w = self.stoken_size
        # pixels: (B, super tokens, pixels of its grid cell, C)
        pixels = nhwc(x).reshape(B, hh, h, ww, w, C).transpose(2, 3).reshape(B, hh * ww, h * w, C)
        affinity, affinity_sum = self.associate(pixels, hh, ww)
        affinity = self.association(affinity)
        stokens = fold3x3(affinity.transpose(-1, -2) @ pixels, hh, ww) / (affinity_sum + 1e-12)
        return affinity, stokens

    def associate(self, pixels: torch.Tensor, hh: int, ww: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The association iterations, without gradient (as in the official code; gradients reach the super
        tokens through ``pixels`` only): Q (B, hh*ww, h*w, 9) after ``n_iter`` iterations, and Q's column sums
        (B, hh, ww, 1)."""
        B, _, _, C = pixels.shape
        with torch.no_grad():
            stokens = pixels.mean(2).reshape(B, hh, ww, C)  # initial super tokens: the mean of each grid cell
            for idx in range(self.n_iter):
                # association: Q^t = softmax(X S^(t-1)^T / sqrt(d)) over the 9 neighbouring super tokens
                affinity = (pixels @ unfold3x3(stokens).transpose(-1, -2) * self.scale).softmax(-1)
                affinity_sum = fold3x3(affinity.sum(2).unsqueeze(-1), hh, ww)
                if idx < self.n_iter - 1:  # super-token update: S^t = column-normalised Q^t^T X
                    stokens = fold3x3(affinity.transpose(-1, -2) @ pixels, hh, ww) / (affinity_sum + 1e-12)
        return affinity, affinity_sum


class StokenAttentionLayer(nn.Module):
    def __init__(self, dim, n_iter, stoken_size, num_heads, mlp_ratio, qkv_bias, drop_path, layerscale, init_values):
        super().__init__()
        self.layerscale = layerscale
        self.pos_embed = ResDWC(dim, 3)
        self.norm1 = _LayerNorm2dWrapper(dim)
        self.attn = StokenAttention(dim, stoken_size, n_iter, num_heads, qkv_bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.BatchNorm2d(dim)
        self.mlp2 = Mlp(dim, int(dim * mlp_ratio))
        if layerscale:
            self.gamma_1 = nn.Parameter(init_values * torch.ones(1, dim, 1, 1))
            self.gamma_2 = nn.Parameter(init_values * torch.ones(1, dim, 1, 1))

    def forward(self, x):
        x = self.pos_embed(x)
        if self.layerscale:
            x = x + self.drop_path(self.gamma_1 * self.attn(self.norm1(x)))
            return x + self.drop_path(self.gamma_2 * self.mlp2(self.norm2(x)))
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp2(self.norm2(x)))


def _conv_bn(cin, cout, stride, act=True):
    layers = [nn.Conv2d(cin, cout, 3, stride, 1)]
    return layers + ([GELU()] if act else []) + [nn.BatchNorm2d(cout)]


class PatchEmbed(nn.Module):
    """Stride-4 convolutional stem (official key layout ``patch_embed.proj.{0..11}``)."""

    def __init__(self, dim: int):
        super().__init__()
        half = dim // 2
        self.proj = nn.Sequential(
            *_conv_bn(3, half, 2), *_conv_bn(half, half, 1), *_conv_bn(half, dim, 2), *_conv_bn(dim, dim, 1)
        )

    def forward(self, x):
        return ops.dense_conv(self.proj, x)


class PatchMerging(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.proj = nn.Sequential(*_conv_bn(cin, cout, 2, act=False))

    def forward(self, x):
        return ops.dense_conv(self.proj, x)


class _Layer(nn.Module):
    """One official ``BasicLayer``: the stage's blocks and the downsample that starts the next stage."""

    def __init__(self, blocks: nn.ModuleList, downsample: nn.Module | None):
        super().__init__()
        self.blocks = blocks
        self.downsample = downsample


def _check_stoken_size(stoken_size) -> list:
    """``stoken_size`` as a list of 4 entries, each a positive int or an (h, w) pair of them; anything else (0,
    negative sizes, a triple, a string) is refused here rather than running as another model or failing deep
    inside the forward."""

    def size_ok(s) -> bool:
        return isinstance(s, int) and not isinstance(s, bool) and s > 0

    entries = list(stoken_size) if isinstance(stoken_size, Sequence) and not isinstance(stoken_size, str) else None
    if (
        entries is None
        or len(entries) != NUM_STAGES
        or not all(
            size_ok(s) or (isinstance(s, Sequence) and len(s) == 2 and all(size_ok(v) for v in s)) for s in entries
        )
    ):
        raise ValueError(
            f"STViT stoken_size must list {NUM_STAGES} super-token sizes, one per stage, each a positive int or an "
            f"(h, w) pair of them (1 = global attention), e.g. [8, 4, 2, 1]; got {stoken_size!r}"
        )
    return entries


class STViT(StagedBackbone):
    """STViT feature extractor returning the stride 4/8/16/32 stage outputs selected by ``out_indices``.

    Args:
        arch: 'small' | 'base' | 'large' | 'shrunk' (tests and demos) or a dict with keys embed_dims, depths,
            num_heads, n_iter, stoken_size, layerscale, init_values (optional mlp_ratio=4, qkv_bias=True).
        stoken_size: per-stage super-token sizes overriding the arch's (e.g. for dense inputs); an
            entry of 1 means plain global self-attention in that stage; an entry may be an (h, w) pair.
        out_indices, drop_path_rate, with_cp, frozen_stages, norm_eval, pretrained, norm_out: as in
            ``StagedBackbone`` (the output norm is a LayerNorm).
    """

    family = "stvit"
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
        stoken_size: Sequence[int | Sequence[int]] | None = None,
        norm_out: bool = False,
    ):
        super().__init__()
        arch = resolve_arch(arch, {**ARCHS, "shrunk": SHRUNK}, "STViT", _REQUIRED, _DEFAULTS)
        if stoken_size is not None:
            arch["stoken_size"] = _check_stoken_size(stoken_size)
        check_arch_lengths(arch, ("embed_dims", "depths", "num_heads", "n_iter", "stoken_size", "layerscale"), "STViT")
        _check_stoken_size(arch["stoken_size"])
        for dim, heads in zip(arch["embed_dims"], arch["num_heads"]):
            if dim % heads:
                raise ValueError(f"STViT arch: embed dim {dim} is not divisible by its num_heads {heads}")
        self._setup_options(arch, out_indices, frozen_stages, norm_eval, with_cp)
        dims = arch["embed_dims"]

        self.patch_embed = PatchEmbed(dims[0])
        dpr = drop_path_rates(drop_path_rate, arch["depths"])
        self.layers = nn.ModuleList()
        for i in range(NUM_STAGES):
            size = arch["stoken_size"][i]
            size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
            blocks = nn.ModuleList(
                [
                    StokenAttentionLayer(
                        dims[i],
                        arch["n_iter"][i],
                        size,
                        arch["num_heads"][i],
                        arch["mlp_ratio"],
                        arch["qkv_bias"],
                        dpr[i][j],
                        arch["layerscale"][i],
                        arch["init_values"],
                    )
                    for j in range(arch["depths"][i])
                ]
            )
            downsample = PatchMerging(dims[i], dims[i + 1]) if i < NUM_STAGES - 1 else None
            self.layers.append(_Layer(blocks, downsample))
        entries = ["patch_embed"] + [f"layers.{i}.downsample" for i in range(NUM_STAGES - 1)]
        self._setup_outputs(
            dims, "layers.{stage}.blocks.{block}", entries, norm_out, lambda c: LayerNorm2d(c, eps=1e-6)
        )
        self._finish(pretrained)

    # freezing (see StagedBackbone.frozen_modules)
    def stem_modules(self):
        return [self.patch_embed]

    def stage_modules(self, i):
        mods = [self.layers[i].blocks]
        return ([self.layers[i - 1].downsample] if i > 0 else []) + mods

    def forward(self, x):
        return self.forward_stages(x, self.out_indices)

    def forward_stages(self, x, indices: Sequence[int], until: int = NUM_STAGES - 1) -> tuple[torch.Tensor, ...]:
        """The outputs of the stages ``indices`` (sorted), running stages 0..``until`` only."""
        check_input(x, "STViT", self._stem_dtype())
        x = self.patch_embed(x)  # channels_last with fast paths on (ops.dense_conv, see backbones/ops/table.py)
        outs = []
        for i in range(until + 1):
            layer = self.layers[i]
            x = self._run_blocks(layer.blocks, x, i)
            if i in indices:
                outs.append(self._output(i, x))
            if i < until and layer.downsample is not None:
                x = layer.downsample(x)
        return tuple(outs)


class ClassifierHead(LinearHead):
    """The official classification head: 1x1 conv to ``projection`` channels, BatchNorm, swish, then global pool,
    dropout and linear (official keys ``proj.``, ``norm.``, ``head.``)."""

    def __init__(self, channels, num_classes=1000, pool_type="avg", drop_rate=0.0, projection=1024):
        super().__init__(projection, num_classes, pool_type, drop_rate)
        self.proj = nn.Conv2d(channels, projection, 1)
        self.norm = nn.BatchNorm2d(projection)

    def pre_logits(self, x):
        return global_pool(F.silu(self.norm(self.proj(x))), self.pool_type)


# --- the family record (backbones.families) -------------------------------------------------------------
def _attention_modules(model: STViT) -> dict:
    return {(i, j): blk.attn for i, layer in enumerate(model.layers) for j, blk in enumerate(layer.blocks)}


def _stoken_stages(model: STViT) -> list[int]:
    """The stages with super tokens larger than a pixel: only they have an association map."""
    sizes = [s if isinstance(s, (list, tuple)) else (s,) for s in model.arch["stoken_size"]]
    return [i for i, s in enumerate(sizes) if max(s) > 1]


_IDENTITY_KERNEL_SHAPE = (9, 1, 3, 3)  # the official Unfold/Fold: torch.eye(9).reshape(9, 1, 3, 3)


def _official_extras(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The constant identity kernels of the official conv-based Unfold / Fold
    (``layers.i.blocks.j.attn.{unfold,fold}.weights``) of every block of ``sd``."""
    blocks = sorted({m.group(0) for k in sd if (m := re.match(r"layers\.\d+\.blocks\.\d+\.attn\.", k))})
    if not blocks:
        raise ValueError("No STViT attention blocks (layers.i.blocks.j.attn.*) in the state dict.")
    eye = torch.eye(9).reshape(_IDENTITY_KERNEL_SHAPE)
    return {b + name: eye.clone() for b in blocks for name in ("unfold.weights", "fold.weights")}


def _official_build(builder, options):
    model = builder(SimpleNamespace(drop=0.0, drop_path=0.0))  # its training script's args
    for layer, size in zip(model.layers, options.get("stoken_size") or ()):
        for block in layer.blocks:  # read at every forward: the same switch as our stoken_size argument
            block.attn.stoken_size = (size, size)
    return model


def _official_stages(model, x):
    return model.pos_drop(model.patch_embed(x)), [(layer.blocks, layer.downsample) for layer in model.layers]


def _head_cost(channels: int) -> tuple[int, int]:
    """1x1 conv to 1024 + BN + linear to 1000 at 7x7."""
    return channels * 1024 + 1024 + 2 * 1024 + 1024 * 1000 + 1000, channels * 1024 * 49 + 1024 * 1000


FAMILY = register(
    Family(
        name="stvit",
        cls=STViT,
        type_name="STViT",
        title="STViT",
        sizes={**ARCHS, "shrunk": SHRUNK},
        released=tuple(ARCHS),
        key_pattern=re.compile(r"^layers\.\d+\.blocks\.\d+\.|^patch_embed\.proj\.\d+\."),
        signature_keys=("layers.{}.blocks.0.pos_embed.conv.weight", r"^layers\.{}\.blocks\.(\d+)\."),
        attention_modules=_attention_modules,
        probes={"association": stoken_record},
        picture="stoken",
        attention_stages=_stoken_stages,
        no_map_reason="stoken_size 1 there (plain global attention, no super tokens)",
        official_extras=_official_extras,
        official=OfficialCode(
            repo="hhb072/STViT (models/stvit.py)",
            classes=("STViT", "StokenAttention"),
            prefix="stvit_",
            build=_official_build,
            stages=_official_stages,
        ),
        options=frozenset({"stoken_size"}),
        head_cost=_head_cost,
        classifier=Classifier(
            first_conv="patch_embed.proj.0",
            license="mit",
            head=ClassifierHead,
            head_args={"projection": 1024},
            official_keys={"proj.": "head.proj.", "norm.": "head.norm.", "head.": "head.fc."},
            # the releases are files in a shared Google Drive folder (stvit-small-224.pth, ...): no direct URL
            weights={variant: "" for variant in ARCHS},
            origin_url="https://github.com/hhb072/STViT",
            paper_ids="arXiv:2211.11167",
        ),
        report_variant="small",
        # the COCO configs' super-token sizes (their `dense_stoken_size`; tests/test_perf_models.py keeps them equal)
        settings={"dense": {"stoken_size": (8, 4, 2, 1)}},
        paper={  # arXiv:2211.11167; throughput in images/s on the paper's GPU
            "small": PaperFigures(25, 4.4, 677),
            "base": PaperFigures(52, 9.9, 361),
            "large": PaperFigures(95, 15.6, 269),
        },
    )
)
