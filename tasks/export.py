"""Exports of a trained model: its backbone (``tools/export_backbone.py``) or the whole detector / segmentor in
mm's checkpoint format (``tools/export_model.py``).

Inputs are our Lightning checkpoints (``state_dict`` keys ``model.*``, plus Lightning's training state) and
mm-format checkpoints (``{'state_dict': {'backbone.*': ...}, 'meta': ...}``), always read through
``backbones.pretrained.read_checkpoint`` (``weights_only`` with an allow-list). The training config comes from
``--config`` or from the checkpoint (read as literals, never executed); the tensors are checked against the model
that config builds before anything is written. The file formats themselves are ``backbones/export.py``'s.
"""

from __future__ import annotations

import ast
import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from mmengine.config import Config

from backbones.export import (
    EXTENSIONS,
    ExportError,
    canonical_state_dict,
    plain_meta,
    resolve_format,
    save_backbone,
    save_torch,
    tensor_sha256,
)
from backbones.pretrained import CheckpointError, detect_family, read_checkpoint, state_dict_diff

from .config import config_text, register_scope

# backbone config ``type`` -> family
BACKBONE_TYPES = {"STViT": "stvit", "HATNet": "hatnet"}
# Where a Lightning checkpoint may carry the training config (text or plain dict) and the metrics.
_CONFIG_KEYS = ("mm_config", "cfg", "config")
_METRICS_KEYS = ("val_metrics", "metrics")


# --- reading training checkpoints ------------------------------------------------------------------------
@dataclass
class TrainingCheckpoint:
    """A trained model's weights and provenance, from a Lightning or mm-format checkpoint.

    Args:
        path: the file it was read from.
        kind: ``'lightning'`` or ``'mm'``.
        state_dict: the mm model's tensors, keys without Lightning's ``model.`` prefix.
        step: the optimizer step it was saved at (None: not recorded).
        epoch: the epoch it was saved in (None: not recorded).
        metrics: the last validation metrics.
        metrics_source: where ``metrics`` were found, in words.
        best: ``ModelCheckpoint``'s best score, ``{'monitor', 'score'}``.
        config_text: the training config stored in the checkpoint, if any.
        meta: an mm checkpoint's own meta.
    """

    path: str
    kind: str
    state_dict: dict
    step: int | None = None
    epoch: int | None = None
    metrics: dict = field(default_factory=dict)
    metrics_source: str = "none"
    best: dict = field(default_factory=dict)
    config_text: str | None = None
    meta: dict = field(default_factory=dict)


def read_training_checkpoint(path: str | os.PathLike) -> TrainingCheckpoint:
    """Read a Lightning checkpoint of ``tools/train.py`` or an mm-format checkpoint (``state_dict`` + ``meta``).

    Args:
        path: the checkpoint file.

    Raises ``CheckpointError`` for a file that is neither, backbone exports included (``load_pretrained`` reads those).
    """
    path = os.fspath(path)
    obj, _ = read_checkpoint(path)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("state_dict"), Mapping):
        found = sorted(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"{path!r} is not a Lightning or mm-format checkpoint: expected a 'state_dict' entry "
            f"(top-level entries: {found}). To re-export a backbone file, load it with "
            "backbones.load_pretrained instead."
        )
    sd = {k: v for k, v in obj["state_dict"].items() if isinstance(v, torch.Tensor)}
    if "pytorch-lightning_version" in obj or (sd and all(k.startswith("model.") for k in sd)):
        return _read_lightning(path, obj, sd)
    meta = dict(obj.get("meta") or {})
    if "export_version" in meta and "family" in meta:
        raise CheckpointError(
            f"{path!r} is a backbone export ({meta['family']}, tools/export_backbone.py), not a whole model: load it "
            "with backbones.load_pretrained or a backbone init_cfg=dict(type='Pretrained', checkpoint=...)."
        )
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    metrics = meta.get("metrics") if isinstance(meta.get("metrics"), Mapping) else {}
    return TrainingCheckpoint(
        path,
        "mm",
        sd,
        step=meta.get("iter", meta.get("step")),
        epoch=meta.get("epoch"),
        metrics=dict(metrics),
        metrics_source="checkpoint meta['metrics']" if metrics else "none",
        config_text=meta.get("cfg") if isinstance(meta.get("cfg"), str) else None,
        meta=meta,
    )


