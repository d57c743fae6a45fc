"""Experiment trackers from the config's ``loggers`` section: Lightning's own logger classes.

    loggers = [
        dict(type='TensorBoardLogger'),
        dict(type='WandbLogger', project='dense-vit', offline=True),
        dict(type='MLFlowLogger', tracking_uri='file:./mlruns'),
    ]

Each entry holds the keyword arguments of that Lightning class (for ``WandbLogger`` also ``wandb.init``'s, for
``TensorBoardLogger`` also ``SummaryWriter``'s); an unknown key is refused with the list of valid ones. Files go
into the work dir unless the entry says otherwise: ``WORK_DIR/tb`` (TensorBoard), ``WORK_DIR/wandb`` (W&B) and
``WORK_DIR/mlruns`` (an MLflow file store, when neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` is set;
MLflow 3 needs ``MLFLOW_ALLOW_FILE_STORE=true`` for file stores, which is set for them). The W&B project and the
MLflow experiment default to the config's name, their runs to the work dir's. The CSV logger (``WORK_DIR/logs``,
read by tools/plot_curves.py) is always on; without a ``loggers`` section a run logs CSV and TensorBoard, as before.

W&B and MLflow are optional extras: ``pip install 'dense-vit[wandb]'`` / ``pip install 'dense-vit[mlflow]'``.

What each tracker receives (``RunReport``, a callback, and ``finish_tracking``):

* at the start of training, the resolved hyper-parameters: the config flattened to ``section.key`` entries
  (lists of dicts, such as pipelines, by index: ``train_dataloader.dataset.pipeline.0.type``), the resolved
  ``lightning.Trainer`` arguments (``trainer/...``, e.g. ``max_steps`` taken from ``train_cfg``) and the run's
  world size, total batch size and initial learning rates (``run/...``, after ``--auto-scale-lr``);
* the config text (``config.py``: a TensorBoard text entry, a file of the W&B run, an MLflow artifact);
* the metrics during training (Lightning's logging) and, at the end, the final validation metrics as
  ``final/<metric>`` at the last step.
"""

from __future__ import annotations

import importlib
import inspect
import os
import os.path as osp
from collections.abc import Mapping, Sequence

import lightning as L
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from mmengine.config import Config

from ..config.load import config_text

# type -> (class, optional package it needs, the extra that installs it)
TRACKERS = {
    "TensorBoardLogger": (TensorBoardLogger, None, None),
    "WandbLogger": (WandbLogger, "wandb", "wandb"),
    "MLFlowLogger": (MLFlowLogger, "mlflow", "mlflow"),
}
# Objects (or paths this module sets) that a config entry cannot meaningfully give.
_NOT_FROM_CONFIG = {"TensorBoardLogger": {"log_dir"}, "WandbLogger": {"experiment"}, "MLFlowLogger": set()}
# MLflow keeps parameter values up to 250 characters (Lightning cuts longer ones): longer lists are spread by index.
_MAX_VALUE_CHARS = 250


def _valid_keys(type_name: str) -> set[str]:
    cls = TRACKERS[type_name][0]
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    if type_name == "WandbLogger":  # **kwargs go to wandb.init
        import wandb

        keys |= set(inspect.signature(wandb.init).parameters)
    elif type_name == "TensorBoardLogger":  # **kwargs go to the SummaryWriter
        from torch.utils.tensorboard import SummaryWriter

        keys |= set(inspect.signature(SummaryWriter.__init__).parameters) - {"self"}
    return keys - _NOT_FROM_CONFIG[type_name]


def _require(type_name: str, where: str) -> None:
    package, extra = TRACKERS[type_name][1:]
    if package is None:
        return
    try:
        importlib.import_module(package)
    except ImportError as e:
        raise ImportError(
            f"{where}: {type_name} needs the {package!r} package, which is not installed. Install the extra: "
            f"pip install 'dense-vit[{extra}]'"
        ) from e


