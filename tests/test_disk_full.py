"""A checkpoint write that fails for space (tasks/training/disk_space.py): the segmentation demo writes last.ckpt at
every step into a work dir that has room for one and a half of its checkpoints.

Where the test may mount (root), the work dir is a tmpfs of that size: the first checkpoint is written, the second
fails with the kernel's own ENOSPC, which torch's zip writer reports only as the context of its ``RuntimeError``.
Where it may not, this process gets a file size limit of half a checkpoint instead (``RLIMIT_FSIZE``; Python
ignores SIGXFSZ, so the write fails with EFBIG): that proves the same handling of a write that fails for space,
with the first checkpoint, but not the words and free bytes of a full device. Either way the run ends in plain
words without a traceback, nothing partial is left (the first step's checkpoint loads where there is one), the line
before training said that space was short, and the printed command resumes the run once there is room."""

import contextlib
import os
import resource
import shlex
import subprocess

import pytest

from tasks.training.checkpoint_io import load_checkpoint_safely
from tasks.training.restart import resume_command
from tests._runs import run_here, seg_opts
from tests._tools import SEG_CFG, load_tool


@contextlib.contextmanager
def _room_for(folder, size: int):
    """Yields 'ENOSPC' with a tmpfs of ``size`` bytes mounted at ``folder``, or where mounting is not permitted,
    'EFBIG' with a file size limit of ``size // 3`` bytes for this process."""
    os.makedirs(folder)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mount.returncode == 0:
        try:
            yield "ENOSPC"
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 3, hard))
    try:
        yield "EFBIG"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_during_a_checkpoint_write_says_so_and_the_run_resumes(
    seg_run, data_opts, tmp_path, capfd, log_lines
):
    size = os.path.getsize(seg_run.ckpt)  # the same model and optimizer: a checkpoint of this run's size
    work = tmp_path / "work"
    last = work / "last.ckpt"
    argv = [SEG_CFG, "--work-dir", str(work), "--cfg-options"]
    argv += seg_opts(data_opts, "trainer.max_steps=3", "checkpoint_every_n_steps=1")
    with _room_for(work, size + size // 2) as kind:
        with pytest.raises(SystemExit) as exit_info:
            load_tool("train").cli(argv)
        assert exit_info.value.code == 1
        err = capfd.readouterr().err
        assert "Traceback" not in err and "enforce fail" not in err, err[-3000:]
        assert not [p.name for p in work.iterdir() if p.suffix == ".tmp"]
        message = err.strip().splitlines()[-1]
        assert message.startswith("rank 0 failed: DiskFullError: cannot write a checkpoint: "), message
        if kind == "ENOSPC":
            assert load_checkpoint_safely(last)["global_step"] == 1  # the first step's, intact
            assert f"the device of {work} is full (No space left on device): the checkpoint {last} needs about " in (
                message
            )
            assert " are free. Nothing partial was left. " in message
            assert f"The last complete checkpoint is {last} (step 1); free space" in message
        else:
            assert f"the checkpoint {last} needs about " in message and "the file size limit" in message
            assert not last.exists() and "No complete checkpoint is in the work dir yet" in message
            assert "raise the limit" in message
        command = message.partition(" and resume: ")[2]
        assert command == resume_command(argv, str(work))
        if kind == "ENOSPC":  # said before training; room again: the tmpfs grows, its files stay
            assert any(f"the work dir {work} has " in ln and "less than two checkpoints" in ln for ln in log_lines)
            subprocess.run(["mount", "-o", "remount,size=512m", str(work)], check=True)
        else:
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        # the printed command, once there is room: the run goes on to its end
        run_here("train", shlex.split(command)[2:])
        assert load_checkpoint_safely(last)["global_step"] == 3
    print(f"{kind}: {message}")


def test_resume_command_replaces_the_resume_flag_and_names_the_work_dir():
    assert resume_command(["c.py", "--resume", "x.ckpt", "--cfg-options", "a=1"], "w") == (
        "python tools/train.py c.py --cfg-options a=1 --work-dir w --resume auto"
    )
    assert resume_command(["c.py", "--work-dir", "my dir", "--resume"], "my dir") == (
        "python tools/train.py c.py --work-dir 'my dir' --resume auto"
    )
