"""LightningModule wrapping an mmdet detector / mmseg segmentor built from an mmengine config.

Lightning owns the loop (devices, DDP, AMP, checkpoints, logging); the mm model keeps its own
``data_preprocessor`` (normalisation, padding, batching, moving the pseudo-collated batch to the device),
its losses (``parse_losses``) and its ``predict`` post-processing. Evaluation is a torchmetrics evaluator
(``tasks/metrics.py``) updated per batch and computed once per epoch.

Non-finite losses: the top-level config key ``nonfinite_loss`` says what a NaN / inf loss does.
``'raise'`` (default) stops training with a ``FloatingPointError`` naming the step and the non-finite loss
terms; the checkpoints on disk are from before that step. ``'skip'`` skips the step (no backward, no
optimizer step; the LR schedule still advances), warns, and logs the running count as
``train/skipped_nonfinite``. Under DDP the ranks agree (one all-reduce of a flag per step), so all skip
or all stop together. A checkpoint is never written from non-finite weights (``on_save_checkpoint`` raises).

Checkpoints also hold every rank's torch / numpy / ``random`` RNG states, restored when training resumes,
so that with the resumable train loader (tasks/data.py) a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import random

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm

from .config import build_from_registry, register_scope
from .optim import build_optimizer, build_schedulers

log = logging.getLogger(__name__)
NONFINITE_MODES = ('raise', 'skip')


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rng_states() -> dict:
    """This process's RNG states as types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {'torch': torch.get_rng_state(), 'python': random.getstate(),
              'numpy': [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states['torch'])
    version, internal, gauss = states['python']
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states['numpy']
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states['cuda'])


