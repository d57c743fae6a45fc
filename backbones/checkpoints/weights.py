"""Reading checkpoints and loading them into a model, with one key / shape report.

Every weight file of the project goes through here: backbone checkpoints (``load_pretrained`` in
``backbones/checkpoints/pretrained.py`` adds the official key filter and the variant checks), whole models
(``load_from``, ``tools/test.py``, ``tools/infer.py``: ours, mmdet's / mmseg's ``{'state_dict', 'meta'}`` files,
Lightning checkpoints whose keys start with ``model.``) and training checkpoints (``--resume``, read by
``tasks/training/checkpoint_io.py``). Files are read with ``torch.load(weights_only=True)`` and a small allow-list, so a
crafted checkpoint cannot run code; ``http(s)://`` URLs are downloaded and verified first
(``backbones/checkpoints/download.py``). Pure PyTorch: no Lightning, no mm.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..errors import CheckpointError

# Classes that may appear in trusted-format checkpoints besides tensors and Python builtins: the
# official DeiT-style training scripts store their `args` as an argparse.Namespace.
SAFE_GLOBALS = [argparse.Namespace]


def _summary(keys: list[str], n: int = 6) -> str:
    return ", ".join(keys[:n]) + (f", ... (+{len(keys) - n})" if len(keys) > n else "")


# --- the report ------------------------------------------------------------------------------------------
@dataclass
class KeyReport:
    """How checkpoint tensors fit a model's ``state_dict()``: by key and shape.

    False when everything fits (nothing missing, unexpected or mismatched); ``str()`` lists the differences.
    """

    loaded: list[str] = field(default_factory=list)  # same key, same shape: these load
    missing: list[str] = field(default_factory=list)  # expected, absent from the checkpoint
    unexpected: list[str] = field(default_factory=list)  # in the checkpoint, unknown to the model
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

    def summary(self, source: str) -> str:
        """One line for the log: what loaded from ``source``, what was skipped and why, every key named."""
        text = f"Loaded {len(self.loaded)} tensors from {source}"
        if self.mismatched:
            text += f"; skipped {len(self.mismatched)} for a shape mismatch: {'; '.join(self.mismatched)}"
        if self.missing:
            text += f"; missing from the checkpoint (initialised as configured): {', '.join(self.missing)}"
        if self.unexpected:
            text += f"; not in the model (ignored): {', '.join(self.unexpected)}"
        return text


def state_dict_diff(
    given: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], optional=None
) -> KeyReport:
    """Compare checkpoint tensors (``given``) with a model's ``state_dict()`` (``expected``): keys and shapes.

    Args:
        given: the tensors about to be loaded or written, by key.
        expected: the model's own state dict.
        optional: ``optional(key)`` is True for expected keys that may be absent from ``given`` (e.g. layers
            the checkpoint cannot have); None: every expected key is required.

    Returns a ``KeyReport``: false when the keys and shapes agree, else ``str(report)`` names the missing and
    unexpected keys and the shape mismatches, for an error message that the caller completes with the fix.
    """
    missing = [k for k in expected if k not in given and not (optional and optional(k))]
    unexpected = [k for k in given if k not in expected]
    same, mismatched = [], []
    for k in given:
        if k in expected:
            if tuple(given[k].shape) == tuple(expected[k].shape):
                same.append(k)
            else:
                mismatched.append(f"{k}: checkpoint {tuple(given[k].shape)} vs model {tuple(expected[k].shape)}")
    return KeyReport(sorted(same), sorted(missing), sorted(unexpected), sorted(mismatched))


# --- reading files -------------------------------------------------------------------------------------
def check_checkpoint_path(path: str | os.PathLike, sha256: str | None = None) -> str:
    """The local file that ``path`` names: ``path`` itself, or for an ``http(s)://`` URL the verified file in
    torch.hub's cache (downloaded once, see ``backbones/checkpoints/download.py``).

    Args:
        path: a file path (``~`` expanded) or an ``http(s)://`` URL (optionally ``#sha256=<hex>``).
        sha256: the expected sha256 of a URL's file; None: from the URL, if it gives one.

    Raises CheckpointError for a missing file, another kind of URL, a failed download or a wrong hash.
    """
    from .download import fetch, is_url

    path = os.fspath(path)
    if is_url(path):
        return fetch(path, sha256)
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path)
    if scheme:  # e.g. 'open-mmlab://resnet50_v1c', 'torchvision://resnet50', 's3://...'
        raise CheckpointError(
            f"Checkpoint {path!r} is a URL ({scheme.group(0)}...) that this loader cannot fetch; the backbones "
            "load local files and http(s):// URLs only. Download the checkpoint and pass its path."
        )
    path = os.path.expanduser(path)  # '~/weights/x.pth', as mmengine's own loader reads it
    if os.path.isdir(path):
        ckpts = sorted(f for f in os.listdir(path) if f.endswith((".ckpt", ".pth", ".pt", ".safetensors")))
        raise CheckpointError(
            f"Checkpoint {path!r} is a folder, not a checkpoint file: give a file in it"
            + (f" ({', '.join(ckpts[:5])}{', ...' if len(ckpts) > 5 else ''})." if ckpts else ".")
        )
    if not os.path.isfile(path):
        raise CheckpointError(
            f"Checkpoint file not found: {path!r}. Check the path (relative paths are resolved from {os.getcwd()!r})."
        )
    return path


def read_checkpoint(path: str | os.PathLike, sha256: str | None = None) -> tuple[dict, dict]:
    """Read a .pth/.pt/.ckpt (weights_only, allow-listed classes) or .safetensors file, or an http(s) URL's.

    Args:
        path: the file, or an ``http(s)://`` URL (see ``check_checkpoint_path``).
        sha256: the expected sha256 of a URL's file; None: from the URL, if it gives one.

    Returns (object, safetensors metadata). Raises CheckpointError with the path and the fix for a missing,
    truncated, corrupt or unsafe file.
    """
    path = check_checkpoint_path(path, sha256)
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
    """A safetensors file named .pth, a torch.save file named .safetensors, or an ONNX graph gets its own
    message."""
    if path.lower().endswith(".onnx"):
        raise CheckpointError(
            f"{path!r} is an ONNX graph, for onnxruntime and other ONNX runtimes; PyTorch weights cannot be read "
            "back from it. Load the .pth or .safetensors export of the same checkpoint instead "
            "(tools/export_backbone.py CHECKPOINT --out backbone.pth)."
        )
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


# --- whole models --------------------------------------------------------------------------------------
def is_state_dict(obj) -> bool:
    """A non-empty mapping of string keys to tensors."""
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def model_state_dict(obj, source: str = "the checkpoint") -> tuple[dict, dict, str]:
    """The model tensors of a checkpoint, keys as the model names them.

    Layouts: a plain state dict; ``{'state_dict': ..., 'meta': ...}`` (mmengine's Runner, mmdet's / mmseg's
    releases, ``tools/export_model.py``); a Lightning checkpoint of ``tools/train.py`` (``state_dict`` keys
    ``model.*``, ``model.`` removed); ``{'model': ...}`` (official releases). A ``module.`` prefix
    (DataParallel / DDP) is removed.

    Args:
        obj: the object ``read_checkpoint`` returned.
        source: the file, for the error message.

    Returns (tensors, meta, layout name). Raises CheckpointError when no tensors are found.
    """
    if is_state_dict(obj):
        sd, meta, layout = dict(obj), {}, "plain state dict"
    elif isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping) and obj["state_dict"]:
        sd = {k: v for k, v in obj["state_dict"].items() if isinstance(v, torch.Tensor)}
        meta = dict(obj["meta"]) if isinstance(obj.get("meta"), Mapping) else {}
        layout = "state_dict checkpoint"
        if "pytorch-lightning_version" in obj or (sd and all(k.startswith("model.") for k in sd)):
            sd, layout = {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")}, "Lightning"
    elif isinstance(obj, Mapping) and is_state_dict(obj.get("model")):
        sd, layout = dict(obj["model"]), "official release"
        meta = dict(obj["meta"]) if isinstance(obj.get("meta"), Mapping) else {}
    else:
        found = sorted(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"No model weights found in {source} (top-level entries: {found}). "
            "Expected a state dict, {'state_dict': ...} or {'model': ...}."
        )
    return {k.removeprefix("module."): v for k, v in sd.items()}, meta, layout


def load_state_dict_checked(model: nn.Module, sd: Mapping[str, torch.Tensor], source: str, strict: bool) -> KeyReport:
    """Load ``sd`` into ``model`` after comparing keys and shapes; returns the report.

    Args:
        model: the module to load into (in place).
        sd: the tensors, keys as ``model.state_dict()`` names them.
        source: the file they come from, for messages.
        strict: True: any difference raises CheckpointError and nothing is loaded. False: the tensors whose key
            and shape match load; shape mismatches (e.g. heads with another number of classes), missing and
            unexpected keys are left out and listed in the report (mmengine's ``load_checkpoint(strict=False)``).

    Raises CheckpointError when nothing matches (another model's file), or on any difference when ``strict``.
    """
    report = state_dict_diff(sd, model.state_dict())
    if strict and report:
        raise CheckpointError(f"{source} does not match the {type(model).__name__}. {report}")
    if not report.loaded:
        ours = sorted({k.split(".")[0] + "." for k in model.state_dict()})[:8]
        theirs = sorted({k.split(".")[0] + "." for k in sd})[:8]
        raise CheckpointError(
            f"{source} does not fit this {type(model).__name__}: none of its {len(sd)} tensors has a key and shape "
            f"of the model (its keys start with {theirs}, the model's with {ours}). Pick a checkpoint of this "
            "model; a backbone export loads with model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...)."
        )
    model.load_state_dict({k: sd[k] for k in report.loaded}, strict=False)
    return report


def load_model_weights(
    model: nn.Module, checkpoint: str | os.PathLike | Mapping, strict: bool = False, sha256: str | None = None
) -> KeyReport:
    """Read a whole-model checkpoint (file, URL or loaded object) and load it into ``model``.

    Args:
        model: the detector / segmentor (any ``nn.Module``), loaded in place.
        checkpoint: a path, an ``http(s)://`` URL or an already read checkpoint; any layout of
            ``model_state_dict``.
        strict: see ``load_state_dict_checked``.
        sha256: the expected sha256 of a URL's file; None: from the URL, if it gives one.

    Returns the ``KeyReport``; ``report.summary(source)`` is the log line.
    """
    if isinstance(checkpoint, Mapping):
        source, obj = "<in-memory checkpoint>", checkpoint
    else:
        source = os.fspath(checkpoint)
        obj, _ = read_checkpoint(source, sha256)
    sd, _, _ = model_state_dict(obj, repr(source))
    return load_state_dict_checked(model, sd, repr(source), strict)
