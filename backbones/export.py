"""Export the backbone of a trained detector / segmentor for sharing: ``pth``, ``safetensors`` or the
official classification layout (``tools/export_backbone.py`` is the command line).

Inputs are our Lightning checkpoints (``state_dict`` keys ``model.backbone.*``, plus Lightning's training
state) and mm-format checkpoints (``{'state_dict': {'backbone.*': ...}, 'meta': ...}``), always read through
``read_checkpoint`` (``weights_only`` with an allow-list). The pure parts (state dict -> file formats, meta,
tensor hash, official key layout, atomic writes) need torch only; reading an mmengine config imports
mmengine lazily.

Every file is written to a temp file in the target's directory, fsynced and ``os.replace``-d, and the same
input always gives the same bytes (sorted keys, no timestamps, each tensor in its own storage).
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import pprint
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .atomic import atomic_write  # noqa: F401  (re-exported: export's public helpers)
from .pretrained import SAFETENSORS_META_KEY, CheckpointError, detect_family, read_checkpoint

FORMATS = ("pth", "safetensors", "official")
EXTENSIONS = {"pth": (".pth", ".pt"), "official": (".pth", ".pt"), "safetensors": (".safetensors",)}
EXPORT_VERSION = 1
# backbone config ``type`` -> (family, class name in this package)
BACKBONE_TYPES = {"STViT": "stvit", "HATNet": "hatnet"}
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


def _plain(obj):
    """Meta -> JSON types only (tensors / numpy scalars -> numbers, tuples -> lists, sorted dict keys)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        obj = obj.item() if obj.numel() == 1 else obj.tolist()
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalars / arrays
        obj = obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
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


# --- reading training checkpoints ------------------------------------------------------------------------
@dataclass
class TrainingCheckpoint:
    """A trained model's weights and provenance, from a Lightning or mm-format checkpoint."""

    path: str
    kind: str  # 'lightning' | 'mm'
    state_dict: dict  # the mm model's tensors, keys without Lightning's 'model.' prefix
    step: int | None = None
    epoch: int | None = None
    metrics: dict = field(default_factory=dict)  # last validation metrics
    metrics_source: str = "none"
    best: dict = field(default_factory=dict)  # ModelCheckpoint's best score: {'monitor', 'score'}
    config_text: str | None = None  # the training config, when the checkpoint carries it
    meta: dict = field(default_factory=dict)  # an mm checkpoint's own meta


# Where a Lightning checkpoint may carry the training config (text or plain dict) and the metrics.
_CONFIG_KEYS = ("mm_config", "cfg", "config")
_METRICS_KEYS = ("val_metrics", "metrics")


