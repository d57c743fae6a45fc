"""``StepTime``: the seconds of every training iteration in the logs, as mmengine's ``IterTimerHook`` logs them.

``train/time`` is the wall time from the end of the previous iteration (or the epoch's start) to the end of this
one, data loading included; ``train/data_time`` the part spent waiting for the batch. Two ``perf_counter`` reads per
iteration; the values are per rank, logged on step only (no collective in the hot loop). ``tools/plot_curves.py
--train-time`` summarises them as mmdet's ``analyze_logs.py cal_train_time`` does.
"""

from __future__ import annotations

import time

import lightning as L


class StepTime(L.Callback):
    """Logs ``train/time`` and ``train/data_time`` (seconds) at every training iteration."""

    def __init__(self) -> None:
        self._last_end = None
        self._start = None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_end = time.perf_counter()  # the first iteration's loader start counts as data time

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._last_end is None or self._start is None:
            return
        pl_module.log("train/time", now - self._last_end, on_step=True, on_epoch=False, batch_size=1)
        pl_module.log("train/data_time", self._start - self._last_end, on_step=True, on_epoch=False, batch_size=1)
        self._last_end = now
