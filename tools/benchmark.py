#!/usr/bin/env python
"""Speed, memory and FLOPs of the backbones at detection / segmentation input sizes.

  python tools/benchmark.py --family stvit --arch small --size 800x1344 --mode train [--compare]
  python tools/benchmark.py --table     # the benchmark logs' speed table (448x672 and 800x1344, train, fp32)
  python tools/benchmark.py --variants  # params and GMACs of the released variants at 224x224
  python tools/benchmark.py --throughput --device cuda --precision bf16  # images/s at 224x224, batch 64
  python tools/benchmark.py --scaling [--sizes 224x224 448x672 800x1344] [--plot scaling.png]  # cost vs size
  python tools/benchmark.py --config CFG [--baseline swin-t|none|CFG] [--size HxW] [--device cuda]  # whole model

Time: median seconds per iteration (forward, and backward of all stage outputs in train mode) after
warm-up. With --compare, every model is timed in this process, round-robin, on the same input, so the
ratios are fair on a noisy shared machine. Peak memory: max RSS of a child process that runs only that
model (CPU), or torch.cuda.max_memory_allocated (CUDA). GFLOPs are multiply-adds of one forward pass
counted with torch.utils.flop_counter (matmuls, convolutions, attention).

--config times the config's whole detector / segmentor instead (perf/whole_model/bench.py): inference images/s at batch
1 on a ready image of the config's test scale (or --size) and through the config's test dataloader, the training
step (forward, backward, the config's optimizer step) and peak memory, next to mmdet's Swin-T Mask R-CNN or mmseg's
Swin-T UPerNet on the same input, round-robin over --repeat rounds after --warmup; a table with ours / Swin-T.
Detectors keep max_per_img boxes (score threshold 0), so that both do the same work at random weights.
"""

from __future__ import annotations

import argparse

import torch

from backbones import FAMILIES
from backbones.checkpoints.atomic import write_json
from perf.backbone.scaling import SCALING_SIZES, scaling, scaling_plot, scaling_tables
from perf.backbone.speed import rows_text, run, speed_table
from perf.backbone.variants import throughput_table, variants_table
from perf.models import BASELINES, Setting
from perf.whole_model.bench import benchmark as whole_model
from perf.whole_model.table import table as whole_model_table
from tasks.config.load import add_cfg_options
from tasks.runtime.cli import command_line


def hxw(text: str) -> tuple[int, int]:
    """``--size``: ``'HxW'`` as (H, W); anything else is a usage error naming the form."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HxW, e.g. 448x672") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: H and W must be positive")
    return h, w


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="stvit")
    p.add_argument(
        "--arch",
        help="a preset of --family ('shrunk': the CPU-test archs; default: the variant its record measures, "
        "small for STViT and HAT-Net); with --scaling, every family's (--table: the measured variants)",
    )
    p.add_argument("--size", type=hxw, help="HxW (default 448x672; 224x224 with --throughput)")
    p.add_argument("--batch", type=int, help="default 1; 64 with --throughput")
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="fp16: autocast, and in train mode a GradScaler as Lightning's 16-mixed",
    )
    p.add_argument(
        "--stoken-size",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="STViT super-token sizes per stage, e.g. 8,4,2,1",
    )
    p.add_argument("--with-cp", action="store_true", help="activation checkpointing")
    p.add_argument("--compare", action="store_true", help=f"also run {', '.join(BASELINES)}")
    p.add_argument(
        "--compile",
        action="store_true",
        help="time ours under torch.compile (inductor); baselines stay eager, GMACs count the eager model, "
        "peak RSS on CPU includes the compiler's",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--variants", action="store_true", help="params / GMACs of every released variant at 224")
    p.add_argument(
        "--table",
        action="store_true",
        help="the benchmark logs' speed table: every registered family's measured variant and named settings "
        "(STViT-S, STViT-S dense, HAT-Net-S) at 448x672 and 800x1344, train, vs reference / Swin-T / ResNet-50, "
        "with peak memory",
    )
    p.add_argument(
        "--throughput",
        action="store_true",
        help="images/s of every released variant of --family in inference (224x224, batch 64 by "
        "default), next to its paper's figures; e.g. --device cuda --precision bf16",
    )
    p.add_argument(
        "--scaling",
        action="store_true",
        help="train-step time and peak memory against the input size (--sizes) for the --table rows, mmdet's "
        "Swin-T and each family's reference implementation, one round-robin run per size; a table, and with "
        "--plot a log-log figure",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        help="--scaling sizes, HxW each (spaces or commas; default "
        + ",".join(f"{h}x{w}" for h, w in SCALING_SIZES)
        + ")",
    )
    p.add_argument("--plot", help="--scaling: write the log-log plot to this PNG")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's default)")
    p.add_argument("--config", help="time this config's whole detector / segmentor (--size: default its test scale)")
    p.add_argument(
        "--baseline",
        default="swin-t",
        help="--config's baseline: swin-t (mmdet's / mmseg's Swin-T config for the task), none, or a config path",
    )
    add_cfg_options(p, "--config: override its keys (values parsed as literals)")
    args = p.parse_args(argv)
    if args.config:
        if args.batch not in (None, 1) or args.precision != "fp32" or args.compile:
            p.error("--config times batch 1 in fp32, eager: drop --batch, --precision and --compile")
        args.baseline = None if args.baseline == "none" else args.baseline
        return args
    if args.cfg_options:
        p.error("--cfg-options applies to --config")
    if args.size is None:
        args.size = (224, 224) if args.throughput else (448, 672)
    if args.batch is None:
        args.batch = 64 if args.throughput else 1
    sizes = [s for item in args.sizes or () for s in item.split(",") if s]
    try:
        args.sizes = [tuple(int(v) for v in s.lower().split("x")) for s in sizes] or list(SCALING_SIZES)
        assert all(len(s) == 2 for s in args.sizes)
    except (ValueError, AssertionError):
        p.error(f"--sizes {' '.join(sizes)}: each size is HxW, e.g. 448x672")
    if args.plot and not args.scaling:
        p.error("--plot draws the --scaling figure: add --scaling")
    return args


@command_line
def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads()))
    memory = not args.no_memory
    setting = None if args.config else Setting.of(args)
    rows = None
    if args.config:
        rows = whole_model(
            args.config, args.baseline, args.size, args.device, args.warmup, args.repeat, memory, args.cfg_options
        )
        print(whole_model_table(rows))
    elif args.variants:
        print(variants_table())
    elif args.table:
        table, rows = speed_table(setting, memory)
        print(table)
    elif args.throughput:
        print(throughput_table(setting))
    elif args.scaling:
        rows = scaling(setting, args.sizes, memory)
        print(scaling_tables(rows))
        if args.plot:
            title = (
                f"train step, batch {args.batch}, {args.precision}, {torch.get_num_threads()} threads, "
                f"{args.device}; ours / reference arch {args.arch or 'as measured'}"
            )
            scaling_plot(rows, args.plot, title)
            print(f"wrote {args.plot}")
    else:
        rows = run(setting, args.compare, memory)
        print(rows_text(rows))
    if args.json and rows is not None:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
