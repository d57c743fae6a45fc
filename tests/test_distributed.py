"""Multi-process runs on CPU (gloo): DDP training and tools/test.py on one machine (two simulated nodes, torchrun's
restarts and SLURM tasks: tests/test_cluster.py).

One 2-process job per session (``ddp_job``) runs the three tool runs whose results the tests compare with one
process's: training, tools/test.py with TTA and sliding windows, tools/test.py --format-only. Lightning's DDP
launcher starts it (the first run, as a user's ``trainer.devices=2`` does); the later runs find the launcher's
variables in each rank and join as externally launched ranks (as under torchrun), each with a rendezvous port of
its own. Python's start-up and imports are paid once per rank instead of once per run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests._runs import TIMEOUT, env, free_port, run_here
from tests._tools import DET_CFG, IMAGE_INFO, REPO, SEG_CFG, flat_metrics, random_checkpoint, warnings_as_errors

pytestmark = pytest.mark.slow  # training processes: scheduled first (conftest.py)

# Each rank runs the tools' mains listed in the JSON file of argv[1], in order, with a callback that hashes the
# rank's parameters and buffers once training ended (after the last validation). Lightning's DDP launcher (in the
# first run) re-runs this file, with the same argv, for rank 1.
DRIVER = """
import hashlib, importlib.util, json, os, sys
import lightning as L

class WeightHash(L.Callback):
    def on_train_end(self, trainer, module):
        h = hashlib.sha256()
        for name, t in sorted(module.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).numpy().tobytes())
        with open(os.path.join({out!r}, f'weights_rank{{trainer.global_rank}}.sha256'), 'w') as f:
            f.write(h.hexdigest())

with open(sys.argv[1]) as f:
    runs = json.load(f)
for i, (tool, port, argv) in enumerate(runs):
    if i:  # the launcher's MASTER_PORT may still be held by the destroyed group's store: a fresh one
        os.environ['MASTER_PORT'] = str(port)
    spec = importlib.util.spec_from_file_location(f'_tool_{{tool}}', os.path.join({repo!r}, 'tools', f'{{tool}}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv, callbacks=[WeightHash()] if tool == 'train' else [])
"""

# A rank whose peer died gives up after 5 minutes instead of Lightning's 30 (and one still importing on a busy
# machine is not given up on too early: the process group's timeout bounds the rendezvous too).
DDP = ["trainer.devices=2", "trainer.strategy.type=ddp", "trainer.strategy.timeout=300"]

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


def run(cmd, timeout=TIMEOUT, **kwargs):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, f"{cmd}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def train_opts(data_opts) -> list:
    return [*data_opts("tiny_ade20k"), "trainer.max_steps=2", "trainer.val_check_interval=2"]


def tool_test_runs(data_opts, folder: Path) -> dict:
    """name -> (config, checkpoint, --cfg-options, flags) of the tools/test.py runs compared: segmentation with
    --tta and sliding-window inference scored by mmseg's own IoUMetric (mIoU and mDice: it gathers through
    mmengine.dist), and --format-only on an image-info-only COCO set; 3 test images (2 + 1 over the ranks)."""
    # The demo's TTA with 2 of its 6 scales (4 views, not 12: the same code path, a third of the inference), and
    # windows of 192 px: one for most views of these 128-192 px images, several for the largest.
    seg_cfg = folder / "seg_tta.py"
    if not seg_cfg.exists():
        seg_cfg.write_text(SEG_TTA_CFG.format(base=SEG_CFG))
    runs = {
        "seg": (
            str(seg_cfg),
            [
                *data_opts("tiny_ade20k"),
                "model.test_cfg.mode=slide",
                "model.test_cfg.crop_size=(192,192)",
                "model.test_cfg.stride=(128,128)",
                "test_evaluator.iou_metrics=[mIoU,mDice]",  # mm's metric class in place of ours
            ],
            ["--tta"],
        ),
        "det": (
            DET_CFG,
            [*data_opts("tiny_coco"), f"test_dataloader.dataset.ann_file={IMAGE_INFO}"],
            ["--format-only"],
        ),
    }
    out = {}
    for name, (config, opts, flags) in runs.items():
        opts = [*opts, "test_dataloader.dataset.indices=3"]
        ckpt = folder / f"{name}.pth"
        out[name] = config, str(ckpt) if ckpt.exists() else random_checkpoint(config, opts, ckpt), opts, flags
    return out


def tool_test_args(name, run, work: Path) -> list:
    config, ckpt, opts, flags = run
    dump = work / ("dump" if name == "seg" else "dump/det.pkl")
    return [config, ckpt, "--work-dir", str(work), "--out-dir", str(work / "files"), "--dump", str(dump), *flags,
            "--cfg-options", *opts]  # fmt: skip


@pytest.fixture(scope="session")
def ddp_job(data_opts, run_once) -> Path:
    """The folder of the session's 2-process job: training (work dir ``train/``, the ranks' weight hashes), then
    tools/test.py's runs of ``tool_test_runs`` (work dirs ``seg/`` and ``det/``)."""

    def make(folder):
        folder = Path(folder)
        runs = [("train", None, [SEG_CFG, "--work-dir", str(folder / "train"), "--cfg-options",
                                 *train_opts(data_opts), *DDP])]  # fmt: skip
        for name, test_run in tool_test_runs(data_opts, folder).items():
            runs.append(("test", free_port(), [*tool_test_args(name, test_run, folder / name), *DDP]))
        (folder / "runs.json").write_text(json.dumps(runs))
        driver = folder / "driver.py"
        driver.write_text(DRIVER.format(repo=REPO, out=str(folder)))
        run([sys.executable, str(driver), str(folder / "runs.json")], env=env(), timeout=4 * TIMEOUT)
        return str(folder)

    return Path(run_once("ddp_job", make))