def build_loggers(cfg: Config, work_dir: str) -> list[Logger]:
    """The run's loggers: the CSV logger (``WORK_DIR/logs``) and the config's ``loggers`` (default: TensorBoard).

    Args:
        cfg: the mmengine config; its optional ``loggers`` is a list of ``dict(type=..., **kwargs)``.
        work_dir: where the CSV logs and, by default, every tracker's files go.
    """
    specs = cfg.get("loggers")
    if specs is None:
        specs = [dict(type="TensorBoardLogger")]
    if not isinstance(specs, Sequence) or isinstance(specs, (str, Mapping)):
        raise ValueError(
            f"loggers must be a list of dict(type=...), got {type(specs).__name__}: e.g. "
            "loggers = [dict(type='TensorBoardLogger'), dict(type='WandbLogger', project='NAME', offline=True)]"
        )
    run_name = osp.basename(osp.normpath(osp.abspath(work_dir)))
    project = osp.splitext(osp.basename(cfg.filename))[0] if cfg.filename else "dense-vit"
    loggers: list[Logger] = [CSVLogger(work_dir, name="logs")]
    for i, spec in enumerate(specs):
        where = f"loggers[{i}]"
        if not isinstance(spec, Mapping) or "type" not in spec:
            raise ValueError(f"{where} must be a dict with a 'type' (one of {sorted(TRACKERS)}), got {spec!r}")
        kwargs = dict(spec)
        type_name = str(kwargs.pop("type"))
        if type_name == "CSVLogger":
            raise ValueError(
                f"{where}: the CSV logger is always on (WORK_DIR/logs, read by tools/plot_curves.py); remove this entry"
            )
        if type_name not in TRACKERS:
            raise ValueError(f"{where}: unknown logger type {type_name!r}; supported: {', '.join(sorted(TRACKERS))}")
        _require(type_name, where)
        valid = _valid_keys(type_name)
        unknown = sorted(set(kwargs) - valid)
        if unknown:
            raise ValueError(f"{where} ({type_name}): unknown key(s) {unknown}. Valid keys: {', '.join(sorted(valid))}")
        if type_name == "TensorBoardLogger":
            kwargs.setdefault("save_dir", work_dir)
            kwargs.setdefault("name", "tb")
        elif type_name == "WandbLogger":
            kwargs.setdefault("save_dir", work_dir)
            kwargs.setdefault("project", project)
            kwargs.setdefault("name", run_name)
        elif type_name == "MLFlowLogger":
            _mlflow_store(kwargs, work_dir, where)
            kwargs.setdefault("experiment_name", project)
            kwargs.setdefault("run_name", run_name)
        logger = TRACKERS[type_name][0](**kwargs)
        if type_name == "WandbLogger" and logger._wandb_init.get("anonymous", 0) is None:
            # Lightning always passes anonymous=None to wandb.init, and wandb >= 0.19 warns on every run that the
            # (removed) setting has no effect whenever the key is given: leave it out unless the config sets it.
            del logger._wandb_init["anonymous"]
        loggers.append(logger)
    return loggers


def _mlflow_store(kwargs: dict, work_dir: str, where: str) -> None:
    """Default the MLflow store to a file store in the work dir, and allow file stores.

    MLflow 3 refuses file stores (``file:`` URIs, plain paths) unless ``MLFLOW_ALLOW_FILE_STORE`` is set: it keeps
    them in "maintenance mode" and points at database stores, which need the full ``mlflow`` package (SQLAlchemy),
    not the ``mlflow-skinny`` of the extra. A config that names a file store, or names none, gets one.
    """
    uri = kwargs.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        kwargs.setdefault("save_dir", osp.join(work_dir, "mlruns"))
        uri = "file:" + kwargs["save_dir"]
    scheme = uri.split(":", 1)[0] if ":" in uri else "file"
    if scheme == "file":
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    elif scheme.split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        try:
            importlib.import_module("sqlalchemy")
        except ImportError as e:
            raise ImportError(
                f"{where}: MLflow's database store ({uri!r}) needs the full mlflow package (SQLAlchemy); the "
                "extra installs mlflow-skinny. pip install mlflow, or use a file store (tracking_uri='file:DIR') "
                "or a tracking server (tracking_uri='http://HOST:PORT')"
            ) from e