def _read_lightning(path: str, obj: Mapping, sd: dict) -> TrainingCheckpoint:
    ckpt = TrainingCheckpoint(
        path,
        "lightning",
        {k.removeprefix("model."): v for k, v in sd.items() if k.startswith("model.")},
        step=obj.get("global_step"),
        epoch=obj.get("epoch"),
    )
    hparams = obj.get("hyper_parameters") if isinstance(obj.get("hyper_parameters"), Mapping) else {}
    for where in (obj, hparams):
        for key in _CONFIG_KEYS:
            value = where.get(key)
            if isinstance(value, str):
                ckpt.config_text = value
            elif isinstance(value, Mapping):
                ckpt.config_text = config_text(Config(dict(value)))
            if ckpt.config_text:
                break
        if ckpt.config_text:
            break
    for key in _METRICS_KEYS:
        if isinstance(obj.get(key), Mapping) and obj[key]:
            ckpt.metrics, ckpt.metrics_source = plain_meta(obj[key]), f"checkpoint[{key!r}]"
            break
    for name, state in (obj.get("callbacks") or {}).items():
        if not (str(name).startswith("ModelCheckpoint") and isinstance(state, Mapping) and state.get("monitor")):
            continue
        monitor = state["monitor"]
        if state.get("best_model_score") is not None:
            ckpt.best = {"monitor": monitor, "score": plain_meta(state["best_model_score"])}
        if not ckpt.metrics and state.get("current_score") is not None:
            ckpt.metrics = {monitor: plain_meta(state["current_score"])}
            ckpt.metrics_source = "ModelCheckpoint current_score (monitored metric only)"
    return ckpt


# --- configs ---------------------------------------------------------------------------------------------
def resolve_config(ckpt: TrainingCheckpoint, config: str | os.PathLike | None = None) -> tuple[Config, dict]:
    """The training config: ``config`` (a file) if given, else the one stored in the checkpoint.

    Args:
        ckpt: the checkpoint being exported.
        config: the training config file; None: use the one ``ckpt`` stores.

    Returns (mmengine Config, {'source': 'file' | 'checkpoint', 'path', 'text'}).
    """
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
        hint = (
            f" tools/train.py saved a copy of the training config next to it: "
            f"{', '.join(os.path.join(here, c) for c in candidates)}."
            if candidates
            else ""
        )
        raise ExportError(
            f"{ckpt.path!r} does not record its config (the backbone's family and arch come from "
            f"it): pass --config CONFIG, the config the model was trained with.{hint}"
        )
    info["text"] = config_text(cfg)
    return cfg, info


def config_from_text(text: str, source: str) -> dict:
    """Read a config stored in a checkpoint WITHOUT running it: only ``key = literal`` statements.

    A config file is Python and executing one from an untrusted checkpoint would run its code, so anything
    but plain literals (calls, imports, expressions) is refused and the user is asked for ``--config``.

    Args:
        text: the stored config (``tasks.config.config_text`` wrote it).
        source: the checkpoint it comes from, for the error message.
    """
    try:
        tree = ast.parse(text, mode="exec")
        out = {}
        for stmt in tree.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                raise ValueError(f"line {stmt.lineno} is not a plain `key = value` assignment")
            out[stmt.targets[0].id] = ast.literal_eval(stmt.value)
        return out
    except (SyntaxError, ValueError) as e:
        raise ExportError(
            f"The config stored in {source!r} is not plain literals ({e}); it is not executed. "
            "Pass --config CONFIG, the config the model was trained with."
        ) from e


