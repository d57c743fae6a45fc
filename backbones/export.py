"""A backbone's export formats: ``pth``, ``safetensors`` and the official classification layout, each with a
meta (family, arch, provenance, sha256 of the tensors). Pure PyTorch: reading training checkpoints and configs
to find the tensors is ``tasks/export.py``'s job (``tools/export_backbone.py`` is the command line).

Every file is written to a temp file in the target's directory, fsynced and ``os.replace``-d, and the same
input always gives the same bytes (sorted keys, no timestamps, each tensor in its own storage).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping

import torch

from .atomic import atomic_write
from .pretrained import SAFETENSORS_META_KEY, CheckpointError, read_checkpoint

FORMATS = ("pth", "safetensors", "official")
EXTENSIONS = {"pth": (".pth", ".pt"), "official": (".pth", ".pt"), "safetensors": (".safetensors",)}
EXPORT_VERSION = 1
# official keys with no counterpart in our backbones (the classification head): left out, for the user to fill
OFFICIAL_HEAD_PATTERNS = {"stvit": (r"^proj\.", r"^norm\.", r"^head\."), "hatnet": (r"^classifier\.",)}
_IDENTITY_KERNEL_SHAPE = (9, 1, 3, 3)  # the official STViT Unfold/Fold: torch.eye(9).reshape(9, 1, 3, 3)


class ExportError(ValueError):
    """A usage problem (format vs. extension, no config, no official counterpart); the message names it."""


# --- formats and extensions ------------------------------------------------------------------------------
def resolve_format(out: str | os.PathLike, fmt: str | None = None) -> str:
    """The export format for ``out``: ``fmt`` if it fits the extension, else inferred from the extension."""
    out = os.fspath(out)
    ext = os.path.splitext(out)[1].lower()
    if fmt is None:
        if ext in EXTENSIONS["safetensors"]:
            return "safetensors"
        if ext in EXTENSIONS["pth"]:
            return "pth"
        raise ExportError(f"Cannot infer the export format from {out!r}: use a .pth / .pt file (formats 'pth' "
                          "and 'official') or a .safetensors file (format 'safetensors').")
    if fmt not in FORMATS:
        raise ExportError(f"Unknown format {fmt!r}; choose one of {list(FORMATS)}.")
    if ext not in EXTENSIONS[fmt]:
        raise ExportError(f"Format {fmt!r} does not match the extension of {out!r}: a {fmt} export must be "
                          f"named {' or '.join(EXTENSIONS[fmt])}.")
    return fmt


# --- tensors ---------------------------------------------------------------------------------------------
def canonical_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sorted keys, CPU, contiguous, one storage per tensor: serialises to the same bytes every time."""
    return {k: sd[k].detach().to("cpu", copy=True).contiguous() for k in sorted(sd)}


