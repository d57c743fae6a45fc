"""Two tiny synthetic datasets in the real COCO / ADE20K layouts, for the demo and the tests
(``tools/make_tiny_data.py`` is the command line; its docstring describes the contents).

Every split draws from its own RNG stream derived from (seed, dataset, split), so the output is byte-identical
for a given seed. Each dataset is written to a temporary sibling directory and renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

JPEG_QUALITY = 92
SIDES = (128, 144, 160, 176, 192)  # image heights / widths are drawn independently from these

# COCO: (id, name, rgb colour). Ids are deliberately not 0..N-1, as in real COCO.
COCO_CATEGORIES = ((1, "square", (215, 40, 40)), (3, "disc", (40, 185, 60)), (7, "triangle", (45, 75, 220)))
# ADE20K: PNG value -> (name, rgb). Values are the real ADE20K indices (1-based) of these names.
ADE_WALL, ADE_FLOOR = 1, 4
ADE_SHAPES = {
    9: ("windowpane", "square", (150, 215, 240)),
    18: ("plant", "triangle", (40, 150, 40)),
    120: ("ball", "disc", (235, 130, 20)),
}
ADE_LABELS = (0, ADE_WALL, ADE_FLOOR, *ADE_SHAPES)


@contextmanager
def _atomic_dir(final: Path):
    """Yield a temp dir next to ``final``; on success it replaces ``final`` (removed on failure)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.replace(final, old)  # renaming onto an empty dir is allowed
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old)


def _rng(seed: int, dataset: int, split: int) -> np.random.Generator:
    return np.random.default_rng([seed, dataset, split])


def _shape_polygon(kind: str, cx: float, cy: float, radius: float, rng) -> list[float]:
    """Flat [x0, y0, x1, y1, ...] polygon of a shape inscribed in the circle (cx, cy, radius)."""
    rot = rng.uniform(-np.pi, np.pi)
    if kind == "square":
        ang = rng.uniform(-0.35, 0.35) + np.pi / 4 + np.arange(4) * np.pi / 2  # mildly rotated square
    elif kind == "triangle":
        ang = rot + np.arange(3) * 2 * np.pi / 3
    else:  # disc
        ang = np.arange(32) * 2 * np.pi / 32
    pts = np.stack([cx + radius * np.cos(ang), cy + radius * np.sin(ang)], 1)
    return [round(float(v), 2) for v in pts.ravel()]


def _poly_mask(polys: list[list[float]], h: int, w: int) -> np.ndarray:
    """Rasterise polygons exactly as pycocotools / mmdet do (HxW uint8 0/1)."""
    return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polys, h, w)))


def _place(rng, h: int, w: int, radii: list[float], margin: float = 6.0) -> list[tuple[float, float, float]]:
    """Non-overlapping circles (cx, cy, r) fully inside the image; circles that don't fit are dropped."""
    placed = []
    for r in radii:
        for _ in range(50):
            cx, cy = rng.uniform(r + 2, w - r - 2), rng.uniform(r + 2, h - r - 2)
            if all(np.hypot(cx - x, cy - y) > r + q + margin for x, y, q in placed):
                placed.append((cx, cy, r))
                break
    return placed


def _background(rng, h: int, w: int, base, amp: float = 22.0, noise: float = 8.0) -> np.ndarray:
    """Mildly textured float image: base colour + smooth low-frequency blotches + pixel noise."""
    # Blotches mostly in brightness, only weakly coloured, so no class colour appears in the background.
    coarse = (rng.normal(0, 1, (6, 6, 1)) + 0.35 * rng.normal(0, 1, (6, 6, 3))).astype(np.float32)
    smooth = np.stack(
        [np.asarray(Image.fromarray(coarse[..., c]).resize((w, h), Image.BILINEAR)) for c in range(3)], -1
    )
    return np.asarray(base, np.float32) + amp * smooth + rng.normal(0, noise, (h, w, 3))


def _paint(img: np.ndarray, mask: np.ndarray, colour, rng, jitter: float = 15.0, noise: float = 6.0):
    colour = np.asarray(colour, np.float32) + rng.uniform(-jitter, jitter, 3)
    m = mask.astype(bool)
    img[m] = colour + rng.normal(0, noise, (int(m.sum()), 3))


def _save_jpeg(img: np.ndarray, path: Path):
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=JPEG_QUALITY)


