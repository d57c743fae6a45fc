"""Loading weights into the backbones: official releases, plain state dicts, our exports, and detector / segmentor
training checkpoints (their ``backbone.`` entries). Files (and http(s) URLs) are read, and keys and shapes compared, by
``backbones/checkpoints/weights.py``; this module finds the backbone's tensors in them, filters the official keys that
have no counterpart, and checks family and variant."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..errors import CheckpointError
from ..families import FAMILIES, family_of, get, titles
from .weights import _summary, is_state_dict, read_checkpoint, state_dict_diff

logger = logging.getLogger("backbones")
SAFETENSORS_META_KEY = "meta"


@dataclass
class LoadReport:
    source: str
    family: str
    loaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # in the checkpoint, deliberately not loaded
    initialised: list[str] = field(default_factory=list)  # in the model, not in the checkpoint (new layers)
    meta: dict = field(default_factory=dict)

    def __str__(self) -> str:
        text = f"Loaded {len(self.loaded)} tensors into {self.family} from {self.source}"
        if self.skipped:
            text += f"; skipped {len(self.skipped)} (classifier head / constant kernels): {_summary(self.skipped)}"
        if self.initialised:
            text += f"; kept the model's own values for {len(self.initialised)}: {_summary(self.initialised)}"
        return text


# --- finding the backbone tensors ------------------------------------------------------------------------
def detect_family(keys) -> str | None:
    """The name of the registered family whose keys these are (``backbones.families.family_of``), or None."""
    family = family_of(list(keys))
    return family.name if family else None


def extract_state_dict(obj, prefix: str | None = None) -> tuple[dict, dict, str]:
    """Find the backbone tensors in any supported checkpoint layout.

    Returns (state_dict with backbone-relative keys, meta, layout name).
    """
    meta: dict = {}
    if is_state_dict(obj):
        sd, layout = dict(obj), "plain state dict"
    elif isinstance(obj, Mapping) and is_state_dict(obj.get("model")):
        sd, layout = dict(obj["model"]), "official release"
        meta = dict(obj["meta"]) if isinstance(obj.get("meta"), Mapping) else {}  # our official-layout exports
    elif isinstance(obj, Mapping) and is_state_dict(obj.get("state_dict")):
        sd, layout = dict(obj["state_dict"]), "state_dict checkpoint"
        meta = dict(obj.get("meta") or {})
    else:
        found = sorted(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"No model weights found in the checkpoint (top-level entries: {found}). "
            "Expected a state dict, {'model': ...} or {'state_dict': ...}."
        )
    sd = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in sd.items()}
    if prefix:
        sub = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
        if not sub:
            raise CheckpointError(
                f"No key starts with prefix {prefix!r}; the checkpoint's keys start with "
                f"{sorted({k.split('.')[0] + '.' for k in sd})[:8]}."
            )
        return sub, meta, layout
    if detect_family(sd) is None:
        # A detector / segmentor training checkpoint ('backbone.' or 'model.backbone.'): take what sits under it.
        sub, heads = {}, set()
        for k, v in sd.items():
            head, sep, rest = k.partition("backbone.")
            if sep and (head == "" or head.endswith(".")):
                sub[rest] = v
                heads.add(head + sep)
        if len(heads) > 1:  # e.g. a model and its EMA copy, or a teacher and a student: never pick one silently
            raise CheckpointError(
                f"The checkpoint holds several backbones, under {sorted(heads)}; say which one to load with "
                f"prefix= (init_cfg=dict(type='Pretrained', checkpoint=..., prefix={sorted(heads)[0]!r}))."
            )
        if not sub:
            raise CheckpointError(
                f"The checkpoint holds no backbone weights: none of its keys belong to {titles()}, and none sit "
                f"under 'backbone.' (first keys: {sorted(sd)[:5]})."
            )
        sd, layout = sub, layout + " (backbone. entries)"
    return sd, meta, layout


def arch_signature(sd: Mapping[str, torch.Tensor], family: str) -> tuple | None:
    """(channels per stage, blocks per stage) read from a state dict, to name variants in errors."""
    key, pat = get(family).signature_keys
    try:
        dims = tuple(sd[key.format(i)].shape[0] for i in range(4))
    except KeyError:
        return None
    depths = tuple(len({m.group(1) for k in sd if (m := re.match(pat.format(i), k))}) for i in range(4))
    return dims, depths


def _variant_name(sig, model: nn.Module) -> str:
    """The released variant with this signature (read from the model's family class), or a description."""
    family = model.family
    for name, a in model.archs.items():
        dims = a.get("embed_dims", a.get("dims"))
        if sig == (tuple(dims), tuple(a["depths"])):
            return f"{family}_{name}"
    return f"{family} with channels {list(sig[0])} and depths {list(sig[1])}" if sig else family


def checkpoint_filter(sd: Mapping[str, torch.Tensor], model: nn.Module) -> tuple[dict, list[str]]:
    """Official -> ours: drop the keys that have no counterpart in the backbone (classification head,
    final projection, constant unfold/fold kernels: the model class's ``skipped_key_patterns``). Every other
    key keeps its official name."""
    kept, skipped = {}, []
    for k, v in sd.items():
        (skipped.append(k) if any(re.search(p, k) for p in model.skipped_key_patterns) else kept.__setitem__(k, v))
    return kept, skipped


# --- loading ---------------------------------------------------------------------------------------------
def load_pretrained(
    model: nn.Module, checkpoint: str | os.PathLike | Mapping, prefix: str | None = None, sha256: str | None = None
) -> LoadReport:
    """Load official / exported / detector weights into an STViT or HATNet, strictly.

    Keys that are skipped on purpose (the model class's ``skipped_key_patterns``) and new layers
    (``out_norms`` when ``norm_out=True``) are listed in the returned report; any other missing or
    unexpected key, a shape mismatch, or weights of another family or variant raise CheckpointError.

    Args:
        model: the STViT or HATNet to load into (in place).
        checkpoint: a .pth / .pt / .ckpt / .safetensors path, an http(s):// URL of one (downloaded once into torch.hub's
            cache and verified, see ``backbones/checkpoints/download.py``), or an already loaded checkpoint object: an
            official release ({'model': ...}), a plain state dict, one of our exports, or a detector / segmentor /
            Lightning checkpoint whose backbone sits under 'backbone.'.
        prefix: take only the keys under this prefix (e.g. 'backbone.'), stripped; None finds the backbone.
        sha256: the expected sha256 of a URL's file; None: from the URL (``#sha256=`` or torch.hub's file name).

    Returns:
        A LoadReport listing the loaded, skipped and newly initialised keys and the export's meta.
    """
    family = getattr(model, "family", None)
    if family not in FAMILIES:
        raise TypeError(
            f"load_pretrained expects a backbone of a registered family ({titles()}), got {type(model).__name__}"
        )
    source = os.fspath(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else "<in-memory checkpoint>"
    name = FAMILIES[family].cls.__name__  # 'STViT' also for its mm adapter (class MMSTViT)
    from_file = isinstance(checkpoint, (str, os.PathLike))
    obj, st_meta = read_checkpoint(checkpoint, sha256) if from_file else (checkpoint, {})
    sd, meta, layout = extract_state_dict(obj, prefix)
    if SAFETENSORS_META_KEY in st_meta:
        meta = json.loads(st_meta[SAFETENSORS_META_KEY])
    _check_meta(meta, model, source)

    ckpt_family = detect_family(sd)
    if ckpt_family != family:
        what = f"a {ckpt_family} checkpoint" if ckpt_family else f"not a {titles()} checkpoint"
        raise CheckpointError(
            f"{source} is {what} ({layout}), but the model is "
            f"{name}. Build the matching backbone type or pick another file."
        )
    sd, skipped = checkpoint_filter(sd, model)
    own = model.state_dict()
    # new layers (output norms) and BN step counters keep the model's own values when the checkpoint lacks them
    diff = state_dict_diff(sd, own, optional=lambda k: k.startswith("out_norms.") or k.endswith("num_batches_tracked"))
    if diff:
        ours = _variant_name(arch_signature(own, family), model)
        theirs = _variant_name(arch_signature(sd, family), model)
        hint = (
            f" The checkpoint looks like {theirs}, the model is {ours}: build the model with the checkpoint's "
            "arch, or pick a checkpoint of this variant."
            if theirs != ours
            else ""
        )
        raise CheckpointError(f"Checkpoint {source} does not fit this {name}.{hint} {diff}")
    # a diverged run's weights load fine and give NaN features downstream, far from the cause
    bad = sorted(k for k, v in sd.items() if v.is_floating_point() and not torch.isfinite(v).all())
    if bad:
        raise CheckpointError(
            f"Checkpoint {source} holds NaN or infinite values in {len(bad)} tensors: {_summary(bad)}. "
            "It comes from a run that diverged or a damaged file: pick an earlier checkpoint of that run, or "
            "another file."
        )
    with torch.no_grad():
        for k, v in sd.items():
            own[k].copy_(v)  # state_dict() tensors share storage with the module's parameters and buffers
    report = LoadReport(
        source, family, loaded=sorted(sd), skipped=skipped, initialised=[k for k in own if k not in sd], meta=meta
    )
    logger.info("%s", report)
    return report


def _check_meta(meta: dict, model: nn.Module, source: str) -> None:
    """Our exports record family and arch: refuse them for another family or variant with a clear message."""
    fam = meta.get("family")
    if fam and fam != model.family:
        name = FAMILIES[model.family].cls.__name__
        raise CheckpointError(f"{source} is an export of a {fam} backbone; the model is {name}.")
    arch = meta.get("arch")
    if isinstance(arch, str):
        arch = json.loads(arch)
    if arch:
        diff = [
            k
            for k in ("embed_dims", "dims", "depths", "num_heads", "head_dim")
            if k in arch and list(_as_list(arch[k])) != list(_as_list(model.arch.get(k)))
        ]
        if diff:
            raise CheckpointError(
                f"{source} was exported from a {fam} with {', '.join(f'{k}={arch[k]}' for k in diff)}"
                f"; the model has {', '.join(f'{k}={model.arch.get(k)}' for k in diff)}. "
                "Build the backbone with the export's arch (meta['arch'])."
            )


def _as_list(v):
    return v if isinstance(v, (list, tuple)) else [v]
