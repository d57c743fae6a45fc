"""The models the benchmarks measure, built by name: ours, ours on the plain path (``reference``), the official
code (``official``, from a file that ``perf.official.load_official`` reads), Swin-T and ResNet-50.

Every model returns its four stage outputs as NCHW maps. Only ``swin-t`` without mmdet and ours need no mm
package (tools/gpu_report.py runs on a machine that has none).
"""

from __future__ import annotations

import dataclasses
import importlib

import torch
from torch import nn

from backbones import FAMILIES, create, fast_paths, load_pretrained
from backbones.families import get

__all__ = ["NAMES", "Setting", "build", "family_options", "model_for", "model_and_input", "ours_and_official"]
BASELINES = ("reference", "swin-t", "resnet50")
NAMES = ("ours", "official", *BASELINES)


class PlainPath(nn.Module):
    """The wrapped backbone computing its plain formulation (``backbones.fast_paths(False)``): explicit N x N
    attention, identity-kernel convolutions for unfold/fold, the official NCHW layout, no row chunks or
    recomputation; the official code's arithmetic.

    Args:
        backbone: the model to run on its plain path (its weights are shared, not copied).
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        with fast_paths(False):
            return self.backbone(x)


def build(
    name: str,
    family: str = "stvit",
    arch=None,
    options=None,
    with_cp: bool = False,
    size=None,
    official=None,
) -> nn.Module:
    """One model of ``NAMES``, seeded (the same weights for ``ours`` and ``reference``), on the CPU.

    Args:
        name: ``ours``, ``reference`` (ours on its plain path), ``official`` (the official classification
            model's stages), ``swin-t`` or ``resnet50``.
        family: a registered family (``backbones.FAMILIES``: ``stvit``, ``hatnet``) (ours, reference, official).
        arch: a preset name, an arch dict, or ``'shrunk'`` (the backbones' CPU-test preset); None: the family's
            measured variant (``Family.measured_variant``). Swin-T is shrunk alike with ``'shrunk'``, ResNet-50 is
            always the full model.
        options: the family's own constructor options (``Family.options``, e.g. STViT's ``stoken_size``) for
            ours, the reference and the official model; None or {}: the preset's.
        with_cp: activation checkpointing (ours, reference, mmdet's Swin-T and ResNet-50).
        size: (H, W) of the input: timm's Swin-T is built for it.
        official: for ``official``: the module that ``perf.official.load_official`` returned.
    """
    torch.manual_seed(0)
    if name in ("ours", "reference", "official"):
        arch = arch or get(family).measured_variant()
        options = family_options(family, options)
    if name in ("ours", "reference"):
        model = create(family, arch, with_cp=with_cp, **options)
        return PlainPath(model) if name == "reference" else model
    if name == "official":
        from .official import build_official

        return build_official(official, family, arch, options)
    if name == "swin-t":
        return swin_t(size, shrunk=arch == "shrunk", with_cp=with_cp)
    if name == "resnet50":
        return _mmdet_backbone(
            dict(
                type="ResNet",
                depth=50,
                out_indices=(0, 1, 2, 3),
                frozen_stages=-1,
                norm_cfg=dict(type="BN", requires_grad=True),
                with_cp=with_cp,
            )
        )
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(NAMES)}")


def family_options(family: str, options) -> dict:
    """``options`` (a mapping, or None) checked against the family's own constructor options (``Family.options``):
    one it does not take is refused naming the ones it takes."""
    options, takes = dict(options or {}), get(family).options
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValueError(
            f"{get(family).title} takes no option {', '.join(unknown)}; its own options: {sorted(takes) or 'none'}"
        )
    return options


@dataclasses.dataclass
class Setting:
    """One measurement: which model, on which input, how it is timed (the benchmark tools' common options).

    Args:
        family: a registered family.
        arch: a preset of ``family``, an arch dict, or ``'shrunk'`` (the backbones' CPU-test preset); None: the
            family's measured variant (``Family.measured_variant``).
        size: (H, W) of the input.
        batch: images per iteration.
        mode: ``train`` (forward + backward) or ``infer``.
        device: torch device.
        precision: ``fp32``, ``bf16`` or ``fp16`` (autocast; fp16 training with a GradScaler).
        options: the family's own constructor options (``Family.options``; {}: the preset's).
        with_cp: activation checkpointing.
        compile: ours under ``torch.compile`` (inductor).
        warmup: untimed iterations first.
        repeat: timed iterations.
        official: the official model file (for the ``official`` model).
        threads: torch's CPU threads in child processes (0: torch's default).
    """

    family: str = "stvit"
    arch: str | dict | None = None
    size: tuple = (448, 672)
    batch: int = 1
    mode: str = "train"
    device: str = "cpu"
    precision: str = "fp32"
    options: dict = dataclasses.field(default_factory=dict)
    with_cp: bool = False
    compile: bool = False
    warmup: int = 1
    repeat: int = 3
    official: str | None = None
    threads: int = 0

    @classmethod
    def of(cls, args, **changes) -> Setting:
        """The setting of a tool's parsed arguments (the attributes it has of these fields), then ``changes``.
        A registered family's option that the tool has as a flag (``--stoken-size``: ``args.stoken_size``) and
        that was given goes into ``options``; given for a family that does not take it, it is refused."""
        names = [f.name for f in dataclasses.fields(cls)]
        setting = dataclasses.replace(cls(**{k: getattr(args, k) for k in names if hasattr(args, k)}), **changes)
        known = set().union(*(f.options for f in FAMILIES.values()))
        given = {k: getattr(args, k) for k in sorted(known) if getattr(args, k, None) is not None}
        try:
            setting.options = family_options(setting.family, {**setting.options, **given})
        except ValueError as e:  # named by the flags of the options this family does not take
            flags = [f"--{k.replace('_', '-')}: " for k in sorted(set(given) - get(setting.family).options)]
            raise SystemExit(f"{''.join(flags[:1])}{e}") from None
        return setting


def model_for(name: str, s: Setting) -> nn.Module:
    """``build(name, ...)`` for setting ``s``, on ``s.device``: ``s.arch`` shapes ours, the reference and the
    official model; the baselines are the full models."""
    official = None
    if name == "official":
        from .official import load_official

        official = load_official(s.official)[0]
    arch = s.arch if name in ("ours", "reference", "official") else "small"
    options = s.options if name in ("ours", "reference", "official") else None
    return build(name, s.family, arch, options, s.with_cp, s.size, official).to(s.device)


def model_and_input(name: str, s: Setting):
    """(``model_for(name, s)``, a random input of ``s.batch`` x 3 x ``s.size`` on ``s.device``)."""
    model = model_for(name, s)
    torch.manual_seed(1)
    return model, torch.randn(s.batch, 3, *s.size, device=s.device)


def ours_and_official(module, family: str, arch: str | None = None, options=None) -> tuple[nn.Module, nn.Module]:
    """(ours, official): the official model (``perf.official.OfficialStages``) and our backbone carrying its
    weights, loaded by ``backbones.load_pretrained`` exactly as a released checkpoint is.

    Args:
        module: the official model file, as ``perf.official.load_official`` returned it.
        family: the family of that file.
        arch: the variant of both (None: the family's measured variant).
        options: the family's own constructor options for both (None: the preset's).
    """
    from .official import build_official

    arch = arch or get(family).measured_variant()
    official = build_official(module, family, arch, options)
    ours = build("ours", family, arch, options)
    load_pretrained(ours, official.model.state_dict())
    return ours, official


# ---- Swin-T: mmdet's, else timm's, else torchvision's (the same architecture) ----------------------------
SWIN_SOURCES = ("mmdet", "timm", "torchvision")


def swin_source() -> str:
    """The first of ``SWIN_SOURCES`` that imports, with its version: where ``swin_t`` takes Swin-T from."""
    for name in SWIN_SOURCES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return f"{name} {module.__version__}"
    raise ImportError("Swin-T needs mmdet, timm or torchvision; none is installed")


def swin_t(size=None, shrunk: bool = False, with_cp: bool = False, source: str | None = None) -> nn.Module:
    """Swin-T (random weights) returning its four stage outputs as NCHW maps.

    Args:
        size: (H, W) of the input (timm builds its position tables for it).
        shrunk: embed dim 32, depths 1, 1, 2, 1, heads 1, 2, 4, 8 (the CPU smoke runs).
        with_cp: activation checkpointing (mmdet's model only).
        source: one of ``SWIN_SOURCES``; None: ``swin_source()``'s.
    """
    source = source or swin_source().split()[0]
    if source not in SWIN_SOURCES:
        raise ValueError(f"Swin-T source {source!r}: choose one of {', '.join(SWIN_SOURCES)}")
    arch = dict(embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)) if shrunk else {}
    if source == "mmdet":
        cfg = dict(dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24]), **arch)
        return _mmdet_backbone(
            dict(type="SwinTransformer", window_size=7, out_indices=(0, 1, 2, 3), with_cp=with_cp, **cfg)
        )
    if with_cp:
        raise ValueError(f"with_cp: only mmdet's Swin-T checkpoints activations; Swin-T comes from {source} here")
    return _NHWCStages(source, size, arch)


class _NHWCStages(nn.Module):
    """timm's or torchvision's Swin-T with its stage outputs (NHWC in both) permuted to NCHW."""

    def __init__(self, source: str, size, arch: dict):
        super().__init__()
        if source == "timm":
            import timm

            names = dict(embed_dims="embed_dim", depths="depths", num_heads="num_heads")  # timm's argument names
            kwargs = dict(features_only=True, img_size=size, pretrained=False)
            kwargs.update({names[k]: v for k, v in arch.items()})
            try:
                self.net = timm.create_model("swin_tiny_patch4_window7_224", strict_img_size=False, **kwargs)
            except TypeError:  # older timm: no strict_img_size
                self.net = timm.create_model("swin_tiny_patch4_window7_224", **kwargs)
        else:
            import torchvision

            if arch:
                depths, heads = arch["depths"], arch["num_heads"]
                model = torchvision.models.SwinTransformer([4, 4], arch["embed_dims"], depths, heads, [7, 7])
            else:
                model = torchvision.models.swin_t()
            f = model.features
            self.net = nn.ModuleList([nn.Sequential(f[0], f[1])] + [nn.Sequential(f[i], f[i + 1]) for i in (2, 4, 6)])

    def forward(self, x):
        if isinstance(self.net, nn.ModuleList):
            outs = []
            for stage in self.net:
                x = stage(x)
                outs.append(x)
        else:
            outs = self.net(x)
        return tuple(o.permute(0, 3, 1, 2) for o in outs)


def _mmdet_backbone(cfg: dict) -> nn.Module:
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope

    # mmdet's registry, in mmdet's scope for this build only: the process's default scope stays as it was (an
    # mmseg model built before or after is not affected, and mmdet does not warn that it forced the scope)
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope("mmdet"):
        return MODELS.build(cfg)
