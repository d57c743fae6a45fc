"""FLOPs of one forward pass, counted with ``torch.utils.flop_counter``: matmuls, convolutions and the attention
products (q @ k^T and attn @ v, also inside ``F.scaled_dot_product_attention``, whose CPU kernel torch's counter
leaves at 0); element-wise ops, softmax, norms, NMS and RoIAlign are not counted (as in fvcore / mmcv and the
papers). Models run their plain path: no oneDNN kernels the counter cannot see, no row chunks (whose halo rows
are an implementation cost, not the model's). "GMACs" are torch's flops / 2e9 (multiply-adds, as the papers).
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from backbones import fast_paths

COCO_SHAPE = (800, 1280)  # (H, W): the "1280x800" of the detection papers' FLOPs column
ADE20K_SHAPE = (512, 512)


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter() -> FlopCounterMode:
    """``FlopCounterMode`` that also counts SDPA's CPU kernel (torch registers a formula for the CUDA kernels
    only; without this an attention on CPU counts 0)."""
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


def count_gmacs(model: torch.nn.Module, x: torch.Tensor) -> float:
    """GMACs of ``model(x)`` in evaluation mode. STViT's plain unfold/fold are identity-kernel convolutions,
    whose copies count as MACs (0.2 % of STViT-S)."""
    model.eval()
    with fast_paths(False), torch.no_grad(), flop_counter() as counter:
        model(x)
    return counter.get_total_flops() / 2e9


# ---- a whole detector / segmentor from its config --------------------------------------------------------
def default_shape(cfg) -> tuple[int, int]:
    """The papers' input size for the config's task: COCO detection 1280x800, ADE20K segmentation 512x512."""
    return COCO_SHAPE if cfg.default_scope == "mmdet" else ADE20K_SHAPE


def build_model(config: str, cfg_options: dict | None = None):
    """The config's mm model, built as tasks/ builds it (random weights: counts do not depend on them)."""
    from tasks import build_task
    from tasks.config.load import load_config

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


def _forward(model, inputs, data_samples):
    """``model(inputs, data_samples, mode='tensor')``; an mmseg decode head whose ``forward`` takes the data samples
    (mmseg's MaskFormer / Mask2Former heads, which mmseg's ``_forward`` calls without them) runs as mmseg's own
    ``predict`` runs it, on the backbone's features."""
    head = getattr(model, "decode_head", None)
    if head is not None and "batch_data_samples" in inspect.signature(type(head).forward).parameters:
        return head(model.extract_feat(inputs), data_samples)
    return model(inputs, data_samples, mode="tensor")


def model_flops(config: str, shape: tuple[int, int] | None = None, cfg_options: dict | None = None) -> dict:
    """``{"gflops": GMACs, "params_m": M, "parts": {part: GMACs}, "params_parts_m": {...}, "shape": [H, W]}`` of
    the config's model on one image of ``shape`` (default ``default_shape``), run as
    ``model(inputs, data_samples, mode='tensor')`` (mmdet / mmseg ``_forward``, as their own get_flops does)."""
    from tasks.config.load import load_config

    cfg = load_config(config, cfg_options)
    shape = tuple(shape) if shape else default_shape(cfg)
    torch.manual_seed(0)  # the RPN's proposals (their number sets the RoI heads' cost) come from the weights
    model = build_model(config, cfg_options)
    inputs, data_samples = fake_batch(model, cfg.default_scope, shape)
    total, parts = count(model, lambda: _forward(model, inputs, data_samples))
    params = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    return dict(
        gflops=total / 2e9,
        params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        parts={k: v / 2e9 for k, v in parts.items()},
        params_parts_m={k: v / 1e6 for k, v in params.items() if v},
        shape=list(shape),
    )
