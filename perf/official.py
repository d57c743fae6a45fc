"""The official model code (hhb072/STViT ``models/stvit.py``, yun-liu/HAT-Net ``HAT_Net.py``), loaded from a
local copy and run unchanged; only the loop over its stages is ours. It returns each stage's last-block output,
the tensors our backbones return.

Packages the files import at the top but this project does not install (fvcore and scipy, which STViT uses only
in its own test code) get minimal stand-ins while the file's imports run, and so does timm, installed or not: the
files' ``@register_model`` would replace this project's timm models of the same names (``stvit_small``, ...) in
timm's registry, and they import from module paths that timm deprecates.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch
import torch.nn as nn
from torchvision.ops import StochasticDepth

from backbones import FAMILIES
from backbones.families import get

REPOS = " or ".join(f.official.repo for f in FAMILIES.values() if f.official)


def _unavailable(name):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in of perf/official.py; install the package to use it")

    return fail


def _to_2tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


def _drop_path(drop_prob=0.0, *args, **kwargs):
    return StochasticDepth(drop_prob, "row")  # timm's DropPath: per-sample, rescaled by 1 / (1 - p)


# Module -> attributes of its stand-in, for the top-level imports of the two official files.
_STANDINS = {
    "timm": {},
    "timm.models": {},
    "timm.models.layers": dict(DropPath=_drop_path, to_2tuple=_to_2tuple, trunc_normal_=nn.init.trunc_normal_),
    "timm.models.registry": dict(register_model=lambda fn: fn),
    "timm.models.vision_transformer": dict(_cfg=lambda **kwargs: dict(kwargs)),
    "fvcore": {},
    "fvcore.nn": dict(
        FlopCountAnalysis=_unavailable("fvcore.nn.FlopCountAnalysis"),
        flop_count_table=_unavailable("fvcore.nn.flop_count_table"),
    ),
    "scipy": {},
    "scipy.io": {},
}


def load_official(path) -> tuple[types.ModuleType, str]:
    """The official model file as a module, and its family ('stvit' or 'hatnet')."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"official model file {path} not found: clone {REPOS} and pass that file")
    tops = {name.split(".")[0] for name in _STANDINS}
    replaced = {top for top in tops if top == "timm" or importlib.util.find_spec(top) is None}
    standins = {}
    for name, attrs in _STANDINS.items():
        if name.split(".")[0] in replaced:
            standins[name] = types.ModuleType(name)
            standins[name].__dict__.update(attrs)
    saved = {name: sys.modules.get(name) for name in standins}
    sys.modules.update(standins)
    try:  # the stand-ins are needed only while the file's imports run
        spec = importlib.util.spec_from_file_location(f"official_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    for family in FAMILIES.values():
        if family.official and all(hasattr(module, name) for name in family.official.classes):
            return module, family.name
    wanted = "; ".join(f"{f.title}: {', '.join(f.official.classes)}" for f in FAMILIES.values() if f.official)
    raise SystemExit(f"{path} defines the official classes of no family ({wanted}): pass the model file of {REPOS}")


class OfficialStages(nn.Module):
    """An official classification model's stage outputs: its own modules, in its own order, without the head.

    Args:
        model: the official classification model.
        family: a registered family with official code (``Family.official``).
    """

    def __init__(self, model: nn.Module, family: str):
        super().__init__()
        self.model, self.family = model, family

    def forward(self, x):
        outs = []
        x, stages = get(self.family).official.stages(self.model, x)
        for blocks, downsample in stages:
            for block in blocks:
                x = block(x)
            outs.append(x)
            if downsample is not None:
                x = downsample(x)
        return tuple(outs)


def build_official(module, family: str, arch: str, options=None) -> OfficialStages:
    """The official ``stvit_<arch>`` / ``HAT_Net_<arch>`` of ``module`` (seeded), with the family's own options
    (``Family.options``, e.g. STViT's ``stoken_size``) applied as ``OfficialCode.build`` does (None: its own)."""
    code = get(family).official
    prefix = code.prefix
    name = f"{prefix}{arch}"
    builder = getattr(module, name, None)
    if builder is None:
        known = sorted(k[len(prefix) :] for k in vars(module) if k.startswith(prefix))
        raise SystemExit(f"the official file has no {name}(); its variants: {', '.join(known)}")
    torch.manual_seed(0)
    model = code.build(builder, dict(options or {}))
    return OfficialStages(model, family)


def max_relative_difference(a_outs, b_outs) -> float:
    """The largest relative difference of paired outputs: max |a - b| / max |a| per output."""
    return max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(a_outs, b_outs))
