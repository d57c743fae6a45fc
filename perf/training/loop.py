"""The training loop against mmengine's Runner: one config trained by ``tools/train.py`` (Lightning) and by
``Runner.from_cfg`` (what ``mim train mmdet CONFIG`` runs), each as a whole process, for a long number of epochs
that marks the time, CPU time and steps done at the end of every epoch. The per-iteration time is the slope
between the marks after a short and after the long number of epochs (start-up, imports, the first epochs and the
final checkpoint lie outside the two marks); peak memory is the process's high-water mark.

Both loops do the same work: the same data (``--data``), batch size, optimizer, clipping, schedules and
seed; no validation (Lightning: ``trainer.limit_val_batches=0``; Runner: no val loop); checkpoints when
Lightning writes them (its ``ModelCheckpoint`` saves with each validation, every ``check_val_every_n_epoch``
epochs, and at the end: the Runner's ``CheckpointHook`` gets that interval and ``save_last``); logging
every ``trainer.log_every_n_steps`` iterations (the Runner's ``LoggerHook`` interval is set to it), to CSV +
TensorBoard (Lightning) and to the text log + scalars JSON + TensorBoard (the Runner, given mmengine's
``TensorboardVisBackend``). The same ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` reach both processes.

Each run is ``python -m perf.training.loop LOOP OUT.json ...`` (``run_loop``): the loop runs in that process, a
Lightning callback or an mmengine hook (``EpochMarks``, ``RunnerEpochMarks``) marking each epoch's end, then the process
writes the marks, its peak resident memory (VmHWM: the high-water mark of this process's own address space, which
``ru_maxrss`` is not, see perf/memory.py), its CPU time, the optimizer steps done and the last logged loss.
The wall time of the whole process is measured around it by the caller (``measure``).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import os.path as osp
import resource
import runpy
import statistics
import subprocess
import sys
import time

from ..child import ROOT

LOOPS = ("lightning", "runner")
SPLITS = ("train", "val", "test")
MARKED = ("wall_s", "cpu_s")  # the clocks of an epoch mark that give a per-step time


def data_options(data_root: str) -> list[str]:
    """``--cfg-options`` pointing every dataloader section of the demo configs at ``data_root``."""
    return [f"{split}_dataloader.dataset.data_root={data_root.rstrip('/')}/" for split in SPLITS]


def runner_config(cfg, work_dir: str, epochs: int):
    """``cfg`` (an mmdet / mmseg config, changed in place and returned) made to train under mmengine's Runner
    for ``epochs`` epochs, doing the work ``tools/train.py`` does with ``lightning_options``:

    * ``train_cfg``: an ``EpochBasedTrainLoop`` of ``epochs`` epochs;
    * no validation or test loop (the Runner wants their dataloader, cfg and evaluator all None);
    * ``default_hooks.logger.interval``: the config's ``trainer.log_every_n_steps`` (Lightning's default 50);
    * ``default_hooks.checkpoint``: every ``trainer.check_val_every_n_epoch`` epochs (default 1) and after the
      last, as Lightning's ``ModelCheckpoint`` saves (mmdet's runtime saves every epoch);
    * ``visualizer.vis_backends`` gains a ``TensorboardVisBackend``, as Lightning writes TensorBoard events.
    """
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type="EpochBasedTrainLoop", max_epochs=epochs)
    for split in ("val", "test"):
        for key in ("dataloader", "cfg", "evaluator"):
            cfg[f"{split}_{key}"] = None
    trainer = cfg.get("trainer") or {}
    cfg.default_hooks.logger.interval = trainer.get("log_every_n_steps", 50)
    cfg.default_hooks.checkpoint.update(interval=trainer.get("check_val_every_n_epoch") or 1, save_last=True)
    backends = list(cfg.visualizer.get("vis_backends") or [])
    if not any(b.get("type") == "TensorboardVisBackend" for b in backends):
        backends.append(dict(type="TensorboardVisBackend"))
    cfg.visualizer.vis_backends = backends
    return cfg


def lightning_options(epochs: int) -> list[str]:
    """``tools/train.py --cfg-options`` for ``epochs`` epochs without validation."""
    return [f"trainer.max_epochs={epochs}", "trainer.limit_val_batches=0"]


def _last_loss_lightning(work_dir: str) -> float | None:
    rows = []
    for path in sorted(glob.glob(osp.join(work_dir, "logs", "**", "metrics.csv"), recursive=True)):
        with open(path, newline="") as f:
            rows += [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    return rows[-1] if rows else None


def _last_loss_runner(work_dir: str) -> float | None:
    losses = []
    for path in sorted(glob.glob(osp.join(work_dir, "*", "vis_data", "scalars.json"))):
        with open(path) as f:
            losses += [json.loads(line)["loss"] for line in f if '"loss"' in line]
    return losses[-1] if losses else None


def mark(epoch: int, steps: int) -> dict:
    """One epoch's end: the epoch count, the optimizer steps done, and this process's wall clock
    (``perf_counter``) and CPU time (user + system) in seconds."""
    return {"epoch": epoch, "steps": steps, "wall_s": time.perf_counter(), "cpu_s": time.process_time()}


def _train_lightning(config: str, work_dir: str, epochs: int, options: list[str]) -> list[dict]:
    """``tools/train.py CONFIG --work-dir W --cfg-options ...`` as its command line runs it (its ``cli``), with a
    callback marking each epoch's end; returns the marks."""
    import lightning as L

    class EpochMarks(L.Callback):
        """``mark`` at the end of each training epoch, before the epoch's checkpoint (Lightning runs the
        checkpoint callbacks last)."""

        def __init__(self):
            self.marks = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.marks.append(mark(trainer.current_epoch + 1, trainer.global_step))

    marks = EpochMarks()
    argv = [config, "--work-dir", work_dir, "--cfg-options", *options, *lightning_options(epochs)]
    tool = runpy.run_path(str(ROOT / "tools" / "train.py"), run_name="train")
    tool["cli"](argv, callbacks=[marks])
    return marks.marks


