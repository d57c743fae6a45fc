"""Jobs that stop and start again: ``--resume auto``, and preemption signals turned into a checkpoint and a requeue.

* ``resume_checkpoint``: what ``tools/train.py --resume [auto|CKPT]`` resumes from. ``auto`` is what a requeued or
  restarted job runs unchanged: ``WORK_DIR/last.ckpt`` when it exists, else a fresh start, logged in one line.
* ``Preemption`` (a Lightning callback that ``tasks.training.trainer.build_trainer`` adds for training): on the
  cluster's
  warning signal (``requeue_signal``, SIGUSR1 by default, as SLURM's ``--signal=USR1@120``) or SIGTERM, every rank
  stops at the next optimizer-step boundary, ``WORK_DIR/last.ckpt`` is written once (atomically, through the
  trainer's checkpoint IO: the exact mid-epoch state that ``--resume`` restores), the SLURM job is requeued with
  ``scontrol requeue`` (array jobs: ``ARRAYJOBID_TASKID``) and the process exits with status ``EXIT_PREEMPTED``.

Why not Lightning's own SLURM handling: its SIGUSR1 handler writes ``hpc_ckpt_N.ckpt`` from inside the signal
handler, i.e. in the middle of whatever step was running (half an accumulation window, or between a rank's
backward and its optimizer step), and as a collective on whichever ranks happen to get the signal; its SIGTERM
handler broadcasts from inside the handler and ends the run at the next batch without a checkpoint, acting on
rank 0's signal only. Here the handler only records the signal; the ranks agree at each optimizer-step boundary
(one all-reduce of a flag, ``Strategy.reduce_boolean_decision``), so a signal that reached any one rank stops all
of them at the same step. ``SLURMEnvironment(auto_requeue=False)`` (tasks/training/trainer.py) switches Lightning's
handler off; Lightning still detects the SLURM ranks and nodes.

A signal that arrives before training starts (while the model and data are built) has the default effect (for
SIGUSR1 and SIGTERM: the process ends, and nothing was trained since the last checkpoint); one that arrives after
the last step (during the final validation) is ignored: the run ends normally.
"""

from __future__ import annotations

import os
import os.path as osp
import shlex
import shutil
import signal
import subprocess
import threading

import lightning as L
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from backbones.errors import CheckpointError

# The process's exit status after a preemption checkpoint: sysexits' EX_TEMPFAIL ("try again later").
EXIT_PREEMPTED = 75


def resume_checkpoint(resume: str | None, work_dir: str) -> str | None:
    """The checkpoint ``--resume`` names: None (no flag: a fresh start), ``'last'`` (``WORK_DIR/last.ckpt``, which
    must exist), ``'auto'`` (``WORK_DIR/last.ckpt`` when it exists, else None; logged) or a path (must exist)."""
    if not resume:
        return None
    last = osp.join(work_dir, "last.ckpt")
    if resume == "auto":
        if osp.isfile(last):
            rank_zero_info(f"--resume auto: resuming from {last}")
            return last
        rank_zero_info(f"--resume auto: no checkpoint {last} yet, starting fresh")
        return None
    ckpt = last if resume == "last" else resume
    if not osp.isfile(ckpt):
        # CheckpointError: a user error, which tools/train.py prints without a traceback
        raise CheckpointError(
            f"--resume: checkpoint {ckpt} does not exist (--resume auto starts fresh when there is none)"
        )
    return ckpt


def resume_command(argv: list[str], work_dir: str) -> str:
    """The ``tools/train.py`` command line ``argv`` (its arguments) with ``--resume auto`` in place of any
    ``--resume`` it had and its work dir named: what resumes the run from ``WORK_DIR/last.ckpt`` (or starts it
    afresh when there is none)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--resume":  # with its value, when one follows
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1
            continue
        if not argv[i].startswith("--resume="):
            out.append(argv[i])
        i += 1
    if not any(a == "--work-dir" or a.startswith("--work-dir=") for a in out):
        out += ["--work-dir", work_dir]
    return shlex.join(["python", "tools/train.py", *out, "--resume", "auto"])


def signal_number(name: str | int) -> signal.Signals:
    """``'SIGUSR1'`` / ``'USR1'`` / ``10`` -> ``signal.SIGUSR1``; unknown names are an error listing the usual ones."""
    if isinstance(name, int) and not isinstance(name, bool):
        return signal.Signals(name)
    text = str(name).upper()
    text = text if text.startswith("SIG") else "SIG" + text
    if text not in signal.Signals.__members__ or text in ("SIGKILL", "SIGSTOP"):
        raise ValueError(
            f"requeue_signal: {name!r} is not a signal that can be caught; use e.g. 'SIGUSR1' (SLURM's "
            "--signal=USR1@120), 'SIGUSR2' or 'SIGINT'"
        )
    return signal.Signals[text]


def slurm_job_id() -> str | None:
    """The id ``scontrol requeue`` takes: ``ARRAYJOBID_TASKID`` for an array task, else ``SLURM_JOB_ID``."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job(ckpt: str) -> bool:
    """Run ``scontrol requeue JOB``; without ``scontrol`` (e.g. in a container), or when it fails, warn that the
    job must be resubmitted. Returns whether the job was requeued."""
    job = slurm_job_id()
    resubmit = f"resubmit it (the same command; --resume auto continues from {ckpt})"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        rank_zero_warn(f"preemption: `scontrol` not found, SLURM job {job} was not requeued: {resubmit}")
        return False
    proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        rank_zero_warn(
            f"preemption: `scontrol requeue {job}` failed (exit status {proc.returncode}: "
            f"{(proc.stderr or proc.stdout).strip()}): {resubmit}"
        )
        return False
    rank_zero_info(f"preemption: SLURM job {job} requeued (scontrol requeue {job})")
    return True


