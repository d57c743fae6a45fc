"""The COCO evaluation benchmark: one evaluator per child process, the comparison.

``tools/benchmark_eval.py`` is the command line over ``run``. The set is ``perf.coco.data``'s (a synthetic
val2017-like set: its instances json for mmdet and ``DetDataSample``s with mask predictions at image size, all
deterministic from the seed); mmdet's ``CocoMetric`` runs as ``perf.coco.mmdet_metric`` captures it; the DDP gather of
our evaluator's state is ``perf.coco.gather``'s. Each evaluator runs in a child process of its own
(``python -m perf.coco.compare``), so that its time and memory are its own, fed the same samples batch by batch;
generating them is not timed, but it is in both children's memory figures alike.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from perf.child import last_json, run_module
from perf.coco.data import CLASSES, coco_json, make_samples
from perf.coco.mmdet_metric import FLAT, run_coco_metric
from perf.memory import peak_rss_gib, rss_gib

__all__ = [
    "EVALUATORS",
    "KEYS",
    "max_difference",
    "run",
    "run_child",
    "run_in_child",
]

EVALUATORS = ("ours", "mmdet")


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
    """``run_child(**config)`` in a fresh Python process (``python -m perf.coco.compare``): its result. With
    ``mmap_threshold`` (bytes), the child runs with glibc's ``MALLOC_MMAP_THRESHOLD_`` set to it (see ``run``)."""
    env = None if mmap_threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)}
    return last_json(run_module("perf.coco.compare", json.dumps(config), env=env))


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


def _main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m perf.coco.compare CONFIG_JSON (a child of perf.coco.compare.run)")
    print(json.dumps(run_child(**json.loads(argv[0]))))


if __name__ == "__main__":
    _main(sys.argv[1:])
