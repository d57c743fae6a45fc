"""Fault injection on the training tools: SIGKILL and resume, non-finite losses, a failing DDP rank.

Every fault is real (a killed process, a NaN produced by the model, an exception on one rank); nothing of
mmdet / mmseg / Lightning / torch is mocked. Tiny shrunk models and images on CPU, a few steps each.
"""

import json
import subprocess
import sys
import time

import lightning as L
import pytest
import torch

from tasks.data.tiny import make_coco
from tests._runs import (
    TIMEOUT,
    assert_same_training_state,
    ddp_opts,
    env,
    kill_and_resume_here,
    load_ckpt,
    run_here,
    seg_opts,
)
from tests._tools import DET_CFG, REPO, SEG_CFG, load_tool

train_tool = load_tool("train")


# --- SIGKILL mid-epoch, then --resume (the segmentation demo's runs, 1 and 2 processes: tests/test_cluster.py) -----
@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_with_aspect_ratio_batches(tmp_path):
    """The detection demo inherits mmdet's batch_sampler=AspectRatioBatchSampler; 8 training images of both
    orientations (one of the 9 has no objects), 4 batches of 2 per epoch, last.ckpt every 3 steps. Killed after
    step 4 with the checkpoint of step 3 (mid-epoch), the same command resumes and ends with the weights,
    optimizer state and lr schedule of the uninterrupted run."""
    make_coco(tmp_path / "data", num_train=9, num_val=1, seed=0)
    root = tmp_path / "data" / "tiny_coco"
    opts = []
    for split in ("train", "val", "test"):
        opts += [f"{split}_dataloader.dataset.data_root={root}/", f"{split}_dataloader.num_workers=0"]
    opts += [
        "train_dataloader.batch_size=2",
        "train_dataloader.dataset.pipeline.2.scale=(96,96)",
        "trainer.max_steps=6",
        "trainer.max_epochs=-1",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=False",
        "trainer.enable_model_summary=False",
        "trainer.deterministic=True",
        "checkpoint_callback.monitor=None",
        "checkpoint_every_n_steps=3",
    ]

    def args(work):
        return [DET_CFG, "--work-dir", str(work), "--resume", "auto", "--cfg-options", *opts]

    run_here("train", args(tmp_path / "ref"))
    saved, final = kill_and_resume_here(args(tmp_path / "run"), tmp_path / "run", tmp_path / "pause", pause_at=4)
    assert saved["global_step"] == 3 and _train_loader_state(saved)["batches"] == 3  # mid-epoch
    assert final["global_step"] == 6
    assert_same_training_state(load_ckpt(tmp_path / "ref" / "last.ckpt"), final)
    assert _train_loader_state(final)["batch_sampler"] == "AspectRatioBatchSampler"


def _train_loader_state(ckpt):
    return ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


# --- non-finite loss ----------------------------------------------------------------------------------------
class NaNAtBatch(L.Callback):
    """Makes the main segmentation head's logits NaN on the n-th training batch (0-based): a real NaN loss
    in ``decode.loss_ce`` while the auxiliary head's loss stays finite."""

    def __init__(self, n):
        self.n, self.batches, self.handle, self.injected_at = n, -1, None, None

    def on_train_start(self, trainer, module):
        def hook(mod, args, out):
            if mod.training and self.batches == self.n:
                self.injected_at = time.monotonic()
                return out * float("nan")

        self.handle = module.model.decode_head.conv_seg.register_forward_hook(hook)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches += 1

    def teardown(self, trainer, module, stage):
        if self.handle is not None:
            self.handle.remove()


def test_nan_loss_stops_naming_step_and_term_and_keeps_last_checkpoint(data_opts, tmp_path):
    nan = NaNAtBatch(3)
    with pytest.raises(
        FloatingPointError,
        match=r"(?s)non-finite loss at step 3 .*decode\.loss_ce=nan.*"
        r"nonfinite_loss='skip'",
    ) as info:
        train_tool.main(
            [
                SEG_CFG,
                "--work-dir",
                str(tmp_path),
                "--cfg-options",
                *seg_opts(data_opts, "trainer.max_steps=6", "checkpoint_every_n_steps=1"),
            ],
            callbacks=[nan],
        )
    stopped_in = time.monotonic() - nan.injected_at
    assert "aux.loss_ce=nan" not in str(info.value)
    ckpt = load_ckpt(tmp_path / "last.ckpt")
    assert ckpt["global_step"] == 3  # the last good state, not overwritten by the failed step
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert stopped_in < 5
    print(f"NaN at step 3: stopped in {stopped_in:.2f} s; last.ckpt from step {ckpt['global_step']}")