def _train_runner(config: str, work_dir: str, epochs: int, options: list[str]) -> list[dict]:
    """``Runner.from_cfg(runner_config(cfg)).train()`` with our backbones registered and a hook marking each
    epoch's end; returns the marks."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import backbones  # noqa: F401  (registers STViT / HAT-Net in mmdet's and mmseg's MODELS)
    from tasks.config.load import load_config, parse_cfg_options

    class RunnerEpochMarks(Hook):
        """``mark`` after each training epoch, before the checkpoint hook (priority LOW, the CheckpointHook's
        VERY_LOW): where Lightning's mark falls too, so neither loop counts its final checkpoint."""

        def __init__(self):
            self.marks = []

        def after_train_epoch(self, runner):
            self.marks.append(mark(runner.epoch + 1, runner.iter))  # the loop counts the epoch after the hooks

    cfg = load_config(config, parse_cfg_options(options))
    runner = Runner.from_cfg(runner_config(cfg, work_dir, epochs))
    marks = RunnerEpochMarks()
    runner.register_hook(marks, priority="LOW")
    runner.train()
    return marks.marks


def run_loop(argv: list[str]) -> dict:
    """The body of ``python -m perf.training.loop LOOP OUT.json CONFIG WORK_DIR EPOCHS [KEY=VALUE ...]``: train, then
    write to OUT.json this process's peak memory (GiB), CPU time (s), steps done, last logged loss and the
    marks of each epoch's end (``mark``)."""
    from perf.memory import peak_rss_gib

    loop, out, config, work_dir, epochs, *options = argv
    train = {"lightning": _train_lightning, "runner": _train_runner}[loop]
    marks = train(config, work_dir, int(epochs), options)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "peak_gib": peak_rss_gib(),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "steps": marks[-1]["steps"] if marks else 0,
        "last_loss": (_last_loss_lightning if loop == "lightning" else _last_loss_runner)(work_dir),
        "marks": marks,
    }
    from backbones.checkpoints.atomic import atomic_write

    atomic_write(out, lambda f: f.write(json.dumps(result).encode()))
    return result


def measure(loop: str, config: str, work_dir: str, epochs: int, threads: int, options: list[str]) -> dict:
    """One whole process training ``config`` with ``loop`` for ``epochs`` epochs on ``threads`` threads;
    its wall time, peak memory, CPU time, steps and last loss. Output goes to ``work_dir/run.log``."""
    os.makedirs(work_dir, exist_ok=True)
    out, log = osp.join(work_dir, "result.json"), osp.join(work_dir, "run.log")
    cmd = [sys.executable, "-m", "perf.training.loop", loop, out, osp.abspath(config), work_dir, str(epochs), *options]
    threads_env = {k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env = {**os.environ, "PYTHONPATH": str(ROOT), **threads_env}
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=work_dir).returncode
    wall = time.perf_counter() - start
    if code != 0 or not osp.isfile(out):
        with open(log) as f:
            tail = "".join(f.readlines()[-30:])
        raise RuntimeError(f"the {loop} run in {work_dir} failed (exit status {code}); the end of {log}:\n{tail}")
    with open(out) as f:
        return {"loop": loop, "epochs": epochs, "wall_s": wall, **json.load(f)}


