"""tools/train.py and tools/test.py end to end on CPU, on tiny synthetic data and the demo configs
(shrunk STViT / HAT-Net, a couple of optimizer steps)."""

import json
import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from tests._tools import DET_CFG, SEG_CFG, TINY_ADE20K, TINY_COCO, flat_metrics, load_tool

train_tool, test_tool = load_tool("train"), load_tool("test")


def _logged_steps(work_dir: str, key: str) -> list[int]:
    """The steps at which the CSV logs of a tools/train.py run hold a value of ``key``."""
    import csv
    import glob

    steps = []
    for path in sorted(glob.glob(osp.join(work_dir, "logs", "**", "metrics.csv"), recursive=True)):
        with open(path, newline="") as f:
            steps += [int(row["step"]) for row in csv.DictReader(f) if row.get(key)]
    return sorted(steps)


def _ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_train_writes_metrics_checkpoint_and_resumes(det_run, copy_run):
    work_dir, metrics = det_run.work_dir, det_run.metrics
    with open(osp.join(work_dir, "metrics.json")) as f:
        saved = json.load(f)
    assert flat_metrics(saved) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    assert {"bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP"} <= set(saved)
    ckpt = _ckpt(osp.join(work_dir, "last.ckpt"))
    assert ckpt["global_step"] == 2
    # LinearLR (by_epoch=False) stepped after each optimizer step, MultiStepLR after the epoch
    assert [s["_global_step"] for s in ckpt["lr_schedulers"]] == [2, 1]
    # the RNG states of tasks/training/callbacks.py's RNGStates, saved by Lightning with the callback states
    (rng,) = ckpt["callbacks"]["RNGStates"]["per_rank"]
    assert {"torch", "python", "numpy"} <= set(rng) and rng["torch"].dtype == torch.uint8
    assert [p for p in os.listdir(work_dir) if p.endswith(".tmp")] == []  # no temp files left behind
    assert osp.isdir(osp.join(work_dir, "logs")) and osp.isdir(osp.join(work_dir, "tb"))
    # the resolved config in the work dir (overrides included) reads back as the one the checkpoint holds
    resolved = Config.fromfile(det_run.config)
    assert resolved.to_dict() == Config.fromstring(ckpt["mm_config"], ".py").to_dict()
    assert resolved.train_dataloader.batch_size == 2 and "tiny_coco" in resolved.train_dataloader.dataset.data_root

    # resume a copy: the shared run stays the two-step run that other tests read
    work_dir = copy_run(det_run).work_dir
    train_tool.main(
        [
            DET_CFG,
            "--work-dir",
            str(work_dir),
            "--resume",
            "--cfg-options",
            *det_run.opts,
            "trainer.max_epochs=2",
        ]
    )
    ckpt = _ckpt(osp.join(work_dir, "last.ckpt"))
    assert ckpt["global_step"] == 4
    assert [s["_global_step"] for s in ckpt["lr_schedulers"]] == [4, 2]  # scheduler state was restored


