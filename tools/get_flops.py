#!/usr/bin/env python
"""Parameters and FLOPs of a whole detector / segmentor built from its config (mmdet's ``get_flops`` interface).

    python tools/get_flops.py CONFIG [--shape H W] [--out FILE.json] [--cfg-options KEY=VALUE ...]

"GFLOPs" here are GMACs (multiply-adds, 1e9), as the papers count them: torch's flop counter divided by 2.
Counted with ``torch.utils.flop_counter.FlopCounterMode`` on one forward pass of one image, so matmuls,
convolutions and the attention products (q @ k^T and attn @ v, also inside
``F.scaled_dot_product_attention``, whose CPU kernel torch's counter leaves at 0) are all included;
element-wise ops, softmax, norms, NMS and RoIAlign are not (as in fvcore / mmcv and the papers). The
backbones run their plain PyTorch path (no oneDNN attention kernel, no row chunks), which computes the same
products as the fast path.

The input is one random image of ``--shape`` (the data preprocessor's output size; padded up to its
``pad_size_divisor``), default the papers' sizes: 1280x800 (H=800, W=1280) for mmdet configs (COCO), 512x512
for mmseg configs (ADE20K). The model runs as
``model(inputs, data_samples, mode='tensor')`` (mmdet / mmseg ``_forward``, as their own get_flops does): for
two-stage detectors the RPN's proposals (at most ``test_cfg.rpn.max_per_img``) go through the RoI heads (masks
of the first 100 RoIs); for segmentors the decode head runs and the auxiliary head, a training-only loss,
does not.

Prints the total and a breakdown by the model's top-level parts (``backbone``, ``neck``, ``rpn_head``,
``roi_head``, ``decode_head``, ...). ``--out`` writes ``{"gflops": total GMACs, "params_m": params in
millions, "parts": {"backbone": GMACs, ...}, "params_parts_m": {...}, "shape": [H, W]}``.
"""

from __future__ import annotations

import argparse
import os.path as osp

from backbones.checkpoints.atomic import check_writable, write_json
from perf.flops import model_flops
from tasks.config.load import add_cfg_options, check_config_path
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="mmengine config file")
    parser.add_argument(
        "--shape",
        type=int,
        nargs="+",
        metavar="H W",
        help="input height and width (one value: square); default 800 1280 for mmdet configs, "
        "512 512 for mmseg configs",
    )
    parser.add_argument("--out", help='write {"gflops" (GMACs), "params_m", "parts": {...}} to this JSON file')
    add_cfg_options(parser)
    args = parser.parse_args(argv)
    if args.shape is not None:
        if len(args.shape) not in (1, 2) or min(args.shape) < 32:
            parser.error(f"--shape takes H W (or one value for a square), each >= 32; got {args.shape}")
        args.shape = tuple(args.shape) * (3 - len(args.shape))
    return args


def format_report(config: str, res: dict) -> str:
    h, w = res["shape"]
    lines = [
        f"{osp.basename(config)}: input {w}x{h} (W x H)",
        f"{'part':<14} {'GFLOPs':>9} {'params (M)':>11}",
        f"{'-' * 14} {'-' * 9} {'-' * 11}",
    ]
    names = list(res["parts"]) + [k for k in res["params_parts_m"] if k not in res["parts"]]
    for name in names:
        flops, params = res["parts"].get(name, 0.0), res["params_parts_m"].get(name, 0.0)
        lines.append(f"{name:<14} {flops:>9.2f} {params:>11.2f}")
    lines.append(f"{'total':<14} {res['gflops']:>9.2f} {res['params_m']:>11.2f}")
    lines.append("GFLOPs here are GMACs (multiply-adds), as the papers count them")
    return "\n".join(lines)


@command_line
def main(argv=None) -> dict:
    args = parse_args(argv)
    check_config_path(args.config)
    if args.out:
        check_writable(args.out)  # before the counting
    res = model_flops(args.config, args.shape, args.cfg_options)
    print(format_report(args.config, res))
    if args.out:
        write_json(args.out, res)
        print(f"written to {args.out}")
    return res


if __name__ == "__main__":
    main()
