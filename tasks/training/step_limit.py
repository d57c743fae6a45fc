"""``StepLimitResume``: a run that stopped at ``max_steps`` inside an epoch resumes inside that epoch.

Lightning ends the epoch loop when ``max_steps`` is reached and then runs the epoch's end as if the epoch had been
trained through. A checkpoint written from there (``last.ckpt`` at the end of training when no validation ran at
that step) records the epoch as finished, so a run resumed from it with a larger ``max_steps`` (training longer,
as one does with mmengine's ``resume`` and a larger ``max_iters``) started the next epoch: the rest of this one was
never trained on, and the run differed from one trained to the larger ``max_steps`` at once. Such a checkpoint's
loop state is written here as Lightning records it at the end of that last optimizer step's batch, which is what a
preemption checkpoint at the same step holds (tasks/training/restart.py): the resumed run goes on with the epoch's
next batch, and ends where the uninterrupted run ends, bit for bit. Checkpoints written anywhere else (at a batch
or a validation inside the epoch, at a real epoch end) are left as they are.
"""

from __future__ import annotations

import lightning as L


class StepLimitResume(L.Callback):
    """Rewrites the loop state of checkpoints written after ``max_steps`` cut an epoch short (module docstring)."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        fit_loop = trainer.fit_loop
        epoch_loop = fit_loop.epoch_loop
        if not (trainer.training and 0 < trainer.max_steps <= trainer.global_step):
            return
        if epoch_loop._num_ready_batches_reached():  # the epoch's last batch was trained: a real epoch end
            return
        epoch_progress = fit_loop.epoch_progress.current
        if epoch_progress.processed != epoch_progress.started:  # written inside the epoch: resumes there already
            return
        state = checkpoint["loops"]["fit_loop"]
        for counts in state["epoch_progress"].values():  # total and current: the epoch started, not processed
            counts["processed"] = counts["completed"] = counts["started"] - 1
        for counts in state["epoch_loop.batch_progress"].values():
            if isinstance(counts, dict):  # the last batch trained, its end not counted yet
                counts["completed"] = counts["processed"] - 1
        state["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1  # counted after the batch's end
        checkpoint["epoch"] = state["epoch_progress"]["current"]["completed"]