def _rle_counts(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts (column-major runs, starting with a run of zeros)."""
    flat = mask.ravel(order="F")
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1, [flat.size]])
    counts = np.diff(bounds).tolist()
    return [0] + counts if flat[0] else counts


def _coco_split(root: Path, split: str, num: int, rng, first_ann_id: int) -> int:
    img_dir = root / f"{split}2017"
    img_dir.mkdir(parents=True)
    # Non-contiguous image ids like real COCO; file names are the zero-padded ids.
    img_ids = np.sort(rng.choice(np.arange(1, 600000), num, replace=False)).tolist()
    n_empty = max(1, num // 12) if num >= 4 else 0
    empty = set(rng.choice(num, n_empty, replace=False).tolist())
    with_crowd = set(
        rng.choice(sorted(set(range(num)) - empty), max(1, num // 6) if num >= 3 else 0, replace=False).tolist()
    )
    images, anns, ann_id = [], [], first_ann_id
    for i, img_id in enumerate(img_ids):
        h, w = int(rng.choice(SIDES)), int(rng.choice(SIDES))
        img = _background(rng, h, w, rng.uniform(95, 165) + rng.uniform(-12, 12, 3))
        n_obj = 0 if i in empty else int(rng.integers(1, 4))
        crowd = i in with_crowd
        radii = [rng.uniform(0.17, 0.27) * min(h, w) for _ in range(n_obj)]
        circles = _place(rng, h, w, ([0.16 * min(h, w)] if crowd else []) + radii)
        for k, (cx, cy, r) in enumerate(circles):
            cat_id, kind, colour = COCO_CATEGORIES[int(rng.integers(len(COCO_CATEGORIES)))]  # name = shape
            if crowd and k == 0:
                # A crowd: a clump of small same-class shapes, annotated as one RLE region.
                polys = [
                    _shape_polygon(kind, cx + dx, cy + dy, rng.uniform(3.5, 6.5), rng)
                    for dx, dy in rng.uniform(-0.7 * r, 0.7 * r, (int(rng.integers(5, 10)), 2))
                ]
                m = _poly_mask(polys, h, w)
                seg, iscrowd = {"counts": _rle_counts(m), "size": [h, w]}, 1
                rle = mask_utils.frPyObjects(seg, h, w)
            else:
                seg, iscrowd = [_shape_polygon(kind, cx, cy, r, rng)], 0
                rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
                m = mask_utils.decode(rle)
            _paint(img, m, colour, rng)
            anns.append(
                {
                    "id": ann_id,
                    "image_id": img_id,
                    "category_id": cat_id,
                    "segmentation": seg,
                    "area": float(mask_utils.area(rle)),
                    "bbox": [round(float(v), 2) for v in mask_utils.toBbox(rle)],
                    "iscrowd": iscrowd,
                }
            )
            ann_id += 1
        name = f"{img_id:012d}.jpg"
        _save_jpeg(img, img_dir / name)
        images.append({"id": img_id, "file_name": name, "height": h, "width": w, "license": 1})
    coco = {
        "info": {
            "description": "tiny synthetic COCO-format dataset (tools/make_tiny_data.py)",
            "version": "1.0",
            "year": 2017,
        },
        "licenses": [{"id": 1, "name": "CC0 1.0", "url": ""}],
        "images": images,
        "annotations": anns,
        "categories": [{"id": i, "name": n, "supercategory": "shape"} for i, n, _ in COCO_CATEGORIES],
    }
    (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(coco, separators=(",", ":")))
    return ann_id


def make_coco(out_dir, num_train: int = 48, num_val: int = 16, seed: int = 0) -> Path:
    """Write ``out_dir/tiny_coco`` (replacing it) and return its path."""
    final = Path(out_dir) / "tiny_coco"
    with _atomic_dir(final) as root:
        (root / "annotations").mkdir()
        next_id = _coco_split(root, "train", num_train, _rng(seed, 0, 0), 1)
        _coco_split(root, "val", num_val, _rng(seed, 0, 1), next_id + 1000)
    return final


def _ade_split(root: Path, split: str, prefix: str, num: int, rng):
    img_dir, ann_dir = root / "images" / split, root / "annotations" / split
    img_dir.mkdir(parents=True)
    ann_dir.mkdir(parents=True)
    for i in range(1, num + 1):
        h, w = int(rng.choice(SIDES)), int(rng.choice(SIDES))
        img = _background(rng, h, w, np.array([205, 190, 155]) + rng.uniform(-15, 15, 3), amp=12)
        img += 10 * np.sin(np.arange(w) * rng.uniform(0.5, 0.9))[None, :, None]  # faint vertical stripes
        seg = np.full((h, w), ADE_WALL, np.uint8)
        # Floor: a band at the bottom with a slanted top edge, brown with horizontal grain.
        yy, xx = np.mgrid[:h, :w]
        top = h * rng.uniform(0.6, 0.8) + rng.uniform(-0.15, 0.15) * (xx - w / 2)
        floor = yy >= top
        _paint(img, floor, (120, 80, 45), rng, noise=4)
        img[floor] += 12 * np.sin(yy[floor] * 1.3)[:, None]
        seg[floor] = ADE_FLOOR
        radii = [rng.uniform(0.15, 0.25) * min(h, w) for _ in range(int(rng.integers(1, 4)))]
        labels = list(ADE_SHAPES)
        for cx, cy, r in _place(rng, h, w, radii):
            label = labels[int(rng.integers(len(labels)))]
            _, kind, colour = ADE_SHAPES[label]
            m = _poly_mask([_shape_polygon(kind, cx, cy, r, rng)], h, w).astype(bool)
            _paint(img, m, colour, rng)
            # 1-px unlabeled (0) outline just outside the shape, like object boundaries in real ADE.
            grown = m.copy()
            grown[1:] |= m[:-1]
            grown[:-1] |= m[1:]
            grown[:, 1:] |= m[:, :-1]
            grown[:, :-1] |= m[:, 1:]
            seg[grown & ~m] = 0
            seg[m] = label
        stem = f"ADE_{prefix}_{i:08d}"
        _save_jpeg(img, img_dir / f"{stem}.jpg")
        Image.fromarray(seg).save(ann_dir / f"{stem}.png")  # 2-D uint8 -> mode 'L', lossless


def make_ade20k(out_dir, num_train: int = 48, num_val: int = 16, seed: int = 0) -> Path:
    """Write ``out_dir/tiny_ade20k`` (replacing it) and return its path."""
    final = Path(out_dir) / "tiny_ade20k"
    with _atomic_dir(final) as root:
        _ade_split(root, "training", "train", num_train, _rng(seed, 1, 0))
        _ade_split(root, "validation", "val", num_val, _rng(seed, 1, 1))
    return final
