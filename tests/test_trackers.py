"""Experiment trackers from the config's ``loggers`` section (tasks/training/trackers.py): one tiny real training
logs to TensorBoard, an offline W&B run and an MLflow file store, and each holds the run's metrics, hyper-parameters and
config text; bad sections are refused with the valid choices."""

import csv
import glob
import json
import os.path as osp
import struct
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

from tasks.data.tiny import make_ade20k
from tasks.training.trackers import build_loggers, flat_params
from tests._tools import SEG_CFG, load_tool

train_tool = load_tool("train")


@pytest.fixture(scope="session")
def tracked_run(run_once):
    """One optimizer step of the demo UPerNet on tiny ADE20K, validated, with all three trackers: once per
    session (the module's tests run on both pytest-xdist workers)."""
    return run_once("tracked_run", _tracked_run)


def _tracked_run(root):
    make_ade20k(root, num_train=2, num_val=1, seed=0)
    config = root / "upernet_tracked.py"
    config.write_text(
        f"_base_ = {SEG_CFG!r}\n"
        "loggers = [\n"
        "    dict(type='TensorBoardLogger'),\n"
        "    dict(type='WandbLogger', project='tiny', offline=True),\n"
        f"    dict(type='MLFlowLogger', tracking_uri='file:{root / 'mlruns'}'),\n"
        "]\n"
    )
    opts = [f"{split}_dataloader.dataset.data_root={root}/tiny_ade20k/" for split in ("train", "val", "test")]
    work_dir = str(root / "work")
    metrics = train_tool.main(
        [
            str(config),
            "--work-dir",
            work_dir,
            "--cfg-options",
            *opts,
            "train_dataloader.batch_size=2",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            "trainer.log_every_n_steps=1",
            "trainer.enable_progress_bar=False",
            "trainer.enable_model_summary=False",
        ]
    )
    return str(root), work_dir, metrics


def _csv_last(work_dir):
    """The last logged value of every metric in the CSV logs."""
    last = {}
    with open(glob.glob(osp.join(work_dir, "logs", "*", "metrics.csv"))[0], newline="") as f:
        for row in csv.DictReader(f):
            last.update({k: float(v) for k, v in row.items() if v and k not in ("step", "epoch")})
    return last


