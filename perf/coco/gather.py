"""The DDP gather of ``DetectionEvaluator``'s state: its peak memory per rank (``gather_peak``), each rank a gloo
process of its own holding the benchmark's generated images (``perf.coco.data``)."""

from __future__ import annotations

from ..memory import peak_rss_gib, rss_gib
from .data import CLASSES, make_samples


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
