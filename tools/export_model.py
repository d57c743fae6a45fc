#!/usr/bin/env python
"""Turn a Lightning checkpoint from tools/train.py into mm's own checkpoint format.

    python tools/export_model.py CHECKPOINT --out FILE.pth [--config CONFIG] [--raw-weights]

The output is ``{'state_dict': model tensors (no 'model.' prefix), 'meta': {'dataset_meta': {classes,
palette, ...}, 'cfg': config text, 'epoch', 'iter', 'metrics', ...}}``, the layout mmengine's Runner writes:
with the config it loads in mmdet's ``init_detector`` / ``DetInferencer`` and mmseg's ``init_model`` /
``MMSegInferencer``, which take the class names and palette from ``meta['dataset_meta']``. The tensors
are checked against the model the config builds (same keys, same shapes) before anything is written;
the file is written atomically and exporting twice gives identical bytes.

A checkpoint of a run with model EMA (``custom_hooks = [dict(type='EMAHook', ...)]``) gives the averaged weights,
in mmengine's EMAHook layout (the raw ones under ``ema_state_dict``); ``--raw-weights`` gives the raw ones alone.
"""

from __future__ import annotations

import argparse

from tasks.deploy.export import WEIGHTS, export_model, format_metrics
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="Lightning .ckpt from tools/train.py: a path or an http(s) URL")
    parser.add_argument("--out", required=True, help="output .pth file")
    parser.add_argument("--config", help="training config (needed when the checkpoint does not store it)")
    parser.add_argument(
        "--raw-weights",
        action="store_true",
        help="from a checkpoint with model EMA (custom_hooks EMAHook), the raw trained weights instead of the average",
    )
    return parser.parse_args(argv)


@command_line
def main(argv=None) -> dict:
    args = parse_args(argv)
    meta = export_model(args.checkpoint, args.out, args.config, raw_weights=args.raw_weights)
    classes = meta["dataset_meta"].get("classes") or ()
    print(
        f"wrote {args.out}: {WEIGHTS[meta['weights']]}, {len(classes)} classes, step {meta['iter']}, "
        f"epoch {meta['epoch']}, "
        f"metrics: {format_metrics(meta['metrics']) or 'none'}\nsha256 of the tensors: {meta['sha256']}"
    )
    return meta


if __name__ == "__main__":
    main()
