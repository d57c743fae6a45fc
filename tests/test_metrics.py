"""tasks.evaluation.coco against the real mmdet ``CocoMetric`` / mmseg ``IoUMetric`` on random-ish data."""

import contextlib
import copy
import io
import json
import multiprocessing
import random
import socket
import traceback

import numpy as np
import pytest
import torch
import torch.distributed as dist
from pycocotools import mask as mask_utils

from perf.coco.compare import run_in_child
from perf.coco.mmdet_metric import run_coco_metric
from tasks.evaluation.coco import DetectionEvaluator
from tasks.evaluation.segmentation import SegmentationEvaluator
from tests._tools import flat_metrics

CLASSES = ("person", "car", "dog", "cat")  # 'cat' is predicted (false positives) but never in the ground truth
CAT_IDS = (3, 7, 18, 25)  # COCO-style non-contiguous ids: mmdet label i <-> CAT_IDS[i]
BBOX_KEYS = ["bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "bbox_mAP_s", "bbox_mAP_m", "bbox_mAP_l"]
SEGM_KEYS = ["segm_mAP", "segm_mAP_50", "segm_mAP_75"]
STAT_SUFFIXES = ["", "_50", "_75", "_s", "_m", "_l"]  # COCOeval.stats[:6]
SEG_CLASSES = 7  # ground truth uses 0-4; 5 is predicted but never labelled; 6 appears nowhere


def _ellipse(h: int, w: int, box) -> np.ndarray:
    """Bool mask of the ellipse inscribed in box (x1, y1, x2, y2), sampled at pixel centres."""
    x1, y1, x2, y2 = box
    yy, xx = np.mgrid[:h, :w] + 0.5
    rx, ry = max((x2 - x1) / 2, 1.0), max((y2 - y1) / 2, 1.0)
    return ((xx - (x1 + x2) / 2) / rx) ** 2 + ((yy - (y1 + y2) / 2) / ry) ** 2 <= 1


def _random_box(rng, h, w, side):
    bw, bh = np.minimum(side * rng.uniform(0.7, 1.4, 2), [w - 2, h - 2])
    x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
    return np.array([x1, y1, x1 + bw, y1 + bh])


def make_detection_data(seed: int = 0, n_images: int = 10):
    """mmdet-style DetDataSamples (predictions + gt at original scale) and the matching COCO json dict.

    Image 0 has no ground truth, image 1 no predictions, images 2 and 5 a crowd region with detections on it;
    objects span COCO's small / medium / large ranges; scores are rounded so that some tie across images.
    """
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    rng = np.random.default_rng(seed)
    categories = [dict(id=c, name=n) for c, n in zip(CAT_IDS, CLASSES, strict=True)]
    coco = dict(images=[], annotations=[], categories=categories)
    samples = []
    for i, img_id in enumerate(rng.choice(10**6, n_images, replace=False).tolist()):
        h, w = rng.integers(150, 260, size=2).tolist()
        coco["images"].append(dict(id=img_id, width=w, height=h, file_name=f"{img_id}.jpg"))
        gts = []  # (label, mask, iscrowd)
        for _ in range(0 if i == 0 else rng.integers(1, 7)):
            side = [rng.uniform(6, 30), rng.uniform(35, 90), rng.uniform(100, 140)][rng.integers(3)]
            gts.append((int(rng.integers(3)), _ellipse(h, w, _random_box(rng, h, w, side)), 0))
        if i in (2, 5):
            crowd = np.zeros((h, w), bool)
            crowd[20:120, 30:150] = rng.random((100, 120)) < 0.7  # crowds are ragged blobs
            gts.append((int(rng.integers(3)), crowd, 1))

        parts = {0: [], 1: []}  # iscrowd -> [(xyxy box, label, mask)]
        for label, mask, iscrowd in gts:
            ys, xs = np.nonzero(mask)
            x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1  # tight box, as in COCO
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            coco["annotations"].append(
                dict(
                    id=len(coco["annotations"]) + 1,
                    image_id=img_id,
                    category_id=CAT_IDS[label],
                    iscrowd=iscrowd,
                    bbox=[float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                    area=float(mask.sum()),
                    segmentation=dict(size=rle["size"], counts=rle["counts"].decode()),
                )
            )
            parts[iscrowd].append(([x1, y1, x2, y2], label, mask))

        boxes, labels = [], []
        if i != 1:
            for label, mask, iscrowd in gts:
                ys, xs = np.nonzero(mask)
                box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
                side = np.sqrt((box[2] - box[0]) * (box[3] - box[1]))
                for _ in range(2 if iscrowd else int(rng.random() < 0.85) + int(rng.random() < 0.2)):
                    boxes.append(box + rng.normal(0, 0.08 * side, 4))
                    labels.append(label if rng.random() < 0.9 else int(rng.integers(3)))
            for _ in range(rng.integers(0, 4)):  # false positives
                boxes.append(_random_box(rng, h, w, rng.uniform(8, 100)))
                labels.append(int(rng.integers(4)))
        boxes = np.clip(np.array(boxes, np.float32).reshape(-1, 4), 0, [w, h, w, h])

        sample = DetDataSample(metainfo=dict(img_id=img_id, ori_shape=(h, w), img_shape=(h, w)))
        sample.pred_instances = InstanceData(
            bboxes=torch.from_numpy(boxes),
            labels=torch.tensor(labels, dtype=torch.long),
            scores=torch.from_numpy(rng.random(len(boxes)).round(2).astype(np.float32)),
            masks=torch.from_numpy(np.array([_ellipse(h, w, b) for b in boxes]).reshape(-1, h, w)),
        )
        for field, part in (("gt_instances", parts[0]), ("ignored_instances", parts[1])):
            bxs, lbs, msk = zip(*part, strict=True) if part else ([], [], [])
            sample.set_field(
                InstanceData(
                    bboxes=HorizontalBoxes(torch.tensor(bxs, dtype=torch.float32).reshape(-1, 4)),
                    labels=torch.tensor(lbs, dtype=torch.long),
                    masks=BitmapMasks(np.array(msk, np.uint8).reshape(-1, h, w), h, w),
                ),
                field,
            )
        samples.append(sample)
    return samples, coco


def make_segmentation_data(seed: int = 0, n_images: int = 6):
    """mmseg-style SegDataSamples: blocky gt with ignore (255) pixels, noisy predictions."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_images):
        h, w = rng.integers(30, 70, size=2).tolist()
        gt = np.kron(rng.integers(0, 5, (h // 8 + 1, w // 8 + 1)), np.ones((8, 8), np.int64))[:h, :w]
        gt[rng.random((h, w)) < 0.1] = 255
        gt[: h // 4, : w // 4] = 255
        pred = np.where(gt == 255, rng.integers(0, 6, (h, w)), gt)  # ignored pixels: predictions don't count
        noise = rng.random((h, w)) < 0.3
        pred[noise] = rng.integers(0, 6, noise.sum())  # class 5 is predicted, never labelled
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(data=torch.from_numpy(gt[None]))
        sample.pred_sem_seg = PixelData(data=torch.from_numpy(pred[None]))
        samples.append(sample)
    return samples


@pytest.fixture(scope="module")
def det_data(tmp_path_factory):
    """Samples, mmdet CocoMetric(classwise=True)'s results on them (against a real COCO ann_file; rounded to 3
    decimals; 'per_class': its classwise tables by our names), and the unrounded COCOeval stats and classwise
    APs (mmdet's formula on pycocotools' precision array) of the result files CocoMetric wrote."""
    from mmdet.evaluation import CocoMetric
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    samples, coco = make_detection_data()
    tmp = tmp_path_factory.mktemp("coco")
    (tmp / "instances.json").write_text(json.dumps(coco))
    metric = CocoMetric(
        ann_file=str(tmp / "instances.json"),
        metric=["bbox", "segm"],
        classwise=True,
        outfile_prefix=str(tmp / "results"),
    )
    metric.dataset_meta = dict(classes=CLASSES)  # CocoMetric maps label i to the id of category CLASSES[i]
    metric.process({}, [s.to_dict() for s in samples])  # what mmengine's Evaluator feeds it
    ref = run_coco_metric(metric, len(samples))  # + its classwise tables

    exact = {"per_class": {}}
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(tmp / "instances.json"))
        for iou_type in ("bbox", "segm"):
            dets = json.loads((tmp / f"results.{iou_type}.json").read_text())
            if iou_type == "segm":  # as CocoMetric does, so that mask AP_s/m/l use mask areas
                [d.pop("bbox") for d in dets]
            coco_eval = COCOeval(gt, gt.loadRes(dets), iou_type)
            coco_eval.params.catIds = list(CAT_IDS)  # as CocoMetric: the dataset's classes, in their order
            coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
            exact.update({f"{iou_type}_mAP{s}": coco_eval.stats[i] for i, s in enumerate(STAT_SUFFIXES)})
            precision = coco_eval.eval["precision"]  # [IoU, recall, class, area, maxDets]
            for suffix, iou, area in (
                ("", slice(None), 0),
                ("_50", slice(0, 1), 0),
                ("_75", slice(5, 6), 0),
                ("_s", slice(None), 1),
                ("_m", slice(None), 2),
                ("_l", slice(None), 3),
            ):
                exact["per_class"][f"{iou_type}_AP{suffix}"] = {}
                for k, name in enumerate(CLASSES):
                    p = precision[iou, :, k, area, -1]
                    p = p[p > -1]
                    exact["per_class"][f"{iou_type}_AP{suffix}"][name] = float(np.mean(p)) if p.size else None
    return samples, ref, exact


@pytest.fixture(scope="module")
def seg_data():
    from mmseg.evaluation import IoUMetric

    samples = make_segmentation_data()
    metric = IoUMetric(iou_metrics=["mIoU"])
    metric.dataset_meta = dict(classes=tuple(f"c{i}" for i in range(SEG_CLASSES)))
    metric.process({}, [s.to_dict() for s in samples])
    ref = {k: v / 100 for k, v in metric.evaluate(len(samples)).items()}  # mmseg reports percentages
    # mmseg's unrounded per-class IoU
    areas = [
        IoUMetric.intersect_and_union(s.pred_sem_seg.data.squeeze(), s.gt_sem_seg.data.squeeze(), SEG_CLASSES, 255)
        for s in samples
    ]
    per_class = IoUMetric.total_area_to_metrics(*[sum(a) for a in zip(*areas, strict=True)], ["mIoU"])
    ref["IoU"], ref["Acc"] = per_class["IoU"], per_class["Acc"]
    ref["gt_area"] = sum(a[3] for a in areas).numpy()  # area_label: ground-truth pixels per class
    return samples, ref


def _evaluate(evaluator, batches):
    for batch in batches:
        evaluator.update(batch)
    return evaluator.compute()


def test_detection_matches_mmdet(det_data):
    samples, ref, exact = det_data
    # the data exercise every number: no -1 (empty area range) and no trivial 0 / 1
    assert all(0.05 < ref[k] < 0.95 for k in BBOX_KEYS + SEGM_KEYS), ref
    out = _evaluate(DetectionEvaluator(class_names=CLASSES), [samples[:4], samples[4:]])
    assert set(out) == set(BBOX_KEYS + SEGM_KEYS + ["per_class"])
    for k in BBOX_KEYS + SEGM_KEYS:
        assert out[k] == pytest.approx(ref[k], abs=1e-3), k  # mmdet rounds to 3 decimals
        assert out[k] == pytest.approx(exact[k], abs=1e-6), k
    _check_per_class(out["per_class"], ref["per_class"], exact["per_class"], ["bbox", "segm"])


def _check_per_class(ours: dict, ref: dict, exact: dict, iou_types: list) -> None:
    names = [f"{t}_AP{s}" for t in iou_types for s in STAT_SUFFIXES]
    assert set(ours) == set(names) and all(set(ours[m]) == set(CLASSES) for m in names)
    # every class of the table is exercised: one without ground truth, the others with AP in (0, 1)
    assert ref["bbox_AP"]["cat"] is None and ours["bbox_AP"]["cat"] is None
    assert all(0.05 < ref["bbox_AP"][c] < 0.95 for c in CLASSES[:3]), ref["bbox_AP"]
    assert sum(v is None for m in names for v in ref[m].values()) > len(iou_types)  # some empty area ranges too
    for m in names:
        for c in CLASSES:  # None exactly where mmdet prints nan
            assert (ours[m][c] is None) == (ref[m][c] is None) == (exact[m][c] is None), (m, c)
            if ours[m][c] is not None:
                assert ours[m][c] == pytest.approx(ref[m][c], abs=5.01e-4), (m, c)  # mmdet's table: 3 decimals
                assert ours[m][c] == pytest.approx(exact[m][c], abs=1e-6), (m, c)
    assert json.loads(json.dumps(ours, allow_nan=False)) == ours  # plain JSON: null, never NaN


def test_detection_box_only_matches_mmdet(det_data):
    samples, ref, exact = det_data
    out = _evaluate(DetectionEvaluator(with_masks=False, class_names=CLASSES), [samples])
    assert set(out) == set(BBOX_KEYS + ["per_class"])
    for k in BBOX_KEYS:
        assert out[k] == pytest.approx(ref[k], abs=1e-3), k
        assert out[k] == pytest.approx(exact[k], abs=1e-6), k
    _check_per_class(out["per_class"], ref["per_class"], exact["per_class"], ["bbox"])
    # masks asked for but not loaded: a clear error, not an AttributeError from inside
    broken = copy.deepcopy(samples[3])  # clone() is shallow
    del broken.gt_instances.masks
    with pytest.raises(ValueError, match=r"LoadAnnotations\(with_mask=True\).*with_masks=False"):
        DetectionEvaluator().update([broken])
    # without class names the classes are named by their indices, for those seen
    unnamed = _evaluate(DetectionEvaluator(with_masks=False), [samples])["per_class"]["bbox_AP"]
    assert unnamed == {str(i): out["per_class"]["bbox_AP"][c] for i, c in enumerate(CLASSES)}


@pytest.mark.slow
def test_detection_update_memory_stays_bounded():
    """COCO-sized images (640x480-ish), 100 bool masks at image size each (allocated as mmdet's predict does),
    fed one per update in a fresh process. After the first 30 images (the allocator's working set for the
    transient mask stacks: the RSS is flat from about the 20th on), the process may grow by the evaluator's state
    (about 2 MiB over these 70 images), not by megabytes per image, as it did when every image kept its own small
    arrays and RLE bytes between the freed mask stacks (a fragmented heap: ~2 MiB per image, ~140 MiB here)."""
    images, warmup = 100, 30
    out = run_in_child(dict(evaluator="ours", ann_file="", images=images, dets=100, batch=1, seed=0))
    growth_mib = (out["rss_trace_gib"][-1] - out["rss_trace_gib"][warmup - 1]) * 1024
    assert growth_mib < 30, growth_mib
    assert 1 < out["state_mib"] < 10
    assert out["metrics"]["segm_mAP"] > 0.01  # a real evaluation ran


def test_detection_image_without_predictions_or_ground_truth(det_data):
    # an image with no detections and no objects (an untrained model on an empty image) is packed and unpacked
    # with no masks at all, and changes no metric (COCOeval skips it)
    samples = det_data[0]
    empty = copy.deepcopy(samples[0])
    empty.set_metainfo(dict(img_id=999))
    for field in ("pred_instances", "gt_instances", "ignored_instances"):
        empty.set_field(getattr(empty, field)[:0], field)
    assert len(empty.pred_instances) == len(empty.gt_instances) == len(empty.ignored_instances) == 0
    assert _evaluate(DetectionEvaluator(), [[empty], samples]) == _evaluate(DetectionEvaluator(), [samples])


def test_detection_order_split_duplicates_reset(det_data):
    samples = det_data[0]
    expected = _evaluate(DetectionEvaluator(), [samples])
    shuffled = random.Random(0).sample(samples, len(samples))
    evaluator = DetectionEvaluator()
    # other order, two calls, and a repeated image (as a padding sampler would give): same numbers
    assert _evaluate(evaluator, [shuffled[:3], shuffled[3:] + shuffled[:1]]) == expected
    evaluator.reset()
    assert _evaluate(evaluator, [samples[5:], samples[:5]]) == expected


def test_segmentation_matches_mmseg(seg_data):
    samples, ref = seg_data
    names = [f"c{i}" for i in range(SEG_CLASSES)]
    evaluator = SegmentationEvaluator(num_classes=SEG_CLASSES, class_names=names)
    out = _evaluate(evaluator, [samples[:2], samples[2:]])
    assert set(out) == {"mIoU", "aAcc", "mAcc", "per_class"}
    for k in ("mIoU", "aAcc", "mAcc"):  # mmseg rounds to 2 decimals of a percent
        assert out[k] == pytest.approx(ref[k], abs=1e-3), k
    # per class: mmseg's unrounded table where the class has ground truth, None (JSON null) where not
    assert set(out["per_class"]) == {"IoU", "Acc"}
    for metric in ("IoU", "Acc"):
        assert list(out["per_class"][metric]) == names
        for i, name in enumerate(names):
            value = out["per_class"][metric][name]
            if ref["gt_area"][i] > 0:
                assert value == pytest.approx(ref[metric][i], rel=1e-6), (metric, name)
            else:  # class 5 (predicted: mmseg IoU 0, Acc nan) and 6 (nowhere: nan)
                assert value is None, (metric, name)
    assert ref["IoU"][5] == 0 and np.isnan(ref["IoU"][6]) and (ref["gt_area"][:5] > 0).all()
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert list(_evaluate(SegmentationEvaluator(SEG_CLASSES), [samples])["per_class"]["IoU"]) == [
        str(i) for i in range(SEG_CLASSES)
    ]
    iou, acc = evaluator.per_class_iou(), evaluator.per_class_acc()
    np.testing.assert_allclose(iou.numpy(), ref["IoU"], rtol=1e-6)  # NaNs at the same places
    assert iou[5] == 0 and torch.isnan(iou[6]) and torch.isnan(acc[5]) and torch.isnan(acc[6])
    # other order and split: same numbers
    evaluator.reset()
    assert _evaluate(evaluator, [samples[3:], samples[:3]]) == out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, port: int, det: list, seg: list, queue) -> None:
    try:
        torch.set_num_threads(1)  # a forked child must not use the parent's OpenMP pool (deadlocks)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        out = {}
        for evaluator, data in ((DetectionEvaluator(), det), (SegmentationEvaluator(SEG_CLASSES), seg)):
            for k in range(0, len(data), 2):
                evaluator.update(data[k : k + 2])
            out.update(evaluator.compute())
        dist.destroy_process_group()
        queue.put((rank, out))
    except BaseException:  # report instead of leaving the test waiting
        queue.put((rank, traceback.format_exc()))


def test_ddp_sync(det_data, seg_data):
    """Two gloo processes holding different numbers of images give the single-process numbers."""
    det, seg = det_data[0], seg_data[0]
    expected = {**_evaluate(DetectionEvaluator(), [det]), **_evaluate(SegmentationEvaluator(SEG_CLASSES), [seg])}
    # unequal shares; rank 1 also repeats an image of rank 0 (what a padding sampler does)
    shares = [(det[:6], seg[:4]), (det[6:] + det[:1], seg[4:])]
    ctx = multiprocessing.get_context("fork")  # the children inherit the imports: quick to start
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, *shares[r], queue), daemon=True) for r in range(2)]
    try:
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for r in range(2):
        assert flat_metrics(results[r]) == pytest.approx(flat_metrics(expected), abs=1e-6, nan_ok=True), results[r]
