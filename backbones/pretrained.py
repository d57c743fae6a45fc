"""Loading weights into the backbones: official releases, plain state dicts, our exports, and detector /
segmentor training checkpoints (their ``backbone.`` entries), without ever unpickling arbitrary objects."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .families import FAMILIES, family_of, get

logger = logging.getLogger("backbones")

# Classes that may appear in trusted-format checkpoints besides tensors and Python builtins: the
# official DeiT-style training scripts store their `args` as an argparse.Namespace.
SAFE_GLOBALS = [argparse.Namespace]
SAFETENSORS_META_KEY = "meta"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded into the given backbone; the message names the problem."""


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


def _summary(keys: list[str], n: int = 6) -> str:
    return ", ".join(keys[:n]) + (f", ... (+{len(keys) - n})" if len(keys) > n else "")


@dataclass
class StateDictDiff:
    """How a state dict differs from the one a model expects (see ``state_dict_diff``)."""

    missing: list[str] = field(default_factory=list)  # expected, absent from the given tensors
    unexpected: list[str] = field(default_factory=list)  # given, unknown to the model
    mismatched: list[str] = field(default_factory=list)  # 'key: checkpoint (shape) vs model (shape)'

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        parts = [
            f"{what} ({len(keys)}): {_summary(keys, n)}"
            for what, keys, n in (
                ("Missing keys", self.missing, 6),
                ("Unexpected keys", self.unexpected, 6),
                ("Shape mismatches", self.mismatched, 3),
            )
            if keys
        ]
        return ". ".join(parts) + "." if parts else "No differences."


def state_dict_diff(
    given: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    optional: Callable[[str], bool] | None = None,
) -> StateDictDiff:
    """Compare checkpoint tensors (``given``) with a model's ``state_dict()`` (``expected``): keys and shapes.

    Args:
        given: the tensors about to be loaded or written, by key.
        expected: the model's own state dict.
        optional: ``optional(key)`` is True for expected keys that may be absent from ``given`` (e.g. layers
            the checkpoint cannot have); None: every expected key is required.

    Returns a ``StateDictDiff``: false when the keys and shapes agree, else ``str(diff)`` names the missing and
    unexpected keys and the shape mismatches, for an error message that the caller completes with the fix.
    """
    missing = [k for k in expected if k not in given and not (optional and optional(k))]
    unexpected = [k for k in given if k not in expected]
    mismatched = [
        f"{k}: checkpoint {tuple(given[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in given
        if k in expected and given[k].shape != expected[k].shape
    ]
    return StateDictDiff(sorted(missing), sorted(unexpected), sorted(mismatched))


# --- reading files -------------------------------------------------------------------------------------
def check_checkpoint_path(path: str | os.PathLike) -> str:
    """``path`` as a string if it names a local file; CheckpointError for a URL or a missing file."""
    path = os.fspath(path)
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path)
    if scheme:  # e.g. 'open-mmlab://resnet50_v1c', 'torchvision://resnet50', 'https://...'
        raise CheckpointError(
            f"Checkpoint {path!r} is a URL ({scheme.group(0)}...); STViT / HAT-Net load local "
            "files only. Download the checkpoint and pass its path."
        )
    if not os.path.isfile(path):
        raise CheckpointError(
            f"Checkpoint file not found: {path!r}. Check the path (relative paths are resolved from {os.getcwd()!r})."
        )
    return path


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    """Read a .pth/.pt/.ckpt (weights_only, allow-listed classes) or .safetensors file.

    Returns (object, safetensors metadata). Raises CheckpointError with the path and the fix for a missing,
    truncated, corrupt or unsafe file.
    """
    path = check_checkpoint_path(path)
    _check_content_matches_extension(path)
    if path.endswith(".safetensors"):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(path, framework="pt") as f:
                meta = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(
                f"Cannot read safetensors file {path!r}: it is truncated, corrupt or not a safetensors file ({e})."
            ) from e
        return tensors, meta
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True), {}
    except pickle.UnpicklingError as e:
        refused = re.search(r"\bGLOBAL ([\w.]+)", str(e))
        if refused is None:  # not a refused class: bytes that are no pickle at all
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "documentation" not in ln]
            raise CheckpointError(
                f"Cannot read checkpoint {path!r}: the file is corrupt or not a PyTorch "
                f"checkpoint ({lines[-1] if lines else e})."
            ) from e
        raise CheckpointError(
            f"Refusing to load {path!r}: it contains Python objects outside the allow-list of safe types "
            f"({refused.group(1)}), and unpickling them could run arbitrary code. If you trust the file, "
            "re-save only its tensors: torch.save(state_dict, 'clean.pth')."
        ) from e
    except Exception as e:  # RuntimeError, EOFError, BadZipFile, IndexError...: whatever broken bytes raise
        raise CheckpointError(
            f"Cannot read checkpoint {path!r}: the file is truncated or corrupt ({e}). Download or export it again."
        ) from e


