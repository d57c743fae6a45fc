"""Child processes that start without the seconds of imports: forked from multiprocessing's fork server, which
imports this module (and with it torch, Lightning, mmdet, mmseg and the project) once per test process.

A forked child is a real process of its own: it writes real files, is SIGKILLed for real, and leaves what a killed
process leaves. The server imports and computes nothing else, so it has no threads (no OpenMP pool) that a fork
could break. Each test process (pytest-xdist worker) starts its server on the first ``process()`` and stops it when it
exits.

What a child runs is a function of this module (multiprocessing pickles it by name): ``train`` (tools/train.py
with tests/_train_driver.py's probes) and ``write`` (one of the atomic writers, stopped at a known point).
"""

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import time

import lightning  # noqa: F401 - imported here, once, for every child
import mmdet.models  # noqa: F401
import mmseg.models  # noqa: F401
import torch

from backbones.atomic import write_json
from backbones.export import save_torch
from tasks.training.checkpoint_io import AtomicCheckpointIO
from tests._runs import LAUNCHER_VARIABLES
from tests._tools import load_tool
from tests._train_driver import PauseAtStep

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([__name__])
# The test process stops its server and waits for it when it exits: no server outlives it, and the CPU time of the
# server and its children counts in the test process's own (what `time pytest ...` reports).
atexit.register(multiprocessing.forkserver._forkserver._stop)


def process(target, *args) -> multiprocessing.Process:
    """``target(*args)`` (a function of this module) started in a child forked from the fork server."""
    proc = _CONTEXT.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _own_session(log):
    """The child leads a process group of its own (a scheduler kills the job's group), with one thread (as
    ``tests._runs.env()`` gives a fresh child), no launcher variables and its output in ``log``."""
    os.setsid()
    for var in [v for v in os.environ if v in LAUNCHER_VARIABLES or v.startswith(("TORCHELASTIC_", "SLURM_"))]:
        del os.environ[var]
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(fd, stream.fileno())


def train(args, log, pause_at, pause_dir) -> None:
    """``tools/train.py args`` (its ``cli``: a failure prints ``rank 0 failed: ...`` and exits with status 1) that
    waits at the end of step ``pause_at`` until ``pause_dir/go`` exists (tests/_train_driver.py's PAUSE_AT_STEP)."""
    _own_session(log)
    load_tool("train").cli(args, callbacks=[PauseAtStep(pause_at, pause_dir)])


class _SlowToPickle:
    """Stops the pickler of a checkpoint that holds it: ``torch.save`` has written part of the file then."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        open(self.marker, "w").close()
        time.sleep(120)
        return (int, ())


def write(which, path, marker, log) -> None:
    """Writes a new version of ``path`` with the writer ``which`` ('ckpt', 'ckpt_streaming', 'metrics', 'export')
    and stops in the middle - while torch.save streams the checkpoint ('ckpt_streaming'), or right before the
    rename of the fully written temp file (the others) - after creating ``marker``, for the test to kill it."""
    _own_session(log)
    if which == "ckpt_streaming":
        AtomicCheckpointIO().save_checkpoint({"w": torch.full((100000,), 2.0), "slow": _SlowToPickle(marker)}, path)

    def stop_at_rename(frame, event, arg):
        if event == "c_call" and arg is os.replace:
            open(marker, "w").close()
            time.sleep(120)

    sys.setprofile(stop_at_rename)
    if which == "ckpt":
        AtomicCheckpointIO().save_checkpoint({"w": torch.full((100000,), 2.0)}, path)
    elif which == "metrics":
        write_json(path, {"mIoU": 0.2})
    elif which == "export":
        save_torch({"w": torch.full((100000,), 2.0)}, path)
