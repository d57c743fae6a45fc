"""tasks/training/work_dir_checkpoint.py: a resumed run keeps ranking its best checkpoints when its work dir was
moved (here: copied elsewhere), and a checkpoint from another directory starts the ranking anew, said in one line
instead of Lightning's warning. Both under warnings-as-errors."""

import glob
import os.path as osp

import torch

from tests._tools import SEG_CFG, load_tool, warnings_as_errors

train_tool = load_tool("train")


def _ranking(work_dir):
    """The mIoU ModelCheckpoint's state in ``work_dir``'s last.ckpt, and the best_* files in ``work_dir``."""
    ckpt = torch.load(osp.join(work_dir, "last.ckpt"), map_location="cpu", weights_only=True)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("ModelCheckpoint{'monitor': 'mIoU'")]
    return state, sorted(glob.glob(osp.join(work_dir, "best_*.ckpt")))


def _resume(run, work_dir, resume):
    opts = [*run.opts, "trainer.max_steps=4", "trainer.val_check_interval=2"]
    with warnings_as_errors():  # Lightning warned "The dirpath has changed" and dropped the ranking
        train_tool.main([SEG_CFG, "--work-dir", str(work_dir), "--resume", resume, "--cfg-options", *opts])


def test_a_moved_work_dir_keeps_ranking_its_best_checkpoints(seg_run, copy_run, log_lines):
    before, (best_before,) = _ranking(seg_run.work_dir)  # save_top_k=1: one best file, from step 2
    run = copy_run(seg_run)
    work_dir = osp.realpath(run.work_dir)
    _resume(run, work_dir, "auto")
    after, best_files = _ranking(work_dir)
    assert after["dirpath"] == work_dir
    # still top 1: the step-4 checkpoint replaced the copied step-2 one or lost to it, in this dir
    assert list(after["best_k_models"]) == best_files == [after["best_model_path"]]
    assert osp.dirname(after["best_model_path"]) == work_dir
    scores = [float(before["best_model_score"]), float(after["current_score"])]
    assert float(after["best_model_score"]) == max(scores)
    if scores[0] >= scores[1]:  # the copied best one kept, under its new path
        assert best_files == [osp.join(work_dir, osp.basename(best_before))]
    assert not any("starts anew" in line for line in log_lines)


def test_a_checkpoint_from_another_directory_starts_the_ranking_anew(seg_run, tmp_path, log_lines):
    work_dir = osp.realpath(tmp_path / "new")
    _resume(seg_run, work_dir, seg_run.ckpt)
    after, best_files = _ranking(work_dir)
    assert list(after["best_k_models"]) == best_files and len(best_files) == 1  # only this run's own
    assert any(f"resuming from a checkpoint written in {osp.realpath(seg_run.work_dir)}" in line for line in log_lines)
