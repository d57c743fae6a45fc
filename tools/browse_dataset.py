#!/usr/bin/env python
"""The images of a dataset split as the model sees them, with their annotations drawn: one PNG per image.

  python tools/browse_dataset.py CONFIG --out-dir DIR [--phase train|val|test] [--n N] [--cfg-options KEY=VALUE ...]

Each image goes through the split's pipeline of CONFIG (resize, flip, crop... as in training for --phase train)
and is drawn with its ground truth by mmdet's DetLocalVisualizer (boxes, masks, class names) or mmseg's
SegLocalVisualizer (the class map and its names). See docs/pictures.md.
"""

from __future__ import annotations

import argparse

from backbones.checkpoints.atomic import check_writable
from tasks.config.load import add_cfg_options, load_config
from tasks.figures.browse import PHASES, browse_dataset
from tasks.runtime.cli import command_line


@command_line
def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="an mmengine config (detection or segmentation)")
    p.add_argument("--out-dir", required=True, help="folder for the PNGs (created)")
    p.add_argument("--phase", choices=PHASES, default="train", help="which split and pipeline (default: train)")
    p.add_argument("--n", type=int, help="draw the first N images only (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cfg_options(p)
    args = p.parse_args(argv)
    if args.n is not None and args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    cfg = load_config(args.config, args.cfg_options, training=False)
    check_writable(args.out_dir, folder=True)
    written = browse_dataset(cfg, args.out_dir, args.phase, args.n, progress=not args.no_progress)
    print(f"wrote {len(written)} picture(s) of the {args.phase} split to {args.out_dir}")
    return written


if __name__ == "__main__":
    main()
