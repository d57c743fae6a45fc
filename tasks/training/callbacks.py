"""Cross-cutting training state as Lightning callbacks (``tasks/training/trainer.py``'s ``build_trainer`` adds them).

* ``RNGStates``: every rank's torch / numpy / ``random`` (and CUDA) RNG states go into the checkpoint
  (``checkpoint['callbacks']['RNGStates']``, Lightning saves a callback's ``state_dict``) and are restored
  when training resumes, so that with the resumable train loader (tasks/data/module.py) a resumed run repeats an
  uninterrupted one bit for bit.
* ``SyncBuffers``: averages BatchNorm running statistics over the DDP ranks before each evaluation.
* ``FiniteWeightsGuard``: refuses to write a checkpoint from non-finite weights.
"""

from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch
import torch.distributed as dist


def world_size() -> int:
    """The number of processes in the default process group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rng_states() -> dict:
    """This process's RNG states as types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    """Restore what ``rng_states`` returned."""
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RNGStates(L.Callback):
    """Saves every rank's RNG states in the checkpoint and restores them when training resumes.

    The state is ``{'per_rank': [rank 0's states, rank 1's, ...]}`` (gathered from all ranks: Lightning asks
    every rank for callback states, rank 0 writes). On resume each rank takes its own entry (rank 0's when the
    checkpoint has fewer ranks). Checkpoints written before this callback existed kept the same list under the
    top-level key ``'rng_states'``; it is read from there when the callback's own entry is absent.
    """

    LEGACY_KEY = "rng_states"

    def __init__(self) -> None:
        self._to_restore: list[dict] | None = None

    def state_dict(self) -> dict:
        states = rng_states()
        if world_size() == 1:
            return {"per_rank": [states]}
        gathered = [None] * world_size()
        dist.all_gather_object(gathered, states)
        return {"per_rank": gathered}

    def load_state_dict(self, state_dict: dict) -> None:
        self._to_restore = state_dict["per_rank"]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Lightning calls this before load_state_dict, which overrides it for checkpoints that have both.
        if checkpoint.get(self.LEGACY_KEY):
            self._to_restore = checkpoint[self.LEGACY_KEY]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Here rather than on loading: nothing between this hook and the first resumed step draws random
        # numbers (the train sampler has its own seeded generator).
        if self._to_restore:
            rank = trainer.global_rank
            set_rng_states(self._to_restore[rank] if len(self._to_restore) > rank else self._to_restore[0])
            self._to_restore = None


class SyncBuffers(L.Callback):
    """Averages the model's floating-point buffers (BatchNorm running statistics) over the DDP ranks before
    each validation and test epoch, as mmengine's ``SyncBuffersHook`` does.

    Under DDP without buffer broadcasts (``forward_sync_buffers=False``, tasks/training/trainer.py, as in
    mmengine) the statistics stay per rank; after this, every rank evaluates, and the checkpoint written after
    validation holds, the same model.
    Integer buffers (``num_batches_tracked``, equal on all ranks anyway) are taken from rank 0.
    """

    @staticmethod
    def sync(module: torch.nn.Module) -> None:
        world = world_size()
        if world == 1:
            return
        for buf in module.buffers():
            if buf.is_floating_point():
                dist.all_reduce(buf)  # SUM then divide: ReduceOp.AVG is NCCL-only
                buf.div_(world)
            else:
                dist.broadcast(buf, src=0)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sync(pl_module)

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sync(pl_module)


class FiniteWeightsGuard(L.Callback):
    """Raises ``FloatingPointError`` instead of writing a checkpoint whose weights hold NaN / inf: nothing is
    written, so the previous checkpoint stays on disk. (Whether a non-finite loss stops or skips a step is
    ``MMTaskModule.training_step``'s decision; this guards whatever got through.)"""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        params = list(pl_module.parameters())
        if not params or bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()):
            return  # one device sync for the common case
        bad = [n for n, p in pl_module.named_parameters() if not torch.isfinite(p.detach()).all()]
        raise FloatingPointError(
            f"refusing to write a checkpoint at step {trainer.global_step}: non-finite "
            f"weights in {bad[:5]}{' ...' if len(bad) > 5 else ''}; the previous "
            "checkpoint is kept"
        )