def tensor_sha256(sd: Mapping[str, torch.Tensor]) -> str:
    """sha256 over sorted keys, each with its dtype, shape and raw bytes (independent of the file format)."""
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().to("cpu").contiguous()
        h.update(f"{k}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def official_state_dict(sd: Mapping[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """Ours -> the official classification model's key layout, head keys absent.

    Our parameter names already are the official ones; STViT also gets the constant identity kernels of
    its conv-based Unfold / Fold (``layers.i.blocks.j.attn.{unfold,fold}.weights``) for every block.
    """
    extra = sorted(k for k in sd if k.startswith("out_norms."))
    if extra:
        raise ExportError(f"The backbone has output norms (norm_out=True: {extra[:2]}...) that the official "
                          f"{family} model does not have, so an 'official' export would lose them. Export with "
                          "--format pth or safetensors instead.")
    out = dict(sd)
    if family == "stvit":
        blocks = sorted({m.group(0) for k in sd if (m := re.match(r"layers\.\d+\.blocks\.\d+\.attn\.", k))})
        if not blocks:
            raise ExportError("No STViT attention blocks (layers.i.blocks.j.attn.*) in the state dict.")
        eye = torch.eye(9).reshape(_IDENTITY_KERNEL_SHAPE)
        for b in blocks:
            out[b + "unfold.weights"] = eye.clone()
            out[b + "fold.weights"] = eye.clone()
    return canonical_state_dict(out)


def plain_meta(obj, for_json: bool = True):
    """Metadata -> plain Python types, the one sanitiser of every meta we write (exports, mm checkpoints).

    Tensors and numpy values become numbers or lists, dict keys strings in sorted order (reproducible files),
    anything else its ``str``. ``for_json=True``: JSON types only (tuples -> lists, NaN / inf -> None), so that
    a .pth meta equals the safetensors one read back from JSON. ``for_json=False``: the types
    ``torch.load(weights_only=True)`` reads, tuples and non-finite floats kept (mm's ``dataset_meta`` has tuples).
    """
    if isinstance(obj, Mapping):
        return {str(k): plain_meta(obj[k], for_json) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        items = [plain_meta(v, for_json) for v in obj]
        return tuple(items) if isinstance(obj, tuple) and not for_json else items
    if isinstance(obj, torch.Tensor):
        return plain_meta(obj.item() if obj.numel() == 1 else obj.tolist(), for_json)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalars / arrays
        return plain_meta(obj.tolist(), for_json)
    if isinstance(obj, float) and not math.isfinite(obj) and for_json:
        return None
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


# --- atomic, reproducible writes -------------------------------------------------------------------------
def save_torch(obj: dict, path: str | os.PathLike) -> None:
    # Through a file object: torch.save then names the archive 'archive', not after the (random) temp file.
    atomic_write(path, lambda f: torch.save(obj, f))


def save_safetensors(sd: Mapping[str, torch.Tensor], meta: dict, path: str | os.PathLike) -> None:
    from safetensors.torch import save
    # One metadata entry only: the header's metadata map has no defined order across processes.
    data = save(dict(sd), metadata={SAFETENSORS_META_KEY: json.dumps(meta, sort_keys=True)})
    atomic_write(path, lambda f: f.write(data))


# --- a backbone's export ----------------------------------------------------------------------------
def save_backbone(sd: Mapping[str, torch.Tensor], model: torch.nn.Module, out: str | os.PathLike,
                  fmt: str | None = None, provenance: Mapping | None = None) -> dict:
    """Write a backbone's tensors to ``out`` in ``fmt`` with their meta; returns the meta that was recorded.

    Args:
        sd: the tensors to write, backbone-relative keys, already checked against ``model`` (e.g. with
            ``backbones.pretrained.state_dict_diff``); ``model.state_dict()`` for a backbone in memory.
        model: the STViT / HATNet they belong to: family, arch, out_indices and norm_out go into the meta.
        out: the file to write (atomically).
        fmt: 'pth', 'safetensors' or 'official'; None: from the extension of ``out``.
        provenance: more meta entries (where the tensors come from: checkpoint, config, step, metrics...).

    The meta holds JSON types only, the same in every format.
    """
    out = os.fspath(out)
    fmt = resolve_format(out, fmt)
    sd = official_state_dict(sd, model.family) if fmt == "official" else canonical_state_dict(sd)
    meta = plain_meta({
        **(provenance or {}),
        "export_version": EXPORT_VERSION,
        "format": fmt,
        "family": model.family,
        "arch": model.arch,
        "out_indices": list(model.out_indices),
        "norm_out": bool(getattr(model, "norm_out", False)),
        "num_tensors": len(sd),
        "num_params": int(sum(t.numel() for t in sd.values())),
        "sha256": tensor_sha256(sd),
    })
    if fmt == "safetensors":
        save_safetensors(sd, meta, out)
    elif fmt == "official":
        save_torch({"model": sd, "meta": meta}, out)  # the released checkpoints' {'model': ...} layout
    else:
        save_torch({"state_dict": sd, "meta": meta}, out)
    return meta


def read_export(path: str | os.PathLike) -> tuple[dict, dict]:
    """(tensors, meta) of an export in any of the three formats."""
    obj, st_meta = read_checkpoint(path)
    if SAFETENSORS_META_KEY in st_meta:
        return dict(obj), json.loads(st_meta[SAFETENSORS_META_KEY])
    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            return dict(obj[key]), dict(obj.get("meta") or {})
    raise CheckpointError(f"{os.fspath(path)!r} is not a backbone export (no 'state_dict' / 'model' entry).")


def verify_export(path: str | os.PathLike) -> dict:
    """Recompute the tensors' sha256 and compare with the recorded one; returns the meta."""
    sd, meta = read_export(path)
    if meta.get("sha256") != tensor_sha256(sd):
        raise CheckpointError(f"{os.fspath(path)!r}: the tensors' sha256 does not match the one recorded in its "
                              "meta; the file was modified or damaged.")
    return meta
