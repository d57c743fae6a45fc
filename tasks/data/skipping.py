"""What a training sample that fails to load does: the config's top-level ``data_errors`` key.

* ``'raise'`` (the default): the run stops with the ``DataError`` that names the file (tasks/data/checks.py).
* ``'skip'``: the sample is left out and its place in the batch is taken by the next sample of the dataset (index
  + 1, + 2, ... until one loads), augmented with the left-out sample's seed. The batches, their number and the
  sampler's state stay those of a run without the bad files, so a resumed run goes on exactly where it stopped
  (tasks/data/sampling.py). ``DataErrors`` (a Lightning callback) logs each left-out sample once, appends
  ``sample index, files, reason`` to ``WORK_DIR/data_errors.tsv`` and counts the distinct samples left out; the
  count is stored in checkpoints (the union over the ranks) and carried over by ``--resume``. Past
  ``data_errors_max`` (a fraction of the training set, default ``DEFAULT_MAX``: 5 %) of distinct samples left out,
  the run stops, naming the count and the file: a wrong ``data_root`` or a broken copy must not train on the rest.
  Under DDP each process counts what it left out and what the checkpoint it resumed from held.

Validation and test samples are never skipped: a metric over part of a split would not be the split's.
``tools/check_data.py`` finds every bad file before a run.
"""

from __future__ import annotations

import json
import logging
import os
import os.path as osp

import lightning as L
import torch.distributed as dist
from torch.utils.data import Dataset

from .checks import DataError

log = logging.getLogger("lightning.pytorch")
MODES = ("raise", "skip")
DEFAULT_MAX = 0.05
KEY = "data_errors"  # the batch entry that carries the left-out samples from the loader to the callback
_TRIES = 100  # samples tried in a row for one place in a batch before the run stops


def data_error_policy(cfg) -> tuple[str, float]:
    """The config's (``data_errors``, ``data_errors_max``), checked; ValueError naming the key otherwise."""
    mode = cfg.get("data_errors") or "raise"
    if mode not in MODES:
        raise ValueError(f"data_errors must be one of {MODES}, got {mode!r}")
    ceiling = cfg.get("data_errors_max", DEFAULT_MAX)
    if isinstance(ceiling, bool) or not isinstance(ceiling, (int, float)) or not 0 <= ceiling <= 1:
        raise ValueError(f"data_errors_max must be a fraction of the training set in [0, 1], got {ceiling!r}")
    return mode, float(ceiling)


def data_error_callbacks(cfg, work_dir: str) -> list[L.Callback]:
    """``[DataErrors]`` for ``data_errors='skip'``, else none (``tasks.training.trainer.build_trainer``)."""
    mode, ceiling = data_error_policy(cfg)
    return [DataErrors(work_dir, ceiling)] if mode == "skip" else []


class SkippingDataset(Dataset):
    """Wraps the training dataset (``SeededDataset`` over ``CheckedDataset``) for ``data_errors='skip'``: a
    ``DataError`` of sample i gives sample i + 1 (and so on) in its place, with the same seed. Every sample carries
    ``KEY``: the JSON list of the samples left out for it, ``[[index, files, reason], ...]``."""

    def __init__(self, dataset: Dataset, files) -> None:
        self.dataset, self.files = dataset, files  # files(index) -> the sample's file names

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        index, seed = key if isinstance(key, tuple) else (key, None)
        left_out = []
        for step in range(_TRIES):
            i = (index + step) % len(self.dataset)
            try:
                data = self.dataset[(i, seed) if seed is not None else i]
            except DataError as e:
                left_out.append([i, self.files(i), str(e)])
                continue
            return {**data, KEY: json.dumps(left_out)}
        raise DataError(
            f"data_errors='skip': {_TRIES} training samples in a row failed to load, from index {index} on "
            f"(the last: {left_out[-1][2]}); the data is broken: check it with tools/check_data.py"
        )


class DataErrors(L.Callback):
    """Logs, records and counts the samples ``SkippingDataset`` left out (module docstring).

    Args:
        work_dir: where ``data_errors.tsv`` goes.
        ceiling: ``data_errors_max``, a fraction of the training set.
    """

    def __init__(self, work_dir: str, ceiling: float) -> None:
        self.path = osp.join(work_dir, "data_errors.tsv")
        self.ceiling = ceiling
        self.left_out: dict[int, list] = {}  # index -> [files, reason], distinct samples

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        new = []
        for i, files, reason in (r for entry in batch.pop(KEY, ()) for r in json.loads(entry)):
            if i not in self.left_out:  # a sample may be left out for two places of one batch
                self.left_out[i] = [files, reason]
                new.append((i, files, reason))
                log.warning("data_errors='skip': left out training sample %d: %s", i, reason)
        if new:
            os.makedirs(osp.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "a") as f:  # one write: lines of several ranks do not interleave
                f.write("".join(f"{i}\t{', '.join(files)}\t{' '.join(reason.split())}\n" for i, files, reason in new))
            self._check_ceiling(len(trainer.train_dataloader.dataset))

    def _check_ceiling(self, size: int) -> None:
        if len(self.left_out) > self.ceiling * size:
            raise DataError(
                f"data_errors='skip': {len(self.left_out)} distinct training samples failed to load, more than "
                f"data_errors_max={self.ceiling} of the {size} samples; they are listed in {self.path}. Fix the data "
                "(tools/check_data.py finds every bad file) or raise data_errors_max"
            )

    def state_dict(self) -> dict:
        left_out = dict(self.left_out)
        if dist.is_available() and dist.is_initialized():  # every rank writes the checkpoint's state together
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, left_out)
            for part in gathered:
                left_out.update(part)
        return {"left_out": {str(i): v for i, v in sorted(left_out.items())}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.left_out = {int(i): v for i, v in state_dict.get("left_out", {}).items()}
