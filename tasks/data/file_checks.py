"""The checks of one sample's files, run in the scan's worker processes (tasks/data/scan.py).

An image is decoded, not only its header read: a JPEG in PIL's draft mode at 1/8 scale (libjpeg still decodes every
entropy-coded segment, so a cut or corrupt stream fails, at a fraction of a full decode's time), then the end-of-image
marker is looked for (OpenCV, which mmcv decodes with, fills a cut file's missing rows with grey); other formats
fully. A label map is decoded fully (its values are checked) and mapped as mmseg's ``LoadAnnotations`` maps it
(``reduce_zero_label``, ``label_map``) before its values are compared with the classes and the ignore index.
"""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple

import numpy as np


class FileTask(NamedTuple):
    """The files of one sample and what they must agree with.

    Attributes:
        img: the image path.
        seg: the label map path, or None.
        size: the image's (width, height) of the annotation file, or None.
        num_classes: the classes of a segmentation dataset (label maps are checked against them), or None.
        ignore_index: the label that marks unlabelled pixels.
        reduce_zero_label: mmseg's ``reduce_zero_label`` of the dataset.
        label_map: mmseg's ``label_map`` of the dataset (old label -> new), or None.
    """

    img: str
    seg: str | None = None
    size: tuple[int, int] | None = None
    num_classes: int | None = None
    ignore_index: int = 255
    reduce_zero_label: bool = False
    label_map: dict | None = None


def _open(path: str, draft: bool):
    """The decoded PIL image of ``path``; raises ``ValueError`` with what is wrong."""
    from PIL import Image, UnidentifiedImageError

    if not os.path.isfile(path):
        raise ValueError("missing: the file does not exist")
    if os.path.getsize(path) == 0:
        raise ValueError("empty: the file has 0 bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)
            full = img.size
            if draft and img.format == "JPEG":
                img.draft("RGB", (max(1, full[0] // 8), max(1, full[1] // 8)))
            img.load()
    except UnidentifiedImageError:
        raise ValueError("not an image: no image format recognises its bytes") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"corrupt or truncated: {e}") from None
    if img.format == "JPEG":
        with open(path, "rb") as f:  # a stream cut after its last complete segment decodes without an error
            f.seek(max(0, os.path.getsize(path) - 1024))
            if b"\xff\xd9" not in f.read():
                raise ValueError("truncated: no JPEG end-of-image marker")
    img.full_size = full
    return img


def check_files(task: FileTask) -> list[tuple[str, str, str]]:
    """The problems of one sample's files, as (file, what is wrong, the fix); empty when it is sound."""
    problems = []
    try:
        img = _open(task.img, draft=True)
    except ValueError as e:
        problems.append((task.img, str(e), "restore the file from the original dataset, or remove the sample"))
        img = None
    if img is not None and task.size is not None and tuple(img.full_size) != tuple(task.size):
        problems.append(
            (
                task.img,
                f"the image is {img.full_size[0]}x{img.full_size[1]} px, the annotation file says "
                f"{task.size[0]}x{task.size[1]} (width x height)",
                "fix the image's width / height in the annotation file, or restore the image",
            )
        )
    if task.seg is not None:
        problems += _check_map(task, img.full_size if img is not None else None)
    return problems


def _check_map(task: FileTask, img_size) -> list[tuple[str, str, str]]:
    try:
        seg = _open(task.seg, draft=False)
    except ValueError as e:
        return [(task.seg, str(e), "restore the label map from the original dataset, or remove the sample")]
    problems = []
    if img_size is not None and seg.full_size != img_size:
        problems.append(
            (
                task.seg,
                f"the label map is {seg.size[0]}x{seg.size[1]} px, its image {task.img} {img_size[0]}x{img_size[1]}",
                "a map labels every pixel of its image at the same size: fix or remove the pair",
            )
        )
    if task.num_classes is None:
        return problems
    values = np.flatnonzero(np.bincount(np.asarray(seg).reshape(-1).astype(np.int64), minlength=1))
    # as mmseg's LoadAnnotations: reduce_zero_label (0 -> 255, ignored; the others one down), then label_map
    reduced = np.where(values == 0, 255, values - 1) if task.reduce_zero_label else values
    mapped = reduced.copy()
    for old, new in (task.label_map or {}).items():
        mapped[reduced == old] = new
    bad = [int(v) for v, m in zip(values, mapped) if m >= task.num_classes and m != task.ignore_index]
    if bad:
        problems.append(
            (
                task.seg,
                f"label values {bad[:10]}{'...' if len(bad) > 10 else ''} are outside the {task.num_classes} "
                f"classes and not the ignore index {task.ignore_index}"
                + (" (after reduce_zero_label)" if task.reduce_zero_label else ""),
                "fix the map, or the dataset's classes",
            )
        )
    return problems
