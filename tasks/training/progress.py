"""The training progress bar of an iteration-based run counts optimizer steps against ``max_steps``.

mm's ``IterBasedTrainLoop`` (the ADE20K configs, the segmentation demo) becomes ``max_steps=N,
max_epochs=-1`` in Lightning (tasks/training/trainer.py): an endless epoch loop stopped by the step count. Lightning's
bars count the batches of the current epoch and, for Rich, print ``Epoch 24/-2``. The bars here are
Lightning's own (Rich where ``rich`` is installed, as Lightning chooses, else TQDM) with one change: the train
bar shows ``Iter`` and ``global_step/max_steps`` (e.g. ``1200/160000``) across epochs, resumed runs included.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar

DESCRIPTION = "Iter"


def is_iteration_based(trainer_kwargs: dict) -> bool:
    """A run stopped by ``max_steps`` with no epoch limit (Lightning turns ``max_epochs=None`` into -1 then)."""
    return (trainer_kwargs.get("max_steps") or -1) > 0 and trainer_kwargs.get("max_epochs") in (None, -1)


class _CountsSteps:
    """Mixed in before a Lightning progress bar: one train bar for the whole run, whose total is ``max_steps``
    and whose count is ``global_step``. It starts at the first epoch (at the resumed step) and is not reset at
    later epochs, so its count and its speed estimate run on across them."""

    _bar_started = False

    @property
    def total_train_batches(self) -> int:
        return self.trainer.max_steps

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._bar_started = False

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if not self._bar_started:
            super().on_train_epoch_start(trainer, pl_module)  # the bar with total max_steps, count 0
            self._bar_started = True
            self._show_steps(trainer, pl_module, None, None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._show_steps(trainer, pl_module, outputs, batch)

    def _show_steps(self, trainer, pl_module, outputs, batch) -> None:
        # Lightning's bars show ``batch_idx + 1`` as the count (and refresh their metrics with it): hand
        # them the step count in its place.
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)


class StepTQDMProgressBar(_CountsSteps, TQDMProgressBar):
    """``TQDMProgressBar`` counting ``global_step/max_steps``."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.set_description(DESCRIPTION)  # instead of "Epoch N"


class StepRichProgressBar(_CountsSteps, RichProgressBar):
    """``RichProgressBar`` counting ``global_step/max_steps``."""

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{DESCRIPTION:{len(self.validation_description)}}"  # padded as Lightning pads "Epoch N"


def step_progress_bar() -> ProgressBar:
    """The bar Lightning would pick by default (Rich if installed, else TQDM), counting steps."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    return StepRichProgressBar() if _RICH_AVAILABLE else StepTQDMProgressBar()
