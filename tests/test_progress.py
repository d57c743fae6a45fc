"""The train progress bar of an iteration-based run counts iterations against max_steps (``1200/160000``),
not the batches of each epoch of an endless loop (``Epoch 24/-2``). Lightning's real bars, real runs."""

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel

from tasks.training.progress import StepRichProgressBar, StepTQDMProgressBar
from tests._tools import SEG_CFG, load_tool


class BarState(L.Callback):
    """What the trainer's train bar shows (description, the rendered count, count, total) at the start of
    every training batch, i.e. after the previous batch and any epoch start, and at the end of training."""

    def __init__(self):
        self.seen = []

    def _read(self, trainer):
        bar = trainer.progress_bar_callback
        if isinstance(bar, RichProgressBar):
            from lightning.pytorch.callbacks.progress.rich_progress import BatchesProcessedColumn

            task = bar.train_progress_bar
            column = next(c for c in bar.progress.columns if isinstance(c, BatchesProcessedColumn))
            shown = column.render(task).plain
            self.seen.append((task.description.split("]")[-1].strip(), shown, task.completed, task.total))
        else:
            tq = bar.train_progress_bar
            self.seen.append((tq.desc.rstrip(": "), f"{tq.n}/{tq.total}", tq.n, tq.total))

    def on_train_batch_start(self, trainer, *args):
        self._read(trainer)

    def on_train_end(self, trainer, *args):
        self._read(trainer)


@pytest.mark.parametrize("bar_cls", [StepTQDMProgressBar, StepRichProgressBar])
def test_iteration_bar_counts_steps_across_epochs(bar_cls):
    state = BarState()
    trainer = L.Trainer(
        max_steps=5,
        max_epochs=-1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[state, bar_cls()],
    )
    trainer.fit(BoringModel())
    assert trainer.current_epoch == 3  # epochs 0, 1, 2 of 2 batches each ran (the last stopped at step 5)
    assert state.seen == [("Iter", f"{n}/5", n, 5) for n in range(6)]


def test_iteration_based_config_run_shows_iterations(data_opts, tmp_path):
    """tools/train.py on the segmentation demo (mm IterBasedTrainLoop -> max_steps, max_epochs=-1): epochs of
    2 batches, 3 iterations, so the run crosses an epoch boundary."""
    state = BarState()
    load_tool("train").main(
        [
            SEG_CFG,
            "--work-dir",
            str(tmp_path),
            "--cfg-options",
            *data_opts("tiny_ade20k"),
            "trainer.enable_progress_bar=True",
            "trainer.limit_train_batches=2",
            "trainer.max_steps=3",
            "trainer.limit_val_batches=0",
            "checkpoint_callback.monitor=None",
        ],
        callbacks=[state],
    )
    assert state.seen == [("Iter", f"{n}/3", n, 3) for n in range(4)]