def _train_fails_without_traceback(argv, capsys) -> str:
    """tools/train.py's command line on ``argv``: exit status 1, no traceback; returns stderr."""
    with pytest.raises(SystemExit) as exit_:
        train_tool.cli(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err, err
    return err


def test_resume_from_a_checkpoint_of_another_task_is_named(det_run, seg_run, tmp_path, capsys):
    # torch's load_state_dict raised a RuntimeError listing hundreds of keys, with Lightning's traceback
    argv = [SEG_CFG, "--work-dir", str(tmp_path), "--resume", det_run.ckpt, "--cfg-options", *seg_run.opts]
    err = _train_fails_without_traceback(argv, capsys)
    assert f"CheckpointError: --resume: {det_run.ckpt} is not a checkpoint of this config's EncoderDecoder" in err
    assert "Missing keys (" in err and "load_from=CKPT" in err


def test_resume_mid_epoch_with_another_batch_size_names_the_key(seg_run, copy_run, capsys):
    # the checkpoint counts the batches of its epoch already trained on in its own batch size
    run = copy_run(seg_run)
    opts = [*run.opts, "train_dataloader.batch_size=1", "trainer.max_steps=3"]
    err = _train_fails_without_traceback(
        [SEG_CFG, "--work-dir", str(run.work_dir), "--resume", "auto", "--cfg-options", *opts], capsys
    )
    assert "ConfigError: --resume: the checkpoint stopped mid-epoch (epoch 0, after 2 batches)" in err
    assert "--cfg-options train_dataloader.batch_size=2" in err


def test_test_tool_detection_show_dir(det_run, tmp_path):
    out, show = str(tmp_path / "m.json"), str(tmp_path / "show")
    metrics = test_tool.main(
        [
            DET_CFG,
            det_run.ckpt,
            "--work-dir",
            str(tmp_path),
            "--out",
            out,
            "--show-dir",
            show,
            "--score-thr",
            "0.0",
            "--cfg-options",
            *det_run.opts,
        ]
    )
    with open(out) as f:
        assert flat_metrics(json.load(f)) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    assert "bbox_mAP" in metrics and "segm_mAP" in metrics
    assert len([p for p in os.listdir(show) if p.endswith(".png")]) == TINY_COCO[1]


def test_segmentation_train_then_test_with_show_dir(seg_run, tmp_path):
    metrics = seg_run.metrics
    assert {"mIoU", "aAcc", "mAcc"} <= set(metrics) and 0 <= metrics["aAcc"] <= 1
    ckpt = _ckpt(seg_run.ckpt)
    assert [s["_global_step"] for s in ckpt["lr_schedulers"]] == [2, 2]
    # without --auto-scale-lr the config's lr (AdamW lr=1e-3) is used as written
    assert {g["initial_lr"] for g in ckpt["optimizer_states"][0]["param_groups"]} == {1e-3}
    show = tmp_path / "show"
    test_metrics = test_tool.main(
        [SEG_CFG, seg_run.ckpt, "--work-dir", str(tmp_path), "--show-dir", str(show), "--cfg-options", *seg_run.opts]
    )
    # val and test are the same split here
    assert flat_metrics(test_metrics) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    saved = json.loads((tmp_path / "test_metrics.json").read_text())
    assert flat_metrics(saved) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    assert len(list(show.glob("*.png"))) == TINY_ADE20K[1]


def test_auto_scale_lr_scales_to_the_real_batch_logs_and_checkpoints_it(data_opts, tmp_path, capfd, caplog):
    # the demo's AdamW lr 1e-3 set for a total batch of 16; here 1 device x 1 node x 2 images
    opts = [
        *data_opts("tiny_ade20k"),
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
        "checkpoint_callback.monitor=None",
        "auto_scale_lr.base_batch_size=16",
    ]
    train_tool.main([SEG_CFG, "--auto-scale-lr", "--work-dir", str(tmp_path), "--cfg-options", *opts])
    scaled = 1e-3 * (1 * 1 * 2) / 16
    groups = _ckpt(tmp_path / "last.ckpt")["optimizer_states"][0]["param_groups"]
    assert len(groups) > 1 and [g["initial_lr"] for g in groups] == pytest.approx([scaled] * len(groups))
    assert groups[0]["initial_lr"] == pytest.approx(1.25e-4)
    out = capfd.readouterr()  # Lightning's console handler, or the log capture where pytest's root logger has one
    assert (
        "auto_scale_lr: total batch 2 = devices 1 x nodes 1 x batch_size 2 x accumulation 1; "
        "lr 0.001 -> 0.000125 = 0.001 x 2 / base_batch_size 16"
    ) in out.out + out.err + caplog.text


def test_auto_scale_lr_without_base_batch_size_is_refused(tmp_path):
    # mmseg's ADE20K bases define no auto_scale_lr; the demo config inherits them
    with pytest.raises(
        ValueError,
        match=r"--auto-scale-lr: .*upernet_hat-net-demo_tiny-ade20k\.py has no "
        r"auto_scale_lr\.base_batch_size.*auto_scale_lr\.base_batch_size=16",
    ):
        train_tool.main([SEG_CFG, "--auto-scale-lr", "--work-dir", str(tmp_path)])
    assert not os.listdir(tmp_path)  # refused before anything was built or written


def test_missing_data_root_names_path_and_fix(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=r"(?s)train_dataloader\.dataset\.data_root '/nonexistent/x/'.*"
        r"make_tiny_data\.py.*--cfg-options train_dataloader",
    ):
        train_tool.main(
            [
                SEG_CFG,
                "--work-dir",
                str(tmp_path),
                "--cfg-options",
                "train_dataloader.dataset.data_root=/nonexistent/x/",
            ]
        )


def test_trainer_section_validated_and_mapped():
    from lightning.pytorch.strategies import DDPStrategy

    from tasks.config.load import load_config
    from tasks.training.trainer import trainer_kwargs

    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_epoch'\].*max_epochs"):
        trainer_kwargs(load_config(SEG_CFG, {"trainer.max_epoch": 3}))
    kwargs = trainer_kwargs(load_config(DET_CFG, {"trainer.strategy": "ddp", "trainer.num_nodes": 2}))
    assert (kwargs["gradient_clip_val"], kwargs["gradient_clip_algorithm"]) == (10.0, "norm")  # optim_wrapper
    assert isinstance(kwargs["strategy"], DDPStrategy) and kwargs["num_nodes"] == 2
    assert kwargs["strategy"]._ddp_kwargs == {"find_unused_parameters": False, "forward_sync_buffers": False}


def test_paramwise_no_decay_and_preprocessor_device(tiny_data):
    from tasks import build_task
    from tasks.config.load import load_config
    from tasks.training.optim import build_optimizer

    cfg = load_config(DET_CFG, {"train_dataloader.dataset.data_root": f"{tiny_data}/tiny_coco/"})
    module, datamodule = build_task(cfg, init_weights=False)
    decay = {
        id(p): g["weight_decay"]
        for g in build_optimizer(module.model, cfg.optim_wrapper).param_groups
        for p in g["params"]
    }
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)
    in_norm = {id(p) for m in module.model.modules() if isinstance(m, norms) for p in m.parameters()}
    for name, p in module.model.named_parameters():
        no_decay = name.endswith(".bias") or id(p) in in_norm or "norm" in name or "pos_embed" in name
        assert decay[id(p)] == (0.0 if no_decay else 0.05), name
    assert any("pos_embed" in name for name, _ in module.model.named_parameters())

    # mm's data_preprocessor caches its device; the module re-syncs it to where it computes
    module.model.data_preprocessor._device = torch.device("meta")
    batch = next(iter(datamodule.train_dataloader()))
    data = module._preprocess(batch, training=True)
    assert data["inputs"].device.type == "cpu" and module.model.data_preprocessor.device.type == "cpu"
    # mmcv's CPU RoIAlign misreads channels_last maps: the RoI heads must get contiguous features
    assert all(f.is_contiguous() for f in module.model.extract_feat(data["inputs"]))


