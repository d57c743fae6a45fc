"""The Lightning callbacks of the evaluation-path measurement (``perf.eval.path``): ``RssTrace`` records the
process's RSS around every validation / test epoch, ``MMMetric`` puts mmdet's ``CocoMetric`` / mmseg's
``IoUMetric`` in place of our evaluator in ``trainer.test`` (the baseline)."""

from __future__ import annotations

import os.path as osp
import tempfile
import time

import lightning as L

from ..memory import peak_rss_gib, rss_gib


def _reset_peak() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class RssTrace(L.Callback):
    """Records this process's RSS (GiB) around every validation / test epoch (sanity checks excluded).

    ``epochs`` holds one dict per evaluation epoch: ``start`` (before the first batch), ``first`` (after it),
    ``batches`` (``[images seen, RSS]`` after every ``every``-th batch), ``loop_end`` (after the last batch,
    before the metric's compute: callbacks' epoch-end hooks run before the module's), ``end`` (after compute,
    and for ``trainer.test`` after every callback's end hook, e.g. the submission files written) and
    ``peak`` (the highest RSS from ``start`` on: Linux resets the process's peak there), with ``images``,
    ``loop_s``, ``total_s`` and, for detection tests, ``dets`` (the number of predicted instances).

    Args:
        limit_gib: raise ``MemoryError`` when the RSS passes this after a batch (None: no limit).
        every: record every this many batches.
    """

    def __init__(self, limit_gib: float | None = None, every: int = 10) -> None:
        self.limit_gib = limit_gib
        self.every = every
        self.epochs: list[dict] = []
        self._batches = self._images = 0
        self._t0 = 0.0

    def _start(self, trainer) -> None:
        if trainer.sanity_checking:
            return
        _reset_peak()
        self._batches = self._images = 0
        self._t0 = time.perf_counter()
        self.epochs.append(dict(start=rss_gib(), batches=[]))

    def _batch(self, trainer, outputs, batch) -> None:
        if trainer.sanity_checking:
            return
        epoch = self.epochs[-1]
        for sample in outputs if isinstance(outputs, list) else ():  # test steps return their predictions
            if "pred_instances" in sample:
                epoch["dets"] = epoch.get("dets", 0) + len(sample.pred_instances)
        self._batches += 1
        self._images += len(batch["data_samples"])
        rss = rss_gib()
        if self._batches == 1:
            epoch["first"] = rss
        if self._batches % self.every == 0:
            epoch["batches"].append([self._images, rss])
        if self.limit_gib is not None and rss > self.limit_gib:
            raise MemoryError(
                f"RssTrace: RSS {rss:.2f} GiB after {self._images} images passed the limit of "
                f"{self.limit_gib} GiB (growth from the epoch start: {rss - epoch['start']:.2f} GiB)"
            )

    def _loop_end(self, trainer) -> None:
        if not trainer.sanity_checking:
            self.epochs[-1].update(loop_end=rss_gib(), images=self._images, loop_s=time.perf_counter() - self._t0)

    def _end(self, trainer) -> None:
        if trainer.sanity_checking or not self.epochs or "end" in self.epochs[-1]:
            return
        self.epochs[-1].update(end=rss_gib(), peak=peak_rss_gib(), total_s=time.perf_counter() - self._t0)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer)

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, outputs, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, outputs, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._loop_end(trainer)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._loop_end(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._end(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # after every callback's on_test_end (SubmissionWriter writes its files there)
        if stage == "test":
            self._end(trainer)


class MMMetric(L.Callback):
    """The baseline: mmdet's ``CocoMetric`` / mmseg's ``IoUMetric`` in place of our evaluator in ``trainer.test``.

    Turns the module's evaluator off (``evaluate_test = False``; the test steps still predict and hand their
    samples to the callbacks) and feeds the library's metric with the ``to_dict()`` of every sample, as
    mmengine's ``Evaluator.process`` does; ``Evaluator.evaluate``'s call at the epoch end. ``format_only``: the
    metric in its format-only mode (COCO results json / label PNGs written into ``out_dir``).

    Args:
        format_only: the metric's ``format_only`` mode (no metrics; files written).
        out_dir: where format-only files go (a temporary directory of the process by default).
    """

    def __init__(self, format_only: bool = False, out_dir: str | None = None) -> None:
        self.format_only = format_only
        self.out_dir = out_dir
        self.metric = None
        self.size = 0
        self.metrics: dict = {}

    def on_test_start(self, trainer, pl_module) -> None:
        pl_module.evaluate_test = False
        dataset = trainer.datamodule.dataset("test")
        self.size = len(dataset)
        out_dir = self.out_dir or tempfile.mkdtemp(prefix="mm-format-")
        if pl_module.scope == "mmdet":
            from mmdet.evaluation import CocoMetric

            iou_types = ["bbox", "segm"] if getattr(pl_module.model, "with_mask", False) else ["bbox"]
            kwargs = dict(format_only=True, outfile_prefix=osp.join(out_dir, "results")) if self.format_only else {}
            self.metric = CocoMetric(ann_file=dataset.ann_file, metric=iou_types, classwise=True, **kwargs)
        else:
            from mmseg.evaluation import IoUMetric

            kwargs = dict(format_only=True, output_dir=out_dir) if self.format_only else {}
            self.metric = IoUMetric(iou_metrics=["mIoU"], **kwargs)
        self.metric.dataset_meta = dataset.metainfo

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.metric.process({}, [sample.to_dict() for sample in outputs])

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self.metrics = {k: float(v) for k, v in self.metric.evaluate(self.size).items() if not isinstance(v, str)}