def _check_content_matches_extension(path: str) -> None:
    """A safetensors file named .pth, or a torch.save file named .safetensors, gets its own message."""
    with open(path, "rb") as f:
        head = f.read(9)
    size = os.path.getsize(path)
    is_zip = head[:4] == b"PK\x03\x04"  # torch.save's (zip) format
    is_safetensors = len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8
    if path.endswith(".safetensors") and is_zip:
        raise CheckpointError(
            f"{path!r} is a PyTorch (torch.save) checkpoint, not a safetensors file: the "
            "extension does not match the content. Rename it to .pth."
        )
    if not path.endswith(".safetensors") and is_safetensors:
        raise CheckpointError(
            f"{path!r} is a safetensors file, but its extension says otherwise: rename it to .safetensors."
        )


# --- finding the backbone tensors ------------------------------------------------------------------------
def detect_family(keys) -> str | None:
    """The name of the registered family whose keys these are (``backbones.families.family_of``), or None."""
    family = family_of(list(keys))
    return family.name if family else None


def _is_state_dict(obj) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def extract_state_dict(obj, prefix: str | None = None) -> tuple[dict, dict, str]:
    """Find the backbone tensors in any supported checkpoint layout.

    Returns (state_dict with backbone-relative keys, meta, layout name).
    """
    meta: dict = {}
    if _is_state_dict(obj):
        sd, layout = dict(obj), "plain state dict"
    elif isinstance(obj, Mapping) and _is_state_dict(obj.get("model")):
        sd, layout = dict(obj["model"]), "official release"
        meta = dict(obj["meta"]) if isinstance(obj.get("meta"), Mapping) else {}  # our official-layout exports
    elif isinstance(obj, Mapping) and _is_state_dict(obj.get("state_dict")):
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
        sub = {}
        for k, v in sd.items():
            head, sep, rest = k.partition("backbone.")
            if sep and (head == "" or head.endswith(".")):
                sub[rest] = v
        if not sub:
            raise CheckpointError(
                "The checkpoint holds no backbone weights: none of its keys belong to STViT "
                "or HAT-Net, and none sit under 'backbone.' (first keys: "
                f"{sorted(sd)[:5]})."
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
def load_pretrained(model: nn.Module, checkpoint: str | os.PathLike | Mapping, prefix: str | None = None) -> LoadReport:
    """Load official / exported / detector weights into an STViT or HATNet, strictly.

    Keys that are skipped on purpose (the model class's ``skipped_key_patterns``) and new layers
    (``out_norms`` when ``norm_out=True``) are listed in the returned report; any other missing or
    unexpected key, a shape mismatch, or weights of another family or variant raise CheckpointError.

    Args:
        model: the STViT or HATNet to load into (in place).
        checkpoint: a .pth / .pt / .ckpt / .safetensors path, or an already loaded checkpoint object: an
            official release ({'model': ...}), a plain state dict, one of our exports, or a detector /
            segmentor / Lightning checkpoint whose backbone sits under 'backbone.'.
        prefix: take only the keys under this prefix (e.g. 'backbone.'), stripped; None finds the backbone.

    Returns:
        A LoadReport listing the loaded, skipped and newly initialised keys and the export's meta.
    """
    family = getattr(model, "family", None)
    if family not in FAMILIES:
        raise TypeError(f"load_pretrained expects an STViT or HATNet model, got {type(model).__name__}")
    source = os.fspath(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else "<in-memory checkpoint>"
    obj, st_meta = read_checkpoint(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else (checkpoint, {})
    sd, meta, layout = extract_state_dict(obj, prefix)
    if SAFETENSORS_META_KEY in st_meta:
        meta = json.loads(st_meta[SAFETENSORS_META_KEY])
    _check_meta(meta, model, source)

    ckpt_family = detect_family(sd)
    if ckpt_family != family:
        what = f"a {ckpt_family} checkpoint" if ckpt_family else "not an STViT/HAT-Net checkpoint"
        raise CheckpointError(
            f"{source} is {what} ({layout}), but the model is "
            f"{type(model).__name__}. Build the matching backbone type or pick another file."
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
        raise CheckpointError(f"Checkpoint {source} does not fit this {type(model).__name__}.{hint} {diff}")
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
        raise CheckpointError(f"{source} is an export of a {fam} backbone; the model is {type(model).__name__}.")
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
