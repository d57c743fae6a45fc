#!/usr/bin/env python
"""Read every sample of a config's datasets once, in parallel, and report every problem before a run starts.

  python tools/check_data.py CONFIG [--cfg-options KEY=VALUE ...] [--splits train,val,test] [--workers N] \
      [--out report.json]

Images missing, empty, truncated, corrupt or not images, of another size than their annotation says; COCO boxes
outside their image or of zero size, polygons of fewer than three points, unknown categories; label maps of another
size than their image, with values outside the classes and the ignore index, or unreadable (tasks/data/scan.py).
Each problem is printed with its file and the fix; --out writes them all as JSON. Exit status 1 when a problem is
found, 0 otherwise. docs/reliability.md says what is checked and how fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from backbones.checkpoints.atomic import check_writable, write_json
from tasks.config.load import add_cfg_options, load_config
from tasks.data.scan import SPLITS, scan, summary
from tasks.runtime.cli import command_line


@command_line
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="an mmengine config (detection or segmentation)")
    p.add_argument("--splits", default=",".join(SPLITS), help="comma-separated splits to read (default: all)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: the CPU cores)")
    p.add_argument("--out", help="write the report (every problem) as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cfg_options(p)
    args = p.parse_args(argv)
    splits = [s for s in args.splits.split(",") if s]
    if not splits or set(splits) - set(SPLITS):
        p.error(f"--splits takes a comma-separated list of {', '.join(SPLITS)}, got {args.splits!r}")
    if args.workers < 1:
        p.error(f"--workers must be at least 1, got {args.workers}")
    cfg = load_config(args.config, args.cfg_options, training=False)
    if args.out:
        check_writable(args.out)
    report = scan(cfg, cfg.get("default_scope"), splits, args.workers, progress=not args.no_progress)
    report["config"] = args.config
    if args.out:
        write_json(args.out, report)
    print("\n".join(summary(report)))
    return report


def cli(argv=None) -> None:
    """``main``, then exit with status 1 when a problem was found, 0 otherwise."""
    sys.exit(1 if main(argv)["problems"] else 0)


if __name__ == "__main__":
    cli()
