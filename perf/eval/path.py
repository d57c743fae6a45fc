"""Process memory of the whole evaluation path a user runs: ``tools/test.py`` and validation inside
``tools/train.py``, against the same path with mmdet's / mmseg's own metric in place of ours.

Each run is a child process (``python -m perf.eval.path --child ...``) that calls the tool's ``main`` with
two extra Lightning callbacks: ``RssTrace`` (this process's RSS at the start of every evaluation epoch, after
each batch, at the end of the loop and after the metric's compute) and, for the baseline, ``MMMetric``, which
switches our evaluator off (``evaluate_test = False``) and feeds the library's metric (``CocoMetric`` /
``IoUMetric``, with ``format_only`` for ``--format-only`` runs) as mmengine's ``Evaluator`` feeds it: the
``to_dict()`` of every predicted sample. Everything else (data loading, the model's predict and its
post-processing, Lightning's loop and callbacks) is the same code in both runs, so the difference is the
metric. The data are the tiny-data generator's (``tools/make_tiny_data.py``), the model the demo config's at
its initial weights with a test config that keeps 100 detections per image (masks at image size).

Growth is measured from the RSS at the start of the evaluation epoch (after the first batch for ``loop``,
so that the model's first-call allocations are not counted): ``loop`` to the end of the prediction loop,
``peak`` to the highest RSS of the epoch, metric compute included. A child stops with an error when its RSS
passes ``rss_limit_gib``, so that an unbounded growth cannot take the machine down. The callbacks are
``perf.eval.callbacks``'s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

from ..child import ROOT, python_env
from ..memory import peak_rss_gib
from .callbacks import MMMetric, RssTrace

DET_CONFIG = str(ROOT / "configs/demo/mask-rcnn_stvit-demo_fpn_tiny-coco.py")
SEG_CONFIG = str(ROOT / "configs/demo/upernet_hat-net-demo_tiny-ade20k.py")
# The demo Mask R-CNN at its initial weights keeps 100 detections per image (COCO's maxDets): every
# proposal's class scores pass a zero threshold, and 300 proposals leave more than 100 boxes after NMS.
DET_100_OPTIONS = (
    "model.test_cfg.rcnn.score_thr=0.0",
    "model.test_cfg.rcnn.max_per_img=100",
    "model.test_cfg.rpn.max_per_img=300",
    "model.test_cfg.rpn.nms_pre=1000",
)


def load_tool(name: str):
    """``tools/NAME.py`` of this checkout as a module (tools/ is not a package; ``test`` would shadow the
    stdlib's)."""
    path = str(ROOT / "tools" / f"{name}.py")
    if not osp.isfile(path):
        raise FileNotFoundError(f"{path} not found: perf.eval.path runs the tools of a source checkout")
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- child process --------------------------------------------------------------------------------------
def _child(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m perf.eval.path --child")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--tool", choices=["test", "train"], required=True)
    parser.add_argument("--impl", choices=["ours", "mm", "mm-format"], default="ours")
    parser.add_argument("--trace", required=True, help="JSON file for the trace")
    parser.add_argument("--limit-gib", type=float)
    parser.add_argument("tool_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    tool_args = args.tool_args[1:] if args.tool_args[:1] == ["--"] else args.tool_args
    trace = RssTrace(args.limit_gib)
    callbacks = [trace]
    if args.impl != "ours":
        callbacks.append(MMMetric(format_only=args.impl == "mm-format"))
    t0, error, metrics = time.perf_counter(), None, {}
    try:
        result = load_tool(args.tool).main(tool_args, callbacks=callbacks)
        metrics = {k: v for k, v in (result or {}).items() if k != "per_class"}
    except MemoryError as e:
        error = str(e)
    if args.impl != "ours":
        metrics = callbacks[1].metrics
    out = dict(
        tool=args.tool,
        impl=args.impl,
        epochs=trace.epochs,
        metrics=metrics,
        error=error,
        wall_s=time.perf_counter() - t0,
        process_peak=peak_rss_gib(),
    )
    with open(args.trace, "w") as f:
        json.dump(out, f)


def _write_checkpoint(config: str, path: str, options: list[str]) -> None:
    import torch

    from tasks import build_task
    from tasks.config.load import load_config, parse_cfg_options

    cfg = load_config(config, parse_cfg_options(options))
    torch.manual_seed(0)
    module, _ = build_task(cfg, init_weights=True)
    torch.save({"state_dict": module.model.state_dict()}, path)


# ---- driver -------------------------------------------------------------------------------------------
def make_data(root: str, coco_val: int = 0, ade_val: int = 0, coco_train: int = 1, ade_train: int = 1) -> str:
    """The tiny COCO / ADE20K sets of ``tools/make_tiny_data.py`` under ``root`` (kept when a previous call
    wrote the same sizes); returns ``root``."""
    spec = dict(coco_val=coco_val, ade_val=ade_val, coco_train=coco_train, ade_train=ade_train)
    stamp = osp.join(root, "eval_path_data.json")
    if osp.isfile(stamp):
        with open(stamp) as f:
            if json.load(f) == spec:
                return root
    tiny = load_tool("make_tiny_data")  # in this process: a child would pay the imports again (seconds of CPU)
    tiny.make_coco(root, coco_train, max(coco_val, 1), 0)
    tiny.make_ade20k(root, ade_train, max(ade_val, 1), 0)
    with open(stamp, "w") as f:
        json.dump(spec, f)
    return root


def run_child(tool: str, impl: str, tool_args: list[str], work: str, label: str, limit_gib: float | None) -> dict:
    """One child process; returns its trace (``error`` set when it stopped at the RSS limit). Its output goes
    to ``work/LABEL.log``."""
    trace = osp.join(work, f"{label}.json")
    cmd = [sys.executable, "-m", "perf.eval.path", "--child", "--tool", tool, "--impl", impl, "--trace", trace]
    if limit_gib is not None:
        cmd += ["--limit-gib", str(limit_gib)]
    with open(osp.join(work, f"{label}.log"), "w") as log:
        proc = subprocess.run([*cmd, "--", *tool_args], env=python_env(), stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: child exited with status {proc.returncode}; see {osp.join(work, label)}.log")
    with open(trace) as f:
        return json.load(f)


def checkpoint(config: str, options: list[str], path: str) -> str:
    """A plain checkpoint of the config's model at its initial weights (seed 0), written once, in this process
    (nothing here is measured)."""
    if not osp.isfile(path):
        _write_checkpoint(config, path, options)
    return path


def _summary(trace: dict, epoch: int = -1) -> dict:
    e = trace["epochs"][epoch]
    return dict(
        images=e["images"],
        dets_per_image=e.get("dets", 0) / max(1, e["images"]),
        start=e["start"],
        loop_growth=e["loop_end"] - e["first"],
        end_growth=e["end"] - e["start"],
        peak_growth=e["peak"] - e["start"],
        peak=e["peak"],
        loop_s=e["loop_s"],
        total_s=e["total_s"],
    )


def measure_test(
    task: str,
    images: int,
    rounds: int,
    work: str,
    format_only: bool = False,
    limit_gib: float | None = 3.5,
    impls: tuple[str, ...] = ("ours", "mm"),
) -> list[dict]:
    """``tools/test.py`` on ``images`` generated images (``task`` 'det': Mask R-CNN with 100 masks per image;
    'seg': UPerNet), ``impls`` (ours and the mm metric) alternating for ``rounds`` rounds; one summary per run."""
    os.makedirs(work, exist_ok=True)
    root = osp.join(work, "data")
    make_data(root, coco_val=images if task == "det" else 0, ade_val=images if task == "seg" else 0)
    config, dataset = (DET_CONFIG, "tiny_coco") if task == "det" else (SEG_CONFIG, "tiny_ade20k")
    options = list(DET_100_OPTIONS) if task == "det" else []
    ckpt = checkpoint(config, options, osp.join(work, f"{task}_init.pth"))
    options += [f"test_dataloader.dataset.data_root={osp.join(root, dataset)}/", "trainer.enable_progress_bar=False"]
    runs = []
    for r in range(rounds):
        for impl in impls:
            label = f"{task}_{'format' if format_only else 'eval'}_{impl}_{r}"
            out_dir = osp.join(work, label)
            args = [config, ckpt, "--work-dir", out_dir, "--cfg-options", *options]
            if format_only and impl == "ours":
                args = [*args[:4], "--format-only", "--out-dir", osp.join(out_dir, "submission"), *args[4:]]
            trace = run_child(
                "test", "mm-format" if format_only and impl == "mm" else impl, args, work, label, limit_gib
            )
            shutil.rmtree(out_dir, ignore_errors=True)
            runs.append(dict(label=label, impl=impl, round=r, error=trace["error"], metrics=trace["metrics"]))
            if trace["epochs"] and "end" in trace["epochs"][-1]:
                runs[-1].update(_summary(trace))
    return runs


def measure_validation(
    images: int, epochs: int, work: str, limit_gib: float | None = 3.5, train_images: int = 8
) -> dict:
    """``tools/train.py`` on the demo Mask R-CNN with ``images`` generated validation images (100 masks each),
    a validation after each of ``epochs`` short epochs (``train_images`` training images, batches of 4); the RSS
    after each validation."""
    os.makedirs(work, exist_ok=True)
    root = make_data(osp.join(work, "data_val"), coco_val=images, coco_train=train_images)
    coco = osp.join(root, "tiny_coco") + "/"
    options = [
        *DET_100_OPTIONS,
        f"train_dataloader.dataset.data_root={coco}",
        f"val_dataloader.dataset.data_root={coco}",
        f"trainer.max_epochs={epochs}",
        "trainer.check_val_every_n_epoch=1",
        "trainer.log_every_n_steps=1",  # epochs of one step: Lightning warns about a longer interval
        "trainer.enable_progress_bar=False",
    ]
    out_dir = osp.join(work, "train_val")
    trace = run_child(
        "train", "ours", [DET_CONFIG, "--work-dir", out_dir, "--cfg-options", *options], work, "train_val", limit_gib
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    epochs_out = [_summary(trace, k) for k in range(len(trace["epochs"]))]
    after = [e["end"] for e in trace["epochs"]]
    return dict(error=trace["error"], epochs=epochs_out, after_validation=after, ratio_last_first=after[-1] / after[0])


if __name__ == "__main__":
    if "--child" in sys.argv[1:2]:
        _child(sys.argv[1:])
