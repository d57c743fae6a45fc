"""The images a user points ``tools/infer.py`` at: files, folders and glob patterns, each checked before a model
is built, so that bad inputs fail fast and nothing is made for them."""

from __future__ import annotations

import glob
import os
import os.path as osp
from collections.abc import Sequence

import cv2
from mmdet.apis.det_inferencer import IMG_EXTENSIONS  # what DetInferencer takes from a folder

from backbones.errors import UserError


class InputError(UserError, ValueError):
    """Bad ``INPUT`` arguments: nothing matched, a missing path, an unreadable image, two images with one name."""


def find_images(inputs: Sequence[str]) -> list[str]:
    """The image files that ``inputs`` name: files, folders (their images, not recursive) and glob patterns.

    Every input must match at least one image and every image must be readable; two images may not share a file
    name (their outputs would overwrite each other). Raises ``InputError`` naming the inputs or files at fault.
    """
    images, empty = [], []
    for item in inputs:
        if osp.isdir(item):
            found = sorted(
                osp.join(item, f)
                for f in os.listdir(item)
                if f.lower().endswith(IMG_EXTENSIONS) and osp.isfile(osp.join(item, f))
            )
        elif osp.isfile(item):
            found = [item]
        elif glob.has_magic(item):
            matches = glob.glob(item, recursive=True)
            found = sorted(p for p in matches if osp.isfile(p) and p.lower().endswith(IMG_EXTENSIONS))
        else:
            raise InputError(f"{item!r}: no such file or folder (relative paths start at {os.getcwd()!r})")
        if not found:
            empty.append(item)
        images += [p for p in found if p not in images]
    if empty:
        raise InputError(f"no images matched {empty} (image files end in {', '.join(IMG_EXTENSIONS)})")
    by_name: dict[str, list[str]] = {}
    for path in images:
        by_name.setdefault(osp.splitext(osp.basename(path))[0], []).append(path)
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    if clashes:
        raise InputError(
            f"images with the same name would overwrite each other's outputs: {clashes}. Run them separately, "
            "with one --out-dir each"
        )
    unreadable = [p for p in images if not _readable(p)]
    if unreadable:
        raise InputError(f"cannot read {len(unreadable)} image(s) (not an image, or corrupt): {unreadable[:10]}")
    return images


def _readable(path: str) -> bool:
    """Whether OpenCV decodes ``path``: at 1/8 size (fast for large photos), or at full size for an image under
    8 px a side, which the reduced decoder refuses with an exception of its resize."""
    try:
        return cv2.imread(path, cv2.IMREAD_REDUCED_GRAYSCALE_8) is not None
    except cv2.error:
        return cv2.imread(path, cv2.IMREAD_GRAYSCALE) is not None
