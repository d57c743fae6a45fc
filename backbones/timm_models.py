"""The families' official classification models as timm models: ``<family>_<variant>`` for every released variant
(``stvit_small``, ``hatnet_tiny``, ...), with timm's model interface and dense-prediction contract
(``features_only``, ``feature_info``, ``forward_intermediates``, ``prune_intermediate_layers``).

``import backbones`` registers them in timm's registry without importing timm (which would add about a second to
every start-up): at once when timm is imported already, else right after the first ``import timm`` completes
(``install``: an import hook that wraps timm's loader once). A family registered later gets its models then too.
Everything here but ``register_family`` is pure PyTorch.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn

from .checkpoints.weights import model_state_dict, read_checkpoint, state_dict_diff
from .errors import CheckpointError
from .families import FAMILIES, Family, get, on_register
from .models.base import NUM_STAGES
from .models.heads import LinearHead

__all__ = ["TimmModel", "checkpoint_filter_fn", "install", "model_names"]
default_cfgs: dict = {}  # timm's register_model reads each model's pretrained cfgs from its module's default_cfgs


def model_names(family: Family) -> list[str]:
    """The timm names of a family's models: ``<family>_<variant>`` per released variant (none without a
    ``classifier`` record)."""
    return [f"{family.name}_{v}" for v in family.released] if family.classifier else []


def _take_indices(num_stages: int, indices) -> tuple[list[int], int]:
    """timm's convention: None = every stage, an int n = the last n, a sequence = those (negative from the end)."""
    if indices is None:
        indices = num_stages
    if isinstance(indices, int):
        if not 0 < indices <= num_stages:
            raise ValueError(f"indices={indices}: the last n stages need 1 <= n <= {num_stages}")
        take = list(range(num_stages - indices, num_stages))
    else:
        take = [i + num_stages if i < 0 else i for i in indices]
        if not take or any(not 0 <= i < num_stages for i in take):
            raise ValueError(f"indices={list(indices)}: stage indices are 0..{num_stages - 1} (or -{num_stages}..-1)")
    return take, max(take)


