"""Helpers of the tests that train in child processes (tests/test_reliability.py, test_cluster.py,
test_distributed.py, test_accumulation.py): their environment, the tiny segmentation run's options, starting
tests/_train_driver.py and killing it at a known step, training in the test's own process, and the comparison of
two training checkpoints."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

from tests._tools import REPO, load_tool

TIMEOUT = 240  # seconds for one training process of these tests
DRIVER = "tests._train_driver"  # run as a module from the repository root (python -m, torchrun -m)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a launcher (Lightning's, torchrun, SLURM) tells the processes it starts: a child that inherits these from
# the test process believes it was launched as one rank of a job.
LAUNCHER_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def env(**extra) -> dict:
    """A child's environment: one thread per process (the test machines have few cores and the ranks of a job
    share them), a free rendezvous port of its own, and no launcher or SLURM variables of the test process."""
    own = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARIABLES and not k.startswith(("TORCHELASTIC_", "SLURM_"))
    }
    return {**own, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **extra}


def seg_opts(data_opts, *extra) -> list:
    """The segmentation demo on 64 px crops of 128 px images, batch 2, without validation: a step takes a fraction
    of a second on one core."""
    return data_opts(
        "tiny_ade20k",
        "crop_size=(64,64)",
        "model.data_preprocessor.size=(64,64)",
        "train_dataloader.dataset.pipeline.2.scale=(128,64)",
        "train_dataloader.dataset.pipeline.3.crop_size=(64,64)",
        "trainer.limit_val_batches=0",
        "checkpoint_callback.monitor=None",
        *extra,
    )


def ddp_opts(devices: int) -> list:
    """Options for a ``devices``-process run on CPU: gloo DDP when 2, with a process-group timeout so that a
    rank waiting for a dead peer gives up instead of hanging."""
    if devices == 1:
        return []
    return [
        f"trainer.devices={devices}",
        "trainer.accelerator=cpu",
        "trainer.strategy.type=ddp",
        "trainer.strategy.timeout=60",
    ]


def load_ckpt(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold bit-identical weights, buffers, optimizer states and lr schedules."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[n], sb[n]) for n in sa)
    assert a["lr_schedulers"] == b["lr_schedulers"]


def start(args, launcher=(), group_env=None, **env_extra) -> subprocess.Popen:
    """tests/_train_driver.py with ``args``, in a process group of its own (a scheduler kills the job's group); the
    processes of one job share ``group_env`` (its MASTER_PORT). The output goes to a file (a pipe nobody reads
    while the test waits could fill up and block the process)."""
    out = tempfile.NamedTemporaryFile("w+", suffix=".log")
    proc = subprocess.Popen(
        [sys.executable, *launcher, "-m", DRIVER, *args],
        cwd=REPO,
        env={**(group_env or env()), **env_extra},
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    proc.log = out
    return proc


def output(proc) -> str:
    proc.log.seek(0)
    return proc.log.read()


def finish(procs, expect=0, timeout=TIMEOUT) -> list:
    """Wait for the processes; assert their exit status; return their output."""
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [output(p) for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == expect, f"exit status {p.returncode}, expected {expect}:\n{log[-6000:]}"
    return logs


def wait_for(path, procs=()) -> str:
    """The text of ``path`` once it exists; fails when one of ``procs`` ended first."""
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(path):
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, f"a process ended while waiting for {path}:\n{output(dead[0])[-6000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def run_here(tool: str, argv: list, environ: dict | None = None, **kwargs) -> dict:
    """``tools/<tool>.py``'s ``main(argv, **kwargs)`` in this process with one thread, as each child of ``env()``
    runs: the same float sums, so its checkpoints and metrics equal a child's bit for bit, without a child's seconds
    of imports. ``environ``: variables set for the run (e.g. a SLURM task's); given, os.environ is restored after
    the run (what the run set too: Lightning's MASTER_PORT, ...)."""
    threads, saved = torch.get_num_threads(), dict(os.environ)
    torch.set_num_threads(1)
    os.environ.update(environ or {})
    try:
        return load_tool(tool).main(argv, **kwargs)
    finally:
        torch.set_num_threads(threads)
        if environ is not None and os.environ != saved:
            os.environ.clear()
            os.environ.update(saved)


def run_job_here(args, envs, record=None, expect=0) -> tuple:
    """A tools/train.py job (``args``) of ``len(envs)`` processes, each rank with its launcher's variables
    ``envs[rank]``: rank 0 in this process (``run_here``), the others children (``start``), all meeting at one
    rendezvous port; with ``record`` (a folder), every rank writes its record there (tests/_train_driver.py
    RecordRanks). ``expect``: the exit status of every rank (rank 0's: the code of the SystemExit that ``main``
    raises, as a process would exit with it). Returns rank 0's validation metrics (or, when ``expect`` is not 0,
    that SystemExit) and the children's output. A failure in this process kills the children (they would wait for
    rank 0 until the process-group timeout)."""
    from tests._train_driver import RecordRanks  # (imports Lightning: not when this module is collected)

    group, extra = env(), {"RECORD_DIR": str(record)} if record else {}
    procs = [start(args, (), group, **e, **extra) for e in envs[1:]]
    here = {"MASTER_ADDR": group["MASTER_ADDR"], "MASTER_PORT": group["MASTER_PORT"], **envs[0]}
    try:
        try:
            result = run_here("train", args, here, callbacks=[RecordRanks(str(record))] if record else [])
        except SystemExit as e:
            if not expect or e.code != expect:
                raise
            result = e
        else:
            assert not expect, f"rank 0 ended normally, expected exit status {expect}"
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return result, finish(procs, expect=expect)


def kill_and_resume_here(args, work, pause, pause_at):
    """The one-process training job ``args`` (its work dir ``work``, ``--resume auto``) SIGKILLed (its process
    group, as a scheduler kills it) while it waits at the end of step ``pause_at`` (tests/_train_driver.py, pause
    folder ``pause``), then the same command again in this process (``run_here``: one thread, bit-identical to a
    child, without a child's imports), checking what the kill left (the resume message, no temp file). Returns
    the last.ckpt that the kill left and the resumed run's final one."""
    import logging

    os.makedirs(pause)
    proc = start(args, PAUSE_AT_STEP=str(pause_at), PAUSE_DIR=str(pause))
    wait_for(os.path.join(pause, "paused_rank0"), [proc])
    saved = load_ckpt(os.path.join(work, "last.ckpt"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    open(os.path.join(pause, "go"), "w").close()

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch")  # where Lightning's rank_zero_info logs
    logger.addHandler(handler)
    try:
        run_here("train", list(args))
    finally:
        logger.removeHandler(handler)
    assert f"--resume auto: resuming from {os.path.join(work, 'last.ckpt')}" in lines, lines
    assert [p for p in os.listdir(work) if p.endswith(".tmp")] == []
    return saved, load_ckpt(os.path.join(work, "last.ckpt"))