class Preempted(SystemExit):
    """Raised on every rank after the preemption checkpoint: ends ``trainer.fit`` (Lightning tears down without
    running validation or epoch-end hooks) and the process, with status ``EXIT_PREEMPTED``."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Preemption(L.Callback):
    """Stops training at the optimizer-step boundary after a preemption signal, with one checkpoint and a requeue.

    Args:
        ckpt_path: the checkpoint written on preemption (``WORK_DIR/last.ckpt``, what ``--resume auto`` reads).
        requeue_signal: the cluster's warning signal (a name such as ``'SIGUSR1'`` or a number); SIGTERM is always
            handled too.
    """

    def __init__(self, ckpt_path: str, requeue_signal: str | int = "SIGUSR1") -> None:
        self.ckpt_path = ckpt_path
        self.signals = tuple(dict.fromkeys([signal_number(requeue_signal), signal.SIGTERM]))
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._active = False
        self._step = 0

    # ---- signal handlers -------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame) -> None:
        if self._active:
            # Only note it: the ranks act together at the next step boundary (on_train_batch_end).
            self.received = self.received or signum
            return
        # Training is over, but a handler restored by Lightning's teardown may still point here: act as before.
        previous = self._previous.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)

    def _install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # (signal.signal's own restriction)
            for signum in self.signals:
                previous = signal.signal(signum, self._on_signal)
                if previous != self._on_signal:
                    self._previous.setdefault(signum, previous)
            self._active = True

    def _uninstall(self) -> None:
        self._active = False
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                # None: a handler not set from Python, which cannot be put back; the default is the nearest
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)

    # ---- Lightning hooks -------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.received = None
            self._install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Again, over the SIGTERM handler that Lightning's signal connector registered after setup (its handler
        # would broadcast from inside the signal handler and stop at the next batch without a checkpoint).
        self._install()
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._step:
            return  # inside an accumulation window: a checkpoint here would lose the accumulated gradients
        self._step = trainer.global_step
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        trainer.save_checkpoint(self.ckpt_path)  # every rank takes part; the checkpoint IO writes atomically
        name = signal.Signals(self.received).name if self.received else "a signal on another rank"
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        requeued = False
        if trainer.is_global_zero:
            rank_zero_info(f"preemption: {name} received; stopped at {where}, checkpoint {self.ckpt_path}")
            if slurm_job_id() is not None:
                requeued = requeue_slurm_job(self.ckpt_path)
            else:
                rank_zero_info("preemption: not a SLURM job: run the same command with --resume auto to continue")
        raise Preempted(
            f"preempted ({name}) at {where}: checkpoint {self.ckpt_path}" + ("; job requeued" if requeued else "")
        )

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._uninstall()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._uninstall()


class ElasticDDPStrategy(DDPStrategy):
    """``DDPStrategy`` that also works after torchrun restarted the worker group (``--max-restarts``).

    Under torchrun the workers' process group meets in the elastic agent's store (``TORCHELASTIC_USE_AGENT_STORE``),
    which outlives the workers; torch 2.14 puts each round's rendezvous keys there without a per-round prefix, so a
    restarted rank reads the dead rank 0's address of the previous round and fails (gloo: "connectFullMesh failed
    ... Connection refused"). Here the process group is created on that store under the prefix
    ``/worker/attempt_<TORCHELASTIC_RESTART_COUNT>``; otherwise this is Lightning's ``DDPStrategy``.
    """

    def setup_distributed(self) -> None:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and not dist.is_initialized():
            self.set_world_ranks()
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.world_size, False, self._timeout
            )
            store = dist.PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
            dist.init_process_group(
                self._get_process_group_backend(),
                store=store,
                rank=self.global_rank,
                world_size=self.world_size,
                timeout=self._timeout,
            )
        super().setup_distributed()  # Lightning's own set-up; it leaves an existing process group as it is
