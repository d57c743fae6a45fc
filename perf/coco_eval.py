"""The COCO evaluation benchmark: a synthetic val2017-like set, one evaluator per child process, the comparison.

``tools/benchmark_eval.py`` is the command line over ``run``. The set: COCO-sized images (640x480-ish, both
orientations), 1-14 polygon objects each of 80 classes (about 7 on average, as val2017), a few crowd regions
(RLE), an instances json for mmdet, and ``dets`` mask predictions per image (jittered copies of the objects and
random false positives, each a random polygon rasterised to an (H, W) bool mask at image size, as mmdet's
``predict`` returns them), as mmdet ``DetDataSample``s, all deterministic from the seed. Each evaluator runs in
a child process of its own (``python -m perf.coco_eval``), so that its time and memory are its own, fed the
same samples batch by batch; generating them is not timed, but it is in both children's memory figures alike.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from perf.child import last_json, run_module
from perf.memory import peak_rss_gib, rss_gib

NUM_CLASSES = 80
CLASSES = tuple(f"class{i}" for i in range(NUM_CLASSES))
SIZES = ((480, 640), (427, 640), (640, 480), (640, 427), (512, 640), (480, 640))  # (H, W), COCO-like
FLAT = [
    "bbox_mAP",
    "bbox_mAP_50",
    "bbox_mAP_75",
    "bbox_mAP_s",
    "bbox_mAP_m",
    "bbox_mAP_l",
    "segm_mAP",
    "segm_mAP_50",
    "segm_mAP_75",
]
EVALUATORS = ("ours", "mmdet")


# ---- synthetic data -------------------------------------------------------------------------------------
def _polygon(rng, cx: float, cy: float, rx: float, ry: float, h: int, w: int) -> list[float]:
    """A random star-shaped polygon (8-14 vertices) around (cx, cy), clipped to the image, as COCO's flat list."""
    n = int(rng.integers(8, 15))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(0.55, 1.0, n)
    xs = np.clip(cx + rx * radii * np.cos(angles), 0, w)
    ys = np.clip(cy + ry * radii * np.sin(angles), 0, h)
    return np.stack([xs, ys], 1).reshape(-1).round(2).tolist()


def image_ground_truth(seed: int, index: int) -> dict:
    """Image ``index``: size and objects ``[(label, polygon or None, crowd mask or None)]``."""
    rng = np.random.default_rng([seed, index, 0])
    h, w = SIZES[int(rng.integers(len(SIZES)))]
    objects = []
    for _ in range(int(rng.integers(1, 15))):
        side = float(np.exp(rng.uniform(np.log(10), np.log(400))))  # small / medium / large
        rx, ry = side / 2 * rng.uniform(0.6, 1.4, 2)
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        objects.append((int(rng.integers(NUM_CLASSES)), _polygon(rng, cx, cy, rx, ry, h, w), None))
    if rng.random() < 0.05:  # a crowd region (iscrowd=1, RLE), as COCO has on ~1% of its objects
        crowd = np.zeros((h, w), np.uint8)
        y, x = int(rng.integers(0, h - 100)), int(rng.integers(0, w - 150))
        crowd[y : y + 100, x : x + 150] = rng.random((100, 150)) < 0.6
        objects.append((int(rng.integers(NUM_CLASSES)), None, crowd))
    return dict(height=h, width=w, objects=objects)


def _object_rle(polygon: list[float] | None, crowd: np.ndarray | None, h: int, w: int) -> dict:
    from pycocotools import mask as mask_utils

    return mask_utils.frPyObjects([polygon], h, w)[0] if crowd is None else mask_utils.encode(np.asfortranarray(crowd))


