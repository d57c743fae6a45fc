"""LightningModule wrapping an mmdet detector / mmseg segmentor built from an mmengine config.

Lightning owns the loop (devices, DDP, AMP, checkpoints, logging); the mm model keeps its own
``data_preprocessor`` (normalisation, padding, batching, moving the pseudo-collated batch to the device),
its losses (``parse_losses``) and its ``predict`` post-processing. Evaluation is what the config's
``val_evaluator`` / ``test_evaluator`` ask for (tasks/evaluation/select.py): our torchmetrics evaluator
(``tasks/evaluation/coco.py``, ``segmentation.py``) or mm's metric classes, updated per batch and computed once
per epoch.

Non-finite losses follow the config's ``nonfinite_loss`` policy (tasks/training/nonfinite.py); the config's
``compile`` compiles the backbone and neck for training (tasks/training/compile.py).

State that is not the task's own lives in Lightning callbacks (tasks/training/callbacks.py, added by
``tasks.training.trainer.build_trainer``): the RNG states of checkpoints, BatchNorm buffers averaged over DDP
ranks before evaluation, and the refusal to write a checkpoint from non-finite weights.
"""

from __future__ import annotations

import lightning as L
import torch
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.optim.scheduler.param_scheduler import _ParamScheduler
from mmengine.registry import Registry
from torch.optim import Optimizer
from torchmetrics import Metric

