"""LightningModule wrapping an mmdet detector / mmseg segmentor built from an mmengine config.

Lightning owns the loop (devices, DDP, AMP, checkpoints, logging); the mm model keeps its own
``data_preprocessor`` (normalisation, padding, batching, moving the pseudo-collated batch to the device),
its losses (``parse_losses``) and its ``predict`` post-processing. Evaluation is a torchmetrics evaluator
(``tasks/metrics.py``) updated per batch and computed once per epoch.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm

from .config import register_scope
from .optim import build_optimizer, build_schedulers


class MMTaskModule(L.LightningModule):
    """Subclasses set ``scope`` and implement ``build_evaluator``."""

    scope: str = ''

    def __init__(self, cfg: Config | dict, *, init_weights: bool = True):
        super().__init__()
        self.cfg = cfg if isinstance(cfg, Config) else Config(cfg)
        register_scope(self.scope)
        model = self.models_registry().build(self.cfg.model)
        if init_weights:  # mmengine's Runner does this; skipped when a checkpoint will overwrite everything
            model.init_weights()
        # SyncBN in mm configs cannot run on CPU or in one process; synchronised BN is Lightning's
        # job (trainer.sync_batchnorm=True converts every BatchNorm back under DDP).
        self.model = revert_sync_batchnorm(model)
        self.evaluator = self.build_evaluator()
        self.val_metrics: dict[str, float] = {}
        self.test_metrics: dict[str, float] = {}

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
        # Per-rank values, logged on step only: no collective in the hot loop.
        self.log_dict({f'train/{k}': v for k, v in log_vars.items()}, on_step=True, on_epoch=False,
                      batch_size=len(data['data_samples']))
        self.log('loss', log_vars['loss'], prog_bar=True, logger=False, on_step=True, on_epoch=False,
                 batch_size=len(data['data_samples']))
        self.log('train/lr', self.trainer.optimizers[0].param_groups[0]['lr'], on_step=True, on_epoch=False,
                 batch_size=len(data['data_samples']))
        return loss

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