def coco_json(seed: int, images: int) -> dict:
    """The instances json of the synthetic set (what mmdet's CocoMetric reads as ``ann_file``)."""
    from pycocotools import mask as mask_utils

    out = dict(images=[], annotations=[], categories=[dict(id=i + 1, name=n) for i, n in enumerate(CLASSES)])
    for index in range(images):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        out["images"].append(dict(id=index + 1, height=h, width=w, file_name=f"{index + 1:012d}.jpg"))
        for label, polygon, crowd in gt["objects"]:
            rle = _object_rle(polygon, crowd, h, w)
            x, y, bw, bh = mask_utils.toBbox(rle).tolist()
            if crowd is None:
                segmentation = [polygon]
            else:
                segmentation = dict(size=rle["size"], counts=rle["counts"].decode())
            # area: the pixel count of the rasterised segmentation (what BitmapMasks give our evaluator), so
            # that both evaluators bin small / medium / large identically
            out["annotations"].append(
                dict(
                    id=len(out["annotations"]) + 1,
                    image_id=index + 1,
                    category_id=label + 1,
                    bbox=[x, y, bw, bh],
                    area=float(mask_utils.area(rle)),
                    iscrowd=int(crowd is not None),
                    segmentation=segmentation,
                )
            )
    return out


def _ellipse_masks(ellipses: list[tuple[float, float, float, float]], h: int, w: int) -> tuple[Any, np.ndarray]:
    """An (N, H, W) bool tensor of filled ellipses ``(cx, cy, rx, ry)`` (pixel centres inside), allocated as
    mmdet's mask head allocates its output (``torch.zeros``, then pasted box by box), and their (N, 4) xyxy
    boxes (exclusive; zeros for an empty mask). Only each ellipse's box is computed, so a 100-mask image takes
    milliseconds where rasterising polygons with pycocotools takes far longer."""
    import torch

    masks = torch.zeros((len(ellipses), h, w), dtype=torch.bool)
    pixels = masks.numpy()
    boxes = np.zeros((len(ellipses), 4), np.float32)
    for k, (cx, cy, rx, ry) in enumerate(ellipses):
        x0, x1 = max(int(cx - rx), 0), min(int(np.ceil(cx + rx)) + 1, w)
        y0, y1 = max(int(cy - ry), 0), min(int(np.ceil(cy + ry)) + 1, h)
        if x1 <= x0 or y1 <= y0:
            continue
        xx = ((np.arange(x0, x1) + 0.5 - cx) / rx) ** 2
        yy = ((np.arange(y0, y1) + 0.5 - cy) / ry) ** 2
        inside = yy[:, None] + xx[None, :] <= 1
        pixels[k, y0:y1, x0:x1] = inside
        cols, rows = np.flatnonzero(inside.any(0)), np.flatnonzero(inside.any(1))
        if len(cols):
            boxes[k] = (x0 + cols[0], y0 + rows[0], x0 + cols[-1] + 1, y0 + rows[-1] + 1)
    return masks, boxes


