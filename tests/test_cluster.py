"""Cluster life, for real: preemption signals under a simulated SLURM job (its environment variables and a fake
``scontrol`` that records its arguments), ``--resume auto``, torchrun's elastic restarts, two simulated nodes.

Every run trains the same tiny segmentation config for 5 optimizer steps (8 images, batch 2) with
``--auto-scale-lr``, and is compared bit for bit with an uninterrupted run: one process, or two gloo processes
(the 1-node reference of the SLURM, torchrun and two-node runs). Signals and kills happen at a known step:
tests/_train_driver.py pauses every rank at the end of a given step until the test has acted. The processes that
get a signal or a kill are children; a run that only has to continue (the same command again) and the references
run their rank 0 in the test process (``run_here``, ``run_job_here``: no child's seconds of imports).
"""

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from backbones.errors import CheckpointError
from tests._runs import (
    TIMEOUT,
    assert_same_training_state,
    ddp_opts,
    finish,
    free_port,
    load_ckpt,
    run_job_here,
    seg_opts,
    start,
    wait_for,
)
from tests._tools import SEG_CFG

pytestmark = pytest.mark.slow  # training processes: scheduled first (conftest.py)

STEPS, PAUSE = 5, 3  # 1 process: 4 batches an epoch, 2 processes: 2; step 3 is mid-epoch for both
EPOCH_END = 4  # the last step of epoch 0 for 1 process
EXIT_PREEMPTED = 75


def train_args(data_opts, work_dir, *extra):
    """The command line every run of this file shares (its work dir aside): the same command resumes."""
    opts = seg_opts(
        data_opts,
        f"trainer.max_steps={STEPS}",
        f"trainer.val_check_interval={STEPS}",
        "trainer.deterministic=True",
        "auto_scale_lr.base_batch_size=8",
        *extra,
    )
    # processes started together (torchrun, SLURM tasks) may reach the rendezvous minutes apart on a loaded machine
    opts += ["trainer.strategy.timeout=300"] if any(o.startswith("trainer.strategy") for o in opts) else []
    return [SEG_CFG, "--work-dir", str(work_dir), "--resume", "auto", "--auto-scale-lr", "--cfg-options", *opts]