class TimmModel(nn.Module):
    """A family's official classification model: ``backbone`` (the family's backbone, its four stages, official
    key names under ``backbone.``) and ``head`` (the official head, ``head.fc`` the classifier).

    Args:
        family: a registered family with a ``classifier`` record.
        arch: a preset of the family or an arch dict (as the backbone takes it).
        num_classes: classes of ``head.fc``; 0: no classifier (``forward`` returns the pre-logits).
        global_pool: 'avg', 'max' or '' (no pooling, with ``num_classes=0``).
        drop_rate: the head's dropout; None: the official model's.
        drop_path_rate: the backbone's stochastic depth.
        in_chans: 3 (the backbones take RGB images only).
        with_head: False: no official head, a parameter-free pooling head instead (a detector's backbone export).
        head_args: the head's own arguments over the family's (STViT: ``projection``).
        **backbone_args: more arguments of the backbone (``stoken_size``, ``with_cp``, ...).
    """

    def __init__(
        self,
        family: str,
        arch: str | dict = "small",
        num_classes: int = 1000,
        global_pool: str = "avg",
        drop_rate: float | None = None,
        drop_path_rate: float = 0.0,
        in_chans: int = 3,
        with_head: bool = True,
        head_args: Mapping | None = None,
        **backbone_args,
    ):
        super().__init__()
        spec = get(family).classifier
        if spec is None:
            raise ValueError(f"the {family} family has no classification model (its record gives no classifier)")
        if in_chans != 3:
            raise ValueError(f"{family} takes RGB images: in_chans must be 3, got {in_chans}")
        self.family, self.in_chans, self.output_fmt = family, 3, "NCHW"
        if drop_path_rate:
            backbone_args["drop_path_rate"] = drop_path_rate
        self.backbone = get(family).cls(arch, **backbone_args)
        if self.backbone.frozen_stages < 0:
            _unused_as_buffers(self.backbone)
        self.num_features = self.backbone.stage_channels[-1]
        self.num_stages = NUM_STAGES
        self.feature_info = [dict(i, module=f"backbone.{i['module']}") for i in self.backbone.feature_info]
        drop_rate = spec.drop_rate if drop_rate is None else drop_rate
        head_args = {**spec.head_args, **(head_args or {})} if with_head else {}
        if with_head:
            self.head = spec.head(self.num_features, num_classes, global_pool, drop_rate, **head_args)
        else:
            self.head = LinearHead(self.num_features, num_classes, global_pool, drop_rate)
        self.num_classes, self.head_hidden_size = num_classes, self.head.hidden_size
        # what timm's exports record to build the model again (config.json's model_args)
        self._model_args = dict(arch=self.backbone.arch, with_head=with_head, head_args=head_args)

    # --- timm's classification interface ---------------------------------------------------------------
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.head.reset(num_classes, global_pool)
        self.num_classes = num_classes

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing of every block in training (the backbone's ``with_cp``)."""
        self.backbone.with_cp = bool(enable)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's map (B, num_features, H/32, W/32)."""
        return self.backbone.forward_stages(x, (self.num_stages - 1,), self.num_stages - 1)[0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # --- timm's dense-prediction interface ---------------------------------------------------------------
    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """The stage maps of ``indices`` (timm's convention: None all, n the last n), and unless
        ``intermediates_only`` the last map computed: ``forward_features``' output, or with ``stop_early`` that
        of the last stage taken. ``norm`` changes nothing: there is no norm between the stages and the head."""
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC'; got {output_fmt!r}")
        take, last_taken = _take_indices(self.num_stages, indices)
        last = last_taken if stop_early or intermediates_only else self.num_stages - 1
        stages = sorted({*take, last})
        maps = dict(zip(stages, self.backbone.forward_stages(x, stages, last)))
        out = [maps[i] if output_fmt == "NCHW" else maps[i].permute(0, 2, 3, 1) for i in take]
        return out if intermediates_only else (maps[last], out)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Remove the stages after the last of ``indices`` (and with ``prune_head`` the head, for a
        parameter-free pooling head); returns the stage indices taken."""
        take, last = _take_indices(self.num_stages, indices)
        names = {id(m): n for n, m in self.backbone.named_modules()}
        for stage in range(last + 1, self.num_stages):
            for module in self.backbone.stage_modules(stage):
                owner, _, attr = names[id(module)].rpartition(".")
                setattr(self.backbone.get_submodule(owner), attr, nn.Identity())
        self.num_stages, self.feature_info = last + 1, self.feature_info[: last + 1]
        if prune_head:
            self.head = LinearHead(self.backbone.stage_channels[last], 0, "")
            self.num_classes = 0
        return take

    # --- weights ------------------------------------------------------------------------------------------
    def load_pretrained(self, path: str | os.PathLike) -> None:
        """timm's ``custom_load``: a file as released or exported, read with ``weights_only`` and the project's
        allow-list (the official training checkpoints hold their ``args`` as an ``argparse.Namespace``), its
        ``model`` entry as the official evaluation loads it (not ``model_ema``), through ``checkpoint_filter_fn``.
        A classifier for another number of classes is left out (``num_classes``)."""
        obj, _ = read_checkpoint(path)
        sd = checkpoint_filter_fn(model_state_dict(obj, repr(os.fspath(path)))[0], self)
        own = self.state_dict()
        other = [k for k in sd if k.startswith("head.fc.") and (k not in own or sd[k].shape != own[k].shape)]
        if not hasattr(self.head, "proj"):  # a head-less model takes the backbone of a classifier's file
            other += [k for k in sd if k.startswith("head.") and k not in own]
        for k in other:
            del sd[k]
        diff = state_dict_diff(sd, own, optional=lambda k: k.startswith("head.fc.") and bool(other))
        if diff:
            raise CheckpointError(
                f"{os.fspath(path)!r} does not fit {self.family} with arch {self.backbone.arch}: {diff} Pick the "
                "file of this variant, or build the model with the file's arch (arch=...)."
            )
        self.load_state_dict(sd, strict=False)


def _unused_as_buffers(backbone: nn.Module) -> None:
    """The parameters a backbone freezes as it is built (HAT-Net's ``proj_norm``: defined, never used by the
    official forward) become buffers of the same names: the keys stay, and timm's optimizers and tests see only
    parameters that get gradients."""
    for name, p in list(backbone.named_parameters()):
        if not p.requires_grad:
            owner, _, attr = name.rpartition(".")
            module = backbone.get_submodule(owner)
            del module._parameters[attr]
            module.register_buffer(attr, p.detach())


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor], model: TimmModel) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under the timm model's keys. The official layout (an official release's ``model``
    entry, our ``--format official`` and plain backbone exports): backbone keys go under ``backbone.``, the head's
    are renamed by the family's ``official_keys``, the constant kernels the backbone leaves out are dropped. Keys
    that are the model's already (a timm export) pass unchanged."""
    sd = {k.removeprefix("module."): v for k, v in state_dict.items()}
    if any(k.startswith("backbone.") for k in sd):
        return sd
    renames = get(model.family).classifier.official_keys
    out = {}
    for k, v in sd.items():
        old = next((p for p in renames if k.startswith(p)), None)
        if old is not None:
            out[renames[old] + k[len(old) :]] = v
        elif not any(re.search(p, k) for p in model.backbone.skipped_key_patterns):
            out[f"backbone.{k}"] = v
    return out


# --- registration -------------------------------------------------------------------------------------------
_REGISTERED: set[str] = set()


def _pretrained_cfg(family: Family, variant: str) -> dict:
    spec = family.classifier
    url = spec.weights.get(variant, "")
    return dict(
        url=url,
        custom_load=bool(url),  # the releases are training checkpoints: TimmModel.load_pretrained reads them
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=(7, 7),
        crop_pct=spec.crop_pct,
        interpolation=spec.interpolation,
        mean=spec.mean,
        std=spec.std,
        first_conv=f"backbone.{spec.first_conv}",
        classifier="head.fc",
        origin_url=spec.origin_url,
        paper_ids=spec.paper_ids,
        license=spec.license,
    )


def _create(family: str, variant: str, name: str, pretrained: bool = False, **kwargs) -> nn.Module:
    from timm.models import build_model_with_cfg

    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    if overlay.get("file") or overlay.get("url"):  # a release as downloaded: read by TimmModel.load_pretrained
        overlay.setdefault("custom_load", True)
    kwargs.setdefault("arch", variant)  # a timm export's config.json gives its arch
    return build_model_with_cfg(
        functools.partial(TimmModel, family),
        name,
        pretrained,
        pretrained_cfg_overlay=overlay,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(feature_cls="getter", out_indices=tuple(range(NUM_STAGES))),
        **kwargs,
    )


def _entrypoint(family: Family, variant: str, name: str):
    def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
        return _create(family.name, variant, name, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__  # timm files the model under this module ('timm_models')
    entrypoint.__doc__ = f"{family.title} {variant}: the official ImageNet-1k classification model."
    return entrypoint


def register_family(family: Family) -> None:
    """Register the family's models with timm (which this imports), each name once."""
    from timm.models import generate_default_cfgs, register_model

    for variant, name in zip(family.released, model_names(family)):
        if name not in _REGISTERED:
            default_cfgs.update(generate_default_cfgs({f"{name}.in1k": _pretrained_cfg(family, variant)}))
            register_model(_entrypoint(family, variant, name))
            _REGISTERED.add(name)


def _register_all() -> None:
    for family in list(FAMILIES.values()):
        register_family(family)


def _timm_ready() -> bool:
    module = sys.modules.get("timm")
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _AfterImport(importlib.abc.Loader):
    """timm's own loader, then the registration; put back as timm's loader once done."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TimmImportHook)]
        _register_all()

    def __getattr__(self, name):  # resource readers and the rest: timm's loader's
        return getattr(self.loader, name)


class _TimmImportHook(importlib.abc.MetaPathFinder):
    """Finds timm with the other finders and wraps its loader (``_AfterImport``). It stays until timm is imported:
    a ``find_spec('timm')`` alone (transformers asks whether timm is installed) imports nothing."""

    searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "timm" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec("timm")
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterImport(spec.loader)
        return spec


def install() -> None:
    """Register every family's models with timm now if timm is imported, else right after ``import timm``; a
    family registered later gets its models as it registers (``import backbones`` calls this once)."""
    on_register(lambda family: register_family(family) if _timm_ready() else None)
    if not _timm_ready() and not any(isinstance(f, _TimmImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TimmImportHook())