def make_samples(seed: int, start: int, stop: int, dets: int) -> list:
    """mmdet ``DetDataSample``s of images [start, stop): predictions and ground truth at original scale."""
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import HorizontalBoxes
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    from pycocotools import mask as mask_utils

    samples = []
    for index in range(start, stop):
        gt = image_ground_truth(seed, index)
        h, w = gt["height"], gt["width"]
        rng = np.random.default_rng([seed, index, 1])
        parts = {0: [], 1: []}  # iscrowd -> [(label, rle)]
        for label, polygon, crowd in gt["objects"]:
            parts[int(crowd is not None)].append((label, _object_rle(polygon, crowd, h, w)))
        # predictions: ellipses on the objects, jittered (mostly the right class), then random false positives
        ellipses, labels = [], []
        for label, rle in parts[0] + parts[1]:
            x, y, bw, bh = mask_utils.toBbox(rle).tolist()
            if bw == 0 or bh == 0:
                continue
            for _ in range(int(rng.integers(1, 4))):
                jitter = rng.normal(0, 0.1, 4)
                cx, cy = x + bw * (0.5 + jitter[0]), y + bh * (0.5 + jitter[1])
                ellipses.append((cx, cy, max(bw / 2 * (1 + jitter[2]), 1.0), max(bh / 2 * (1 + jitter[3]), 1.0)))
                labels.append(label if rng.random() < 0.8 else int(rng.integers(NUM_CLASSES)))
        while len(ellipses) < dets:
            side = float(np.exp(rng.uniform(np.log(8), np.log(300))))
            rx, ry = side / 2 * rng.uniform(0.6, 1.4, 2)
            ellipses.append((rng.uniform(0, w), rng.uniform(0, h), rx, ry))
            labels.append(int(rng.integers(NUM_CLASSES)))
        masks, boxes = _ellipse_masks(ellipses[:dets], h, w)
        boxes += rng.normal(0, 1.0, boxes.shape).astype(np.float32)  # box and mask heads disagree a little

        sample = DetDataSample(metainfo=dict(img_id=index + 1, ori_shape=(h, w), img_shape=(h, w)))
        sample.pred_instances = InstanceData(
            bboxes=torch.from_numpy(boxes),
            labels=torch.tensor(labels[:dets], dtype=torch.long),
            scores=torch.from_numpy(rng.random(len(boxes)).astype(np.float32)),
            masks=masks,
        )
        for field, part in (("gt_instances", parts[0]), ("ignored_instances", parts[1])):
            rles = [rle for _, rle in part]
            msk = mask_utils.decode(rles).transpose(2, 0, 1) if rles else np.zeros((0, h, w), np.uint8)
            bxs = mask_utils.toBbox(rles).reshape(-1, 4) if rles else np.zeros((0, 4))
            bxs[:, 2:] += bxs[:, :2]
            sample.set_field(
                InstanceData(
                    bboxes=HorizontalBoxes(torch.from_numpy(bxs.astype(np.float32))),
                    labels=torch.tensor([label for label, _ in part], dtype=torch.long),
                    masks=BitmapMasks(np.ascontiguousarray(msk), h, w),
                ),
                field,
            )
        samples.append(sample)
    return samples


# ---- mmdet's classwise table ----------------------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def classwise_tables(messages: list[str]) -> list[dict]:
    """mmdet's logged classwise AsciiTables (one per iou_type, in order) -> ``{column: {class: float | None}}``
    (None where mmdet prints nan)."""
    tables = []
    for message in messages:
        rows = [
            [c.strip() for c in line.strip("|").split("|")] for line in message.splitlines() if line.startswith("|")
        ]
        if rows and rows[0][:2] == ["category", "mAP"]:
            tables.append(
                {
                    col: {row[0]: (None if row[i] == "nan" else float(row[i])) for row in rows[1:]}
                    for i, col in enumerate(rows[0])
                    if i
                }
            )
    return tables


def run_coco_metric(metric, n_samples: int) -> dict:
    """``metric.evaluate`` with its classwise tables captured: flat results + ``per_class`` in our names."""
    from mmengine.logging import MMLogger

    logger, handler = MMLogger.get_current_instance(), _Records()
    logger.addHandler(handler)
    try:
        out = {k.split("/")[-1]: v for k, v in metric.evaluate(n_samples).items()}
    finally:
        logger.removeHandler(handler)
    tables = classwise_tables(handler.messages)
    out = {k: v for k, v in out.items() if k in FLAT}
    out["per_class"] = {
        f"{iou_type}_AP{col.removeprefix('mAP')}": values
        for iou_type, table in zip(metric.metrics, tables, strict=True)
        for col, values in table.items()
    }
    return out


