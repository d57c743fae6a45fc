"""LightningModule wrapping an mmdet detector / mmseg segmentor built from an mmengine config.

Lightning owns the loop (devices, DDP, AMP, checkpoints, logging); the mm model keeps its own
``data_preprocessor`` (normalisation, padding, batching, moving the pseudo-collated batch to the device),
its losses (``parse_losses``) and its ``predict`` post-processing. Evaluation is a torchmetrics evaluator
(``tasks/metrics.py``) updated per batch and computed once per epoch.

Non-finite losses: the top-level config key ``nonfinite_loss`` says what a NaN / inf loss does.
``'raise'`` (default) stops training with a ``FloatingPointError`` naming the step and the non-finite loss
terms; the checkpoints on disk are from before that step. ``'skip'`` skips the optimizer step (no update,
no momentum or weight decay, no clipping; BatchNorm running statistics are put back as they were before
the step), warns, and logs the running count as ``train/skipped_nonfinite``. The skipped step still counts
towards ``max_steps`` and the LR schedule advances; with gradient accumulation the window's step is skipped.
Under DDP the ranks agree (one all-reduce of a flag per step), so all skip or all stop together; a skipped
step backpropagates a zero loss on every rank, so that DDP's gradient all-reduce runs as on any other step
(Lightning refuses a ``None`` step under DDP).

State that is not the task's own lives in Lightning callbacks (tasks/callbacks.py, added by
``tasks.trainer.build_trainer``): the RNG states saved in checkpoints and restored on resume, BatchNorm
buffers averaged over DDP ranks before evaluation, and the refusal to write a checkpoint from non-finite
weights.
"""

from __future__ import annotations

import logging
import math

import lightning as L
import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim.scheduler.param_scheduler import _ParamScheduler
from mmengine.registry import Registry
from torch.optim import Optimizer
from torchmetrics import Metric

from .callbacks import world_size
from .config import build_from_registry, config_text, register_scope
from .optim import build_optimizer, build_schedulers, scale_lr

log = logging.getLogger(__name__)
NONFINITE_MODES = ("raise", "skip")


