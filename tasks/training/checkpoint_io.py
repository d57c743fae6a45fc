"""Atomic file writes: checkpoints (a Lightning CheckpointIO) and JSON results.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temp file lives in the
system temp dir (``/tmp``); committing it is a ``shutil.move``, which degrades to copy + delete when
``/tmp`` and the work dir are on different filesystems (node-local /tmp vs. shared storage on a
cluster). A job killed during that copy leaves a truncated ``last.ckpt``. Here the temp file is a
sibling of the target, flushed to disk, and then ``os.replace``-d, which is atomic on POSIX. A writer
killed by SIGKILL cannot delete its temp file: the next write of the same target removes the temp files
of writers (same host) that are no longer alive.

Reading goes through ``backbones.checkpoints.weights.read_checkpoint``: ``weights_only`` unpickling with a small
allow-list, so a crafted checkpoint cannot run code when ``--resume`` / ``tools/test.py`` open it. The config's
``load_from`` (fine-tuning from a whole model) is loaded here too, by ``backbones.checkpoints.weights``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.checkpoint_io import _PATH
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info

from backbones import KeyReport, load_model_weights
from backbones.checkpoints.atomic import atomic_write
from backbones.checkpoints.weights import read_checkpoint, state_dict_diff
from backbones.errors import CheckpointError

from .disk_space import disk_full_error, space_failure


def load_checkpoint_safely(path: str | os.PathLike, map_location: str | torch.device | None = None) -> dict:
    """``torch.load(weights_only=True)`` with the allow-list of ``backbones.checkpoints.weights``; a file that holds
    other Python objects (which could run code when unpickled) is refused with ``CheckpointError``."""
    obj, _ = read_checkpoint(path)  # CPU tensors
    if map_location is not None and not callable(map_location):
        obj = _map(obj, torch.device(map_location) if isinstance(map_location, str) else map_location)
    return obj


def apply_load_from(model: torch.nn.Module, load_from: str | None, resume: str | None) -> KeyReport | None:
    """The config's ``load_from``, as mmengine's Runner honours it: the whole model's weights, loaded after
    ``init_weights()`` and before the first step; ``--resume`` wins (it restores the model too).

    Tensors whose shape differs from the model's (heads with another number of classes) are skipped and the rest
    load, as mmengine's ``load_checkpoint(strict=False)`` does; one log line names what was skipped and what the
    checkpoint lacks. A checkpoint that matches nothing raises ``CheckpointError`` naming the file.

    Args:
        model: the mm detector / segmentor, initialised.
        load_from: a whole-model checkpoint (Lightning ``.ckpt``, mm-format ``.pth``, plain state dict) or an
            http(s) URL of one; None: nothing to load.
        resume: the checkpoint ``--resume`` resolved to; None: not resuming.

    Returns the report, or None when nothing was loaded.
    """
    if not load_from:
        return None
    if resume:
        rank_zero_info(f"Resuming from {resume}; load_from={load_from!r} is not used (the resumed run has weights)")
        return None
    report = load_model_weights(model, load_from, strict=False)
    rank_zero_info(f"load_from: {report.summary(repr(load_from))}")
    return report


def check_resumed_weights(module: torch.nn.Module, checkpoint: dict) -> None:
    """Raise ``CheckpointError`` unless the Lightning ``checkpoint`` that ``--resume`` restores holds exactly the
    tensors (keys and shapes) of ``module``: a checkpoint of another config, family or task would otherwise fail
    inside torch's ``load_state_dict`` with a page of key names and a traceback.

    Args:
        module: the LightningModule being resumed (its trainer, when attached, names the file).
        checkpoint: the loaded checkpoint, before Lightning restores it.
    """
    if "state_dict" not in checkpoint:  # a sharded (FSDP) checkpoint: the strategy loads the shards itself
        return
    report = state_dict_diff(checkpoint["state_dict"], module.state_dict())
    if report:
        source = getattr(module._trainer, "ckpt_path", None) or "the checkpoint"
        model = getattr(module, "model", module)
        raise CheckpointError(
            f"--resume: {source} is not a checkpoint of this config's {type(model).__name__}. {report} "
            "Resume only with the config that wrote it; to start from another model's weights, train afresh "
            "with --cfg-options load_from=CKPT (tensors of another shape are skipped)."
        )


def _map(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _map(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, device) for v in obj)
    return obj


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with a same-directory temp file + ``os.replace`` for local paths, and
    allow-listed ``weights_only`` loading (``weights_only=False`` is never honoured). A write that fails for space
    raises ``DiskFullError`` in plain words (tasks/training/disk_space.py)."""

    def load_checkpoint(self, path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return load_checkpoint_safely(path, map_location)

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[str, int] = {}  # the global step of each checkpoint written, for a full disk's message

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote stores: fsspec's way
        path = os.path.abspath(path)
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, f))
        except Exception as e:
            failure = space_failure(e)  # torch's RuntimeError carries the ENOSPC of the file as its context
            if failure is None:
                raise
            raise disk_full_error(failure, path, checkpoint, self.steps) from e
        self.steps[path] = checkpoint.get("global_step")