# ---- one child: one evaluator ---------------------------------------------------------------------------
def run_child(evaluator: str, ann_file: str, images: int, dets: int, batch: int, seed: int) -> dict:
    """Feed ``images`` generated samples to one evaluator (``ours`` or ``mmdet``), ``batch`` per update, then
    compute. Returns update / compute / total seconds, the process's peak RSS and its RSS growth over the
    updates (GiB: RSS after the last update minus RSS before the first) and after each update (``rss_trace_gib``,
    GiB), for ours the size of the evaluator's
    state (MiB: its arrays and RLE bytes), and the metrics."""
    import torch

    torch.set_num_threads(1)
    if evaluator == "ours":
        from tasks.evaluation.coco import DetectionEvaluator

        metric = DetectionEvaluator(with_masks=True, class_names=CLASSES)
        update, compute = metric.update, metric.compute
    else:
        from mmdet.evaluation import CocoMetric
        from mmengine.logging import MMLogger

        MMLogger.get_instance("mmengine", log_level="WARNING")
        metric = CocoMetric(ann_file=ann_file, metric=["bbox", "segm"], classwise=True)
        metric.dataset_meta = dict(classes=CLASSES)

        def update(samples):
            metric.process({}, [s.to_dict() for s in samples])  # as mmengine's Evaluator.process does

        def compute():
            return run_coco_metric(metric, images)

    make_samples(seed, 0, 1, dets)  # imports and first-call allocations, outside the growth
    rss_before, t_update, trace = rss_gib(), 0.0, []
    for start in range(0, images, batch):
        samples = make_samples(seed, start, min(start + batch, images), dets)
        t0 = time.perf_counter()
        update(samples)
        t_update += time.perf_counter() - t0
        del samples
        trace.append(rss_gib())
    growth = rss_gib() - rss_before
    state = _state_bytes(metric.images) if evaluator == "ours" else None
    t0 = time.perf_counter()
    metrics = compute()
    t_compute = time.perf_counter() - t0
    return dict(
        update_s=t_update,
        compute_s=t_compute,
        total_s=t_update + t_compute,
        peak_gib=peak_rss_gib(),
        growth_gib=growth,
        rss_trace_gib=trace,
        state_mib=None if state is None else state / 2**20,
        metrics=metrics,
    )


def _state_bytes(images: list) -> int:
    """Bytes of DetectionEvaluator's packed state: each image's arrays and RLE counts in its block."""
    return sum(entry[3] - entry[2] for entry in images)


def max_difference(ours: dict, ref: dict) -> tuple[float, str]:
    """Largest |ours - ref| over the flat metrics and the per-class table (None must meet None)."""
    worst, where = 0.0, ""
    pairs = [(k, ours[k], ref[k]) for k in FLAT]
    pairs += [
        (f"{m}[{c}]", ours["per_class"][m][c], v) for m, values in ref["per_class"].items() for c, v in values.items()
    ]
    for name, a, b in pairs:
        diff = float("inf") if (a is None) != (b is None) else 0.0 if a is None else abs(a - b)
        if diff > worst:
            worst, where = diff, name
    return worst, where


# ---- the benchmark: children alternating -------------------------------------------------------------------
KEYS = ("update_s", "compute_s", "total_s", "peak_gib", "growth_gib")


def run_in_child(config: dict, mmap_threshold: int | None = None) -> dict:
    """``run_child(**config)`` in a fresh Python process (``python -m perf.coco_eval``): its result. With
    ``mmap_threshold`` (bytes), the child runs with glibc's ``MALLOC_MMAP_THRESHOLD_`` set to it (see ``run``)."""
    env = None if mmap_threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)}
    return last_json(run_module("perf.coco_eval", json.dumps(config), env=env))