class MMTaskModule(L.LightningModule):
    """An mm model (``cfg.model``) trained, validated and tested by Lightning.

    Subclasses set ``scope`` (``'mmdet'`` / ``'mmseg'``) and implement ``models_registry`` and
    ``build_evaluator``.

    Args:
        cfg: the mmengine config (a ``Config`` or a plain dict): ``model``, ``optim_wrapper``,
            ``param_scheduler`` and the optional ``nonfinite_loss`` (``'raise'`` or ``'skip'``).
        init_weights: run the model's ``init_weights()`` (pretrained backbones included), as mmengine's Runner
            does; False when a checkpoint will overwrite every weight anyway.

    Attributes:
        model: the mm detector / segmentor (SyncBN reverted to BatchNorm; see below).
        evaluator: the torchmetrics evaluator of ``build_evaluator``.
        val_metrics: the last validation metrics (also stored in checkpoints as ``val_metrics``).
        test_metrics: the metrics of the last ``trainer.test``.
        evaluate_test: False makes test steps only predict, without ground truth or metrics
            (``tools/test.py --format-only``); True by default.
        skipped_nonfinite: steps skipped for a non-finite loss so far (``nonfinite_loss='skip'``).
    """

    scope: str = ""

    def __init__(self, cfg: Config | dict, *, init_weights: bool = True) -> None:
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
        # flat float metrics + 'per_class' (see tasks/metrics.py)
        self.val_metrics: dict = {}
        self.test_metrics: dict = {}
        self.evaluate_test = True
        self.__dict__["_tta"] = None  # see enable_tta
        self.nonfinite_loss = self.cfg.get("nonfinite_loss") or "raise"
        if self.nonfinite_loss not in NONFINITE_MODES:
            raise ValueError(f"nonfinite_loss must be one of {NONFINITE_MODES}, got {self.nonfinite_loss!r}")
        self.skipped_nonfinite = 0
        self._skip_optimizer_step = False

    # ---- subclass hooks -------------------------------------------------------------------------
    @staticmethod
    def models_registry() -> Registry:
        """The mm registry that builds ``cfg.model`` (mmdet's or mmseg's ``MODELS``)."""
        raise NotImplementedError

    def build_evaluator(self) -> Metric:
        """The torchmetrics evaluator fed with ``model.predict`` results."""
        raise NotImplementedError

    # ---- data ------------------------------------------------------------------------------------
    def transfer_batch_to_device(self, batch: dict, device: torch.device, dataloader_idx: int) -> dict:
        # The batch stays mm's pseudo-collated dict (lists of uint8 images and data samples); the
        # data_preprocessor moves it (see _preprocess), exactly as under mmengine's Runner.
        return batch

    def _sync_preprocessor_device(self) -> None:
        # mm's BaseDataPreprocessor caches its target device in ``_device`` and only updates it in
        # its own .to()/.cuda(); Lightning moves modules with nn.Module._apply (and FSDP moves them
        # itself), which never calls that. Sync it to where this process computes before each use.
        device = self._trainer.strategy.root_device if self._trainer is not None else self.device
        if self.model.data_preprocessor.device != device:
            self.model._set_device(device)

    def _preprocess(self, batch: dict, training: bool) -> dict:
        self._sync_preprocessor_device()
        return self.model.data_preprocessor(batch, training)

    # ---- steps -----------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        data = self._preprocess(batch, training=True)
        # 'skip': the forward of a step that turns out non-finite must leave no trace either; it would
        # otherwise have moved BatchNorm running statistics (to NaN, for a batch of NaN images).
        buffers = [b.clone() for b in self.model.buffers()] if self.nonfinite_loss == "skip" else None
        losses = self.model(**data, mode="loss")
        loss, log_vars = self.model.parse_losses(losses)
        if self._nonfinite(loss):
            if buffers is not None:
                with torch.no_grad():
                    for b, before in zip(self.model.buffers(), buffers):
                        b.copy_(before)
            return self._nonfinite_step(log_vars, batch_idx, len(data["data_samples"]))
        # Per-rank values, logged on step only: no collective in the hot loop.
        self.log_dict(
            {f"train/{k}": v for k, v in log_vars.items()},
            on_step=True,
            on_epoch=False,
            batch_size=len(data["data_samples"]),
        )
        self.log(
            "loss",
            log_vars["loss"],
            prog_bar=True,
            logger=False,
            on_step=True,
            on_epoch=False,
            batch_size=len(data["data_samples"]),
        )
        self.log(
            "train/lr",
            self.trainer.optimizers[0].param_groups[0]["lr"],
            on_step=True,
            on_epoch=False,
            batch_size=len(data["data_samples"]),
        )
        if self.skipped_nonfinite:
            self.log(
                "train/skipped_nonfinite",
                float(self.skipped_nonfinite),
                on_step=True,
                on_epoch=False,
                batch_size=len(data["data_samples"]),
            )
        return loss

    def _nonfinite(self, loss: torch.Tensor) -> bool:
        flag = (~torch.isfinite(loss.detach())).any().float().reshape(1)
        if world_size() > 1:  # every rank must take the same branch, or DDP's gradient all-reduce desyncs
            dist.all_reduce(flag)
        return bool(flag.item())

    def _nonfinite_step(self, log_vars: dict, batch_idx: int, batch_size: int) -> torch.Tensor:
        vals = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in log_vars.items()}
        bad = {k: v for k, v in vals.items() if not math.isfinite(v)}
        rank = self.global_rank
        where = f"step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx}, rank {rank})"
        terms = (
            ", ".join(f"{k}={v}" for k, v in bad.items())
            if bad
            else "all terms finite on this rank; non-finite on another rank"
        )
        if self.nonfinite_loss == "raise":
            raise FloatingPointError(
                f"non-finite loss at {where}: {terms} (all terms: "
                f"{', '.join(f'{k}={v:.4g}' for k, v in vals.items())}). Training stopped; the "
                "checkpoints on disk are from earlier steps. Lower the learning rate / enable gradient "
                "clipping, or set nonfinite_loss='skip' in the config to skip such steps."
            )
        self.skipped_nonfinite += 1
        log.warning("skipping non-finite loss at %s: %s (%d skipped so far)", where, terms, self.skipped_nonfinite)
        self.log(
            "train/skipped_nonfinite",
            float(self.skipped_nonfinite),
            on_step=True,
            on_epoch=False,
            batch_size=batch_size,
        )
        self._skip_optimizer_step = True  # read by optimizer_step
        # A zero that reaches every trainable parameter: its backward gives each a zero gradient on every rank
        # (DDP all-reduces them as usual) whatever the non-finite activations held.
        return sum(p.sum() for p in self.parameters() if p.requires_grad) * 0.0

    # ---- test-time augmentation ------------------------------------------------------------------
    def enable_tta(self) -> None:
        """Predict with the config's ``tta_model`` (mmseg ``SegTTAModel``, mmdet ``DetTTAModel``) wrapping this
        model as its ``module``, as mmengine's Runner does for ``--tta``. The eval data must then come from the
        config's ``tta_pipeline`` (mm's ``TestTimeAug``: each batch holds one list per augmented view)."""
        if self.cfg.get("tta_model") is None:
            raise ValueError(
                "--tta: the config defines no tta_model (e.g. "
                "tta_model = dict(type='SegTTAModel') with a tta_pipeline; see docs/evaluation.md)"
            )
        tta = build_from_registry(self.models_registry(), dict(self.cfg.tta_model, module=self.model), "tta_model")
        self.check_tta(tta)
        # Kept out of the module tree: the TTA model holds self.model as a child, and registering it would
        # add every weight a second time (``_tta.module.*``) to the state dict and to checkpoint loading.
        self.__dict__["_tta"] = tta

    def check_tta(self, tta: torch.nn.Module) -> None:
        """Subclasses refuse TTA models that cannot merge this model's predictions (with a ValueError)."""

    def _predict(self, batch: dict) -> list:
        tta = self.__dict__.get("_tta")
        if tta is not None:
            # BaseTTAModel.test_step splits the batch into one batch per view, runs the wrapped model's own
            # test_step (data_preprocessor + predict) on each and merges the views of every image.
            self._sync_preprocessor_device()
            return tta.test_step(batch)
        data = self._preprocess(batch, training=False)
        return self.model(**data, mode="predict")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # No self.log here: ranks may run different numbers of val batches (unpadded sampler), so
        # any per-step collective would hang. The only sync is the evaluator's compute() at epoch end.
        self.evaluator.update(self._predict(batch))

    def test_step(self, batch: dict, batch_idx: int) -> list:
        preds = self._predict(batch)
        if self.evaluate_test:
            self.evaluator.update(preds)
        return preds  # for callbacks (tasks/visualize.py)

    def on_validation_epoch_start(self) -> None:
        self._set_class_names("val")

    def on_test_epoch_start(self) -> None:
        self._set_class_names("test")

    def _set_class_names(self, split: str) -> None:
        # per-class results are keyed by the dataset's class names, as mmengine's Evaluator sets dataset_meta
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "dataset"):
            classes = (getattr(datamodule.dataset(split), "metainfo", None) or {}).get("classes")
            if classes is not None:
                self.evaluator.class_names = [str(c) for c in classes]

    def _finish_eval(self) -> dict:
        """The evaluator's flat float metrics (logged) plus its ``per_class`` dict (not logged)."""
        result = self.evaluator.compute()  # gathers all ranks
        self.evaluator.reset()
        metrics = {k: float(v) for k, v in result.items() if k != "per_class"}
        # Same value on every rank already, so no sync_dist (which would be one more collective).
        self.log_dict(metrics, sync_dist=False)
        if "per_class" in result:
            metrics["per_class"] = result["per_class"]
        return metrics

    def on_validation_epoch_end(self) -> None:
        metrics = self._finish_eval()
        if not self.trainer.sanity_checking:
            self.val_metrics = metrics

    def on_test_epoch_end(self) -> None:
        if self.evaluate_test:
            self.test_metrics = self._finish_eval()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The resolved config and the last validation metrics travel with the weights, as plain
        # strings and floats: every loader reads checkpoints with weights_only=True, which refuses
        # mmengine Config objects.
        checkpoint["mm_config"] = config_text(self.cfg)
        checkpoint["val_metrics"] = dict(self.val_metrics)
        checkpoint["skipped_nonfinite"] = self.skipped_nonfinite

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.skipped_nonfinite = int(checkpoint.get("skipped_nonfinite", 0))

    # ---- optimisation ----------------------------------------------------------------------------
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        if self.nonfinite_loss != "skip":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # The closure (training_step + backward) runs first, so that a step found non-finite never reaches
        # the optimizer (nor gradient clipping or the AMP scaler); a finite one steps on the loss it returned.
        loss = optimizer_closure()
        if self._skip_optimizer_step:
            self._skip_optimizer_step = False
            return None
        return optimizer.step(closure=lambda: loss)

    def configure_optimizers(self) -> tuple[list[Optimizer], list[dict]]:
        optimizer = build_optimizer(self.model, self.cfg.optim_wrapper)
        trainer = self.trainer
        scale_lr(
            optimizer,
            self.cfg.get("auto_scale_lr"),
            num_devices=trainer.num_devices,
            num_nodes=trainer.num_nodes,
            batch_size=self.cfg.train_dataloader.batch_size,
        )
        schedulers = build_schedulers(
            optimizer,
            self.cfg.get("param_scheduler"),
            max_epochs=trainer.max_epochs,
            max_steps=trainer.max_steps,
            epoch_length=self._steps_per_epoch,
        )
        return [optimizer], schedulers

    def _steps_per_epoch(self) -> int:
        trainer = self.trainer
        trainer.estimated_stepping_batches  # noqa: B018  (sets up the train loader: num_training_batches)
        return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))

    def lr_scheduler_step(self, scheduler: _ParamScheduler, metric: torch.Tensor | None) -> None:
        # mmengine's _ParamScheduler is not a torch LRScheduler; Lightning calls this at the
        # configured interval ('step' after each optimizer step, 'epoch' after each train epoch).
        scheduler.step()
