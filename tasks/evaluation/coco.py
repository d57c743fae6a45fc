"""COCO box / mask mAP as a torchmetrics ``Metric`` over faster-coco-eval, fed with mmdet data samples.

Both are ``torchmetrics.Metric`` subclasses: hold them as child modules, call ``update(data_samples)`` in
every validation step and ``compute()`` (on every rank: it syncs states across processes) at epoch end, then
``reset()``. Ranks may hold different numbers of images.
``compute()`` returns plain floats under the names logged by the project (see docs/DESIGN.md) and
``per_class = {metric name: {class name: float | None}}`` (None: the class has no ground truth), plain Python
values that JSON and ``torch.load(weights_only=True)`` accept. The records' pieces are
``tasks.evaluation.coco_records``'s, the COCOeval run and the AP selections ``tasks.evaluation.cocoeval``'s.
"""

from typing import Any, Optional, Sequence

import numpy as np
import torch.distributed as dist
from pycocotools import mask as mask_utils
from torchmetrics import Metric

from .coco_records import as_numpy, boxes_xywh, encode_masks_transposed, mask_areas
from .cocoeval import AP_SELECTIONS, average_precision, coco_precision
from .packed import pack, unpack

__all__ = ["DetectionEvaluator"]


class DetectionEvaluator(Metric):
    """COCO box (and mask) mAP of mmdet ``DetDataSample``s, computed with faster-coco-eval's ``COCOeval_faster``.

    ``update(data_samples)`` takes the samples returned by ``model.predict(...)`` /
    ``model(..., mode='predict')``, everything at ORIGINAL image scale (mmdet rescales predictions; its test
    pipelines run ``LoadAnnotations`` after ``Resize``, so ground truth is never resized):

    - ``pred_instances``: ``bboxes`` (N, 4) xyxy, ``scores`` (N,), ``labels`` (N,) contiguous class indices,
      and ``masks`` (N, H, W) bool when ``with_masks``;
    - ``gt_instances``: ``bboxes`` (xyxy ``HorizontalBoxes`` or tensor), ``labels`` (contiguous indices) and,
      when loaded, ``masks`` (``BitmapMasks`` / ``PolygonMasks`` / bool tensor);
    - ``ignored_instances`` (optional, same fields): COCO crowd regions (``PackDetInputs`` moves instances
      with ``gt_ignore_flags`` there), evaluated as ``iscrowd=1``;
    - ``metainfo['img_id']`` (optional, int): samples repeated with the same id (e.g. the padding of a
      ``DistributedSampler``) are evaluated once.

    The state is, per image, the boxes, scores and labels as small numpy arrays and every mask encoded once
    to COCO RLE (``encode_masks_transposed``): no dense mask is kept. Across processes the per-image lists
    are gathered as objects (ranks may hold different numbers of images).

    Ground-truth ``area`` (COCO's small/medium/large split) is the mask area whenever gt masks are present,
    else the box area. COCO's json ``area`` is the segmentation area: the pixel count for RLE (crowd)
    annotations, the polygon area for polygon ones (within a few pixels of the rasterised count that
    ``BitmapMasks`` give). Only the s/m/l numbers depend on it; a box-only config that does not load gt masks
    bins by box area instead.

    ``compute()`` returns floats ``bbox_mAP``, ``bbox_mAP_50``, ``bbox_mAP_75``, ``bbox_mAP_s``,
    ``bbox_mAP_m``, ``bbox_mAP_l`` and, with masks, ``segm_mAP``, ``segm_mAP_50``, ``segm_mAP_75``
    (COCO's -1 when there is no ground truth), and ``per_class``: ``{metric: {class name: float | None}}``
    for metrics ``bbox_AP``, ``bbox_AP_50``, ``bbox_AP_75``, ``bbox_AP_s``, ``bbox_AP_m``, ``bbox_AP_l`` (and
    the same ``segm_AP*`` with masks), the columns of mmdet's ``CocoMetric(classwise=True)`` table, unrounded;
    None where the class has no (non-crowd) ground truth in that area range (mmdet prints nan).

    Args:
        with_masks: also evaluate ``pred_instances.masks`` against the gt masks (COCO ``segm``).
        class_names: names of the contiguous class indices, used as ``per_class`` keys (the dataset's
            ``metainfo['classes']``; the Lightning task sets it from its data module). Without it the keys are
            the indices as strings, for the classes seen in ground truth or predictions.
        kwargs: ``torchmetrics.Metric`` options (``process_group``, ...).
    """

    full_state_update = False

    def __init__(self, with_masks: bool = True, class_names: Optional[Sequence[str]] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.with_masks = with_masks
        self.class_names = class_names
        # The state is packed (tasks/evaluation/packed.py): ``images`` holds one small tuple per image, ``blocks`` the
        # large byte blocks that hold the images' arrays and RLE counts.
        self.add_state("images", default=[], dist_reduce_fx=None)
        self.add_state("blocks", default=[], dist_reduce_fx=None)

    def _apply(self, fn: Any, exclude_state: Sequence[str] = ()) -> Any:
        # Module.to / .cuda must not touch the packed records (numpy and tuples, not tensors)
        return super()._apply(fn, exclude_state=(*exclude_state, "images", "blocks"))

    def forward(self, data_samples: Sequence[Any]) -> None:  # type: ignore[override]
        """Same as ``update`` (a per-batch COCO mAP means nothing)."""
        self.update(data_samples)

    def update(self, data_samples: Sequence[Any]) -> None:  # type: ignore[override]
        for sample in data_samples:
            pack(self.images, self.blocks, self._record(sample))

    def _record(self, sample: Any) -> dict:
        pred = sample.pred_instances
        record = dict(
            dt_boxes=boxes_xywh(pred.bboxes),
            dt_scores=as_numpy(pred.scores).astype(np.float64).reshape(-1),
            dt_labels=as_numpy(pred.labels).astype(np.int64).reshape(-1),
        )
        parts = [sample.gt_instances]
        ignored = sample.get("ignored_instances")
        if ignored is not None and "labels" in ignored:
            parts.append(ignored)
        labels = [as_numpy(p.labels).astype(np.int64).reshape(-1) for p in parts]
        record["gt_boxes"] = np.concatenate([boxes_xywh(p.bboxes) for p in parts])
        record["gt_labels"] = np.concatenate(labels)
        record["gt_crowd"] = np.concatenate([np.full(len(x), i) for i, x in enumerate(labels)])  # 1: ignored
        if all("masks" in p for p in parts):
            record["gt_areas"] = np.concatenate([mask_areas(p.masks) for p in parts])
        else:
            record["gt_areas"] = record["gt_boxes"][:, 2] * record["gt_boxes"][:, 3]
        if self.with_masks:
            self._encode_masks(record, pred, parts, sample.metainfo.get("img_path", ""))
        if "size" not in record:  # box-only: the image size (unused by box COCOeval)
            height, width = sample.metainfo.get("ori_shape", (0, 0))
            record["size"] = [int(width), int(height)]
        img_id = sample.metainfo.get("img_id", -1)
        record["img_id"] = int(img_id) if isinstance(img_id, (int, np.integer)) else -1
        return record

    @staticmethod
    def _encode_masks(record: dict, pred: Any, parts: list, img_path: str) -> None:
        if "masks" not in pred or not all("masks" in p for p in parts):
            raise ValueError(
                f"image {img_path}: DetectionEvaluator(with_masks=True) needs pred_instances.masks and "
                "gt masks; load them with LoadAnnotations(with_mask=True) in the test pipeline, or "
                "evaluate boxes only with with_masks=False"
            )
        record["dt_masks"], size = encode_masks_transposed(pred.masks)
        gt = [encode_masks_transposed(p.masks) for p in parts]
        record["gt_masks"] = [c for counts, _ in gt for c in counts]
        sizes = {tuple(s) for counts, s in [(record["dt_masks"], size), *gt] if counts}
        if len(sizes) > 1:
            raise ValueError(
                f"image {img_path}: masks of different sizes {sorted(sizes)} (transposed: W, H) in "
                "one sample; predictions and ground truth must both be at the original image scale"
            )
        record["size"] = list(sizes.pop()) if sizes else size  # [W, H] of the transposed masks
        record["dt_mask_areas"] = (
            mask_utils.area([dict(size=record["size"], counts=c) for c in record["dt_masks"]])
            .astype(np.float64)
            .reshape(-1)
            if record["dt_masks"]
            else np.zeros(0)
        )

    def compute(self) -> dict[str, Any]:  # type: ignore[override]
        images = self._dedup_and_sort_images()
        labels = np.concatenate([np.zeros(0, np.int64)] + [r[k] for r in images for k in ("gt_labels", "dt_labels")])
        if self.class_names is not None:
            num_classes = len(self.class_names)
            if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
                raise ValueError(
                    f"DetectionEvaluator: label {int(labels.max())} outside the {num_classes} classes "
                    f"of class_names (first: {list(self.class_names[:3])}); the model's num_classes "
                    "and the dataset's metainfo classes must agree"
                )
            cat_ids = list(range(num_classes))
            names = [str(n) for n in self.class_names]
        else:
            cat_ids = sorted(set(labels.tolist()))
            names = [str(c) for c in cat_ids]

        out: dict[str, Any] = {}
        per_class: dict[str, dict[str, Optional[float]]] = {}
        for iou_type in ("bbox", "segm") if self.with_masks else ("bbox",):
            precision = coco_precision(images, cat_ids, iou_type)
            for suffix, iou, area, max_dets in AP_SELECTIONS:
                ap = (
                    average_precision(precision, iou, area, max_dets)
                    if precision is not None
                    else np.full(len(names) + 1, np.nan)
                )
                if iou_type == "bbox" or suffix in ("", "_50", "_75"):
                    out[f"{iou_type}_mAP{suffix}"] = float(ap[-1]) if np.isfinite(ap[-1]) else -1.0  # COCO's -1
                per_class[f"{iou_type}_AP{suffix}"] = {
                    n: (float(v) if np.isfinite(v) else None) for n, v in zip(names, ap[:-1], strict=True)
                }
        out["per_class"] = per_class
        return out

    def _dedup_and_sort_images(self) -> list[dict]:
        # Keep the first sample of each img_id (id -1: always kept), in img_id order. COCOeval breaks score
        # ties between images by image order, so this makes results independent of update / rank order and
        # equal to the official evaluation (which sorts image ids).
        first: dict[int, int] = {}
        ids = [entry[0] for entry in self.images]
        keep = [k for k, i in enumerate(ids) if i < 0 or first.setdefault(i, k) == k]
        keep.sort(key=lambda k: ids[k])
        return [unpack(self.images[k], self.blocks, self.with_masks) for k in keep]

    def _sync_dist(self, dist_sync_fn: Optional[Any] = None, process_group: Optional[Any] = None) -> None:
        # Gather each rank's packed state as one object (ranks may hold different numbers of images, which a
        # per-tensor gather could not): its used bytes and its per-image tuples, a few large buffers to pickle
        # rather than hundreds of thousands of small objects.
        group = process_group or self.process_group
        used = [0] * len(self.blocks)  # each block's written bytes: only those travel
        for entry in self.images:
            used[entry[1]] = max(used[entry[1]], entry[3])
        local = (list(self.images), [block[:n] for block, n in zip(self.blocks, used, strict=True)])
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, local, group=group)
        del local
        images, blocks = [], []
        for rank_images, rank_blocks in gathered:
            images += [(i, b + len(blocks), *rest) for i, b, *rest in rank_images]
            blocks += rank_blocks
        self.images, self.blocks = images, blocks