def slurm_env(tmp_path, rank=0, ntasks=1, nodes=1, **extra):
    """A SLURM task's variables (as srun sets them) and a fake ``scontrol`` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    return dict(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="train",
        SLURM_NTASKS=str(ntasks),
        SLURM_NTASKS_PER_NODE=str(ntasks // nodes),
        SLURM_NNODES=str(nodes),
        SLURM_NODELIST="localhost",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        **extra,
    )


@pytest.fixture(scope="session")
def reference(data_opts, run_once):
    """Uninterrupted runs: ``{1: one process, 2: two gloo processes (SLURM tasks)}``, each as (its last.ckpt, its
    work dir), with each rank's record in ``WORK_DIR/record`` (tests/_train_driver.py RecordRanks). Trained once per
    session, rank 0 in the test process (``run_here``: one thread, as the children)."""

    def make(folder):
        for devices in (1, 2):
            work = folder / f"ref{devices}"
            (work / "record").mkdir(parents=True)
            envs = [slurm_env(work, rank=r, ntasks=devices) for r in range(devices)]
            run_job_here(train_args(data_opts, work, *ddp_opts(devices)), envs, work / "record")
        return str(folder)

    folder = Path(run_once("cluster_reference", make))
    return {
        devices: (load_ckpt(folder / f"ref{devices}" / "last.ckpt"), folder / f"ref{devices}") for devices in (1, 2)
    }


def records(folder, world):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


def resume_here(args, work, envs, reference, done):
    """The same command again (``args``, work dir ``work``) after a preemption at step ``done``, rank 0 in this
    process (the others children, ``run_job_here``): every rank trains only the uninterrupted run's batches after
    step ``done`` and the run ends with its weights. Returns the final last.ckpt."""
    record = work.parent / "record_resumed"
    record.mkdir()
    run_job_here(args, envs, record)
    resumed, uninterrupted = records(record, len(envs)), records(reference[1] / "record", len(envs))
    assert [r["batches"] for r in resumed] == [r["batches"][done:] for r in uninterrupted]
    final = load_ckpt(work / "last.ckpt")
    assert final["global_step"] == STEPS
    assert_same_training_state(reference[0], final)
    return final


def test_sigusr1_under_slurm_checkpoints_requeues_and_the_same_command_resumes_exactly(data_opts, reference, tmp_path):
    """A SLURM array task of two gloo processes gets SIGUSR1 mid-epoch, on rank 1 only: the ranks agree at the step
    boundary, every rank stops after step 3 with one checkpoint, rank 0 requeues the array task, the processes
    exit with status 75; the same command again finishes with the uninterrupted run's weights and requeues
    nothing. Rank 0 runs in this process (its exit status: the code of the SystemExit that ends it), rank 1 is a
    child, signalled by a thread of the test while it waits at the end of step 3."""
    work, pause = tmp_path / "work", tmp_path / "pause"
    pause.mkdir()
    args = train_args(data_opts, work, *ddp_opts(2))
    array = dict(SLURM_ARRAY_JOB_ID="4200", SLURM_ARRAY_TASK_ID="7")
    envs = [slurm_env(tmp_path, rank=r, ntasks=2, **array) for r in range(2)]
    envs[1].update(PAUSE_AT_STEP=str(PAUSE), PAUSE_DIR=str(pause))
    received = []

    def signal_rank1():  # rank 0 (this process's main thread) waits in the step-3 all-reduce meanwhile
        try:
            os.kill(int(wait_for(pause / "paused_rank1")), signal.SIGUSR1)
            received.append(int(wait_for(pause / "signalled_rank1")))
        finally:
            (pause / "go").touch()

    thread = threading.Thread(target=signal_rank1, daemon=True)
    thread.start()
    stop, _ = run_job_here(args, envs, expect=EXIT_PREEMPTED)
    thread.join()
    assert received == [signal.SIGUSR1]
    # rank 0 was not signalled: it stopped on rank 1's signal, at the next step boundary (mid-epoch)
    ckpt_path = work / "last.ckpt"
    assert (
        str(stop)
        == f"preempted (a signal on another rank) at step {PAUSE} (epoch 1): checkpoint {ckpt_path}; job requeued"
    )
    assert load_ckpt(ckpt_path)["global_step"] == PAUSE
    assert (tmp_path / "scontrol.calls").read_text() == "requeue 4200_7\n"
    assert [p for p in os.listdir(work) if p.endswith(".tmp") or p.startswith("hpc_ckpt")] == []

    resume_here(args, work, envs, reference[2], PAUSE)
    assert (tmp_path / "scontrol.calls").read_text().count("requeue") == 1  # the second run was not requeued


def test_sigterm_without_scontrol_at_the_end_of_an_epoch_checkpoints_and_resumes_exactly(
    data_opts, reference, tmp_path
):
    """SIGTERM in a one-process SLURM job whose container has no ``scontrol``, at the end of step 4, the last of
    epoch 0 (4 batches an epoch): the checkpoint of that step is written all the same, the log says the job must be
    resubmitted; the same command resumes at the start of epoch 1 with the uninterrupted run's batch and random
    state (the restored, finished epoch's iterator must not draw from torch's global RNG) and ends with its
    weights."""
    work, pause = tmp_path / "work", tmp_path / "pause"
    pause.mkdir()
    no_scontrol = slurm_env(tmp_path)
    no_scontrol["PATH"] = os.path.dirname(sys.executable)  # python, no scontrol
    args = train_args(data_opts, work)
    proc = start(args, PAUSE_AT_STEP=str(EPOCH_END), PAUSE_DIR=str(pause), **no_scontrol)
    os.kill(int(wait_for(pause / "paused_rank0", [proc])), signal.SIGTERM)
    wait_for(pause / "signalled_rank0", [proc])
    (pause / "go").touch()
    (log,) = finish([proc], expect=EXIT_PREEMPTED)
    assert "--resume auto: no checkpoint" in log and "starting fresh" in log, log[-4000:]
    assert f"SIGTERM received; stopped at step {EPOCH_END} (epoch 0)" in log, log[-4000:]
    assert "`scontrol` not found, SLURM job 4242 was not requeued: resubmit it" in log, log[-4000:]
    saved = load_ckpt(work / "last.ckpt")
    assert saved["global_step"] == EPOCH_END
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batches"] == EPOCH_END  # all of epoch 0

    resume_here(args, work, [no_scontrol], reference[1], EPOCH_END)
    assert [p for p in os.listdir(work) if p.endswith(".tmp")] == []


def test_torchrun_restarts_a_killed_worker_and_training_continues_exactly(data_opts, reference, tmp_path):
    """torchrun --max-restarts=1, 2 gloo workers, --resume auto: worker 1 SIGKILLed after step 4 (last.ckpt is from
    step 3, mid-epoch); torchrun restarts the group, which resumes from step 3 and ends with the uninterrupted
    weights. (This is also the test of a 2-process run killed mid-epoch and resumed: a whole job killed and run
    again resumes the same way: tests/test_reliability.py.)"""
    work, pause = tmp_path / "work", tmp_path / "pause"
    pause.mkdir()
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1"]
    args = train_args(data_opts, work, *ddp_opts(2), "checkpoint_every_n_steps=3")
    proc = start(args, launcher, PAUSE_AT_STEP="4", PAUSE_DIR=str(pause))
    pid = int(wait_for(pause / "paused_rank1", [proc]))
    wait_for(pause / "paused_rank0", [proc])
    assert load_ckpt(work / "last.ckpt")["global_step"] == 3
    os.kill(pid, signal.SIGKILL)
    (pause / "go").touch()
    (log,) = finish([proc], timeout=2 * TIMEOUT)  # two starts of the group
    assert log.count("--resume auto: no checkpoint") == 1, log[-6000:]
    assert f"--resume auto: resuming from {work / 'last.ckpt'}" in log, log[-6000:]
    final = load_ckpt(work / "last.ckpt")
    assert final["global_step"] == STEPS
    assert_same_training_state(reference[2][0], final)
    # mmseg's config has no batch_sampler: the plain BatchSampler's position was restored (the detection configs'
    # AspectRatioBatchSampler: tests/test_reliability.py)
    assert final["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batch_sampler"] == "BatchSampler"


def test_two_nodes_ranks_shards_lr_and_weights_equal_one_node(data_opts, reference, tmp_path):
    """Two torchrun launches (--nnodes=2, one gloo process each) into one work dir, trainer.num_nodes=2: global
    ranks 0 and 1 on nodes 0 and 1, each rank the data shard of the 1-node 2-process run, --auto-scale-lr counting
    the nodes, and that run's final weights."""
    work, record = tmp_path / "work", tmp_path / "record"
    record.mkdir()
    port = str(free_port())
    args = train_args(data_opts, work, *ddp_opts(2), "trainer.devices=1", "trainer.num_nodes=2")
    procs = [
        start(
            args,
            [
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
            ],
            RECORD_DIR=str(record),
        )
        for node in (0, 1)
    ]
    logs = finish(procs)
    assert "auto_scale_lr: total batch 4 = devices 1 x nodes 2 x batch_size 2 x accumulation 1" in logs[0]
    ranks = records(record, 2)
    assert [(r["global_rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    one_node = records(reference[2][1] / "record", 2)
    assert [r["batches"] for r in ranks] == [r["batches"] for r in one_node]
    # every epoch (2 batches a rank) splits the 8 images between the ranks
    for epoch in range(2):
        shards = [{f for b in r["batches"][2 * epoch : 2 * epoch + 2] for f in b} for r in ranks]
        assert len(shards[0]) == len(shards[1]) == 4 and not shards[0] & shards[1]
    final = load_ckpt(work / "last.ckpt")
    assert final["global_step"] == STEPS
    assert_same_training_state(reference[2][0], final)


def test_resume_values_and_requeue_signal_names(tmp_path, monkeypatch, caplog):
    from tasks.training.restart import resume_checkpoint, signal_number, slurm_job_id

    with caplog.at_level("INFO"):
        assert resume_checkpoint("auto", str(tmp_path)) is None
    # one record (what handlers print it depends on how Lightning's logging was set up in this process)
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"--resume auto: no checkpoint {tmp_path}/last.ckpt yet" in m for m in said) == 1, said
    assert resume_checkpoint(None, str(tmp_path)) is None
    with pytest.raises(CheckpointError, match=r"last\.ckpt does not exist \(--resume auto starts fresh"):
        resume_checkpoint("last", str(tmp_path))
    (tmp_path / "last.ckpt").write_bytes(b"")
    assert resume_checkpoint("last", str(tmp_path)) == str(tmp_path / "last.ckpt")
    caplog.clear()
    with caplog.at_level("INFO"):
        assert resume_checkpoint("auto", str(tmp_path)) == str(tmp_path / "last.ckpt")
    said = [r.getMessage() for r in caplog.records]
    assert said.count(f"--resume auto: resuming from {tmp_path}/last.ckpt") == 1, said

    assert signal_number("USR2") == signal_number("SIGUSR2") == signal_number(int(signal.SIGUSR2)) == signal.SIGUSR2
    for bad in ("SIGKILL", "USR3"):
        with pytest.raises(ValueError, match=rf"requeue_signal: '{bad}' is not a signal that can be caught"):
            signal_number(bad)

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert slurm_job_id() == "4242"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4200")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")
    assert slurm_job_id() == "4200_7"


def test_main_again_in_one_process_on_the_same_work_dir_reuses_its_mm_logger(tmp_path):
    """tools/train.py's main run again in a process that lives on (the resumes above, a notebook) finds the mm
    logger of its work dir created: it takes it as it is, without mmengine's warning about arguments for an existing
    instance, and keeps writing mm.log."""
    from mmengine.logging import MMLogger

    from tasks.training.process import setup_mm_logger
    from tests._tools import warnings_as_errors

    with warnings_as_errors():
        setup_mm_logger(str(tmp_path))
        setup_mm_logger(str(tmp_path))
    logger = MMLogger.get_instance(str(tmp_path))
    logger.info("still logging")
    assert "still logging" in (tmp_path / "mm.log").read_text()
