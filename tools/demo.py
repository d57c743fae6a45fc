#!/usr/bin/env python
"""The main job on a fresh machine: make the tiny datasets, train and evaluate one STViT detection run
and one HAT-Net segmentation run on them, draw the predictions and the backbones' attention maps, and say
where everything is.

    python tools/demo.py [--work-dir work_dirs/demo] [--data data] [--cfg-options KEY=VALUE ...]

Each step is the same command a user would type (tools/make_tiny_data.py, tools/train.py, tools/test.py,
tools/visualize_attention.py, tools/plot_curves.py), printed before it runs. The steps run in this process, one
after the other, as the scripts' own ``__main__``: each fresh interpreter would import torch, Lightning and the
mm packages again (seconds of CPU each: docs/measuring.md). Relative paths are taken from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tasks.evaluation.analysis import run_script

ROOT = Path(__file__).resolve().parents[1]
RUNS = [  # (name, config, metric that the demo must reach, threshold)
    ("detection (STViT, Mask R-CNN)", "configs/demo/mask-rcnn_stvit-demo_fpn_tiny-coco.py", "bbox_mAP_50", 0.3),
    ("segmentation (HAT-Net, UperNet)", "configs/demo/upernet_hat-net-demo_tiny-ade20k.py", "mIoU", 0.4),
]

VAL_IMAGES = {"mask-rcnn": "val2017", "upernet": "images/validation"}  # where the attention maps' image comes from


def run(script: str, args: list[str]) -> None:
    """``python SCRIPT ARGS`` in this process; a failing step stops the demo naming it."""
    print("+", sys.executable, script, *args, flush=True)
    try:
        run_script(str(ROOT / script), args)
    except SystemExit as e:  # a tool's bad-input message is its exit code (tasks.runtime.cli): not printed yet
        if e.code not in (None, 0):
            why = e.code if isinstance(e.code, str) else f"exit status {e.code}; its output is above"
            raise SystemExit(f"demo: {script} failed ({why})") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default="work_dirs/demo")
    parser.add_argument("--data", default="data")
    parser.add_argument("--cfg-options", nargs="+", default=[], help="passed to both train and test")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # the relative paths below and in the configs are the repository's
    work, data = Path(args.work_dir), Path(args.data)
    if not (data / "tiny_coco").is_dir() or not (data / "tiny_ade20k").is_dir():
        run("tools/make_tiny_data.py", ["--out", str(data)])
    roots = {"mask-rcnn": data / "tiny_coco", "upernet": data / "tiny_ade20k"}
    summary, ok = [], True
    for name, config, key, threshold in RUNS:
        stem = Path(config).stem
        run_dir = work / stem
        root = str(roots[stem.split("_")[0]]) + "/"
        options = [f"{split}_dataloader.dataset.data_root={root}" for split in ("train", "val", "test")]
        options += args.cfg_options
        t0 = time.time()
        run("tools/train.py", [config, "--work-dir", str(run_dir), "--cfg-options", *options])
        train_s = time.time() - t0
        run(
            "tools/test.py",
            [
                config,
                str(run_dir / "last.ckpt"),
                "--work-dir",
                str(run_dir),
                "--out",
                str(run_dir / "test_metrics.json"),
                "--show-dir",
                str(run_dir / "vis"),
                "--cfg-options",
                *options,
            ],
        )
        image = sorted((roots[stem.split("_")[0]] / VAL_IMAGES[stem.split("_")[0]]).glob("*.jpg"))[0]
        run(
            "tools/visualize_attention.py",
            [
                config,
                str(run_dir / "last.ckpt"),
                str(image),
                "--out-dir",
                str(run_dir / "attention"),
                "--cfg-options",
                *options,
            ],
        )
        run("tools/plot_curves.py", [str(run_dir), "--out", str(run_dir / "training_curves.png")])
        metrics = json.loads((run_dir / "test_metrics.json").read_text())
        passed = metrics.get(key, 0.0) >= threshold
        ok &= passed
        summary.append((name, metrics, key, threshold, passed, train_s, run_dir))
    print("\n=== demo results ===")
    for name, metrics, key, threshold, passed, train_s, run_dir in summary:
        shown = ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, (int, float)))
        print(f"{name}: {shown}  (trained in {train_s / 60:.1f} min)")
        print(f"  {key} >= {threshold}: {'yes' if passed else 'NO'}")
        print(
            f"  metrics: {run_dir / 'test_metrics.json'}  pictures: {run_dir / 'vis'}/  "
            f"checkpoints and logs: {run_dir}/"
        )
        print(f"  attention maps (tools/visualize_attention.py): {run_dir / 'attention'}/")
        print(f"  training curves (tools/plot_curves.py): {run_dir / 'training_curves.png'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