def _wandb_records(path):
    """The records of an offline W&B run file: a LevelDB-style log (32 KiB blocks of records with a 7-byte header:
    crc32, length, type) after W&B's 7-byte file header, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", path
    pos, block, chunk = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little left in this block for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _wandb_run(work_dir):
    (path,) = glob.glob(osp.join(work_dir, "wandb", "offline-run-*", "run-*.wandb"))
    history, config = {}, {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.config.update})
    return osp.dirname(path), history, config


def test_wandb_offline_run_holds_metrics_hyperparameters_and_config(tracked_run):
    _, work_dir, metrics = tracked_run
    run_dir, history, config = _wandb_run(work_dir)
    for key, value in _csv_last(work_dir).items():  # the same values as the CSV logs: train losses, lr, val metrics
        assert history[key] == pytest.approx(value), key
    assert {f"final/{k}": history[f"final/{k}"] for k in ("mIoU", "aAcc", "mAcc")} == {
        f"final/{k}": pytest.approx(metrics[k]) for k in ("mIoU", "aAcc", "mAcc")
    }
    assert config["model.backbone.type"] == "HATNet"
    assert config["trainer/max_steps"] == 1 and config["run/world_size"] == 1 and config["run/total_batch_size"] == 2
    assert config["train_dataloader.dataset.pipeline.0.type"] == "LoadImageFromFile"
    with open(osp.join(run_dir, "files", "config.py")) as f:
        text = f.read()
    assert "'type': 'HATNet'" in text and Config.fromstring(text, ".py").model.backbone.type == "HATNet"


def test_mlflow_file_store_holds_metrics_hyperparameters_and_config(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    # MLflow 3 opens a file store only with this set; the run set it in the process that trained it, which under
    # pytest-xdist may be the other worker
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root, work_dir, metrics = tracked_run
    root = Path(root)
    client = MlflowClient(f"file:{root / 'mlruns'}")
    experiment = client.get_experiment_by_name("upernet_tracked")  # named after the config
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "work" and run.info.status == "FINISHED"
    for key, value in _csv_last(work_dir).items():
        assert run.data.metrics[key] == pytest.approx(value), key
    for k in ("mIoU", "aAcc", "mAcc"):
        assert run.data.metrics[f"final/{k}"] == pytest.approx(metrics[k])
    assert run.data.params["model.backbone.type"] == "HATNet" and run.data.params["trainer/max_steps"] == "1"
    text = open(client.download_artifacts(run.info.run_id, "config.py", str(root / "artifacts"))).read()
    assert Config.fromstring(text, ".py").model.backbone.type == "HATNet"


def test_tensorboard_and_csv_hold_the_run(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, work_dir, metrics = tracked_run
    events = EventAccumulator(glob.glob(osp.join(work_dir, "tb", "*"))[0], size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert events.Scalars("final/mIoU")[-1].value == pytest.approx(metrics["mIoU"])
    assert events.Scalars("train/loss")[-1].value == pytest.approx(_csv_last(work_dir)["train/loss"])
    (config_text,) = events.Tensors("config/text_summary")
    assert b"HATNet" in config_text.tensor_proto.string_val[0]
    hparams = open(glob.glob(osp.join(work_dir, "logs", "*", "hparams.yaml"))[0]).read()
    assert "model.backbone.type: HATNet" in hparams  # the CSV logger, which tools/plot_curves.py reads, stays


def _cfg(loggers):
    return Config(dict(loggers=loggers))


@pytest.mark.parametrize(
    "loggers, message",
    [
        ([dict(type="WandbLogger", projekt="x")], r"loggers\[0\] \(WandbLogger\): unknown key\(s\) \['projekt'\]. "),
        ([dict(type="MLFlowLogger", tracking_url="x")], r"Valid keys: .*tracking_uri"),
        ([dict(type="TensorBoardLogger", nme="x")], r"\['nme'\].*Valid keys: .*flush_secs.*name"),
        ([dict(type="CometLogger")], r"unknown logger type 'CometLogger'; supported: MLFlowLogger, TensorBoardLogger"),
        ([dict(type="CSVLogger")], r"the CSV logger is always on"),
        ([dict(project="x")], r"loggers\[0\] must be a dict with a 'type'"),
        (dict(type="TensorBoardLogger"), r"loggers must be a list"),
    ],
)
def test_bad_loggers_section_is_refused_with_the_valid_choices(tmp_path, loggers, message):
    with pytest.raises(ValueError, match=message):
        build_loggers(_cfg(loggers), str(tmp_path))


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_missing_tracker_package_names_the_extra(tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed: `import` raises ImportError
    type_name = {"wandb": "WandbLogger", "mlflow": "MLFlowLogger"}[package]
    with pytest.raises(ImportError, match=rf"{type_name} needs the '{package}' package.*dense-vit\[{package}\]"):
        build_loggers(_cfg([dict(type=type_name)]), str(tmp_path))


def test_wandb_offline_run_starts_without_a_warning(tmp_path, capfd):
    # wandb warned "The anonymous setting has no effect" on every run: Lightning passes anonymous=None
    _, logger = build_loggers(_cfg([dict(type="WandbLogger", project="tiny", offline=True)]), str(tmp_path))
    try:
        assert logger.experiment.offline
    finally:
        logger.experiment.finish()
    assert "WARNING" not in capfd.readouterr().err


def test_default_loggers_are_csv_and_tensorboard_in_the_work_dir(tmp_path):
    csv_logger, tb = build_loggers(Config(dict()), str(tmp_path))
    assert (type(csv_logger).__name__, csv_logger.root_dir) == ("CSVLogger", str(tmp_path / "logs"))
    assert (type(tb).__name__, tb.root_dir) == ("TensorBoardLogger", str(tmp_path / "tb"))


def test_flat_params_spreads_dicts_and_lists_of_dicts():
    flat = flat_params(dict(a=dict(b=1, c=[dict(type="X"), dict(type="Y")]), d=(1, 2), e=["x" * 200, "y" * 100]))
    assert flat == {"a.b": 1, "a.c.0.type": "X", "a.c.1.type": "Y", "d": (1, 2), "e.0": "x" * 200, "e.1": "y" * 100}


def test_mlflow_database_store_without_sqlalchemy_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # mlflow-skinny, the extra, has no SQLAlchemy
    with pytest.raises(ImportError, match=r"database store \('sqlite:///x.db'\) needs the full mlflow package"):
        build_loggers(_cfg([dict(type="MLFlowLogger", tracking_uri="sqlite:///x.db")]), str(tmp_path))