def slope(run: dict, epochs: tuple[int, int], key: str) -> float:
    """Seconds per optimizer step of one run between its marks after ``epochs`` = (short, long) epochs
    (``key``: ``wall_s`` or ``cpu_s``); start-up and the first epochs lie before both marks and cancel."""
    at = {m["epoch"]: m for m in run["marks"]}
    missing = [n for n in epochs if n not in at]
    if missing:
        raise ValueError(f"the {run['loop']} run marked epochs {sorted(at)}, not {missing}: did it stop early?")
    short, long = at[epochs[0]], at[epochs[1]]
    steps = long["steps"] - short["steps"]
    if steps <= 0:
        raise ValueError(
            f"the {run['loop']} run did {long['steps']} steps after {epochs[1]} epochs, {short['steps']} after "
            f"{epochs[0]}: nothing to compare"
        )
    return (long[key] - short[key]) / steps


def compare(
    config: str,
    data_root: str,
    work_root: str,
    epochs: tuple[int, int],
    rounds: int,
    threads: int,
    cfg_options: list[str] = (),
    warmup: int = 1,
    seed_per_round: bool = True,
    log=print,
) -> dict:
    """``rounds`` rounds of one run of each loop for the long number of epochs, alternating which loop goes
    first, after ``warmup`` unmeasured short runs of each loop.

    Args:
        config: the config both loops train (its ``*_dataloader.dataset.data_root`` set to ``data_root``).
        data_root: the dataset folder (e.g. ``data/tiny_coco``).
        work_root: where each run's work dir goes (``ROUND_LOOP_EPOCHS``).
        epochs: the (short, long) numbers of epochs: each run trains the long one, and the time per step is the
            slope between its marks after the short and after the long number of epochs.
        rounds: how many rounds.
        threads: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of every run.
        cfg_options: more ``KEY=VALUE`` config overrides for both loops (after the data root's).
        warmup: short runs of each loop before the first round, not counted: the first process after an install
            or a reboot compiles bytecode and reads the libraries from disk, which made round 0's first run
            seconds slower than the same run later.
        seed_per_round: round ``r`` trains both loops with ``randomness.seed=r`` (before ``cfg_options``, which
            may fix it). One seed gives both loops the same batches (mmengine's ``DefaultSampler`` and our
            ``ResumableSampler`` both shuffle by ``randperm(seed + epoch)``) but not the same random draws
            (initial weights, flips, the RoI heads' samplers), and those change the work of a step (e.g. how
            many positive RoIs the mask head runs on). With one seed every round repeats the same draws, so
            they cannot show in the spread; a seed per round lets them.
        log: called with one line per finished run.

    Returns a report: every run (with its epoch marks), each loop's per-step wall and CPU time per round, and per
    round the ratios lightning / runner of the per-step wall time, per-step CPU time and peak memory.
    """
    data = data_options(osp.abspath(data_root))
    runs: dict = {loop: [] for loop in LOOPS}
    warmups = []
    for w in range(warmup):
        for loop in LOOPS:
            work_dir = osp.abspath(osp.join(work_root, f"warmup{w}_{loop}"))
            res = measure(loop, config, work_dir, epochs[0], threads, [*data, *cfg_options])
            warmups.append(res)
            log(f"warm-up {loop:9s} {epochs[0]} epochs: {res['wall_s']:.1f} s wall (not counted)")
    for r in range(rounds):
        order = LOOPS if r % 2 == 0 else LOOPS[::-1]
        seed = [f"randomness.seed={r}"] if seed_per_round else []
        for loop in order:
            work_dir = osp.abspath(osp.join(work_root, f"{r}_{loop}_{epochs[1]}"))
            res = measure(loop, config, work_dir, epochs[1], threads, [*data, *seed, *cfg_options])
            runs[loop].append({"round": r, **res})
            log(
                f"round {r} {loop:9s} {epochs[1]} epochs: {res['steps']} steps, {res['wall_s']:.1f} s wall, "
                f"{res['cpu_s']:.1f} s CPU, peak {res['peak_gib']:.2f} GiB, last loss {res['last_loss']}"
            )
    per_step = {key: {loop: [slope(run, epochs, key) for run in runs[loop]] for loop in LOOPS} for key in MARKED}
    ratios = {
        "time": [a / b for a, b in zip(per_step["wall_s"]["lightning"], per_step["wall_s"]["runner"])],
        "cpu_time": [a / b for a, b in zip(per_step["cpu_s"]["lightning"], per_step["cpu_s"]["runner"])],
        "peak_memory": [a["peak_gib"] / b["peak_gib"] for a, b in zip(runs["lightning"], runs["runner"])],
    }
    return {
        "config": config,
        "epochs": list(epochs),
        "threads": threads,
        "rounds": rounds,
        "seed_per_round": seed_per_round,
        "warmup": warmups,
        "runs": runs,
        "per_step_s": per_step["wall_s"],
        "per_step_cpu_s": per_step["cpu_s"],
        "ratios": ratios,
    }


def spread(values: list[float], digits: int = 2) -> str:
    """``median (min .. max)``."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f} .. {max(values):.{digits}f})"


if __name__ == "__main__":
    run_loop(sys.argv[1:])