def test_nan_loss_skip_mode_skips_and_counts(data_opts, tmp_path):
    train_tool.main(
        [
            SEG_CFG,
            "--work-dir",
            str(tmp_path),
            "--cfg-options",
            *seg_opts(data_opts, "trainer.max_steps=4", "nonfinite_loss=skip", "checkpoint_every_n_steps=4"),
        ],
        callbacks=[NaNAtBatch(1)],
    )
    ckpt = load_ckpt(tmp_path / "last.ckpt")
    assert ckpt["skipped_nonfinite"] == 1 and ckpt["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    import csv

    with open(next((tmp_path / "logs").rglob("metrics.csv"))) as f:
        rows = list(csv.DictReader(f))
    assert max(float(r["train/skipped_nonfinite"]) for r in rows if r.get("train/skipped_nonfinite")) == 1


# --- faults on one DDP rank --------------------------------------------------------------------------------
DDP_FAULTS_DRIVER = '''
import hashlib, importlib.util, json, os, sys, time
import lightning as L
import torch
spec = importlib.util.spec_from_file_location('train_tool', os.path.join({repo!r}, 'tools', 'train.py'))
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)


def tensors_hash(named):
    h = hashlib.sha256()
    for name, t in sorted(named):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).numpy().tobytes())
    return h.hexdigest()


def hashes(module):
    """Parameters, and parameters with buffers (BatchNorm running statistics)."""
    return tensors_hash(module.named_parameters()), tensors_hash(module.state_dict().items())


def write(path, text):
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)  # the other rank polls for the file: it must appear complete


class Faults(L.Callback):
    """Rank 1's images of its training batch number {nan_at} (0-based) become NaNs before the model's data
    preprocessor sees them; rank 0's stay as they are. Every rank records hashes of its parameters and buffers
    before and after that batch and once {steps} steps are done, in OUT/rank<R>.json; then rank 1 raises."""

    def __init__(self):
        self.batches, self.record = -1, {{}}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches += 1
        if self.batches == {nan_at}:
            self.record['before'] = hashes(module)
            if trainer.global_rank == 1:
                batch['inputs'] = [torch.full(x.shape, float('nan')) for x in batch['inputs']]
        if trainer.global_step == {steps}:
            finite = all(bool(torch.isfinite(t).all()) for t in module.state_dict().values() if t.is_floating_point())
            self.record.update(final=hashes(module), finite=finite, skipped=module.nonfinite.skipped,
                               batches=self.batches)
            write(os.path.join({out!r}, f'rank{{trainer.global_rank}}.json'), json.dumps(self.record))
            if trainer.global_rank == 1:
                deadline = time.monotonic() + 60  # rank 0's record first: the failure ends rank 0 too
                while not os.path.exists(os.path.join({out!r}, 'rank0.json')) and time.monotonic() < deadline:
                    time.sleep(0.01)
                write({marker!r}, repr(time.time()))
                raise RuntimeError('injected failure')

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.batches == {nan_at}:
            self.record.update(after=hashes(module), step_after=trainer.global_step)


train.cli(sys.argv[1:], callbacks=[Faults()])
'''


@pytest.mark.slow
def test_ddp_nan_on_one_rank_skipped_by_both_then_exception_on_one_rank_ends_all(data_opts, tmp_path):
    """One 2-process DDP job (gloo) with two faults, each on rank 1 only.

    A NaN loss (a batch of NaN images at batch 1) under nonfinite_loss='skip': both ranks skip that step (no
    optimizer step anywhere: every rank's parameters and BatchNorm statistics after it equal those before it, and
    the ranks' parameters stay equal), neither hangs, and training carries on with finite weights and statistics
    (last.ckpt of step 3 counts the skip).

    Then an exception on rank 1 at the start of step 4 (of 20): every rank ends soon after, the job exits non-zero
    and its output names the failed rank and the error."""
    marker = tmp_path / "raised_at"
    driver = tmp_path / "driver.py"
    driver.write_text(DDP_FAULTS_DRIVER.format(repo=REPO, out=str(tmp_path), marker=str(marker), nan_at=1, steps=3))
    opts = seg_opts(data_opts, "trainer.max_steps=20", "nonfinite_loss=skip", "checkpoint_every_n_steps=3")
    start = time.time()
    proc = subprocess.run(
        [sys.executable, str(driver), SEG_CFG, "--work-dir", str(tmp_path / "w"), "--cfg-options", *opts, *ddp_opts(2)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    end = time.time()
    out = proc.stdout + proc.stderr

    # the NaN on rank 1: skipped on both ranks
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, rec in enumerate(ranks):
        assert rec["before"] == rec["after"], f"rank {r} stepped on the NaN batch"
        assert rec["finite"], f"rank {r} ended with non-finite weights or BatchNorm statistics"
        assert rec["skipped"] == 1 and rec["batches"] == 3 and rec["step_after"] == 2, rec  # the skip counts
    # parameters: equal on both ranks (BatchNorm statistics are per rank under DDP, as in mmengine)
    assert ranks[0]["before"][0] == ranks[1]["before"][0] and ranks[0]["final"][0] == ranks[1]["final"][0]
    assert ranks[0]["final"][0] != ranks[0]["after"][0]  # the step after the skipped one did train
    assert "non-finite on another rank" in out and "decode.loss_ce=nan" in out, out[-4000:]
    ckpt = load_ckpt(tmp_path / "w" / "last.ckpt")
    assert ckpt["global_step"] == 3 and ckpt["skipped_nonfinite"] == 1

    # the exception on rank 1: every rank ends, and the output names it
    assert proc.returncode != 0
    assert "rank 1 failed: RuntimeError: injected failure" in out, out[-4000:]
    after = end - float(marker.read_text())
    assert after < 60, after
    print(
        f"NaN on rank 1 only: both ranks skipped; rank 1 raised at step 4: all ranks gone {after:.1f} s later "
        f"(total {end - start:.0f} s), exit status {proc.returncode}"
    )
