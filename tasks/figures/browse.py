"""``tools/browse_dataset.py``: the images of a split as the model sees them, their annotations drawn.

Each image goes through the dataset's own pipeline (resize, flip, crop, photometric changes), and the packed
``inputs`` tensor is drawn, as mmdet's / mmseg's ``analysis_tools/browse_dataset.py`` draw it: the pipeline does not
normalise (the model's data preprocessor does, on the batch), so the packed tensor is the pixels in the loader's
BGR order, turned to RGB here. The val / test pipelines load the annotations after resizing (the metrics compare
at the original size); here they are loaded first, so that they are resized with the image. Detection: the
ground-truth boxes, masks and class names (mmdet ``DetLocalVisualizer``; crowd regions, packed apart as
``ignored_instances``, are not drawn); segmentation: the class map blended over the image with its class names (mmseg
``SegLocalVisualizer``). One PNG per image, written atomically.
"""

from __future__ import annotations

import copy
import itertools
import os
import os.path as osp

import cv2
import mmcv
import numpy as np
from mmengine.config import Config

from backbones.checkpoints.atomic import atomic_write

from ..config.scopes import register_scope
from ..data.module import MMDataModule

PHASES = ("train", "val", "test")


def packed_image(item: dict) -> np.ndarray:
    """The RGB uint8 HxWx3 image of a pipeline output's packed ``inputs`` (CHW, BGR as the loader read it)."""
    return np.ascontiguousarray(item["inputs"].permute(1, 2, 0).numpy()[..., ::-1]).astype(np.uint8)


def annotations_first(pipeline: list) -> list:
    """``pipeline`` with its ``LoadAnnotations`` steps right after the image loading (the first step), so that
    the geometric transforms apply to the annotations too; the training pipelines' order already."""
    loads = [step for step in pipeline if step.get("type") == "LoadAnnotations"]
    rest = [step for step in pipeline if step.get("type") != "LoadAnnotations"]
    return rest[:1] + loads + rest[1:]


def _visualizer(scope: str, meta: dict):
    # a name of our own: mm's visualizers are named singletons, and the config's 'visualizer' may exist already
    if scope == "mmdet":
        from mmdet.visualization import DetLocalVisualizer

        vis = DetLocalVisualizer(name=f"browse-{id(meta)}")
    else:
        from mmseg.visualization import SegLocalVisualizer

        vis = SegLocalVisualizer(name=f"browse-{id(meta)}", alpha=0.5)
    vis.dataset_meta = meta
    return vis


def _drawable(sample, scope: str):
    """The data sample with plain arrays where mmdet's visualizer wants them (as mmdet's browse_dataset does)."""
    sample = sample.numpy()
    if scope == "mmdet":
        from mmdet.models.utils import mask2ndarray
        from mmdet.structures.bbox import BaseBoxes

        gt = sample.gt_instances
        if isinstance(gt.get("bboxes", None), BaseBoxes):
            gt.bboxes = gt.bboxes.tensor
        if gt.get("masks", None) is not None:
            gt.masks = mask2ndarray(gt.masks).astype(bool)
        sample.gt_instances = gt
    return sample


def browse_dataset(
    cfg: Config, out_dir: str, phase: str = "train", n: int | None = None, progress: bool = True
) -> list[str]:
    """Draw the first ``n`` images of a split after its pipeline, with their annotations, into ``out_dir``.

    Args:
        cfg: the loaded config (``tasks.config.load.load_config``); its ``{phase}_dataloader.dataset`` is browsed.
        out_dir: the folder for the PNGs (created); each is named after its image file (``<stem>.png``).
        phase: ``'train'`` (the training pipeline: random flips and crops as in training), ``'val'`` or ``'test'``.
        n: how many images (default: all of the split).
        progress: show a progress bar (tqdm, on stderr).

    Returns:
        the paths of the PNGs written, in dataset order.
    """
    from tqdm import tqdm

    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    scope = cfg.get("default_scope")
    register_scope(scope)
    cfg = copy.deepcopy(cfg)
    dataset_cfg = cfg[f"{phase}_dataloader"]["dataset"]
    if dataset_cfg.get("pipeline"):
        dataset_cfg["pipeline"] = annotations_first(dataset_cfg["pipeline"])
    dataset = MMDataModule(cfg, scope).dataset(phase)
    count = len(dataset) if n is None else min(n, len(dataset))
    vis = _visualizer(scope, dataset.metainfo)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for i in tqdm(range(count), desc=f"Browsing {phase}", unit="img", disable=not progress):
        item = dataset[i]
        sample = _drawable(item["data_samples"], scope)
        stem = osp.splitext(osp.basename(sample.img_path))[0]
        path = osp.join(out_dir, f"{stem}.png")
        if path in written:  # the same file twice in a split (e.g. a repeated dataset): keep both
            path = next(p for k in itertools.count(1) if (p := osp.join(out_dir, f"{stem}_{k}.png")) not in written)
        # out_file=None: the drawing stays in the visualizer (no vis backends), then is written atomically
        vis.add_datasample(stem, packed_image(item), sample, draw_gt=True, draw_pred=False)
        ok, png = cv2.imencode(".png", mmcv.rgb2bgr(vis.get_image()))
        if not ok:
            raise RuntimeError(f"could not encode the drawing of {sample.img_path} as PNG")
        atomic_write(path, lambda f, data=png: f.write(data.tobytes()))
        written.append(path)
    return written
