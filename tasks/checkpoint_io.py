"""Atomic file writes: checkpoints (a Lightning CheckpointIO) and JSON results.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temp file lives in the
system temp dir (``/tmp``); committing it is a ``shutil.move``, which degrades to copy + delete when
``/tmp`` and the work dir are on different filesystems (node-local /tmp vs. shared storage on a
cluster). A job killed during that copy leaves a truncated ``last.ckpt``. Here the temp file is a
sibling of the target, flushed to disk, and then ``os.replace``-d, which is atomic on POSIX.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.checkpoint_io import _PATH
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO


def atomic_write_bytes(path: str | os.PathLike, write) -> None:
    """Call ``write(fileobj)`` on a temp file next to ``path``, fsync it, then rename it onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a checkpoint should be as readable as a normal file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path: str | os.PathLike, obj: dict) -> None:
    """Atomic JSON write; non-finite floats become null (JSON has no NaN)."""
    clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in obj.items()}
    text = json.dumps(clean, indent=2, sort_keys=True) + '\n'
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with a same-directory temp file + ``os.replace`` for local paths."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote stores: fsspec's way
        atomic_write_bytes(path, lambda f: torch.save(checkpoint, f))
