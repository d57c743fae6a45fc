"""The family registry: one record per backbone family with everything the rest of the project asks of a family.

Each family's own file (``backbones/models/stvit.py``, ``backbones/models/hatnet.py``) builds its ``Family`` and calls
``register`` when it is imported (``import backbones`` imports both). Code outside a family's file looks the
family up here (``FAMILIES[name]``, ``get``, ``create``, ``family_of``) instead of testing family names, so a new
family is one file plus one ``register`` call (docs/backbones.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class OfficialCode:
    """How a family's official classification code is recognised, built and run stage by stage
    (``perf.official``: loaded from a local copy of the official model file and run unchanged).

    Args:
        repo: where the file comes from, for messages (``'hhb072/STViT (models/stvit.py)'``).
        classes: names the file defines; a file defining all of them is this family's.
        prefix: the prefix of its variant builders (``'stvit_'``: ``stvit_small`` ...).
        build: ``build(builder, options) -> model``: the classification model from its variant builder, with
            the family's own ``options`` applied ({``'stoken_size'``: ...}; {}: its own).
        stages: ``stages(model, x) -> (stem output, [(blocks, downsample or None), ...])``: the stem run on ``x``
            and the four stages' block lists with the module that starts the next stage.
    """

    repo: str
    classes: tuple[str, ...]
    prefix: str
    build: Callable[[Callable, Mapping[str, object]], nn.Module]
    stages: Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, list]]


@dataclass(frozen=True)
class Classifier:
    """A family's official classification model around its backbone: what its timm models take from the family
    (``backbones.timm_models``: one model ``<family>_<variant>`` per released variant).

    Args:
        head: ``head(channels, num_classes, pool_type, drop_rate, **head_args) -> module``: the official head on
            the last stage's map, with the interface of ``backbones.models.heads.LinearHead`` (``fc``, ``hidden_size``,
            ``pool_type``, ``reset``, ``forward(x, pre_logits)``).
        head_args: the head's own arguments in the released variants (STViT: ``projection=1024``).
        official_keys: {official key prefix: the timm model's} for the head's tensors (``'head.': 'head.fc.'``).
        first_conv: the backbone's first convolution (``'patch_embed.0'``), timm's ``first_conv``.
        drop_rate: the head's dropout in the official model.
        weights: {released variant: the direct download URL of its ImageNet-1k release, or '' where the release
            is no direct download (a shared folder)}.
        origin_url: the page that lists the releases.
        paper_ids: the paper (``'arXiv:2211.11167'``).
        license: the code's license where the repository states one.
        crop_pct, interpolation, mean, std: the official evaluation's preprocessing (224 crops).
    """

    head: Callable[..., nn.Module]
    official_keys: Mapping[str, str]
    first_conv: str
    weights: Mapping[str, str]
    origin_url: str
    paper_ids: str
    head_args: Mapping[str, object] = field(default_factory=dict)
    drop_rate: float = 0.0
    license: str | None = None
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PaperFigures:
    """A released variant as its paper reports it: the classification model (head included) at 224x224.

    Args:
        params_m: parameters in millions.
        gmacs: multiply-adds of one image, in billions.
        images_per_s: inference throughput on the paper's GPU (None: the paper gives none).
    """

    params_m: float
    gmacs: float
    images_per_s: float | None = None


@dataclass(frozen=True)
class Family:
    """What the project asks of a backbone family.

    Args:
        name: the family's name (``'stvit'``), the models' ``family`` attribute and the ``family`` of exports.
        cls: its constructor, a ``StagedBackbone`` subclass taking ``arch`` first.
        type_name: its ``type`` in mm configs (``'STViT'``).
        title: its name in tables and messages (``'HAT-Net'``).
        sizes: its presets by name, the released variants and ``'shrunk'`` (the tests' and demos' arch).
        released: the names of ``sizes`` that are released variants (with official weights).
        key_pattern: a regular expression that keys of its state dicts match (``family_of`` counts them).
        signature_keys: (a key template with ``{}`` for the stage, of a tensor whose first dim is the stage's
            channels; a regular expression template whose group 1 is the block index of a stage's keys): the
            (channels, depths) of a state dict, to name variants in errors.
        attention_modules: ``attention_modules(model) -> {(stage, block): module}``: the modules whose probe
            points ``backbones.models.attention_maps.record_attention`` watches.
        probes: {probe attribute of an attention module: ``record(module, input shape, probe output) -> dict``}.
        picture: the kind of its attention records, which picks the picture ``tools/visualize_attention.py`` draws
            (``tasks.figures.pictures``: ``'stoken'``, ``'hat'``; None or another kind: the maps the records hold).
        attention_stages: ``attention_stages(model) -> [stage, ...]``: the stages with a map worth drawing.
        no_map_reason: why a stage outside ``attention_stages`` has no map (for the tool's error messages).
        official_extras: ``official_extras(state_dict) -> {key: tensor}``: what the official layout holds beyond
            our keys (constant tensors), for ``backbones.checkpoints.export``'s ``'official'`` format; None: nothing.
        official: how to run its official code (``perf.official``); None: no official code known.
        options: constructor arguments of its own that the measuring tools pass through (``'stoken_size'``).
        head_cost: ``head_cost(channels) -> (params, MACs at 224x224)`` of the official classification head that
            the backbone leaves out (``perf.backbone.variants``); None: no head.
        classifier: the official classification model (its head, weights, preprocessing) for the family's timm
            models; None: no timm models.
        report_variant: the variant that the measuring reports (``tools/benchmark.py``'s tables,
            ``tools/gpu_report.py``) give a row; '': the first of ``released`` (``'shrunk'`` when none is).
        settings: named settings of its ``options`` that the reports measure beside the preset, each a row of its
            own ({``'dense'``: {``'stoken_size'``: (8, 4, 2, 1)}}: the row "STViT-S dense"); each key one of
            ``options``.
        paper: {released variant: its paper's figures} (``perf.backbone.variants``); a variant left out has none.
    """

    name: str
    cls: type
    type_name: str
    title: str
    sizes: Mapping[str, dict]
    released: tuple[str, ...]
    key_pattern: re.Pattern
    signature_keys: tuple[str, str]
    attention_modules: Callable[[nn.Module], dict]
    probes: Mapping[str, Callable]
    picture: str | None = None
    attention_stages: Callable[[nn.Module], list[int]] = lambda model: [0, 1, 2, 3]
    no_map_reason: str = ""
    official_extras: Callable[[Mapping], dict] | None = None
    official: OfficialCode | None = None
    options: frozenset[str] = field(default_factory=frozenset)
    head_cost: Callable[[int], tuple[int, int]] | None = None
    classifier: Classifier | None = None
    report_variant: str = ""
    settings: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    paper: Mapping[str, PaperFigures] = field(default_factory=dict)

    def measured_variant(self) -> str:
        """The variant the reports measure: ``report_variant``, else the first released one, else ``'shrunk'``."""
        return self.report_variant or (self.released[0] if self.released else "shrunk")


FAMILIES: dict[str, Family] = {}
_LISTENERS: list[Callable[[Family], None]] = []


def on_register(listener: Callable[[Family], None]) -> None:
    """Call ``listener(family)`` for every registered family, now and whenever one is registered later (how
    ``backbones.mm`` gives each family its mm registry adapter without a line per family)."""
    _LISTENERS.append(listener)
    for family in list(FAMILIES.values()):
        listener(family)


def register(family: Family) -> Family:
    """Add ``family`` to ``FAMILIES`` (its own file calls this once); returns it. Registering another record
    under a taken name or mm type name is refused."""
    for other in FAMILIES.values():
        if other.name != family.name and other.type_name == family.type_name:
            raise ValueError(f"family {family.name!r}: mm type name {family.type_name!r} is {other.name!r}'s")
    if family.name in FAMILIES and FAMILIES[family.name] is not family:
        raise ValueError(f"a backbone family named {family.name!r} is registered already; pick another name")
    FAMILIES[family.name] = family
    for listener in _LISTENERS:
        listener(family)
    return family


def unregister(name: str) -> None:
    """Remove the family ``name`` (a family registered for a while only, e.g. by a test)."""
    FAMILIES.pop(name, None)


def get(name: str) -> Family:
    """The registered family ``name``; a ``KeyError`` naming the registered ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown backbone family {name!r}; registered: {sorted(FAMILIES)}") from None


def by_type_name(type_name: str) -> Family | None:
    """The family whose mm config ``type`` is ``type_name`` (a scope prefix ``mmdet.`` is ignored), or None."""
    short = str(type_name).rpartition(".")[2]
    return next((f for f in FAMILIES.values() if f.type_name == short), None)


def create(name: str, size: str | dict = "small", **kwargs) -> nn.Module:
    """A backbone of family ``name``: ``size`` a preset of its ``sizes`` or an arch dict; ``kwargs`` go to its
    constructor (``out_indices``, ``with_cp``, ...)."""
    return get(name).cls(size, **kwargs)


def family_of(obj: nn.Module | Mapping[str, torch.Tensor]) -> Family | None:
    """The family of a backbone (its ``family`` attribute) or of a state dict (the family whose ``key_pattern``
    most keys match); None when it is none of the registered ones."""
    if isinstance(obj, nn.Module):
        return FAMILIES.get(getattr(obj, "family", None))
    counts = {name: sum(1 for k in obj if f.key_pattern.search(k)) for name, f in FAMILIES.items()}
    best = max(counts, key=counts.get, default=None)
    return FAMILIES[best] if best is not None and counts[best] else None


def titles(conjunction: str = "or") -> str:
    """The registered families' titles for messages: ``'STViT or HAT-Net'`` (``conjunction`` before the last)."""
    names = [f.title for f in FAMILIES.values()]
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}" if len(names) > 1 else "".join(names)
