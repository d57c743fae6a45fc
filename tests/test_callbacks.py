"""The training-state callbacks of tasks/training/callbacks.py on a real Lightning Trainer: RNG states saved in the
checkpoint's callback entry (and read from the top-level key older checkpoints used) and restored on resume,
the refusal to write non-finite weights, and which callbacks ``build_trainer`` adds."""

import random

import lightning as L
import numpy as np
import pytest
import torch
from mmengine.config import Config
from torch import nn
from torch.utils.data import DataLoader

from tasks.training.callbacks import FiniteWeightsGuard, RNGStates, SyncBuffers
from tasks.training.trainer import build_trainer


class TinyRegression(L.LightningModule):
    """A linear layer fitted by SGD on fixed data: a real module, fast enough to train in a test."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        # own generator: iterating draws nothing from the global RNGs this test checks
        data = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(data, batch_size=2, generator=torch.Generator().manual_seed(0))


class RNGAtFirstBatch(L.Callback):
    """Records the global RNG states when the first training batch starts (after every on_train_start)."""

    def __init__(self):
        self.states = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.states is None:
            self.states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


def _trainer(root, max_steps, callbacks):
    return L.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )


def _scramble_rngs(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


@pytest.fixture
def trained(tmp_path):
    """Two steps of TinyRegression with RNGStates; returns (checkpoint path, the RNG states when it was saved)."""
    _scramble_rngs(7)
    trainer = _trainer(tmp_path, 2, [RNGStates()])
    trainer.fit(TinyRegression())
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    path = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(path)
    return path, saved


def _resume_and_probe(tmp_path, path):
    _scramble_rngs(123)  # a fresh process would start elsewhere: only a restore brings the states back
    probe = RNGAtFirstBatch()
    trainer = _trainer(tmp_path, 3, [RNGStates(), probe])
    trainer.fit(TinyRegression(), ckpt_path=path)
    assert trainer.global_step == 3
    return probe.states


def _assert_same_states(got, saved):
    assert torch.equal(got[0], saved[0])
    assert got[1] == saved[1]
    assert np.array_equal(got[2], saved[2])


def test_rng_states_are_saved_in_the_callback_entry_and_restored(trained, tmp_path):
    path, saved = trained
    ckpt = torch.load(path, weights_only=True)
    assert "rng_states" not in ckpt  # the module no longer writes them itself
    (states,) = ckpt["callbacks"]["RNGStates"]["per_rank"]  # one process: one entry
    assert torch.equal(states["torch"], saved[0]) and tuple(states["python"][1]) == saved[1][1]
    _assert_same_states(_resume_and_probe(tmp_path, path), saved)


def test_checkpoint_with_rng_states_at_the_old_top_level_key_still_resumes_exactly(trained, tmp_path):
    path, saved = trained
    ckpt = torch.load(path, weights_only=True)
    ckpt["rng_states"] = ckpt["callbacks"].pop("RNGStates")["per_rank"]  # where MMTaskModule stored them
    old = tmp_path / "old_layout.ckpt"
    torch.save(ckpt, old)
    _assert_same_states(_resume_and_probe(tmp_path, old), saved)


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path):
    module = TinyRegression()
    trainer = _trainer(tmp_path, 1, [FiniteWeightsGuard()])
    trainer.fit(module)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    with torch.no_grad():
        module.layer.bias.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"step 1: non-finite weights in \['layer.bias'\]"):
        trainer.save_checkpoint(path)
    assert path.read_bytes() == before


def test_build_trainer_adds_the_state_callbacks(tmp_path):
    cfg = Config(dict(model=dict(type="Anything"), trainer=dict(max_steps=1, accelerator="cpu")))
    kinds = [type(c) for c in build_trainer(cfg, str(tmp_path / "train")).callbacks]
    assert {RNGStates, SyncBuffers, FiniteWeightsGuard} <= set(kinds)
    kinds = [type(c) for c in build_trainer(cfg, str(tmp_path / "test"), for_test=True).callbacks]
    assert SyncBuffers in kinds and RNGStates not in kinds and FiniteWeightsGuard not in kinds
