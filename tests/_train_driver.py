"""tools/train.py's command line with two probes, for tests that run training in their own processes (launched
directly, by Lightning's DDP launcher, by torchrun or as simulated SLURM tasks), as ``python -m tests._train_driver``
(``torchrun ... -m tests._train_driver``) from the repository root. Configured by the environment:

* ``PAUSE_AT_STEP=N`` and ``PAUSE_DIR=D``: at the end of optimizer step N every rank writes ``D/paused_rank<R>``
  (its pid) and waits until ``D/go`` exists, so that a test can signal or kill a process at a known step. While
  waiting, a rank whose ``Preemption`` callback has recorded a signal writes ``D/signalled_rank<R>``. Once
  ``D/go`` exists nothing pauses again (a resumed or restarted run passes step N).
* ``RECORD_DIR=D``: at the end of training every rank writes ``D/rank<R>.json``: its global, local and node rank,
  the world size and the image files of each of its training batches.
"""

import gc
import json
import os
import os.path as osp
import sys
import time

import lightning as L

from tasks.training.restart import Preemption
from tests._tools import load_tool


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)  # the test polls for the file: it must appear complete


class PauseAtStep(L.Callback):
    def __init__(self, step, folder):
        self.step, self.folder = step, folder
        self.go = osp.join(folder, "go")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.step or osp.exists(self.go):
            return
        rank = trainer.global_rank
        preemption = next(c for c in trainer.callbacks if isinstance(c, Preemption))
        _write(osp.join(self.folder, f"paused_rank{rank}"), str(os.getpid()))
        deadline, noted = time.monotonic() + 200, False
        while not osp.exists(self.go) and time.monotonic() < deadline:
            if preemption.received is not None and not noted:
                _write(osp.join(self.folder, f"signalled_rank{rank}"), str(preemption.received))
                noted = True
            time.sleep(0.01)


class RecordRanks(L.Callback):
    def __init__(self, folder):
        self.folder, self.batches = folder, []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append([osp.basename(s.img_path) for s in batch["data_samples"]])

    def on_train_end(self, trainer, module):
        record = dict(
            global_rank=trainer.global_rank,
            local_rank=trainer.local_rank,
            node_rank=trainer.node_rank,
            world_size=trainer.world_size,
            batches=self.batches,
        )
        _write(osp.join(self.folder, f"rank{trainer.global_rank}.json"), json.dumps(record))


if __name__ == "__main__":
    callbacks = []
    if os.environ.get("PAUSE_AT_STEP"):
        callbacks.append(PauseAtStep(int(os.environ["PAUSE_AT_STEP"]), os.environ["PAUSE_DIR"]))
    if os.environ.get("RECORD_DIR"):
        callbacks.append(RecordRanks(os.environ["RECORD_DIR"]))
    train = load_tool("train")
    gc.freeze()  # as in the test workers (tests/conftest.py): collections walk what the run creates only
    train.cli(sys.argv[1:], callbacks=callbacks)
