#!/usr/bin/env python
"""Predict on your own images with a trained detector / segmentor: one overlay and one JSON per image.

    python tools/infer.py CONFIG CKPT INPUT [INPUT ...] --out-dir DIR [--batch-size N] [--device cpu|cuda]
                          [--score-thr T] [--cfg-options KEY=VALUE ...]

CONFIG is the config the model was trained with. CKPT is a Lightning checkpoint of tools/train.py, an mm-format
model (tools/export_model.py) or a backbone export (tools/export_backbone.py: only the backbone is loaded). INPUTs
are image files, folders (their images) and glob patterns (quote them: 'photos/**/*.jpg').

DIR receives, in mmdet's DetInferencer layout, ``vis/<image file name>`` (the predictions drawn on the image) and
``preds/<image stem>.json`` (DetInferencer's / MMSegInferencer's result: labels, scores, boxes and RLE masks, or the
class-index map ``sem_seg``; segmentation also writes it as ``preds/<image stem>.png``). See docs/inference.md.
"""

from __future__ import annotations

import argparse

from tasks.config.load import add_cfg_options, torch_device
from tasks.deploy.inference import run_inference
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="the mmengine config the model was trained with")
    parser.add_argument(
        "checkpoint", help="Lightning .ckpt, mm-format .pth or backbone export: a path or an http(s) URL"
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="image files, folders or glob patterns")
    parser.add_argument("--out-dir", required=True, help="output folder (vis/ and preds/ are written in it)")
    parser.add_argument("--batch-size", type=int, default=1, help="images per forward pass (default: 1)")
    parser.add_argument("--device", type=torch_device, help="cpu, cuda, cuda:1... (default: a GPU when there is one)")
    parser.add_argument(
        "--score-thr", type=float, default=0.3, help="draw detections above this score (all are in the JSON)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cfg_options(parser, "override config keys, e.g. model.test_cfg.rcnn.score_thr=0.5 (values parsed as literals)")
    return parser.parse_args(argv)


@command_line
def main(argv=None) -> list[str]:
    args = parse_args(argv)
    images = run_inference(
        args.config,
        args.checkpoint,
        args.inputs,
        args.out_dir,
        batch_size=args.batch_size,
        device=args.device,
        score_thr=args.score_thr,
        cfg_options=args.cfg_options,
        progress=not args.no_progress,
    )
    print(f"{len(images)} image(s): overlays in {args.out_dir}/vis, predictions in {args.out_dir}/preds")
    return images


if __name__ == "__main__":
    main()
