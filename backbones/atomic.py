"""Atomic file writes shared by exports (backbones/export.py) and checkpoints / metrics (tasks/).

The temp file is a sibling of the target, flushed and fsynced, then ``os.replace``-d onto it (atomic on
POSIX), and the directory is fsynced so the rename itself is durable. A reader therefore sees the previous
file or the new one, never a truncated one. A writer killed by SIGKILL cannot delete its temp file: the
next write of the same target removes the temp files of writers (same host) that are no longer alive.
"""

from __future__ import annotations

import glob
import os
import socket
import tempfile
from collections.abc import Callable
from typing import BinaryIO

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


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(fileobj)`` on a temp file next to ``path``, fsync it, then rename it onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    name = os.path.basename(path)
    _remove_stale_temps(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{_HOST}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
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

    from .export import plain_meta  # export imports this module

    write_text(path, json.dumps(plain_meta(obj), indent=2, sort_keys=True) + "\n")
