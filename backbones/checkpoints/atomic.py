"""Atomic file writes shared by exports (backbones/checkpoints/export.py) and checkpoints / metrics (tasks/).

The temp file is a sibling of the target, flushed and fsynced, then ``os.replace``-d onto it (atomic on
POSIX), and the directory is fsynced so the rename itself is durable. A reader therefore sees the previous
file or the new one, never a truncated one. A writer killed by SIGKILL cannot delete its temp file: the
next write of the same target removes the temp files of writers (same host) that are no longer alive.
"""

from __future__ import annotations

import glob
import math
import os
import socket
import tempfile
from collections.abc import Callable, Mapping
from typing import BinaryIO

import torch

from ..errors import UserError

_HOST = socket.gethostname().replace(".", "_")


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
    for tmp in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.{_HOST}.*.tmp")):
        pid = os.path.basename(tmp)[len(name) + len(_HOST) + 3 :].split(".", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            try:
                os.remove(tmp)
            except FileNotFoundError:  # another writer cleaned it up
                pass


class OutputError(UserError, OSError):
    """An output path that cannot be written: its folder cannot be created or written, or a file is expected where
    a folder is (or the reverse). The message names the path and the reason; the tools print it without a
    traceback."""


def _cannot_write(path: str, error: OSError) -> OutputError:
    where = f" ({error.filename})" if error.filename and error.filename != path else ""
    return OutputError(f"cannot write {path!r}: {error.strerror or error}{where}; give a path in a writable folder")


def check_writable(path: str | os.PathLike, folder: bool = False) -> None:
    """Raise an ``OutputError`` unless ``path`` can be written, before any work is done for it: the folder that
    will hold it is created (as the writers create it) and a temporary file is made and removed there.

    Args:
        path: the output file (or, with ``folder``, the output folder).
        folder: ``path`` is a folder the tool fills (``--show-dir``, ``--out-dir``), not a file.
    """
    path = os.fspath(path)
    if not folder and os.path.isdir(path):
        raise OutputError(f"{path!r} is a folder: give the name of the file to write")
    if folder and os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{path!r} is a file: give a folder to write the outputs in")
    directory = os.path.abspath(path) if folder else os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise _cannot_write(path, e) from None


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object], mode: str = "wb") -> None:
    """Call ``write(fileobj)`` on a temp file next to ``path``, fsync it, then rename it onto ``path``. A path
    whose folder cannot be created or written raises an ``OutputError``. ``mode='w+b'``: ``write`` may also read
    back what it wrote (to check it before it replaces ``path``)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    try:
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temps(directory, name)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.{_HOST}.{os.getpid()}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise _cannot_write(path, e) from None
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results should be as readable as normal files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory file descriptors
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Atomic text write (UTF-8)."""
    atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path: str | os.PathLike, obj: dict) -> None:
    """Atomic JSON write; non-finite floats become null (JSON has no NaN), at any depth."""
    import json

    write_text(path, json.dumps(plain_meta(obj), indent=2, sort_keys=True) + "\n")


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
