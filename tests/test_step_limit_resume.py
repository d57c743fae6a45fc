"""tasks/training/step_limit.py: a run trained to ``max_steps`` inside an epoch and then resumed with a larger
``max_steps`` trains the batches, and ends with the state, of one run to the larger ``max_steps``. With gradient
accumulation (2 batches a step, 4 an epoch): the first run stops after step 1, half way through epoch 0; the
longer one crosses into epoch 1. Validation (and the best checkpoint) at step 2 only: the end of training writes
last.ckpt after the step-2 one (tasks/training/work_dir_checkpoint.py; Lightning kept the step-2 file)."""

import json

from tests._runs import assert_same_training_state, load_ckpt, run_here, seg_opts
from tests._tools import SEG_CFG


def test_training_longer_continues_the_epoch_where_max_steps_stopped(data_opts, tmp_path):
    from tests._train_driver import RecordRanks  # (imports Lightning: not when this module is collected)

    opts = seg_opts(data_opts, "trainer.deterministic=True", "trainer.accumulate_grad_batches=2")
    opts += ["trainer.limit_val_batches=1", "trainer.val_check_interval=2", "checkpoint_callback.monitor=mIoU"]

    def train(work, steps, name):
        record = tmp_path / name
        record.mkdir()
        argv = [SEG_CFG, "--work-dir", str(work), "--resume", "auto", "--cfg-options", *opts]
        run_here("train", [*argv, f"trainer.max_steps={steps}"], callbacks=[RecordRanks(str(record))])
        return json.loads((record / "rank0.json").read_text())["batches"]

    whole = train(tmp_path / "whole", 3, "whole")
    first, longer = train(tmp_path / "cut", 1, "first"), train(tmp_path / "cut", 3, "longer")
    assert len(first) == 2 and first + longer == whole  # the longer run went on with batch 3 of epoch 0
    uninterrupted, resumed = load_ckpt(tmp_path / "whole" / "last.ckpt"), load_ckpt(tmp_path / "cut" / "last.ckpt")
    assert [p.name for p in (tmp_path / "whole").glob("best_*.ckpt")] == ["best_mIoU_0_2.ckpt"]  # validated at 2
    assert uninterrupted["global_step"] == resumed["global_step"] == 3  # not the step-2 checkpoint's
    assert_same_training_state(uninterrupted, resumed)
    assert resumed["loops"] == uninterrupted["loops"] and resumed["epoch"] == uninterrupted["epoch"] == 1