def run(
    images: int,
    dets: int,
    repeats: int,
    batch: int,
    seed: int,
    log=print,
    evaluators: tuple[str, ...] = EVALUATORS,
    mmap_threshold: int | None = None,
) -> dict:
    """``repeats`` rounds of the ``evaluators``' children, alternating (ours, mmdet, then mmdet, ours, ...),
    printing a row per child through ``log``. Returns ``runs`` (per evaluator: the children's results) and, when
    both ran, ``ratios`` (per key of ``KEYS``: ours / mmdet per round) and ``max_diff`` / ``max_diff_at``
    (``max_difference`` of round 0).

    ``mmap_threshold`` runs every child with glibc's fixed mmap threshold (``MALLOC_MMAP_THRESHOLD_``): large
    blocks are then always mapped apart from the heap, which keeps an evaluator that holds many small
    per-mask objects (mmdet's ``CocoMetric``) from fragmenting the heap between the freed mask stacks (see
    ``tasks/evaluation/coco.py``). Ours needs no such setting; it is there to run the baseline at full size."""
    unknown = set(evaluators) - set(EVALUATORS)
    if unknown or not evaluators:
        raise ValueError(f"evaluators must be a non-empty subset of {EVALUATORS}, got {evaluators}")
    runs: dict[str, list] = {name: [] for name in evaluators}
    with tempfile.TemporaryDirectory() as tmp:
        ann_file = os.path.join(tmp, "instances.json")
        with open(ann_file, "w") as f:
            json.dump(coco_json(seed, images), f)
        config = dict(ann_file=ann_file, images=images, dets=dets, batch=batch, seed=seed)
        setting = "" if mmap_threshold is None else f", MALLOC_MMAP_THRESHOLD_={mmap_threshold}"
        log(f"{images} images, {dets} mask predictions each, {repeats} round(s){setting}")
        log(
            f"{'round':>5}  {'evaluator':<9} {'update s':>9} {'compute s':>9} {'total s':>9} {'peak GiB':>8} "
            f"{'growth GiB':>10}"
        )
        for r in range(repeats):
            for name in evaluators if r % 2 == 0 else evaluators[::-1]:
                res = run_in_child(dict(config, evaluator=name), mmap_threshold)
                runs[name].append(res)
                log(
                    f"{r:>5}  {name:<9} {res['update_s']:>9.2f} {res['compute_s']:>9.2f} {res['total_s']:>9.2f} "
                    f"{res['peak_gib']:>8.2f} {res['growth_gib']:>10.3f}"
                )
    if len(runs) < 2:
        return dict(runs=runs)
    ratios = {k: [o[k] / m[k] for o, m in zip(runs["ours"], runs["mmdet"], strict=True)] for k in KEYS}
    diff, where = max_difference(runs["ours"][0]["metrics"], runs["mmdet"][0]["metrics"])
    for k, values in ratios.items():
        spread = f" (min {min(values):.3f}, max {max(values):.3f})" if len(values) > 1 else ""
        log(f"ours / mmdet {k.rsplit('_', 1)[0]:<8} median {statistics.median(values):.3f}{spread}")
    log(
        f"max |ours - mmdet| over {len(FLAT)} metrics and the per-class table: {diff:.2e} ({where}); "
        "mmdet rounds to 3 decimals"
    )
    return dict(runs=runs, ratios=ratios, max_diff=diff, max_diff_at=where)


# ---- the DDP gather of DetectionEvaluator's state ------------------------------------------------------------
def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets VmHWM (peak RSS) to the current RSS
        f.write("5")


def _gather_rank(rank: int, world: int, port: int, images: int, source: int, dets: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from tasks.evaluation.coco import DetectionEvaluator
    from tasks.evaluation.packed import pack, unpack

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    evaluator = DetectionEvaluator(with_masks=True, class_names=CLASSES)
    for start in range(rank * source, (rank + 1) * source):
        evaluator.update(make_samples(0, start, start + 1, dets))
    records = [unpack(entry, evaluator.blocks, True) for entry in evaluator.images]
    evaluator.reset()
    for k in range(images // world):  # this rank's share: the generated images again, under new ids
        record = dict(records[k % len(records)], img_id=rank * images + k + 1)
        pack(evaluator.images, evaluator.blocks, record)
    del records
    state = sum(entry[3] - entry[2] for entry in evaluator.images) / 2**30
    dist.barrier()
    before = rss_gib()
    _reset_peak_rss()
    evaluator.sync()  # what compute() does first: every rank's state gathered on every rank
    out = dict(rank=rank, state_gib=state, rss_before_gib=before, peak_gib=peak_rss_gib(), images=len(evaluator.images))
    evaluator.unsync()
    dist.destroy_process_group()
    queue.put(out)


def gather_peak(images: int = 5000, world: int = 2, source: int = 50, dets: int = 100) -> list[dict]:
    """Each of ``world`` gloo processes holds ``images / world`` images of DetectionEvaluator state (``source``
    generated images with ``dets`` masks each, repeated under new ids) and gathers all of it (``sync()``, as
    ``compute()`` does). Returns per rank: its state's size, its RSS before the gather and its peak during it
    (GiB), and the number of images gathered."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_rank, args=(r, world, port, images, source, dets, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    return results


def _main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m perf.coco_eval CONFIG_JSON (a child of perf.coco_eval.run)")
    print(json.dumps(run_child(**json.loads(argv[0]))))


if __name__ == "__main__":
    _main(sys.argv[1:])
