"""What tools/visualize_attention.py does: the config's backbone with a checkpoint's weights, each image
prepared as the model sees it in testing, the attention recorded in its forward pass and drawn as the picture of
the family's record kind (``tasks.figures.pictures``)."""

from __future__ import annotations

import os
import os.path as osp

import torch

from backbones import FAMILIES, family_of, load_pretrained
from backbones.families import by_type_name
from backbones.models.attention_maps import last_blocks, record_attention

from ..config.load import build_from_registry
from ..config.scopes import register_scope
from .attention import PreparedImage
from .errors import FigureError
from .pictures import picture_of


def build_backbone(cfg, checkpoint: str, device: str):
    """The config's backbone with the checkpoint's backbone weights, in eval mode."""
    bcfg = (cfg.get("model") or {}).get("backbone")
    type_name = str((bcfg or {}).get("type", "")).rpartition(".")[2]
    if by_type_name(type_name) is None:
        raise FigureError(
            f"{cfg.filename}: model.backbone.type is {type_name or None!r}; attention maps are drawn for the "
            f"backbone families' types only: {', '.join(sorted(f.type_name for f in FAMILIES.values()))}"
        )
    from mmengine.registry import MODELS

    bcfg = dict(bcfg, init_cfg=None)  # every weight comes from CHECKPOINT, nothing from the config's init_cfg
    backbone = build_from_registry(MODELS, bcfg, "model.backbone")
    print(load_pretrained(backbone, checkpoint))
    return backbone.to(device).eval()


def test_pipeline(cfg):
    """The config's test pipeline without its annotation loading (there are none for an arbitrary image)."""
    from mmengine.dataset import Compose

    section = cfg.get("test_dataloader") or {}
    steps = (section.get("dataset") or {}).get("pipeline")
    if not steps:
        raise FigureError(
            f"{cfg.filename}: test_dataloader.dataset.pipeline is missing: the image would not "
            "be prepared as the model sees it. Add the test pipeline to the config."
        )
    return Compose([dict(s) for s in steps if not str(s.get("type", "")).endswith("LoadAnnotations")])


def prepare(path: str, pipeline, preprocessor, device: str) -> PreparedImage:
    """Run one image through the test pipeline and the model's data preprocessor (as in testing)."""
    import mmcv
    from mmengine.dataset import pseudo_collate

    if not osp.isfile(path):
        raise FigureError(f"image {path!r} does not exist")
    try:
        original = mmcv.imread(path, channel_order="rgb")
    except Exception as e:  # cv2 / PIL raise a variety of errors for unreadable files
        raise FigureError(f"cannot read image {path!r}: {e}") from e
    if original is None:
        raise FigureError(f"cannot read image {path!r}: not an image file that OpenCV can decode")
    packed = pipeline(dict(img_path=path))
    data = preprocessor(pseudo_collate([packed]), training=False)
    meta = data["data_samples"][0].metainfo
    scale = meta.get("scale_factor", (1.0, 1.0))
    return PreparedImage(
        path, original, data["inputs"].to(device), tuple(meta["img_shape"][:2]), (float(scale[0]), float(scale[1]))
    )


def query_point(point, image: PreparedImage) -> tuple[float, float]:
    """The query (x, y) in original-image pixels (``point``, default the centre), checked to lie inside the
    image."""
    H, W = image.original.shape[:2]
    x, y = point if point is not None else ((W - 1) / 2, (H - 1) / 2)
    if not (0 <= x < W and 0 <= y < H):
        raise FigureError(
            f"--point {x:g} {y:g} lies outside {image.path!r} ({W}x{H} pixels): give X in [0, {W}) and Y in [0, {H})"
        )
    return x, y


def select_stages(backbone, stages=None, stoken=None) -> list[int]:
    """The stages to draw: ``--stages``, else every stage with a map (the family's ``attention_stages``)."""
    family = family_of(backbone)
    with_maps = family.attention_stages(backbone)
    if not with_maps:
        raise FigureError(
            f"this {family.type_name} has no stage with an attention map to draw ({family.no_map_reason})"
        )
    stages = stages if stages is not None else with_maps
    without = [i for i in stages if i in range(4) and i not in with_maps]
    if without:
        raise FigureError(f"--stages {without}: {family.no_map_reason}; stages with a map: {with_maps}")
    bad = [i for i in stages if i not in range(4)]
    if bad:
        raise FigureError(f"--stages {bad}: stages are 0, 1, 2, 3")
    if stoken is not None and len(stoken) not in (1, len(stages)):
        raise FigureError(
            f"--stoken takes one index for all stages or one per drawn stage ({len(stages)}: "
            f"{stages}); got {len(stoken)}"
        )
    return sorted(set(stages))


def output_path(out_dir: str, image_path: str, suffix: str, taken: set[str]) -> str:
    stem = osp.splitext(osp.basename(image_path))[0]
    path, n = osp.join(out_dir, f"{stem}_{suffix}.png"), 1
    while path in taken:  # two images with the same name in different directories
        path, n = osp.join(out_dir, f"{stem}-{n}_{suffix}.png"), n + 1
    taken.add(path)
    return path


def draw_attention(cfg, checkpoint: str, images, out_dir: str, stages=None, point=None, stoken=None, device="cpu"):
    """Draw each image's attention picture into ``out_dir`` (tools/visualize_attention.py says what it shows) and
    return the PNGs' paths: ``cfg`` builds the backbone, loaded from ``checkpoint``, and prepares the images;
    ``stages``, ``point`` and ``stoken`` are the tool's ``--stages``, ``--point`` and ``--stoken``."""
    register_scope(cfg.default_scope)
    from mmengine.registry import MODELS

    backbone = build_backbone(cfg, checkpoint, device)
    family = family_of(backbone)
    picture = picture_of(family.picture)
    if stoken is not None and not picture.takes_stoken:
        raise FigureError(
            f"--stoken picks the super token a super-token picture shows; the {family.title} picture has none: "
            "leave --stoken out"
        )
    stages = select_stages(backbone, stages, stoken)
    preprocessor = build_from_registry(MODELS, dict(cfg.model.data_preprocessor), "model.data_preprocessor")
    pipeline = test_pipeline(cfg)
    blocks = [key for key in last_blocks(backbone) if key[0] in stages]
    if not blocks:
        raise FigureError(f"this {family.title} backbone has no attention module in stages {stages}: nothing to draw")
    os.makedirs(out_dir, exist_ok=True)
    written, taken = [], set()
    for path in images:
        image = prepare(path, pipeline, preprocessor, device)
        xy = query_point(point, image)
        with torch.no_grad(), record_attention(backbone, blocks) as records:
            backbone(image.inputs)
        maps = {stage: records[(stage, block)] for stage, block in blocks}
        out = output_path(out_dir, path, f"{family.name}_{picture.suffix}", taken)
        picture.draw(out, image, maps, xy, family.title, stoken)
        written.append(out)
        print(f"wrote {out}")
    return written