def test_ddp_two_processes_same_weights_and_metrics_as_one(ddp_job, data_opts, tmp_path):
    # the validation images split unevenly over the 2 ranks: validation must neither hang nor double count
    hashes = [(ddp_job / f"weights_rank{r}.sha256").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1], "ranks diverged"
    work = ddp_job / "train"
    ddp_metrics = json.loads((work / "metrics.json").read_text())

    # the checkpoint evaluated by one process (this one): every val image counted once in both cases
    out = tmp_path / "single.json"
    args = [SEG_CFG, str(work / "last.ckpt"), "--work-dir", str(tmp_path), "--out", str(out), "--cfg-options"]
    run_here("test", [*args, *train_opts(data_opts), "trainer.devices=1"])
    single = json.loads(out.read_text())
    assert set(single) == set(ddp_metrics) >= {"mIoU", "aAcc", "mAcc"}
    assert flat_metrics(single) == pytest.approx(flat_metrics(ddp_metrics), abs=1e-6, nan_ok=True)


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


def outputs(work: Path):
    """A tools/test.py run's --out-dir files and --dump (its PNGs' bytes / the pickle's contents: pickled tensors
    hold a per-process serialization id), and its metrics (None for --format-only)."""
    files = {f: (work / "files" / f).read_bytes() for f in sorted(os.listdir(work / "files"))}
    files.update({f"dump/{f}": readable(work / "dump" / f) for f in sorted(os.listdir(work / "dump"))})
    metrics = work / "test_metrics.json"
    return files, json.loads(metrics.read_text()) if metrics.exists() else None


def test_test_tool_tta_slide_submission_files_and_mm_metric_each_image_once(ddp_job, data_opts, tmp_path):
    """tools/test.py under 2 processes (3 images: 2 + 1) gives one process's metrics and files: segmentation
    with --tta and sliding-window inference, scored by mmseg's own IoUMetric (mIoU and mDice: it gathers through
    mmengine.dist), and --format-only on an image-info-only COCO set; the --dump of either (the pickle's images in
    dataset order, gathered from both ranks) too. Our evaluator's gather under DDP: the training test above."""
    for name, test_run in tool_test_runs(data_opts, ddp_job).items():
        # in this process, one thread as each DDP process: the same float sums
        run_here("test", [*tool_test_args(name, test_run, tmp_path / name), "trainer.devices=1"])
        files, metrics = outputs(tmp_path / name)
        # a PNG per image / bbox + segm json, and the dump: a PNG per image / one pickle (no spool files left)
        assert len(files) == (6 if name == "seg" else 3), sorted(files)
        ddp_files, ddp_metrics = outputs(ddp_job / name)
        assert ddp_files == files
        if name == "seg":  # mmseg's IoUMetric (percentages): every image once, so the same sums
            assert set(metrics) >= {"mIoU", "mDice", "aAcc"} and ddp_metrics == metrics
        else:
            assert metrics is None and len({r["image_id"] for r in json.loads(files["results.bbox.json"])}) == 3


def test_metrics_logged_under_ddp_without_a_warning(seg_run, tmp_path, monkeypatch):
    # Lightning warned "It is recommended to use self.log('mIoU', ..., sync_dist=True)" on every distributed
    # validation or test; a 1-process gloo group is enough to show it
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, env()[key])
    opts = [*seg_run.opts, "trainer.devices=1", "trainer.strategy.type=ddp"]
    with warnings_as_errors():
        metrics = run_here("test", [SEG_CFG, seg_run.ckpt, "--work-dir", str(tmp_path), "--cfg-options", *opts])
    assert flat_metrics(metrics) == pytest.approx(flat_metrics(seg_run.metrics), abs=1e-6, nan_ok=True)