def read_training_checkpoint(path: str | os.PathLike) -> TrainingCheckpoint:
    path = os.fspath(path)
    obj, _ = read_checkpoint(path)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("state_dict"), Mapping):
        found = sorted(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(f"{path!r} is not a Lightning or mm-format checkpoint: expected a 'state_dict' entry "
                              f"(top-level entries: {found}). To re-export a backbone file, load it with "
                              "backbones.load_pretrained instead.")
    sd = {k: v for k, v in obj["state_dict"].items() if isinstance(v, torch.Tensor)}
    if "pytorch-lightning_version" in obj or (sd and all(k.startswith("model.") for k in sd)):
        return _read_lightning(path, obj, sd)
    meta = dict(obj.get("meta") or {})
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    metrics = meta.get("metrics") if isinstance(meta.get("metrics"), Mapping) else {}
    return TrainingCheckpoint(path, "mm", sd, step=meta.get("iter", meta.get("step")), epoch=meta.get("epoch"),
                              metrics=dict(metrics), metrics_source="checkpoint meta['metrics']" if metrics
                              else "none", config_text=meta.get("cfg") if isinstance(meta.get("cfg"), str)
                              else None, meta=meta)


def _read_lightning(path: str, obj: Mapping, sd: dict) -> TrainingCheckpoint:
    ckpt = TrainingCheckpoint(path, "lightning", {k.removeprefix("model."): v for k, v in sd.items()
                                                  if k.startswith("model.")},
                              step=obj.get("global_step"), epoch=obj.get("epoch"))
    hparams = obj.get("hyper_parameters") if isinstance(obj.get("hyper_parameters"), Mapping) else {}
    for where in (obj, hparams):
        for key in _CONFIG_KEYS:
            value = where.get(key)
            if isinstance(value, str):
                ckpt.config_text = value
            elif isinstance(value, Mapping):
                ckpt.config_text = _config_text_from_dict(value)
            if ckpt.config_text:
                break
        if ckpt.config_text:
            break
    for key in _METRICS_KEYS:
        if isinstance(obj.get(key), Mapping) and obj[key]:
            ckpt.metrics, ckpt.metrics_source = _plain(obj[key]), f"checkpoint[{key!r}]"
            break
    for name, state in (obj.get("callbacks") or {}).items():
        if not (str(name).startswith("ModelCheckpoint") and isinstance(state, Mapping) and state.get("monitor")):
            continue
        monitor = state["monitor"]
        if state.get("best_model_score") is not None:
            ckpt.best = {"monitor": monitor, "score": _plain(state["best_model_score"])}
        if not ckpt.metrics and state.get("current_score") is not None:
            ckpt.metrics = {monitor: _plain(state["current_score"])}
            ckpt.metrics_source = "ModelCheckpoint current_score (monitored metric only)"
    return ckpt


def _config_text_from_dict(d: Mapping) -> str:
    from mmengine.config import Config
    return config_text(Config(dict(d)))


# --- configs ---------------------------------------------------------------------------------------------
def resolve_config(ckpt: TrainingCheckpoint, config: str | os.PathLike | None = None):
    """The training config: ``config`` (a file) if given, else the one stored in the checkpoint.

    Returns (mmengine Config, {'source', 'path', 'text'}).
    """
    from mmengine.config import Config
    if config is not None:
        config = os.fspath(config)
        if not os.path.isfile(config):
            raise ExportError(f"Config file not found: {config!r}.")
        cfg = Config.fromfile(config)
        info = {"source": "file", "path": config}
    elif ckpt.config_text:
        cfg = Config(config_from_text(ckpt.config_text, ckpt.path))
        info = {"source": "checkpoint", "path": None}
    else:
        here = os.path.dirname(os.path.abspath(ckpt.path))
        candidates = sorted(f for f in os.listdir(here) if f.endswith(".py"))
        hint = (f" tools/train.py saved a copy of the training config next to it: "
                f"{', '.join(os.path.join(here, c) for c in candidates)}." if candidates else "")
        raise ExportError(f"{ckpt.path!r} does not record its config (the backbone's family and arch come from "
                          f"it): pass --config CONFIG, the config the model was trained with.{hint}")
    info["text"] = config_text(cfg)
    return cfg, info


def config_from_text(text: str, source: str) -> dict:
    """Read a config stored in a checkpoint WITHOUT running it: only ``key = literal`` statements.

    A config file is Python and executing one from an untrusted checkpoint would run its code, so anything
    but plain literals (calls, imports, expressions) is refused and the user is asked for ``--config``.
    """
    try:
        tree = ast.parse(text, mode="exec")
        out = {}
        for stmt in tree.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                raise ValueError(f"line {stmt.lineno} is not a plain `key = value` assignment")
            out[stmt.targets[0].id] = ast.literal_eval(stmt.value)
        return out
    except (SyntaxError, ValueError) as e:
        raise ExportError(f"The config stored in {source!r} is not plain literals ({e}); it is not executed. "
                          "Pass --config CONFIG, the config the model was trained with.") from e


def config_text(cfg) -> str:
    """The resolved config as Python source that ``Config.fromstring(text, '.py')`` reads back.

    One ``key = literal`` per top-level entry (pprint, no yapf: ``Config.pretty_text`` takes a second or
    more); configs holding non-literal values (lazy-import configs) fall back to ``pretty_text``.
    """
    lines = []
    for key, value in cfg.to_dict().items():
        text = pprint.pformat(value, width=110, sort_dicts=False)
        try:
            ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return cfg.pretty_text
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def backbone_config(cfg) -> tuple[str, dict]:
    """(family, backbone kwargs) from ``cfg.model.backbone``."""
    model = cfg.get("model") or {}
    bcfg = model.get("backbone") if isinstance(model, Mapping) else None
    if not isinstance(bcfg, Mapping) or "type" not in bcfg:
        raise ExportError("The config has no model.backbone with a 'type': cannot tell which backbone to export.")
    bcfg = bcfg.to_dict() if hasattr(bcfg, "to_dict") else dict(bcfg)
    type_name = str(bcfg["type"]).rpartition(".")[2]
    if type_name not in BACKBONE_TYPES:
        raise ExportError(f"model.backbone.type is {bcfg['type']!r}; only {sorted(BACKBONE_TYPES)} backbones can "
                          "be exported.")
    return BACKBONE_TYPES[type_name], bcfg


def build_backbone(family: str, bcfg: Mapping):
    """The pure backbone (no weights loaded) described by a ``model.backbone`` config."""
    from . import hatnet, stvit
    cls = stvit.STViT if family == "stvit" else hatnet.HATNet
    kwargs = {k: v for k, v in bcfg.items() if k not in ("type", "init_cfg", "pretrained")}
    return cls(**kwargs)


def backbone_tensors(model_sd: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The ``backbone.*`` tensors of a detector / segmentor state dict, with backbone-relative keys."""
    sd = {k[len("backbone."):]: v for k, v in model_sd.items() if k.startswith("backbone.")}
    if not sd:
        prefixes = sorted({k.split(".")[0] + "." for k in model_sd})[:8]
        raise CheckpointError(f"{source} holds no backbone: none of its {len(model_sd)} model tensors sit under "
                              f"'backbone.' (their keys start with {prefixes}).")
    return sd


def check_against_backbone(sd: Mapping[str, torch.Tensor], model, source: str) -> None:
    """The tensors must be exactly the built backbone's state dict: same keys, same shapes."""
    own = model.state_dict()
    fam = detect_family(sd)
    if fam not in (None, model.family):
        raise CheckpointError(f"{source} holds a {fam} backbone, but the config describes {type(model).__name__}.")
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    mismatched = [f"{k}: checkpoint {tuple(sd[k].shape)} vs config {tuple(own[k].shape)}"
                  for k in sorted(set(sd) & set(own)) if sd[k].shape != own[k].shape]
    if missing or unexpected or mismatched:
        raise CheckpointError(
            f"The backbone in {source} does not match the config's model.backbone ({type(model).__name__}, "
            f"arch {model.arch}): missing {len(missing)} {missing[:4]}, unexpected {len(unexpected)} "
            f"{unexpected[:4]}, shape mismatches {len(mismatched)} {mismatched[:3]}. Pass the config the model "
            "was trained with (--config).")


# --- export ----------------------------------------------------------------------------------------------
def backbone_meta(family: str, model, bcfg: Mapping, ckpt: TrainingCheckpoint, config_info: Mapping,
                  sd: Mapping[str, torch.Tensor], fmt: str) -> dict:
    meta = {
        "export_version": EXPORT_VERSION,
        "format": fmt,
        "family": family,
        "arch": model.arch,
        "out_indices": list(model.out_indices),
        "norm_out": bool(getattr(model, "norm_out", False)),
        "backbone_cfg": {k: v for k, v in bcfg.items() if k not in ("init_cfg", "pretrained")},
        "source": {"checkpoint": ckpt.path, "kind": ckpt.kind},
        "config": dict(config_info),
        "step": ckpt.step,
        "epoch": ckpt.epoch,
        "metrics": ckpt.metrics,
        "metrics_source": ckpt.metrics_source,
        "best": ckpt.best,
        "num_tensors": len(sd),
        "num_params": int(sum(t.numel() for t in sd.values())),
        "sha256": tensor_sha256(sd),
    }
    return _plain(meta)


def export_backbone(checkpoint: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None,
                    config: str | os.PathLike | None = None) -> dict:
    """Write the backbone of ``checkpoint`` to ``out``; returns the meta that was recorded."""
    out = os.fspath(out)
    fmt = resolve_format(out, fmt)  # before any work: a wrong extension fails fast
    ckpt = read_training_checkpoint(checkpoint)
    sd = backbone_tensors(ckpt.state_dict, repr(ckpt.path))
    cfg, config_info = resolve_config(ckpt, config)
    family, bcfg = backbone_config(cfg)
    model = build_backbone(family, bcfg)
    check_against_backbone(sd, model, repr(ckpt.path))
    sd = official_state_dict(sd, family) if fmt == "official" else canonical_state_dict(sd)
    meta = backbone_meta(family, model, bcfg, ckpt, config_info, sd, fmt)
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