from ..config.load import build_from_registry, config_text
from ..config.scopes import register_scope
from ..evaluation.select import build_evaluators, check_monitor
from ..evaluation.tta import TTAPredictor
from .checkpoint_io import check_resumed_weights
from .compile import compile_model, compile_options
from .nonfinite import NonFiniteLossPolicy
from .optim import configure_optimizers


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
        with_masks: the model predicts instance masks (``predicts_masks``).
        evaluator: the validation evaluator: ours (``build_evaluator``, a torchmetrics ``Metric``) or mm's metric
            classes (``tasks.evaluation.mm_metric.MMEvaluator``), as ``val_evaluator`` asks
            (``tasks.evaluation.select``).
        test_evaluator: the same for ``test_evaluator`` (the same object when both ask for the same).
        val_metrics: the last validation metrics (also stored in checkpoints as ``val_metrics``).
        validated: a validation epoch ended in this process (``tools/train.py`` validates after ``fit`` otherwise).
        test_metrics: the metrics of the last ``trainer.test``.
        tta: the ``TTAPredictor`` that test steps predict with (``tasks.evaluation.tta.enable_tta``), or None.
        evaluate_test: False makes test steps only predict, without ground truth or metrics
            (``tools/test.py --format-only``); True by default.
        nonfinite: the ``nonfinite_loss`` policy and its state (``NonFiniteLossPolicy``).
        compiled: the submodules that the config's ``compile`` compiled when training started
            (tasks/training/compile.py).
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
        self.with_masks = self.predicts_masks()
        # the config's val_evaluator / test_evaluator: ours where it computes them, else mm's metric classes
        self.evaluator, self.test_evaluator = build_evaluators(
            self.cfg, self.scope, self.build_evaluator, with_masks=self.with_masks
        )
        # flat float metrics + 'per_class' (see tasks/evaluation/coco.py)
        self.val_metrics: dict = {}
        self.validated = False  # a validation epoch ended in this process (its metrics may be none: format_only)
        self.test_metrics: dict = {}
        self.evaluate_test = True
        self.tta: TTAPredictor | None = None  # tasks.evaluation.tta.enable_tta sets it
        self.nonfinite = NonFiniteLossPolicy(self.cfg.get("nonfinite_loss"))
        compile_options(self.cfg.get("compile"))  # a bad `compile` value fails here, before any data is read
        self.compiled: list[str] = []  # the submodules compiled for training (on_fit_start)

    def on_fit_start(self) -> None:
        # The config's `compile` is mmengine's switch for training (it compiles train_step); tools/test.py's
        # evaluation stays eager. Compiled once per module; validation inside fit runs the compiled parts too.
        if not self.compiled:
            self.compiled = compile_model(self.model, self.cfg.get("compile"))

    # ---- subclass hooks -------------------------------------------------------------------------
    @staticmethod
    def models_registry() -> Registry:
        """The mm registry that builds ``cfg.model`` (mmdet's or mmseg's ``MODELS``)."""
        raise NotImplementedError

    def predicts_masks(self) -> bool:
        """Whether the model's predictions hold instance masks (``with_masks``); detection tasks say."""
        return False

    def build_evaluator(self, **options) -> Metric:
        """Our torchmetrics evaluator fed with ``model.predict`` results; ``options`` come from the config's
        metric (``tasks.evaluation.select.ours_options``)."""
        raise NotImplementedError

    # ---- data ------------------------------------------------------------------------------------
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
        batch_size = len(data["data_samples"])
        with self.nonfinite.guard(self.model) as step:
            losses = self.model(**data, mode="loss")
        loss, log_vars = self.model.parse_losses(losses)
        loss, skipped = step.finish(loss, log_vars, self._where(batch_idx), self.parameters)
        if not skipped:
            # Per-rank values, logged on step only: no collective in the hot loop.
            self.log_dict({f"train/{k}": v for k, v in log_vars.items()}, on_step=True, batch_size=batch_size)
            self.log("loss", log_vars["loss"], prog_bar=True, logger=False, on_step=True, batch_size=batch_size)
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            self.log("train/lr", lr, on_step=True, batch_size=batch_size)
        if self.nonfinite.skipped:
            self.log("train/skipped_nonfinite", float(self.nonfinite.skipped), on_step=True, batch_size=batch_size)
        return loss

    def _where(self, batch_idx: int | None = None) -> str:
        batch = f", batch {batch_idx}" if batch_idx is not None else ""
        return f"step {self.global_step} (epoch {self.current_epoch}{batch}, rank {self.global_rank})"

    # The 'raise' policy's check points: every logging interval, before validation, before a checkpoint is
    # written, at the end of training (tasks/training/nonfinite.py). Each reads the flags once.
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        if self.nonfinite.mode == "raise":
            self.nonfinite.zero_nonfinite_grads(self.parameters(), self._where())

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            self.nonfinite.check()

    def on_validation_start(self) -> None:
        self.nonfinite.check()

    def on_train_end(self) -> None:
        self.nonfinite.check()

    def check_tta(self, tta: torch.nn.Module) -> None:
        """Subclasses refuse TTA models that cannot merge this model's predictions (with a ValueError)."""

    # ---- evaluation ------------------------------------------------------------------------------
    def _predict(self, batch: dict) -> list:
        if self.tta is not None:
            self._sync_preprocessor_device()
            return self.tta(batch)
        data = self._preprocess(batch, training=False)
        return self.model(**data, mode="predict")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        # No self.log here: ranks may run different numbers of val batches (unpadded sampler), so
        # any per-step collective would hang. The only sync is the evaluator's compute() at epoch end.
        self._update(self.evaluator, batch, self._predict(batch))

    def test_step(self, batch: dict, batch_idx: int) -> list:
        preds = self._predict(batch)
        if self.evaluate_test:
            self._update(self.test_evaluator, batch, preds)
        return preds  # for callbacks (tasks/figures/predictions.py)

    @staticmethod
    def _update(evaluator, batch: dict, preds: list) -> None:
        if getattr(evaluator, "takes_batch", False):  # mm's metrics: process(data_batch, data_samples)
            evaluator.update(preds, batch)
        else:
            evaluator.update(preds)

    def setup(self, stage: str) -> None:
        if stage == "fit":  # before the first step, not at the first checkpoint
            check_monitor(self.cfg, self.evaluator, self.scope)
            datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
            if datamodule is not None and hasattr(datamodule, "dataset"):
                self.check_classes(datamodule.dataset("train"), "train")

    def check_classes(self, dataset, split: str) -> None:
        """Subclasses refuse a model whose heads do not predict the dataset's classes (with a ValueError naming the
        config keys); called for the train split before the first step and for each evaluated split.

        Args:
            dataset: the built mm dataset (its ``metainfo['classes']``).
            split: ``'train'``, ``'val'`` or ``'test'``, for the message.
        """

    def on_validation_epoch_start(self) -> None:
        self._set_class_names("val", self.evaluator)

    def on_test_epoch_start(self) -> None:
        self._set_class_names("test", self.test_evaluator)

    def _set_class_names(self, split: str, evaluator) -> None:
        # per-class results are keyed by the dataset's class names, as mmengine's Evaluator sets dataset_meta
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "dataset"):
            dataset = datamodule.dataset(split)
            self.check_classes(dataset, split)
            if hasattr(evaluator, "set_dataset"):  # mm's metrics: dataset_meta, size (and ann_file)
                evaluator.set_dataset(dataset)
                return
            classes = (getattr(dataset, "metainfo", None) or {}).get("classes")
            if classes is not None:
                evaluator.class_names = [str(c) for c in classes]

    def _finish_eval(self, evaluator) -> dict:
        """The evaluator's flat float metrics (logged) plus its ``per_class`` dict (not logged)."""
        result = evaluator.compute()  # gathers all ranks
        evaluator.reset()
        metrics = {k: float(v) for k, v in result.items() if k != "per_class"}
        # Same value on every rank already; the max over ranks keeps it exactly (a mean could round it), and
        # without sync_dist Lightning warns on every distributed validation.
        self.log_dict(metrics, sync_dist=True, reduce_fx="max")
        if "per_class" in result:
            metrics["per_class"] = result["per_class"]
        return metrics

    def on_validation_epoch_end(self) -> None:
        metrics = self._finish_eval(self.evaluator)
        if not self.trainer.sanity_checking:
            self.val_metrics, self.validated = metrics, True

    def on_test_epoch_end(self) -> None:
        if self.evaluate_test:
            self.test_metrics = self._finish_eval(self.test_evaluator)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.nonfinite.check(collective=False)  # every rank holds the gradient flags, which DDP made equal
        # The resolved config and the last validation metrics travel with the weights, as plain
        # strings and floats: every loader reads checkpoints with weights_only=True, which refuses
        # mmengine Config objects.
        checkpoint["mm_config"] = config_text(self.cfg)
        checkpoint["val_metrics"] = dict(self.val_metrics)
        checkpoint.update(self.nonfinite.state_dict())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        check_resumed_weights(self, checkpoint)  # before Lightning loads them
        self.nonfinite.load_state_dict(checkpoint)

    # ---- optimisation ----------------------------------------------------------------------------
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        if self.nonfinite.mode != "skip":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # The closure (training_step + backward) runs first, so that a step found non-finite never reaches
        # the optimizer (nor gradient clipping or the AMP scaler); a finite one steps on the loss it returned.
        loss = optimizer_closure()
        if self.nonfinite.take_skip():
            return None
        return optimizer.step(closure=lambda: loss)

    def configure_optimizers(self) -> tuple[list[Optimizer], list[dict]]:
        return configure_optimizers(self.model, self.cfg, self.trainer)

    def lr_scheduler_step(self, scheduler: _ParamScheduler, metric: torch.Tensor | None) -> None:
        # mmengine's _ParamScheduler is not a torch LRScheduler; Lightning calls this at the
        # configured interval ('step' after each optimizer step, 'epoch' after each train epoch).
        scheduler.step()