def backbone_config(cfg: Config | Mapping) -> tuple[str, dict]:
    """(family, backbone kwargs) from ``cfg.model.backbone``."""
    model = cfg.get("model") or {}
    bcfg = model.get("backbone") if isinstance(model, Mapping) else None
    if not isinstance(bcfg, Mapping) or "type" not in bcfg:
        raise ExportError("The config has no model.backbone with a 'type': cannot tell which backbone to export.")
    bcfg = bcfg.to_dict() if hasattr(bcfg, "to_dict") else dict(bcfg)
    type_name = str(bcfg["type"]).rpartition(".")[2]
    if type_name not in BACKBONE_TYPES:
        raise ExportError(
            f"model.backbone.type is {bcfg['type']!r}; only {sorted(BACKBONE_TYPES)} backbones can be exported."
        )
    return BACKBONE_TYPES[type_name], bcfg


def build_backbone(family: str, bcfg: Mapping) -> torch.nn.Module:
    """The pure backbone (no weights loaded) described by a ``model.backbone`` config."""
    from backbones import HATNet, STViT

    cls = STViT if family == "stvit" else HATNet
    return cls(**{k: v for k, v in bcfg.items() if k not in ("type", "init_cfg", "pretrained")})


# --- checks ----------------------------------------------------------------------------------------------
def backbone_tensors(model_sd: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The ``backbone.*`` tensors of a detector / segmentor state dict, with backbone-relative keys."""
    sd = {k[len("backbone.") :]: v for k, v in model_sd.items() if k.startswith("backbone.")}
    if not sd:
        prefixes = sorted({k.split(".")[0] + "." for k in model_sd})[:8]
        raise CheckpointError(
            f"{source} holds no backbone: none of its {len(model_sd)} model tensors sit under "
            f"'backbone.' (their keys start with {prefixes})."
        )
    return sd


def check_against_model(
    sd: Mapping[str, torch.Tensor],
    model: torch.nn.Module,
    source: str,
    fix: str = "Pass the config the model was trained with (--config).",
) -> None:
    """The tensors must be exactly the state dict of the model the config builds: same keys, same shapes.

    Args:
        sd: the tensors.
        model: the model the config builds.
        source: where the tensors come from, for the message.
        fix: the last sentence of the message: what to do.
    """
    family = getattr(model, "family", None)
    found = detect_family(sd) if family else None
    if found not in (None, family):
        raise CheckpointError(
            f"{source} holds a {found} backbone, but the config describes {type(model).__name__}. {fix}"
        )
    diff = state_dict_diff(sd, model.state_dict())
    if diff:
        what = f"model.backbone ({type(model).__name__}, arch {model.arch})" if family else "model"
        raise CheckpointError(f"{source} does not match the config's {what}. {diff} {fix}")


# --- exports ---------------------------------------------------------------------------------------------
def export_backbone(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    fmt: str | None = None,
    config: str | os.PathLike | None = None,
) -> dict:
    """Write the backbone of a trained detector / segmentor to ``out``; returns the meta that was recorded.

    Args:
        checkpoint: a Lightning checkpoint of ``tools/train.py`` or an mm-format checkpoint.
        out: the file to write: ``.pth`` / ``.pt`` or ``.safetensors``.
        fmt: ``'pth'``, ``'safetensors'`` or ``'official'``; None: from the extension of ``out``.
        config: the training config; None: the one the checkpoint stores.
    """
    resolve_format(out, fmt)  # before any work: a wrong extension fails fast
    ckpt = read_training_checkpoint(checkpoint)
    sd = backbone_tensors(ckpt.state_dict, repr(ckpt.path))
    cfg, config_info = resolve_config(ckpt, config)
    family, bcfg = backbone_config(cfg)
    model = build_backbone(family, bcfg)
    check_against_model(sd, model, repr(ckpt.path))
    provenance = {
        "backbone_cfg": {k: v for k, v in bcfg.items() if k not in ("init_cfg", "pretrained")},
        "source": {"checkpoint": ckpt.path, "kind": ckpt.kind},
        "config": dict(config_info),
        "step": ckpt.step,
        "epoch": ckpt.epoch,
        "metrics": ckpt.metrics,
        "metrics_source": ckpt.metrics_source,
        "best": ckpt.best,
    }
    return save_backbone(sd, model, out, fmt, provenance)


def dataset_meta(cfg: Config) -> dict:
    """The test dataset's metainfo (classes, palette...), as mmdet's ``init_detector`` computes it: the
    dataset is built with ``lazy_init=True``, so no annotation file is read."""
    from mmengine.registry import DATASETS

    errors = []
    for section in ("test_dataloader", "val_dataloader", "train_dataloader"):
        loader = cfg.get(section)
        if loader and loader.get("dataset"):
            dataset_cfg = copy.deepcopy(loader["dataset"])
            dataset_cfg["lazy_init"] = True
            try:
                return plain_meta(dict(DATASETS.build(dataset_cfg).metainfo), for_json=False)
            except Exception as e:  # e.g. a wrapper dataset without lazy_init
                errors.append(f"{section}: {e}")
    raise ExportError(
        "Cannot get the class names / palette from the config: no dataloader dataset could be "
        f"built ({'; '.join(errors) or 'no dataloader sections'})."
    )


def export_model(
    checkpoint: str | os.PathLike, out: str | os.PathLike, config: str | os.PathLike | None = None
) -> dict:
    """Write a trained detector / segmentor in mm's checkpoint format to ``out``; returns the meta.

    The file is ``{'state_dict': model tensors, 'meta': {'dataset_meta', 'cfg', 'epoch', 'iter', 'metrics', ...}}``,
    the layout mmengine's Runner writes, which mmdet's ``init_detector`` and mmseg's ``init_model`` load.

    Args:
        checkpoint: a Lightning checkpoint of ``tools/train.py``.
        out: the ``.pth`` / ``.pt`` file to write.
        config: the training config; None: the one the checkpoint stores.
    """
    out = os.fspath(out)
    if os.path.splitext(out)[1].lower() not in EXTENSIONS["pth"]:
        raise ExportError(f"{out!r}: an mm checkpoint is a torch.save file, name it .pth or .pt.")
    ckpt = read_training_checkpoint(checkpoint)
    if not ckpt.state_dict:
        raise CheckpointError(f"{ckpt.path!r} holds no model tensors.")
    cfg, config_info = resolve_config(ckpt, config)
    scope = cfg.get("default_scope")
    if scope not in ("mmdet", "mmseg"):
        raise ExportError(f"The config's default_scope must be 'mmdet' or 'mmseg', got {scope!r}.")
    register_scope(scope)
    from mmengine.registry import MODELS

    model_cfg = copy.deepcopy(cfg.model)
    if isinstance(model_cfg.get("backbone"), dict):
        model_cfg.backbone.init_cfg = None  # the checkpoint provides every weight; load nothing here
    with torch.device("cpu"):
        check_against_model(ckpt.state_dict, MODELS.build(model_cfg), repr(ckpt.path))
    sd = canonical_state_dict(ckpt.state_dict)
    meta = {
        "dataset_meta": dataset_meta(cfg),
        "cfg": config_info["text"],
        "config_path": config_info.get("path"),
        "epoch": ckpt.epoch,
        "iter": ckpt.step,
        "metrics": plain_meta(ckpt.metrics, for_json=False),
        "metrics_source": ckpt.metrics_source,
        "best": plain_meta(ckpt.best, for_json=False),
        "source": {"checkpoint": ckpt.path, "kind": ckpt.kind},
        "sha256": tensor_sha256(sd),
    }
    save_torch({"state_dict": sd, "meta": meta}, out)
    return meta
