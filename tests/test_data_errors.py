"""``data_errors='skip'`` (tasks/data/skipping.py) on sets with two bad training samples: the detection demo trains
to its end and lists both (without it, the run stops naming the first); the segmentation demo resumed mid-epoch
ends with the state of an uninterrupted run and the count carried over, and under 2-process gloo DDP the
checkpoint counts the samples that either rank left out."""

import shutil

import pytest

from tasks.data.checks import DataError
from tasks.data.tiny import make_coco
from tests._runs import assert_same_training_state, ddp_opts, load_ckpt, run_here, run_job_here, seg_opts
from tests._tools import DET_CFG, SEG_CFG

STATE = "DataErrors"  # the callback's entry in the checkpoints' "callbacks"


def _left_out(ckpt) -> dict:
    return ckpt["callbacks"][STATE]["left_out"]


def _cut(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_detection_demo_skips_two_bad_images_and_lists_them_or_stops_at_the_first(tmp_path):
    root = make_coco(tmp_path / "data", num_train=9, num_val=1, seed=0)
    bad = sorted((root / "train2017").iterdir())[2:4]
    _cut(bad[0])  # a truncated JPEG
    bad[1].unlink()  # a missing file
    opts = [f"{s}_dataloader.dataset.data_root={root}/" for s in ("train", "val", "test")]
    opts += [
        "train_dataloader.num_workers=1",  # the left-out samples travel from a loader worker
        "val_dataloader.num_workers=0",
        "train_dataloader.batch_size=2",
        "train_dataloader.dataset.pipeline.2.scale=(96,96)",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=False",
        "trainer.enable_model_summary=False",
        "checkpoint_callback.monitor=None",
    ]
    with pytest.raises(DataError, match=rf"^train sample \d+\b.*({bad[0].name}|{bad[1].name})") as info:
        run_here("train", [DET_CFG, "--work-dir", str(tmp_path / "raise"), "--cfg-options", *opts])
    assert "Traceback" not in str(info.value)  # the message, not the loader worker's traceback
    work = tmp_path / "skip"
    # 2 of 8 samples: past the default ceiling of 5 % (the demo's 48 images would stay under it)
    run_here(
        "train", [DET_CFG, "--work-dir", str(work), "--cfg-options", *opts, "data_errors=skip", "data_errors_max=0.25"]
    )
    ckpt = load_ckpt(work / "last.ckpt")
    assert ckpt["global_step"] == 4 and ckpt["epoch"] == 1  # 8 samples (one image has no object), batches of 2
    lines = (work / "data_errors.tsv").read_text().splitlines()
    assert len(lines) == 2 and len(_left_out(ckpt)) == 2
    for path in bad:
        assert sum(str(path) in line for line in lines) == 1, lines


@pytest.fixture
def ade_two_bad_maps(tiny_data, tmp_path):
    """A copy of the tiny ADE20K set whose training label maps 2 and 6 (of 8) are cut short."""
    root = tmp_path / "data"
    shutil.copytree(tiny_data / "tiny_ade20k", root / "tiny_ade20k")
    maps = sorted((root / "tiny_ade20k" / "annotations" / "training").iterdir())
    for i in (2, 6):
        _cut(maps[i])
    return root


def _seg_opts(data_opts, root, *extra):
    return [
        *seg_opts(data_opts, "data_errors=skip", "data_errors_max=0.25", "trainer.deterministic=True", *extra),
        *(f"{s}_dataloader.dataset.data_root={root}/tiny_ade20k/" for s in ("train", "val", "test")),
    ]


def test_skip_resumes_exactly_and_carries_the_count(ade_two_bad_maps, data_opts, tmp_path):
    opts = _seg_opts(data_opts, ade_two_bad_maps)

    def train(work, steps):
        run_here("train", [SEG_CFG, "--work-dir", str(work), "--resume", "auto", "--cfg-options", *opts, steps])
        return load_ckpt(work / "last.ckpt")

    whole = train(tmp_path / "whole", "trainer.max_steps=6")  # 4 batches an epoch: into the second epoch
    first = train(tmp_path / "cut", "trainer.max_steps=3")
    resumed = train(tmp_path / "cut", "trainer.max_steps=6")
    assert len(_left_out(first)) == 1 and len(_left_out(whole)) == 2  # sample 6 comes after step 3
    assert _left_out(resumed) == _left_out(whole)  # the resumed run's count went on from the checkpoint's
    assert_same_training_state(whole, resumed)
    assert resumed["loops"] == whole["loops"]
    assert len((tmp_path / "cut" / "data_errors.tsv").read_text().splitlines()) == 2  # logged once each
    # a lower ceiling: the second bad sample stops the run, naming the count and the list
    with pytest.raises(DataError, match=r"2 distinct training samples failed to load, more than data_errors_max"):
        train(tmp_path / "low", "data_errors_max=0.2")


@pytest.mark.slow
def test_skip_under_ddp_counts_both_ranks(ade_two_bad_maps, data_opts, tmp_path, log_lines):
    work = tmp_path / "ddp"
    opts = _seg_opts(data_opts, ade_two_bad_maps, "trainer.max_steps=2", *ddp_opts(2))
    run_job_here([SEG_CFG, "--work-dir", str(work), "--cfg-options", *opts], [{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}])
    ckpt = load_ckpt(work / "last.ckpt")
    assert ckpt["global_step"] == 2 and len(_left_out(ckpt)) == 2  # the epoch's 8 samples: both bad ones
    # rank 0 (this process) met one of them, rank 1 the other: the checkpoint holds the union
    assert len([line for line in log_lines if "left out training sample" in line]) == 1
    assert len((work / "data_errors.tsv").read_text().splitlines()) == 2
