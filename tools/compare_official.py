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

from backbones.checkpoints.atomic import write_json
from perf.backbone.against_official import compare_official, result_table
from perf.official import REPOS


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", required=True, help=f"the model file of {REPOS}")
    p.add_argument("--arch", help="a variant of the file's family (default: the one its record measures)")
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


def main(argv=None):
    args = parse_args(argv)
    r = compare_official(args)
    print(result_table(r))
    if args.json:
        write_json(args.json, r)


if __name__ == "__main__":
    main()