class MMTaskModule(L.LightningModule):
    """Subclasses set ``scope`` and implement ``build_evaluator``."""

    scope: str = ''

    def __init__(self, cfg: Config | dict, *, init_weights: bool = True):
        super().__init__()
        self.cfg = cfg if isinstance(cfg, Config) else Config(cfg)
        register_scope(self.scope)
        model = build_from_registry(self.models_registry(), self.cfg.model)
        if init_weights:  # mmengine's Runner does this; skipped when a checkpoint will overwrite everything
            model.init_weights()
        # SyncBN in mm configs cannot run on CPU or in one process; synchronised BN is Lightning's
        # job (trainer.sync_batchnorm=True converts every BatchNorm back under DDP).
        self.model = revert_sync_batchnorm(model)
        self.evaluator = self.build_evaluator()
        self.val_metrics: dict[str, float] = {}
        self.test_metrics: dict[str, float] = {}
        self.nonfinite_loss = self.cfg.get('nonfinite_loss') or 'raise'
        if self.nonfinite_loss not in NONFINITE_MODES:
            raise ValueError(f'nonfinite_loss must be one of {NONFINITE_MODES}, got {self.nonfinite_loss!r}')
        self.skipped_nonfinite = 0
        self._rng_to_restore = None

    # ---- subclass hooks -------------------------------------------------------------------------
    @staticmethod
    def models_registry():
        raise NotImplementedError

    def build_evaluator(self):
        raise NotImplementedError

    # ---- data ------------------------------------------------------------------------------------
    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        # The batch stays mm's pseudo-collated dict (lists of uint8 images and data samples); the
        # data_preprocessor moves it (see _preprocess), exactly as under mmengine's Runner.
        return batch

    def _preprocess(self, batch: dict, training: bool) -> dict:
        # mm's BaseDataPreprocessor caches its target device in ``_device`` and only updates it in
        # its own .to()/.cuda(); Lightning moves modules with nn.Module._apply (and FSDP moves them
        # itself), which never calls that. Sync it to where this process computes before each use.
        device = self._trainer.strategy.root_device if self._trainer is not None else self.device
        if self.model.data_preprocessor.device != device:
            self.model._set_device(device)
        return self.model.data_preprocessor(batch, training)

    # ---- steps -----------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        data = self._preprocess(batch, training=True)
        losses = self.model(**data, mode='loss')
        loss, log_vars = self.model.parse_losses(losses)
        if self._nonfinite(loss):
            return self._nonfinite_step(log_vars, batch_idx, len(data['data_samples']))
        # Per-rank values, logged on step only: no collective in the hot loop.
        self.log_dict({f'train/{k}': v for k, v in log_vars.items()}, on_step=True, on_epoch=False,
                      batch_size=len(data['data_samples']))
        self.log('loss', log_vars['loss'], prog_bar=True, logger=False, on_step=True, on_epoch=False,
                 batch_size=len(data['data_samples']))
        self.log('train/lr', self.trainer.optimizers[0].param_groups[0]['lr'], on_step=True, on_epoch=False,
                 batch_size=len(data['data_samples']))
        if self.skipped_nonfinite:
            self.log('train/skipped_nonfinite', float(self.skipped_nonfinite), on_step=True, on_epoch=False,
                     batch_size=len(data['data_samples']))
        return loss

    def _nonfinite(self, loss: torch.Tensor) -> bool:
        flag = (~torch.isfinite(loss.detach())).any().float().reshape(1)
        if _distributed():  # every rank must take the same branch, or DDP's gradient all-reduce desyncs
            dist.all_reduce(flag)
        return bool(flag.item())

    def _nonfinite_step(self, log_vars: dict, batch_idx: int, batch_size: int) -> None:
        vals = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}
        bad = {k: v for k, v in vals.items() if not math.isfinite(v)}
        rank = self.global_rank
        where = (f'step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx}, rank {rank})')
        terms = (', '.join(f'{k}={v}' for k, v in bad.items()) if bad else
                 'all terms finite on this rank; non-finite on another rank')
        if self.nonfinite_loss == 'raise':
            raise FloatingPointError(
                f'non-finite loss at {where}: {terms} (all terms: '
                f'{", ".join(f"{k}={v:.4g}" for k, v in vals.items())}). Training stopped; the '
                "checkpoints on disk are from earlier steps. Lower the learning rate / enable gradient "
                "clipping, or set nonfinite_loss='skip' in the config to skip such steps.")
        self.skipped_nonfinite += 1
        log.warning('skipping non-finite loss at %s: %s (%d skipped so far)', where, terms, self.skipped_nonfinite)
        self.log('train/skipped_nonfinite', float(self.skipped_nonfinite), on_step=True, on_epoch=False,
                 batch_size=batch_size)
        return None  # Lightning then runs no backward and no optimizer step

    def _predict(self, batch: dict) -> list:
        data = self._preprocess(batch, training=False)
        return self.model(**data, mode='predict')

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # No self.log here: ranks may run different numbers of val batches (unpadded sampler), so
        # any per-step collective would hang. The only sync is the evaluator's compute() at epoch end.
        self.evaluator.update(self._predict(batch))

    def test_step(self, batch: dict, batch_idx: int) -> list:
        preds = self._predict(batch)
        self.evaluator.update(preds)
        return preds  # for callbacks (tasks/visualize.py)

    def _sync_buffers(self) -> None:
        # Under DDP, BatchNorm running statistics stay per rank (no broadcast_buffers, as in mmengine).
        # Average them once before evaluating, as mmengine's SyncBuffersHook does, so that every rank
        # evaluates - and the checkpoint written after validation holds - the same model.
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        for buf in self.model.buffers():
            if buf.is_floating_point():
                dist.all_reduce(buf)  # SUM then divide: ReduceOp.AVG is NCCL-only
                buf.div_(dist.get_world_size())
            else:  # e.g. num_batches_tracked, equal on all ranks anyway
                dist.broadcast(buf, src=0)

    def on_validation_epoch_start(self) -> None:
        self._sync_buffers()

    def on_test_epoch_start(self) -> None:
        self._sync_buffers()

    def _finish_eval(self) -> dict[str, float]:
        metrics = {k: float(v) for k, v in self.evaluator.compute().items()}  # gathers all ranks
        self.evaluator.reset()
        # Same value on every rank already, so no sync_dist (which would be one more collective).
        self.log_dict(metrics, sync_dist=False)
        return metrics

    def on_validation_epoch_end(self) -> None:
        metrics = self._finish_eval()
        if not self.trainer.sanity_checking:
            self.val_metrics = metrics

    def on_test_epoch_end(self) -> None:
        self.test_metrics = self._finish_eval()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The resolved config and the last validation metrics travel with the weights, as plain
        # strings and floats: every loader reads checkpoints with weights_only=True, which refuses
        # mmengine Config objects.
        from backbones.export import config_text
        checkpoint['mm_config'] = config_text(self.cfg)
        checkpoint['val_metrics'] = dict(self.val_metrics)
        params = [p for p in self.parameters()]
        if params and not bool(torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()):
            bad = [n for n, p in self.named_parameters() if not torch.isfinite(p.detach()).all()]
            raise FloatingPointError(f'refusing to write a checkpoint at step {self.global_step}: non-finite '
                                     f'weights in {bad[:5]}{" ..." if len(bad) > 5 else ""}; the previous '
                                     'checkpoint is kept')
        states = rng_states()
        if _distributed():  # dump_checkpoint runs on every rank; rank 0 writes
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, states)
            checkpoint['rng_states'] = gathered
        else:
            checkpoint['rng_states'] = [states]
        checkpoint['skipped_nonfinite'] = self.skipped_nonfinite

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        states = checkpoint.get('rng_states')
        if states:
            self._rng_to_restore = states[self.global_rank] if len(states) > self.global_rank else states[0]
        self.skipped_nonfinite = int(checkpoint.get('skipped_nonfinite', 0))

    def on_train_start(self) -> None:
        # Here rather than in on_load_checkpoint: nothing between this hook and the first resumed step
        # draws random numbers (the train sampler has its own seeded generator).
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    # ---- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.cfg.optim_wrapper)
        trainer = self.trainer
        schedulers = build_schedulers(optimizer, self.cfg.get('param_scheduler'),
                                      max_epochs=trainer.max_epochs, max_steps=trainer.max_steps,
                                      epoch_length=self._steps_per_epoch)
        return [optimizer], schedulers

    def _steps_per_epoch(self) -> int:
        trainer = self.trainer
        trainer.estimated_stepping_batches  # noqa: B018  (sets up the train loader: num_training_batches)
        return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))

    def lr_scheduler_step(self, scheduler, metric) -> None:
        # mmengine's _ParamScheduler is not a torch LRScheduler; Lightning calls this at the
        # configured interval ('step' after each optimizer step, 'epoch' after each train epoch).
        scheduler.step()
