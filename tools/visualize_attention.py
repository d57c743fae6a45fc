#!/usr/bin/env python
"""Draw what the backbone attends to on an image: STViT's super tokens, HAT-Net's window and global attention.

    python tools/visualize_attention.py CONFIG CHECKPOINT IMAGE [IMAGE ...] --out-dir DIR
        [--stages I ...] [--point X Y] [--stoken INDEX ...] [--device cpu|cuda]

CONFIG: the training config (its ``model.backbone`` builds the backbone; its test pipeline and data
preprocessor prepare each image exactly as tools/test.py feeds it to the model: resize, normalisation,
padding). CHECKPOINT: a Lightning ``.ckpt`` (tools/train.py), an mm-format checkpoint (tools/export_model.py),
a backbone export (tools/export_backbone.py: .pth / .safetensors / official layout) or an official ImageNet
release: only the backbone's weights are used (``backbones.load_pretrained``).

The maps are the ones the backbone computes in its forward pass (``backbones.attention_maps``), from the last
block of each stage, averaged over heads, drawn over the original image (mapped back through the pipeline's
scale factor and padding), one labelled PNG per image in DIR:

- STViT, ``<image>_stvit_supertokens.png``, for each stage with super tokens (``stoken_size`` > 1):
  top: every pixel assigned to the super token (among its 9 neighbours) with the highest affinity, drawn
  as region boundaries; bottom: the soft association (affinity) of every pixel to one super token: the one
  under ``--point`` (default the image centre), or ``--stoken`` (flat row-major index in that stage's grid,
  one value per drawn stage or one for all).
- HAT-Net, ``<image>_hatnet_attention.png``, for the query pixel ``--point X Y`` (original-image pixels,
  default the image centre), one column per stage: top: its attention inside its grid_size window; bottom:
  its global attention over the pooled map (over all positions in a stage without windows).
"""

from __future__ import annotations

import argparse
import os
import os.path as osp

import torch

from backbones import FAMILIES, CheckpointError, family_of, load_pretrained
from backbones.atomic import check_writable
from backbones.attention_maps import last_blocks, record_attention
from tasks.config.load import add_cfg_options, build_from_registry, load_config, torch_device
from tasks.config.scopes import register_scope
from tasks.figures.attention import PreparedImage, draw_hatnet, draw_stvit, map_pixel, stage_stride
from tasks.runtime.cli import command_line

# a family's picture kind (``Family.picture``) -> the file name suffix of its picture
PICTURES = {"stoken": "supertokens", "hat": "attention"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="training config (mmengine); model.backbone must be STViT or HATNet")
    parser.add_argument(
        "checkpoint", help="Lightning .ckpt, mm-format checkpoint, backbone export or official ImageNet release"
    )
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--out-dir", required=True, help="directory for the PNGs (created if missing)")
    parser.add_argument(
        "--stages",
        nargs="+",
        type=int,
        metavar="I",
        help="stages to draw, 0-3 (default: STViT every stage with super tokens, HAT-Net all)",
    )
    parser.add_argument(
        "--point",
        nargs=2,
        type=float,
        metavar=("X", "Y"),
        help="query point in original-image pixels (default: the image centre)",
    )
    parser.add_argument(
        "--stoken",
        nargs="+",
        type=int,
        metavar="INDEX",
        help="STViT: super token whose soft association is drawn, as a flat row-major index in "
        "the stage's super-token grid; one per drawn stage, or one for all "
        "(default: the super token under --point)",
    )
    parser.add_argument(
        "--device", type=torch_device, default="cpu", help="torch device, e.g. 'cpu' or 'cuda' (default: cpu)"
    )
    add_cfg_options(parser)
    return parser.parse_args(argv)


# --- model and input -----------------------------------------------------------------------------------------
def build_backbone(cfg, checkpoint: str, device: str):
    """The config's backbone with the checkpoint's backbone weights, in eval mode."""
    bcfg = (cfg.get("model") or {}).get("backbone")
    type_name = str((bcfg or {}).get("type", "")).rpartition(".")[2]
    drawable = [f.type_name for f in FAMILIES.values() if f.picture in PICTURES]
    if type_name not in drawable:
        raise SystemExit(
            f"error: {cfg.filename}: model.backbone.type is {type_name or None!r}; attention maps are "
            f"drawn for {' and '.join(drawable)} backbones only."
        )
    from mmengine.registry import MODELS

    bcfg = dict(bcfg, init_cfg=None)  # every weight comes from CHECKPOINT, nothing from the config's init_cfg
    backbone = build_from_registry(MODELS, bcfg, "model.backbone")
    try:
        report = load_pretrained(backbone, checkpoint)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from e
    print(report)
    return backbone.to(device).eval()


def test_pipeline(cfg):
    """The config's test pipeline without its annotation loading (there are none for an arbitrary image)."""
    from mmengine.dataset import Compose

    section = cfg.get("test_dataloader") or {}
    steps = (section.get("dataset") or {}).get("pipeline")
    if not steps:
        raise SystemExit(
            f"error: {cfg.filename}: test_dataloader.dataset.pipeline is missing: the image would not "
            "be prepared as the model sees it. Add the test pipeline to the config."
        )
    return Compose([dict(s) for s in steps if not str(s.get("type", "")).endswith("LoadAnnotations")])


