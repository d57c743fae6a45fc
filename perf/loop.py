"""The training loop against mmengine's Runner: one config trained by ``tools/train.py`` (Lightning) and by
``Runner.from_cfg`` (what ``mim train mmdet CONFIG`` runs), each as a whole process, for a short and a long
number of epochs. The per-iteration time is the slope between the two (start-up cancels); peak memory is the
process's high-water mark.

Both loops do the same work: the same data (``--data``), batch size, optimizer, clipping, schedules and
seed; no validation (Lightning: ``trainer.limit_val_batches=0``; Runner: no val loop); checkpoints when
Lightning writes them (its ``ModelCheckpoint`` saves with each validation, every ``check_val_every_n_epoch``
epochs, and at the end: the Runner's ``CheckpointHook`` gets that interval and ``save_last``); logging
every ``trainer.log_every_n_steps`` iterations (the Runner's ``LoggerHook`` interval is set to it), to CSV +
TensorBoard (Lightning) and to the text log + scalars JSON + TensorBoard (the Runner, given mmengine's
``TensorboardVisBackend``). The same ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` reach both processes.

Each run is ``python -m perf.loop LOOP OUT.json ...`` (``run_loop``): the loop runs in that process, which then
writes its peak resident memory (VmHWM: the high-water mark of this process's own address space, which
``ru_maxrss`` is not, see perf/memory.py), its CPU time, the optimizer steps done and the last logged loss.
The wall time is measured around the whole process by the caller (``measure``).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ("lightning", "runner")
SPLITS = ("train", "val", "test")


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


def _train_lightning(config: str, work_dir: str, epochs: int, options: list[str]):
    """``tools/train.py CONFIG --work-dir W --cfg-options ...`` as its command line runs it; returns a function
    that gives the optimizer steps done, read from the ``last.ckpt`` it wrote (called once the peak memory is
    taken: loading the checkpoint is the measurement's, not the loop's)."""
    from tasks.training.checkpoint_io import load_checkpoint_safely

    argv = [config, "--work-dir", work_dir, "--cfg-options", *options, *lightning_options(epochs)]
    sys.argv = [str(ROOT / "tools" / "train.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return lambda: int(load_checkpoint_safely(osp.join(work_dir, "last.ckpt"))["global_step"])


def _train_runner(config: str, work_dir: str, epochs: int, options: list[str]):
    """``Runner.from_cfg(runner_config(cfg)).train()`` with our backbones registered; returns a function that
    gives the steps done."""
    from mmengine.runner import Runner

    import backbones  # noqa: F401  (registers STViT / HAT-Net in mmdet's and mmseg's MODELS)
    from tasks.config import load_config, parse_cfg_options

    cfg = load_config(config, parse_cfg_options(options))
    runner = Runner.from_cfg(runner_config(cfg, work_dir, epochs))
    runner.train()
    steps = runner.iter
    return lambda: steps


def run_loop(argv: list[str]) -> dict:
    """The body of ``python -m perf.loop LOOP OUT.json CONFIG WORK_DIR EPOCHS [KEY=VALUE ...]``: train, then
    write to OUT.json this process's peak memory (GiB), CPU time (s), steps done and last logged loss."""
    from perf.memory import peak_rss_gib

    loop, out, config, work_dir, epochs, *options = argv
    train = {"lightning": _train_lightning, "runner": _train_runner}[loop]
    steps_done = train(config, work_dir, int(epochs), options)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = peak_rss_gib()  # before anything this measurement reads
    result = {
        "peak_gib": peak,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "steps": steps_done(),
        "last_loss": (_last_loss_lightning if loop == "lightning" else _last_loss_runner)(work_dir),
    }
    from backbones.atomic import atomic_write

    atomic_write(out, lambda f: f.write(json.dumps(result).encode()))
    return result


def measure(loop: str, config: str, work_dir: str, epochs: int, threads: int, options: list[str]) -> dict:
    """One whole process training ``config`` with ``loop`` for ``epochs`` epochs on ``threads`` threads;
    its wall time, peak memory, CPU time, steps and last loss. Output goes to ``work_dir/run.log``."""
    os.makedirs(work_dir, exist_ok=True)
    out, log = osp.join(work_dir, "result.json"), osp.join(work_dir, "run.log")
    cmd = [sys.executable, "-m", "perf.loop", loop, out, osp.abspath(config), work_dir, str(epochs), *options]
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


def slope(short: dict, long: dict, key: str) -> float:
    """Seconds per optimizer step between a short and a long run of one loop (start-up cancels)."""
    steps = long["steps"] - short["steps"]
    if steps <= 0:
        raise ValueError(f"the long run did {long['steps']} steps, the short one {short['steps']}: nothing to compare")
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
    """``rounds`` rounds of (short, long) runs of both loops, alternating which loop goes first, after
    ``warmup`` unmeasured short runs of each loop.

    Args:
        config: the config both loops train (its ``*_dataloader.dataset.data_root`` set to ``data_root``).
        data_root: the dataset folder (e.g. ``data/tiny_coco``).
        work_root: where each run's work dir goes (``ROUND_LOOP_EPOCHS``).
        epochs: the (short, long) numbers of epochs.
        rounds: how many rounds.
        threads: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` of every run.
        cfg_options: more ``KEY=VALUE`` config overrides for both loops (after the data root's).
        warmup: short runs of each loop before the first round, not counted: the first process after an
            install or a reboot compiles bytecode and reads the libraries from disk, which made round 0's
            first run seconds slower than the same run later and skewed that round's slope.
        seed_per_round: round ``r`` trains both loops with ``randomness.seed=r`` (before ``cfg_options``, which
            may fix it). One seed gives both loops the same batches (mmengine's ``DefaultSampler`` and our
            ``ResumableSampler`` both shuffle by ``randperm(seed + epoch)``) but not the same random draws
            (initial weights, flips, the RoI heads' samplers), and those change the work of a step (e.g. how
            many positive RoIs the mask head runs on). With one seed every round repeats the same draws, so
            they cannot show in the spread; a seed per round lets them.
        log: called with one line per finished run.

    Returns a report: every run, each loop's per-step wall and CPU time per round, and per round the ratios
    lightning / runner of the per-step wall time, per-step CPU time and peak memory (of the long runs).
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
        round_options = [*data, *seed, *cfg_options]
        for n in epochs:
            for loop in order:
                work_dir = osp.abspath(osp.join(work_root, f"{r}_{loop}_{n}"))
                res = measure(loop, config, work_dir, n, threads, round_options)
                runs[loop].append({"round": r, **res})
                log(
                    f"round {r} {loop:9s} {n} epochs: {res['steps']} steps, {res['wall_s']:.1f} s wall, "
                    f"{res['cpu_s']:.1f} s CPU, peak {res['peak_gib']:.2f} GiB, last loss {res['last_loss']}"
                )
    per_step = {
        key: {loop: [slope(*runs[loop][2 * r : 2 * r + 2], key) for r in range(rounds)] for loop in LOOPS}
        for key in ("wall_s", "cpu_s")
    }
    ratios = {
        "time": [a / b for a, b in zip(per_step["wall_s"]["lightning"], per_step["wall_s"]["runner"])],
        "cpu_time": [a / b for a, b in zip(per_step["cpu_s"]["lightning"], per_step["cpu_s"]["runner"])],
        "peak_memory": [a["peak_gib"] / b["peak_gib"] for a, b in zip(runs["lightning"][1::2], runs["runner"][1::2])],
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
