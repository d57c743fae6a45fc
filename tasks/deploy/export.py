"""Exports of a trained model: its backbone (``tools/export_backbone.py``) or the whole detector / segmentor in
mm's checkpoint format (``tools/export_model.py``).

Inputs are our Lightning checkpoints (``state_dict`` keys ``model.*``, plus Lightning's training state) and
mm-format checkpoints (``{'state_dict': {'backbone.*': ...}, 'meta': ...}``), always read through
``backbones.checkpoints.weights.read_checkpoint`` (``weights_only`` with an allow-list). The training config comes from
``--config`` or from the checkpoint (read as literals, never executed); the tensors are checked against the model
that config builds before anything is written. The file formats themselves are ``backbones/checkpoints/export.py``'s.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping

import torch
from mmengine.config import Config

from backbones import FAMILIES
from backbones.checkpoints.atomic import plain_meta
from backbones.checkpoints.export import (
    EXTENSIONS,
    ExportError,
    canonical_state_dict,
    export_release,
    resolve_format,
    save_backbone,
    save_torch,
    tensor_sha256,
)
from backbones.checkpoints.pretrained import detect_family
from backbones.checkpoints.weights import check_checkpoint_path, is_state_dict, read_checkpoint, state_dict_diff
from backbones.errors import CheckpointError
from backbones.families import by_type_name, get

from ..config.scopes import register_scope
from .checkpoints import read_training_checkpoint, resolve_config

# meta ``weights`` -> what the tools print
WEIGHTS = {"ema": "EMA weights", "raw": "raw weights"}


def format_metrics(metrics: Mapping) -> str:
    """The validation metrics of an export's meta for the tools' one-line summary: ``name=value`` (4 significant
    digits), without ``per_class`` (a value per class and metric, e.g. 150 ADE20K classes; it stays in the meta).

    Args:
        metrics: the meta's ``metrics`` dict.
    """
    flat = {k: v for k, v in metrics.items() if k != "per_class"}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in flat.items())


def backbone_config(cfg: Config | Mapping) -> tuple[str, dict]:
    """(family, backbone kwargs) from ``cfg.model.backbone``."""
    model = cfg.get("model") or {}
    bcfg = model.get("backbone") if isinstance(model, Mapping) else None
    if not isinstance(bcfg, Mapping) or "type" not in bcfg:
        raise ExportError("The config has no model.backbone with a 'type': cannot tell which backbone to export.")
    bcfg = bcfg.to_dict() if hasattr(bcfg, "to_dict") else dict(bcfg)
    family = by_type_name(bcfg["type"])
    if family is None:
        types = sorted(f.type_name for f in FAMILIES.values())
        raise ExportError(f"model.backbone.type is {bcfg['type']!r}; only {types} backbones can be exported.")
    return family.name, bcfg


def build_backbone(family: str, bcfg: Mapping) -> torch.nn.Module:
    """The pure backbone (no weights loaded) described by a ``model.backbone`` config."""
    return get(family).cls(**{k: v for k, v in bcfg.items() if k not in ("type", "init_cfg", "pretrained")})


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
    raw_weights: bool = False,
) -> dict:
    """Write the backbone of a trained detector / segmentor to ``out``; returns the meta that was recorded (its
    ``weights``: ``'ema'`` or ``'raw'``).

    Args:
        checkpoint: a Lightning checkpoint of ``tools/train.py``, an mm-format checkpoint, or an official release
            (``backbones.checkpoints.export.export_release``: its variant from its shapes; ``timm`` keeps its head).
        out: the file to write: ``.pth`` / ``.pt``, ``.safetensors``, ``.onnx``, or the folder of a ``timm`` export.
        fmt: ``'pth'``, ``'safetensors'``, ``'official'``, ``'onnx'`` or ``'timm'``; None: from the extension of
            ``out``.
        config: the training config; None: the one the checkpoint stores.
        raw_weights: export the raw trained weights of a checkpoint with model EMA (default: the average).
    """
    resolve_format(out, fmt)  # before any work: a wrong extension fails fast
    try:
        ckpt = read_training_checkpoint(checkpoint)
    except CheckpointError:
        obj, _ = read_checkpoint(check_checkpoint_path(checkpoint))
        if isinstance(obj, Mapping) and is_state_dict(obj.get("model")):  # an official release, as downloaded
            return export_release(check_checkpoint_path(checkpoint), out, fmt)
        raise
    model_sd, weights = ckpt.weights(raw_weights)
    sd = backbone_tensors(model_sd, repr(ckpt.path))
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
        "weights": weights,
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
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    config: str | os.PathLike | None = None,
    raw_weights: bool = False,
) -> dict:
    """Write a trained detector / segmentor in mm's checkpoint format to ``out``; returns the meta.

    The file is ``{'state_dict': model tensors, 'meta': {'dataset_meta', 'cfg', 'epoch', 'iter', 'metrics', ...}}``,
    the layout mmengine's Runner writes, which mmdet's ``init_detector`` and mmseg's ``init_model`` load. From a
    checkpoint with model EMA it is by default the layout of mmengine's ``EMAHook``: the average in ``state_dict``,
    the raw weights in ``ema_state_dict`` (``module.<key>``, and the update count ``steps``); with ``raw_weights``,
    the raw weights in ``state_dict`` and no ``ema_state_dict``. ``meta['weights']`` says which: ``'ema'`` / ``'raw'``.

    Args:
        checkpoint: a Lightning checkpoint of ``tools/train.py``.
        out: the ``.pth`` / ``.pt`` file to write.
        config: the training config; None: the one the checkpoint stores.
        raw_weights: the raw trained weights of a checkpoint with model EMA (default: the average).
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
    model_sd, weights = ckpt.weights(raw_weights)
    with torch.device("cpu"):
        check_against_model(model_sd, MODELS.build(model_cfg), repr(ckpt.path))
    sd = canonical_state_dict(model_sd)
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
        "weights": weights,
    }
    exported = {"state_dict": sd, "meta": meta}
    if weights == "ema":  # mmengine's EMAHook checkpoint: its resume reads the raw weights from here
        raw = canonical_state_dict(ckpt.raw_state_dict)
        exported["ema_state_dict"] = {"module." + k: v for k, v in raw.items()}
        exported["ema_state_dict"]["steps"] = torch.tensor(ckpt.ema_steps or 0, dtype=torch.long)
    save_torch(exported, out)
    return meta