def prepare(path: str, pipeline, preprocessor, device: str) -> PreparedImage:
    """Run one image through the test pipeline and the model's data preprocessor (as in testing)."""
    import mmcv
    from mmengine.dataset import pseudo_collate

    if not osp.isfile(path):
        raise SystemExit(f"error: image {path!r} does not exist")
    try:
        original = mmcv.imread(path, channel_order="rgb")
    except Exception as e:  # cv2 / PIL raise a variety of errors for unreadable files
        raise SystemExit(f"error: cannot read image {path!r}: {e}") from e
    if original is None:
        raise SystemExit(f"error: cannot read image {path!r}: not an image file that OpenCV can decode")
    packed = pipeline(dict(img_path=path))
    data = preprocessor(pseudo_collate([packed]), training=False)
    meta = data["data_samples"][0].metainfo
    scale = meta.get("scale_factor", (1.0, 1.0))
    return PreparedImage(
        path, original, data["inputs"].to(device), tuple(meta["img_shape"][:2]), (float(scale[0]), float(scale[1]))
    )


def query_point(args, image: PreparedImage) -> tuple[float, float]:
    """The query (x, y) in original-image pixels, checked to lie inside the image."""
    H, W = image.original.shape[:2]
    x, y = args.point if args.point is not None else ((W - 1) / 2, (H - 1) / 2)
    if not (0 <= x < W and 0 <= y < H):
        raise SystemExit(
            f"error: --point {x:g} {y:g} lies outside {image.path!r} ({W}x{H} pixels): give X in "
            f"[0, {W}) and Y in [0, {H})"
        )
    return x, y


def select_stages(args, backbone) -> list[int]:
    """The stages to draw: ``--stages``, else every stage with a map (the family's ``attention_stages``)."""
    family = family_of(backbone)
    with_maps = family.attention_stages(backbone)
    if not with_maps:
        raise SystemExit(
            f"error: this {family.type_name} has no stage with an attention map to draw ({family.no_map_reason})"
        )
    stages = args.stages if args.stages is not None else with_maps
    without = [i for i in stages if i in range(4) and i not in with_maps]
    if without:
        raise SystemExit(f"error: --stages {without}: {family.no_map_reason}; stages with a map: {with_maps}")
    bad = [i for i in stages if i not in range(4)]
    if bad:
        raise SystemExit(f"error: --stages {bad}: stages are 0, 1, 2, 3")
    if args.stoken is not None and len(args.stoken) not in (1, len(stages)):
        raise SystemExit(
            f"error: --stoken takes one index for all stages or one per drawn stage ({len(stages)}: "
            f"{stages}); got {len(args.stoken)}"
        )
    return sorted(set(stages))


def chosen_stokens(indices, records: dict, point, image: PreparedImage) -> dict[int, int]:
    """{stage: super token to show}: ``--stoken`` (one for all stages or one per stage), else the one under
    the point."""
    chosen = {}
    for n, (stage, rec) in enumerate(sorted(records.items())):
        (hh, ww), (h, w) = rec["grid"], rec["stoken_size"]
        if indices is None:
            row, col = map_pixel(point, stage_stride(stage), image)
            chosen[stage] = row // h * ww + col // w
            continue
        token = indices[n if len(indices) > 1 else 0]
        if not 0 <= token < hh * ww:
            raise SystemExit(
                f"error: --stoken {token}: stage {stage} of {image.path!r} has {hh}x{ww} super tokens "
                f"(flat row-major indices 0..{hh * ww - 1})"
            )
        chosen[stage] = token
    return chosen


def output_path(out_dir: str, image_path: str, suffix: str, taken: set[str]) -> str:
    stem = osp.splitext(osp.basename(image_path))[0]
    path, n = osp.join(out_dir, f"{stem}_{suffix}.png"), 1
    while path in taken:  # two images with the same name in different directories
        path, n = osp.join(out_dir, f"{stem}-{n}_{suffix}.png"), n + 1
    taken.add(path)
    return path


@command_line
def main(argv=None) -> list[str]:
    """Writes the PNGs and returns their paths."""
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, training=False)
    check_writable(args.out_dir, folder=True)
    register_scope(cfg.default_scope)
    from mmengine.registry import MODELS

    backbone = build_backbone(cfg, args.checkpoint, args.device)
    stages = select_stages(args, backbone)
    preprocessor = build_from_registry(MODELS, dict(cfg.model.data_preprocessor), "model.data_preprocessor")
    pipeline = test_pipeline(cfg)
    blocks = [key for key in last_blocks(backbone) if key[0] in stages]
    os.makedirs(args.out_dir, exist_ok=True)
    written, taken = [], set()
    for path in args.images:
        image = prepare(path, pipeline, preprocessor, args.device)
        point = query_point(args, image)
        with torch.no_grad(), record_attention(backbone, blocks) as records:
            backbone(image.inputs)
        maps = {stage: records[key] for key, stage in zip(blocks, stages)}
        picture = family_of(backbone).picture
        out = output_path(args.out_dir, path, f"{backbone.family}_{PICTURES[picture]}", taken)
        if picture == "stoken":
            draw_stvit(out, image, maps, point, chosen_stokens(args.stoken, maps, point, image))
        else:
            draw_hatnet(out, image, maps, point)
        written.append(out)
        print(f"wrote {out}")
    return written


if __name__ == "__main__":
    main()