def flat_params(obj, prefix: str = "") -> dict:
    """``{'a.b.0.c': value}`` from nested dicts and lists: dicts always, lists when they hold containers or are
    too long for one tracker parameter; other values as they are (the loggers turn them into text)."""
    out = {}
    if isinstance(obj, Mapping):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)) and (
        any(isinstance(v, (Mapping, list, tuple)) for v in obj) or len(repr(obj)) > _MAX_VALUE_CHARS
    ):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        return {prefix: obj}
    for key, value in items:
        out.update(flat_params(value, f"{prefix}.{key}" if prefix else key))
    return out


def run_hyperparameters(cfg: Config, trainer: L.Trainer, trainer_args: Mapping) -> dict:
    """The resolved hyper-parameters of a run: the config, the trainer's arguments and what the run decided.

    Args:
        cfg: the run's resolved config.
        trainer: the trainer that runs it (world size, accumulation, optimisers).
        trainer_args: the ``lightning.Trainer`` arguments resolved from ``cfg``
            (``tasks.training.trainer.trainer_kwargs``; passed in, since the trainer module imports this one).
    """
    params = flat_params(cfg.to_dict())
    params.update({f"trainer/{k}": v for k, v in flat_params(trainer_args).items()})
    batch_size = (cfg.get("train_dataloader") or {}).get("batch_size")
    params["run/world_size"] = trainer.world_size
    if batch_size:
        params["run/total_batch_size"] = batch_size * trainer.world_size * trainer.accumulate_grad_batches
    for i, optimizer in enumerate(trainer.optimizers):
        lrs = sorted({group["lr"] for group in optimizer.param_groups})
        params[f"run/optimizer{i}/initial_lr"] = lrs[0] if len(lrs) == 1 else lrs
    return {k: v if isinstance(v, (bool, int, float, str)) or v is None else repr(v) for k, v in params.items()}


def log_config_text(logger: Logger, text: str) -> None:
    """The config text, where each tracker shows files: a TensorBoard text entry, a W&B run file, an MLflow
    artifact. The CSV logger has the work dir's copy of the config."""
    if isinstance(logger, TensorBoardLogger):
        # TensorBoard renders text as markdown: indented, it is shown verbatim as code
        logger.experiment.add_text("config", "\n".join("    " + line for line in text.splitlines()))
    elif isinstance(logger, WandbLogger):
        run = logger.experiment
        path = osp.join(run.dir, "config.py")  # files in the run's directory belong to the run
        with open(path, "w") as f:
            f.write(text)
        run.save(path, base_path=run.dir, policy="now")
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_text(logger.run_id, text, "config.py")


class RunReport(L.Callback):
    """Sends the resolved hyper-parameters and the config text to every logger when training starts (rank 0).

    Args:
        cfg: the run's resolved config (``--cfg-options`` and ``--auto-scale-lr`` applied).
        trainer_args: the ``lightning.Trainer`` arguments resolved from ``cfg`` (``trainer_kwargs(cfg)``).
    """

    def __init__(self, cfg: Config, trainer_args: Mapping) -> None:
        self.cfg, self.trainer_args = cfg, dict(trainer_args)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or not trainer.loggers:
            return
        params = run_hyperparameters(self.cfg, trainer, self.trainer_args)
        text = config_text(self.cfg)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)
            log_config_text(logger, text)
            logger.save()


def finish_tracking(trainer: L.Trainer, metrics: Mapping) -> None:
    """Log the final validation metrics (``final/<metric>``, flat floats; ``per_class`` left out) at the last step,
    then close every logger: a W&B run is finished, so that its directory is complete when the process goes on.

    Args:
        trainer: the trainer that ran (its loggers).
        metrics: the run's last validation metrics (``module.val_metrics``).
    """
    if not trainer.is_global_zero:
        return
    final = {f"final/{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    for logger in trainer.loggers:
        if final:
            logger.log_metrics(final, step=trainer.global_step)
        logger.save()
        logger.finalize("success")
        if isinstance(logger, WandbLogger):
            logger.experiment.finish()
