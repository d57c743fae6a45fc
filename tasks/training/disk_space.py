"""A full disk under a checkpoint write, said in plain words, and a note before training when space is short.

A checkpoint that cannot be written for space stops the run with ``DiskFullError``: the device is full (or the
file size limit is reached), the checkpoint's path, the bytes it needs and the bytes free, the last complete
checkpoint of the work dir (path and step) and the command that resumes from it. torch's zip writer reports the
``OSError`` (ENOSPC) of the file only as the context of its own ``RuntimeError`` ("unexpected pos ..."): the
cause is found in the exception's chain (``space_failure``). The temp file is removed by ``atomic_write``, so
nothing partial is left and the previous checkpoint stays loadable.

``DiskSpaceCheck`` (a callback of ``build_trainer``) logs one line before training when the work dir's device has
less free space than two checkpoints take (``checkpoint_bytes``: the weights and buffers, and per trainable
parameter the optimizer's moments): the write of the next checkpoint beside the previous one would fail there.
"""

from __future__ import annotations

import errno
import logging
import os
import os.path as osp
import shutil

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from backbones.errors import UserError

log = logging.getLogger("lightning.pytorch")
_SPACE = {errno.ENOSPC: "full", errno.EDQUOT: "over its quota", errno.EFBIG: "at its file size limit"}


class DiskFullError(UserError, OSError):
    """A checkpoint that could not be written for space; the message says what was written where, how much was
    needed and free, which checkpoint is intact and (``resume``, added by ``tools/train.py``) how to resume."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message, self.resume = message, ""

    def __str__(self) -> str:
        return self.message + (f": {self.resume}" if self.resume else " with the same command and --resume auto")


def space_failure(error: BaseException) -> OSError | None:
    """The ``OSError`` of a full device, a quota or a file size limit in ``error``'s chain (``__cause__`` /
    ``__context__``), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _SPACE:
            return error
        error = error.__cause__ or error.__context__
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB ({n:,} bytes)"


def tensor_bytes(obj, seen: set | None = None) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists, tuples), each storage counted once: the bulk of a
    checkpoint's ``torch.save`` file."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def _step(path: str, steps: dict) -> str:
    if path in steps:
        return str(steps[path])
    try:  # written by an earlier process: the tensors stay on disk (mmap), the step is read
        return str(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", "?"))
    except Exception:  # noqa: BLE001 - the step is a detail of the message
        return "?"


def disk_full_error(failure: OSError, path: str, checkpoint: dict, steps: dict) -> DiskFullError:
    """The ``DiskFullError`` for ``failure`` while ``checkpoint`` was written to ``path``.

    Args:
        failure: the space ``OSError`` (``space_failure``).
        path: the checkpoint being written.
        checkpoint: what was being written (its tensors give the size needed).
        steps: the global step of each checkpoint this process wrote, by path.
    """
    folder = osp.dirname(osp.abspath(path))
    free = shutil.disk_usage(folder).free
    needed = tensor_bytes(checkpoint)
    if failure.errno == errno.EFBIG:
        what = (
            f"the checkpoint {path} needs about {_mib(needed)}, more than the largest file this process may write "
            "(the file size limit, `ulimit -f`, or the file system's maximum file size)"
        )
    else:
        what = (
            f"the device of {folder} is {_SPACE[failure.errno]} ({failure.strerror}): the checkpoint {path} needs "
            f"about {_mib(needed)}, {_mib(free)} are free"
        )
    last = osp.join(folder, "last.ckpt")
    intact = (
        f"The last complete checkpoint is {last} (step {_step(last, steps)}); "
        if osp.isfile(last)
        else "No complete checkpoint is in the work dir yet (the run starts afresh); "
    )
    fix = (
        "raise the limit (or write to a file system that takes larger files)"
        if failure.errno == errno.EFBIG
        else "free space (or move the work dir to a larger disk)"
    )
    return DiskFullError(f"cannot write a checkpoint: {what}. Nothing partial was left. {intact}{fix} and resume")


class DiskSpaceCheck(L.Callback):
    """One log line before training when the work dir's device has less free space than two checkpoints.

    Args:
        work_dir: where the checkpoints go.
    """

    def __init__(self, work_dir: str) -> None:
        self.work_dir = work_dir

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The optimizer's state is still empty: its moments are counted from its hyperparameters (Adam's betas:
        # two per parameter, SGD's momentum: one), as they will be once it has stepped.
        size = tensor_bytes(pl_module.state_dict())
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                slots = 2 if "betas" in group else int(bool(group.get("momentum")))
                size += slots * sum(p.numel() * p.element_size() for p in group["params"] if p.requires_grad)
        free = shutil.disk_usage(self.work_dir).free
        if free < 2 * size:
            log.warning(
                "the work dir %s has %s free, less than two checkpoints of about %s each: a checkpoint write will "
                "fail for space (the previous one stays until the next is complete)",
                os.path.abspath(self.work_dir),
                _mib(free),
                _mib(size),
            )
