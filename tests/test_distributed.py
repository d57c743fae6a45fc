"""Multi-process runs on CPU (gloo): DDP training and tools/test.py on one machine (two simulated nodes, torchrun's
restarts and SLURM tasks: tests/test_cluster.py)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests._runs import TIMEOUT, env, run_here
from tests._tools import DET_CFG, IMAGE_INFO, REPO, SEG_CFG, flat_metrics, random_checkpoint

pytestmark = pytest.mark.slow  # training processes: scheduled first (conftest.py)

# Runs tools/train.py's main with a callback that hashes each rank's parameters and buffers once
# training ended (after the last validation). Lightning's DDP launcher re-runs this file per rank.
DRIVER = """
import hashlib, importlib.util, os, sys
import lightning as L
spec = importlib.util.spec_from_file_location('train_tool', os.path.join({repo!r}, 'tools', 'train.py'))
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)

class WeightHash(L.Callback):
    def on_train_end(self, trainer, module):
        h = hashlib.sha256()
        for name, t in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).numpy().tobytes())
        with open(os.path.join({out!r}, f'weights_rank{{trainer.global_rank}}.sha256'), 'w') as f:
            f.write(h.hexdigest())

train.main(sys.argv[1:], callbacks=[WeightHash()])
"""


def run(cmd, timeout=TIMEOUT, **kwargs):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{cmd}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def test_ddp_two_processes_same_weights_and_metrics_as_one(data_opts, tmp_path):
    # the validation images split unevenly over the 2 ranks: validation must neither hang nor double count
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(repo=REPO, out=str(tmp_path)))
    opts = [*data_opts("tiny_ade20k"), "trainer.max_steps=2", "trainer.val_check_interval=2"]
    work = tmp_path / "ddp"
    run(
        [
            sys.executable,
            str(driver),
            SEG_CFG,
            "--work-dir",
            str(work),
            "--cfg-options",
            *opts,
            "trainer.devices=2",
            "trainer.strategy=ddp",
        ],
        env=env(),
    )
    hashes = [(tmp_path / f"weights_rank{r}.sha256").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1], "ranks diverged"
    ddp_metrics = json.loads((work / "metrics.json").read_text())

    # the checkpoint evaluated by one process (this one): every val image counted once in both cases
    out = tmp_path / "single.json"
    args = [SEG_CFG, str(work / "last.ckpt"), "--work-dir", str(tmp_path), "--out", str(out), "--cfg-options", *opts]
    run_here("test", [*args, "trainer.devices=1"])
    single = json.loads(out.read_text())
    assert set(single) == set(ddp_metrics) >= {"mIoU", "aAcc", "mAcc"}
    assert flat_metrics(single) == pytest.approx(flat_metrics(ddp_metrics), abs=1e-6, nan_ok=True)


SEG_TTA_CFG = """_base_ = [{base!r}]
tta_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(
        type="TestTimeAug",
        transforms=[
            [dict(type="Resize", scale_factor=r, keep_ratio=True) for r in (0.75, 1.25)],
            [dict(type="RandomFlip", prob=p, direction="horizontal") for p in (0.0, 1.0)],
            [dict(type="LoadAnnotations", reduce_zero_label=True)],
            [dict(type="PackSegInputs")],
        ],
    ),
]
"""


def plain(x):
    """``x`` with its tensors as lists, for ==."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return {k: plain(v) for k, v in x.items()} if isinstance(x, dict) else x


def readable(path):
    """A PNG's bytes, or a dump pickle's images with their tensors as lists."""
    import mmengine

    return path.read_bytes() if path.suffix != ".pkl" else plain(mmengine.load(path))


def test_test_tool_tta_slide_and_submission_files_each_image_once(data_opts, tmp_path):
    """tools/test.py under 2 processes (3 images: 2 + 1) gives one process's metrics and files: segmentation
    with --tta and sliding-window inference, and --format-only on an image-info-only COCO set; the --dump of
    either (the pickle's images in dataset order, gathered from both ranks) too."""
    # The demo's TTA with 2 of its 6 scales (4 views, not 12: the same code path, a third of the inference), and
    # windows of 192 px: one for most views of these 128-192 px images, several for the largest.
    seg_cfg = tmp_path / "seg_tta.py"
    seg_cfg.write_text(SEG_TTA_CFG.format(base=SEG_CFG))
    runs = {
        "seg": (
            str(seg_cfg),
            [
                *data_opts("tiny_ade20k"),
                "model.test_cfg.mode=slide",
                "model.test_cfg.crop_size=(192,192)",
                "model.test_cfg.stride=(128,128)",
            ],
            ["--tta"],
        ),
        "det": (
            DET_CFG,
            [*data_opts("tiny_coco"), f"test_dataloader.dataset.ann_file={IMAGE_INFO}"],
            ["--format-only"],
        ),
    }
    for name, (config, opts, flags) in runs.items():
        opts = [*opts, "test_dataloader.dataset.indices=3"]
        ckpt = random_checkpoint(config, opts, tmp_path / f"{name}.pth")
        out = {}
        for devices in (1, 2):
            work = tmp_path / f"{name}{devices}"
            args = [
                config,
                ckpt,
                "--work-dir",
                str(work),
                "--out-dir",
                str(work / "files"),
                "--dump",
                str(work / ("dump" if name == "seg" else "dump/det.pkl")),
                *flags,
                "--cfg-options",
                *opts,
                f"trainer.devices={devices}",
            ]
            if devices == 1:  # in this process, one thread as each DDP process: the same float sums
                run_here("test", args)
            else:
                run([sys.executable, "tools/test.py", *args, "trainer.strategy=ddp"], env=env(), timeout=2 * TIMEOUT)
            files = {f: (work / "files" / f).read_bytes() for f in sorted(os.listdir(work / "files"))}
            # the dump: its PNGs' bytes / the pickle's contents (pickled tensors hold a per-process serialization id)
            files.update({f"dump/{f}": readable(work / "dump" / f) for f in sorted(os.listdir(work / "dump"))})
            metrics = work / "test_metrics.json"
            out[devices] = files, json.loads(metrics.read_text()) if metrics.exists() else None
        files, metrics = out[1]
        # a PNG per image / bbox + segm json, and the dump: a PNG per image / one pickle (no spool files left)
        assert len(files) == (6 if name == "seg" else 3), sorted(files)
        assert out[2][0] == files
        if name == "seg":
            assert metrics["mIoU"] == pytest.approx(out[2][1]["mIoU"], abs=1e-6)
        else:
            assert metrics is None and len({r["image_id"] for r in json.loads(files["results.bbox.json"])}) == 3