def test_checkpoint_write_is_atomic(tmp_path):
    from tasks.training.checkpoint_io import AtomicCheckpointIO

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("killed mid-write")

    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        io.save_checkpoint({"w": torch.zeros(1000), "x": Unpicklable()}, path)
    assert torch.equal(_ckpt(path)["w"], torch.ones(3))  # the previous checkpoint is intact
    assert os.listdir(tmp_path) == ["last.ckpt"]  # and the partial temp file is gone


def test_plot_curves_draws_every_loss_lr_and_metric_of_each_run(det_run, tmp_path):
    import shutil

    from tasks.figures import curves as plot_curves
    from tasks.figures.errors import FigureError

    work_dir, metrics = str(det_run.work_dir), det_run.metrics
    other = tmp_path / "run_b"  # a second run: the same logs under another work dir
    shutil.copytree(osp.join(work_dir, "logs"), other / "logs")
    fig = plot_curves.plot_curves([work_dir, str(other)], tmp_path / "curves.png")
    panels = {ax.get_title(): {line.get_label(): line for line in ax.get_lines()} for ax in fig.axes}
    losses = [
        "train/loss",
        "train/loss_bbox",
        "train/loss_cls",
        "train/loss_mask",
        "train/loss_rpn_bbox",
        "train/loss_rpn_cls",
    ]
    # the logged scalars (per_class is a nested dict, not logged); -1: no object of that size, not a value
    shown = [k for k, v in metrics.items() if isinstance(v, float) and v != -1.0]
    for run in (work_dir, str(other)):
        assert {f"{run}: {k}" for k in losses} <= set(panels["losses"])
        lr = panels["learning rate"][f"{run}: train/lr"]
        # every logged lr row (the fixture's run may have been resumed by another test into the same dir)
        assert list(lr.get_xdata()) == _logged_steps(work_dir, "train/lr") and all(v > 0 for v in lr.get_ydata())
        assert set(panels["validation metrics"]) >= {f"{run}: {k}" for k in shown}
        for k in shown:  # the value logged at the end of the epoch is the one plotted
            line = panels["validation metrics"][f"{run}: {k}"]
            assert line.get_ydata()[-1] == pytest.approx(metrics[k])
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    only = plot_curves.plot_curves([work_dir], tmp_path / "losses.png", keys=["train/loss*"])
    assert [ax.get_title() for ax in only.axes] == ["losses"]
    with pytest.raises(FigureError, match=r"no CSV log found; expected .*logs/version_\*/metrics.csv"):
        plot_curves.plot_curves([str(tmp_path)], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
