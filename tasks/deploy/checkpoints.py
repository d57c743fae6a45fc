"""Reading training checkpoints: ours (Lightning: ``state_dict`` keys ``model.*`` plus the training state) and
mm's (``{'state_dict': ..., 'meta': ...}``), always through ``backbones.checkpoints.weights`` (``weights_only`` with an
allow-list; http(s) URLs downloaded once and verified), and the training config they carry (read as literals,
never executed).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from mmengine.config import Config

from backbones.checkpoints.atomic import plain_meta
from backbones.checkpoints.export import ExportError
from backbones.checkpoints.weights import check_checkpoint_path, model_state_dict, read_checkpoint
from backbones.errors import CheckpointError

from ..config.load import config_text

# Where a Lightning checkpoint may carry the training config (text or plain dict) and the metrics.
_CONFIG_KEYS = ("mm_config", "cfg", "config")
_METRICS_KEYS = ("val_metrics", "metrics")


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
        raw_state_dict: with model EMA (mmengine's EMAHook layout, ours too: ``ema_state_dict`` holds
            ``module.<key>`` tensors), the raw trained weights, while ``state_dict`` holds the averaged ones;
            None without EMA.
        ema_steps: with model EMA, the average's update count (``ema_state_dict['steps']``).
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
    raw_state_dict: dict | None = None
    ema_steps: int | None = None

    def weights(self, raw: bool = False) -> tuple[dict, str]:
        """(tensors, ``'ema'`` | ``'raw'``): the averaged weights when the checkpoint has model EMA, unless ``raw``.

        Args:
            raw: the raw trained weights even when the checkpoint holds an average.
        """
        if self.raw_state_dict is None:
            return self.state_dict, "raw"
        return (self.raw_state_dict, "raw") if raw else (self.state_dict, "ema")


def read_training_checkpoint(path: str | os.PathLike) -> TrainingCheckpoint:
    """Read a Lightning checkpoint of ``tools/train.py`` or an mm-format checkpoint (``state_dict`` + ``meta``).

    Args:
        path: the checkpoint file, or an http(s) URL of one (``#sha256=`` verifies it; see
            backbones/checkpoints/download.py).

    Raises ``CheckpointError`` for a file that is neither, backbone exports included (``load_pretrained`` reads those).
    """
    path = check_checkpoint_path(path)  # a URL: the verified file in torch.hub's cache
    obj, _ = read_checkpoint(path)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("state_dict"), Mapping):
        found = sorted(obj)[:10] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(
            f"{path!r} is not a Lightning or mm-format checkpoint: expected a 'state_dict' entry "
            f"(top-level entries: {found}). To re-export a backbone file, load it with "
            "backbones.load_pretrained instead."
        )
    sd, _, layout = model_state_dict(obj, repr(path))
    if layout == "Lightning":
        ckpt = _read_lightning(path, obj, sd)
        ckpt.raw_state_dict, ckpt.ema_steps = _raw_weights(obj)
        return ckpt
    meta = dict(obj.get("meta") or {})
    if "export_version" in meta and "family" in meta:
        raise CheckpointError(
            f"{path!r} is a backbone export ({meta['family']}, tools/export_backbone.py), not a whole model: load it "
            "with backbones.load_pretrained or a backbone init_cfg=dict(type='Pretrained', checkpoint=...)."
        )
    metrics = meta.get("metrics") if isinstance(meta.get("metrics"), Mapping) else {}
    ckpt = TrainingCheckpoint(
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
    ckpt.raw_state_dict, ckpt.ema_steps = _raw_weights(obj)
    return ckpt


def _raw_weights(obj: Mapping) -> tuple[dict | None, int | None]:
    """The raw weights that mmengine's EMAHook (and tasks/training/ema.py) keep under ``ema_state_dict``, and the
    average's update count; (None, None) without EMA."""
    ema = obj.get("ema_state_dict")
    if not isinstance(ema, Mapping):
        return None, None
    raw = {k[len("module.") :]: v for k, v in ema.items() if k.startswith("module.") and isinstance(v, torch.Tensor)}
    steps = ema.get("steps")
    return (raw or None), (int(steps) if isinstance(steps, torch.Tensor) and raw else None)


def _read_lightning(path: str, obj: Mapping, sd: dict) -> TrainingCheckpoint:
    ckpt = TrainingCheckpoint(
        path,
        "lightning",
        sd,
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
        text: the stored config (``tasks.config.load.config_text`` wrote it).
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
