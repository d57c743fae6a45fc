"""COCO average precision of ``DetectionEvaluator``'s records (``tasks.evaluation.coco``): faster-coco-eval's
``COCOeval_faster`` run on them (``coco_precision``) and the APs mmdet's ``CocoMetric`` reports, read from its
precision array (``average_precision`` of the ``AP_SELECTIONS``)."""

import contextlib
import io
from typing import Optional

import numpy as np

# mmdet's CocoMetric evaluates with maxDets (100, 300, 1000) (its proposal_nums): mAP at 100 detections per
# image, the other numbers and the classwise table at 1000 (the same unless a model keeps more than 100).
MAX_DETS = [100, 300, 1000]
# (suffix, IoU threshold index (None: all ten), area range index (all, small, medium, large), maxDets index)
AP_SELECTIONS = [
    ("", None, 0, 0),
    ("_50", 0, 0, 2),
    ("_75", 5, 0, 2),
    ("_s", None, 1, 2),
    ("_m", None, 2, 2),
    ("_l", None, 3, 2),
]


def average_precision(precision: np.ndarray, iou: Optional[int], area: int, max_dets: int) -> np.ndarray:
    """(K + 1,) APs of COCOeval's ``eval['precision']`` [T, R, K, A, M]: per category as mmdet's ``classwise``
    table computes them, then over all categories as ``COCOeval.summarize`` does (the mean of the entries
    that are not -1); NaN where there is no ground truth in that area range."""
    p = precision[:, :, :, area, max_dets] if iou is None else precision[iou : iou + 1, :, :, area, max_dets]
    p = p.transpose(2, 0, 1).reshape(p.shape[2], -1)  # (K, T * R)
    valid = p > -1
    sums, counts = np.where(valid, p, 0).sum(1), valid.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.append(sums / counts, sums.sum() / counts.sum())


def coco_precision(images: list[dict], cat_ids: list[int], iou_type: str) -> Optional[np.ndarray]:
    """COCOeval_faster's ``eval['precision']`` [T, R, K, A, M] on the records (None when there is nothing to
    evaluate). Images are numbered in their (sorted) order, which COCOeval keeps."""
    from faster_coco_eval import COCO, COCOeval_faster

    if not images or not cat_ids:
        return None
    gt_anns, dt_anns = [], []
    segm = iou_type == "segm"
    for img, r in enumerate(images, start=1):
        for k in range(len(r["gt_labels"])):
            ann = dict(
                id=len(gt_anns) + 1,
                image_id=img,
                category_id=int(r["gt_labels"][k]),
                bbox=r["gt_boxes"][k].tolist(),
                area=float(r["gt_areas"][k]),
                iscrowd=int(r["gt_crowd"][k]),
            )
            if segm:
                ann["segmentation"] = dict(size=r["size"], counts=r["gt_masks"][k])
            gt_anns.append(ann)
        for k in range(len(r["dt_labels"])):
            ann = dict(
                id=len(dt_anns) + 1,
                image_id=img,
                category_id=int(r["dt_labels"][k]),
                score=float(r["dt_scores"][k]),
                iscrowd=0,
                bbox=r["dt_boxes"][k].tolist(),
            )
            if segm:  # mask results: areas from the masks (mmdet drops their boxes; segm COCOeval ignores them)
                ann["segmentation"] = dict(size=r["size"], counts=r["dt_masks"][k])
                ann["area"] = float(r["dt_mask_areas"][k])
            else:
                ann["area"] = float(r["dt_boxes"][k, 2] * r["dt_boxes"][k, 3])
            dt_anns.append(ann)
    # RLE size [rows, cols] of the (transposed) masks
    image_list = [dict(id=i, height=r["size"][0], width=r["size"][1]) for i, r in enumerate(images, start=1)]
    categories = [dict(id=c, name=str(c)) for c in cat_ids]
    coco_gt = COCO(dict(images=image_list, annotations=gt_anns, categories=categories))
    coco_dt = COCO(dict(images=image_list, annotations=dt_anns, categories=categories))
    coco_eval = COCOeval_faster(coco_gt, coco_dt, iou_type)
    coco_eval.params.catIds = cat_ids
    coco_eval.params.maxDets = list(MAX_DETS)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval.evaluate()
        coco_eval.accumulate()
    return coco_eval.eval["precision"]
