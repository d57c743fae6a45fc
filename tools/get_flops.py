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
import math
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # run from a checkout, uninstalled

import torch  # noqa: E402
from mmengine.config import DictAction  # noqa: E402

COCO_SHAPE = (800, 1280)  # (H, W): the "1280x800" of the detection papers' FLOPs column
ADE20K_SHAPE = (512, 512)


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
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=DictAction,
        default={},
        metavar="KEY=VALUE",
        help="override config keys (values parsed as literals)",
    )
    args = parser.parse_args(argv)
    if args.shape is not None:
        if len(args.shape) not in (1, 2) or min(args.shape) < 32:
            parser.error(f"--shape takes H W (or one value for a square), each >= 32; got {args.shape}")
        args.shape = tuple(args.shape) * (3 - len(args.shape))
    return args


# ---- counting ----------------------------------------------------------------------------------------------
def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter() -> torch.utils.flop_counter.FlopCounterMode:
    """``FlopCounterMode`` that also counts SDPA's CPU kernel (torch registers a formula for the CUDA kernels
    only; without this an attention on CPU counts 0)."""
    from torch.utils.flop_counter import FlopCounterMode

    mapping = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            mapping[op] = _sdpa_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


def count(model: torch.nn.Module, run) -> tuple[int, dict[str, int]]:
    """Flops (torch's count: 2 per multiply-add) of ``run()`` in total and per top-level child of ``model``.

    Parts are attributed by wrapping each child's ``forward`` (not by module hooks: mmdet calls
    ``self.roi_head.forward(...)`` directly, which no hook sees); flops outside every child are ``other``."""
    from backbones import fast_paths

    parts: dict[str, int] = {}
    active: list[str] = []

    def wrap(name, forward):
        def counted(*args, **kwargs):
            if active:  # a part called from another part counts for the outer one
                return forward(*args, **kwargs)
            active.append(name)
            before = counter.get_total_flops()
            try:
                return forward(*args, **kwargs)
            finally:
                parts[name] = parts.get(name, 0) + counter.get_total_flops() - before
                active.pop()

        return counted

    children = dict(model.named_children())
    for name, child in children.items():
        child.forward = wrap(name, child.forward)  # an instance attribute, removed again below
    try:
        # the plain path: no oneDNN kernels the counter cannot see, no row chunks (whose halo rows are an
        # implementation cost, not the model's)
        with fast_paths(False), torch.no_grad(), flop_counter() as counter:
            run()
    finally:
        for child in children.values():
            del child.forward
    total = counter.get_total_flops()
    parts = {k: int(v) for k, v in parts.items() if v}
    if total - sum(parts.values()):
        parts["other"] = int(total - sum(parts.values()))
    return int(total), parts


# ---- the model and its fake batch ------------------------------------------------------------------------
def default_shape(cfg) -> tuple[int, int]:
    """The papers' input size for the config's task: COCO detection 1280x800, ADE20K segmentation 512x512."""
    return COCO_SHAPE if cfg.default_scope == "mmdet" else ADE20K_SHAPE


def build_model(config: str, cfg_options: dict | None = None):
    """The config's mm model, built as tasks/ builds it (random weights: counts do not depend on them)."""
    from tasks import build_task
    from tasks.config import load_config

    return build_task(load_config(config, cfg_options), init_weights=False)[0].model.eval()


def fake_batch(model, scope: str, shape: tuple[int, int]):
    """One random normalised image (1, 3, H', W'), H' and W' padded as the data preprocessor pads, and its
    data sample, as ``model.data_preprocessor`` would hand them to the model."""
    divisor = getattr(model.data_preprocessor, "pad_size_divisor", 1) or 1
    h, w = (math.ceil(s / divisor) * divisor for s in shape)
    meta = dict(
        img_shape=tuple(shape),
        ori_shape=tuple(shape),
        pad_shape=(h, w),
        batch_input_shape=(h, w),
        scale_factor=(1.0, 1.0),
        img_id=0,
    )
    if scope == "mmdet":
        from mmdet.structures import DetDataSample as Sample
    else:
        from mmseg.structures import SegDataSample as Sample
    generator = torch.Generator().manual_seed(0)
    return torch.randn(1, 3, h, w, generator=generator), [Sample(metainfo=meta)]


def get_flops(config: str, shape: tuple[int, int] | None = None, cfg_options: dict | None = None) -> dict:
    """``{"gflops": GMACs, "params_m": M, "parts": {part: GMACs}, "params_parts_m": {...}, "shape": [H, W]}``."""
    from tasks.config import load_config

    cfg = load_config(config, cfg_options)
    shape = tuple(shape) if shape else default_shape(cfg)
    torch.manual_seed(0)  # the RPN's proposals (their number sets the RoI heads' cost) come from the weights
    model = build_model(config, cfg_options)
    inputs, data_samples = fake_batch(model, cfg.default_scope, shape)
    total, parts = count(model, lambda: model(inputs, data_samples, mode="tensor"))
    params = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    return dict(
        gflops=total / 2e9,
        params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        parts={k: v / 2e9 for k, v in parts.items()},
        params_parts_m={k: v / 1e6 for k, v in params.items() if v},
        shape=list(shape),
    )


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


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not osp.isfile(args.config):
        raise FileNotFoundError(f"config {args.config} does not exist")
    res = get_flops(args.config, args.shape, args.cfg_options)
    print(format_report(args.config, res))
    if args.out:
        from tasks.checkpoint_io import write_json

        write_json(args.out, res)
        print(f"written to {args.out}")
    return res


if __name__ == "__main__":
    main()
