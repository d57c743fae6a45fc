"""Atomic file writes: checkpoints (a Lightning CheckpointIO) and JSON results.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose temp file lives in the
system temp dir (``/tmp``); committing it is a ``shutil.move``, which degrades to copy + delete when
``/tmp`` and the work dir are on different filesystems (node-local /tmp vs. shared storage on a
cluster). A job killed during that copy leaves a truncated ``last.ckpt``. Here the temp file is a
sibling of the target, flushed to disk, and then ``os.replace``-d, which is atomic on POSIX. A writer
killed by SIGKILL cannot delete its temp file: the next write of the same target removes the temp files
of writers (same host) that are no longer alive.

Reading is as strict as ``backbones.pretrained.read_checkpoint``: ``weights_only`` unpickling with a small
allow-list, so a crafted checkpoint cannot run code when ``--resume`` / ``tools/test.py`` open it.
"""

from __future__ import annotations

import glob
import json
import math
import os
import socket
import tempfile
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins.io.checkpoint_io import _PATH
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

_HOST = socket.gethostname().replace('.', '_')


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _remove_stale_temps(directory: str, name: str) -> None:
    """Temp files ``.NAME.HOST.PID.*.tmp`` left by killed writers on this host."""
    for tmp in glob.glob(os.path.join(glob.escape(directory), f'.{glob.escape(name)}.{_HOST}.*.tmp')):
        pid = os.path.basename(tmp)[len(name) + len(_HOST) + 3:].split('.', 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            try:
                os.remove(tmp)
            except FileNotFoundError:  # another writer cleaned it up
                pass


def atomic_write_bytes(path: str | os.PathLike, write) -> None:
    """Call ``write(fileobj)`` on a temp file next to ``path``, fsync it, then rename it onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(path)
    _remove_stale_temps(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=f'.{name}.{_HOST}.{os.getpid()}.', suffix='.tmp', dir=directory)
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


def load_checkpoint_safely(path: str | os.PathLike, map_location=None) -> dict:
    """``torch.load(weights_only=True)`` with the allow-list of ``backbones.pretrained``; a file that holds
    other Python objects (which could run code when unpickled) is refused with ``CheckpointError``."""
    from backbones.pretrained import read_checkpoint
    obj, _ = read_checkpoint(path)  # CPU tensors
    if map_location is not None and not callable(map_location):
        obj = _map(obj, torch.device(map_location) if isinstance(map_location, str) else map_location)
    return obj


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
    allow-listed ``weights_only`` loading (``weights_only=False`` is never honoured)."""

    def load_checkpoint(self, path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict:
        if not isinstance(get_filesystem(path), LocalFileSystem):
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        if not os.path.exists(path):
            raise FileNotFoundError(f'Checkpoint file not found: {path}')
        return load_checkpoint_safely(path, map_location)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote stores: fsspec's way
        atomic_write_bytes(path, lambda f: torch.save(checkpoint, f))
