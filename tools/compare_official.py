#!/usr/bin/env python
"""Our backbones against the official model code: same weights, same input, timed in one process.

  python tools/compare_official.py --official PATH/STViT/models/stvit.py --size 800x1344
  python tools/compare_official.py --official PATH/HAT-Net/HAT_Net.py --size 448x672

The official files (hhb072/STViT ``models/stvit.py``, yun-liu/HAT-Net ``HAT_Net.py``) are not part of this
repository: clone the repositories and pass the model file; the family is recognised from its classes. Its
model code runs unchanged. Only the loop over its stages is ours: it returns each stage's last-block output,
the tensors our backbones return. Packages the files import at the top but this project does not install
(timm; for STViT also fvcore and scipy, which it uses only in its own test code) get minimal stand-ins.

Our backbone is built with the official model's weights, loaded by ``backbones.load_pretrained`` exactly as a
released checkpoint is. Printed: the outputs' largest relative difference (evaluation mode), the median
seconds per iteration of each model (train mode = forward + backward of the four stage outputs), timed
round-robin so that machine noise hits both alike, the speedup, and each model's peak memory alone in a
child process (max RSS on CPU, ``torch.cuda.max_memory_allocated`` on CUDA). The loading is ``perf/official.py``'s.
"""

from __future__ import annotations

import argparse

import torch

from backbones.atomic import write_json
from backbones.families import get
from perf.memory import peak_memory_gib
from perf.models import Setting, ours_and_official
from perf.official import REPOS, load_official, max_relative_difference
from perf.timing import time_models


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", required=True, help=f"the model file of {REPOS}")
    p.add_argument("--arch", default="small")
    p.add_argument("--size", default="448x672", type=lambda s: tuple(int(v) for v in s.lower().split("x")))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument(
        "--stoken-size",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="STViT super-token sizes per stage for both models, e.g. 8,4,2,1",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    p.add_argument("--json", help="also write the result to this JSON file")
    return p.parse_args(argv)


def run(args) -> dict:
    module, family = load_official(args.official)
    if args.stoken_size and "stoken_size" not in get(family).options:
        raise SystemExit(f"--stoken-size sets STViT's super-token sizes; the official file is {get(family).title}'s")
    ours, official = (m.to(args.device) for m in ours_and_official(module, family, args.arch, args.stoken_size))
    torch.manual_seed(1)
    x = torch.randn(args.batch, 3, *args.size, device=args.device)
    with torch.no_grad():
        try:
            official_outs = official.eval()(x)
        except RuntimeError as e:  # HAT-Net's official window grids must divide every stage map
            raise SystemExit(
                f"the official {family} model cannot run at {args.size[0]}x{args.size[1]}: "
                f"{str(e).splitlines()[0]} (official HAT-Net needs multiples of 224)"
            ) from e
        diff = max_relative_difference(official_outs, ours.eval()(x))
    models = {"official": official, "ours": ours}
    times = time_models(models, x, args.mode, args.precision, args.warmup, args.repeat)
    del official, ours, models
    result = dict(
        family=family,
        arch=args.arch,
        size=f"{args.size[0]}x{args.size[1]}",
        batch=args.batch,
        mode=args.mode,
        precision=args.precision,
        stoken_size=args.stoken_size,
        device=args.device,
        max_relative_difference=diff,
        official_seconds=times["official"],
        ours_seconds=times["ours"],
        speedup=times["official"] / times["ours"],
    )
    if not args.no_memory:
        setting = Setting.of(args, family=family)
        result["official_peak_gib"] = peak_memory_gib("official", setting)
        result["ours_peak_gib"] = peak_memory_gib("ours", setting)
    return result


def main(argv=None):
    args = parse_args(argv)
    r = run(args)
    peaks = f"{r['official_peak_gib']:.2f} / {r['ours_peak_gib']:.2f}" if "ours_peak_gib" in r else "n/a"
    print(
        "| model | input | mode | official s/iter | ours s/iter | speedup | peak GiB official / ours "
        "| max rel. diff |\n|---|---|---|---|---|---|---|---|"
    )
    print(
        f"| {r['family']}-{r['arch']} | {r['size']} | {r['mode']} | {r['official_seconds']:.2f} "
        f"| {r['ours_seconds']:.2f} | {r['speedup']:.2f}x | {peaks} | {r['max_relative_difference']:.1e} |"
    )
    if args.json:
        write_json(args.json, r)


if __name__ == "__main__":
    main()
