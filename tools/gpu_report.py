#!/usr/bin/env python
"""GPU evidence in one run: exactness, the detection-size training step, throughput and torch.compile, as one
Markdown report (written to --out and printed).

  PYTHONPATH=. python tools/gpu_report.py --device cuda --out gpu_report.md \\
      [--official STViT/models/stvit.py] [--official HAT-Net/HAT_Net.py]
  python tools/gpu_report.py --device cpu --quick --out report.md   # smoke run: small sizes, few iterations

It needs only torch, ``backbones``, ``perf`` and (for Swin-T) mmdet, timm or torchvision: no mmengine / mmcv /
mmdet / mmseg is required, so it runs on a machine that has PyTorch and nothing of this project installed
(``PYTHONPATH=.`` in the checkout, as above). The official model files (hhb072/STViT ``models/stvit.py``,
yun-liu/HAT-Net ``HAT_Net.py``) are optional, one ``--official`` each; ``perf/official.py`` loads them and tells
the family from the file, as for ``tools/compare_official.py``. The run is ``perf/gpu/report.py``'s, the
measuring ``perf/gpu/sections.py``'s.

Sections (a row for each registered family's measured variant and each of its named settings, from the family
registry: STViT-S in its preset and the COCO configs' dense setting, HAT-Net-S; the official models when given;
Swin-T):
- exactness: fp32 stage outputs (TF32 off) on --device against our CPU fast paths, against the plain
  formulation (explicit N x N attention) on --device, and against the official code on --device;
- training step: forward + backward of the four stage outputs, bf16 / fp16 (GradScaler) / fp32 autocast;
- throughput: inference images/s as the STViT paper's ``throughput()`` measures it, fp32 and bf16, of every
  released variant;
- torch.compile: the bf16 training step compiled against eager, with the compile time (one child process
  per model, so a compiler crash or hang costs that row only).

Time: CUDA events after warm-up on CUDA (perf_counter on CPU); peak memory: torch.cuda.max_memory_allocated,
reset per row (weights and gradients included). A failing row (out of memory, compile error) is recorded in the
report and the run goes on; rows that would start after --budget-s seconds are skipped with a note.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from backbones import FAMILIES
from perf.gpu.report import SECTIONS, gpu_report
from perf.official import REPOS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="small sizes, few iterations, small variants (CPU smoke run)")
    p.add_argument(
        "--official",
        action="append",
        default=[],
        metavar="FILE",
        help=f"an official model file ({REPOS}); repeat it for each family (optional)",
    )
    p.add_argument(
        "--families",
        help=f"comma-separated registered families whose rows to measure (default: all, {','.join(FAMILIES)})",
    )
    p.add_argument("--out", help="write the Markdown report here too (it is always printed)")
    p.add_argument(
        "--budget-s",
        type=float,
        help="skip the rows that would start after this many seconds (default 480; 110 with --quick)",
    )
    p.add_argument(
        "--sections",
        default="exactness,training,throughput,compile",
        help="comma-separated subset of exactness,training,throughput,compile",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: torch's; 1 with --quick on CPU, "
        "where OpenMP barriers on a busy machine cost ~30x the arithmetic)",
    )
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"unknown --sections {sorted(unknown)}; choose from exactness,training,throughput,compile")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu (with --quick for a smoke run)")
    args.families = args.families.split(",") if args.families else None
    unknown = set(args.families or ()) - set(FAMILIES)
    if unknown:
        p.error(f"unknown --families {sorted(unknown)}; registered: {','.join(FAMILIES)}")
    for path in args.official:
        if not Path(path).is_file():
            p.error(f"--official {path}: no such file (clone {REPOS}, pass that file)")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = ("python tools/gpu_report.py " + shlex.join(argv)).strip()
    print(
        gpu_report(
            command,
            args.sections.split(","),
            args.device,
            args.quick,
            args.budget_s,
            args.threads,
            args.official,
            args.families,
            args.out,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
