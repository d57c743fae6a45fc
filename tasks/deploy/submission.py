"""``tools/test.py --out-dir DIR`` (with ``--format-only``: without metrics): test-server submission files,
converted by the libraries' own metrics in their format-only mode.

* mmdet: ``DIR/results.bbox.json`` and, for models with masks, ``DIR/results.segm.json``, as mmdet's
  ``CocoMetric(format_only=True, outfile_prefix=DIR/results)`` writes them (``results2json``): the annotation
  file's image and category ids, RLE masks with ``counts`` as str. The annotation file needs only ``images``
  and ``categories`` (e.g. ``image_info_test-dev2017.json``). Every rank's per-image results are gathered to
  rank 0, which writes the files.
* mmseg: one label PNG per image, named after the image, as mmseg's ``IoUMetric(format_only=True,
  output_dir=DIR)`` writes them for the test server (``reduce_zero_label`` undone: label + 1). Each rank writes
  the images of its own batches (the eval sampler gives every image to exactly one rank).

Files appear in DIR only when complete: each rank writes into its own temporary directory inside DIR and
renames the finished files into place at the end.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import os.path as osp
import shutil
import tempfile

import lightning as L
import torch.distributed as dist

COCO_PREFIX = "results"  # -> results.bbox.json, results.segm.json
# IoUMetric's name prefix (mmengine warns about a metric without one); in format-only mode it computes no names
PREFIX = "submission"


class _DropSavedIn(logging.Filter):
    """mmdet's ``CocoMetric`` logs ``results are saved in <dir>`` naming the temporary directory the files are
    written in before they are renamed into place; tools/test.py says where they went."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("results are saved in")


@contextlib.contextmanager
def _quiet_coco_metric():
    """Keep pycocotools' progress prints (reading the annotation file) and mmdet's temporary path off the console."""
    from mmengine.logging import MMLogger

    logger, drop = MMLogger.get_current_instance(), _DropSavedIn()
    logger.addFilter(drop)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.removeFilter(drop)


def _gather_to_rank0(items: list) -> list | None:
    """All ranks' lists concatenated on rank 0 (None on the others); the list itself in one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(items, gathered, dst=0)
    return None if gathered is None else [x for part in gathered for x in part]


class SubmissionWriter(L.Callback):
    """Writes the predictions of ``trainer.test`` as submission files.

    Args:
        out_dir: directory for the files (created if missing).
        scope: ``'mmdet'`` (COCO results json) or ``'mmseg'`` (label PNGs).
    """

    def __init__(self, out_dir: str, scope: str):
        if scope not in ("mmdet", "mmseg"):
            raise ValueError(f"scope must be 'mmdet' or 'mmseg', got {scope!r}")
        self.out_dir = out_dir
        self.scope = scope
        self.metric = None
        self.tmp_dir = None
        self.reduce_zero_label = False

    def on_test_start(self, trainer, pl_module) -> None:
        dataset = trainer.datamodule.dataset("test")
        os.makedirs(self.out_dir, exist_ok=True)
        self.tmp_dir = tempfile.mkdtemp(prefix=f".partial-rank{trainer.global_rank}-", dir=self.out_dir)
        if self.scope == "mmdet":
            from mmdet.evaluation import CocoMetric

            ann_file = getattr(dataset, "ann_file", None)
            if not ann_file:
                raise ValueError(
                    "--out-dir: the COCO results format takes its image and category ids from the "
                    "annotation file; test_dataloader.dataset has no ann_file"
                )
            iou_types = ["bbox", "segm"] if pl_module.with_masks else ["bbox"]
            with _quiet_coco_metric():  # it reads the annotation file with pycocotools
                self.metric = CocoMetric(
                    ann_file=ann_file,
                    metric=iou_types,
                    format_only=True,
                    outfile_prefix=osp.join(self.tmp_dir, COCO_PREFIX),
                )
        else:
            from mmseg.evaluation import IoUMetric

            self.metric = IoUMetric(format_only=True, output_dir=self.tmp_dir, prefix=PREFIX)
            self.reduce_zero_label = bool(getattr(dataset, "reduce_zero_label", False))
        self.metric.dataset_meta = dataset.metainfo

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        samples = [sample.cpu().to_dict() for sample in outputs]
        if self.scope == "mmseg":
            for sample in samples:
                # SegTTAModel's merged samples keep no metainfo, so IoUMetric would not undo reduce_zero_label
                sample.setdefault("reduce_zero_label", self.reduce_zero_label)
        self.metric.process({}, samples)

    def on_test_end(self, trainer, pl_module) -> None:
        if self.scope == "mmdet":
            results = _gather_to_rank0(self.metric.results)
            if results is not None:
                # in image id order, so that the files do not depend on the number of processes
                results.sort(key=lambda gt_pred: gt_pred[1]["img_id"])
                with _quiet_coco_metric():
                    self.metric.compute_metrics(results)  # format_only: writes the json files, returns {}
        for name in sorted(os.listdir(self.tmp_dir)):
            os.replace(osp.join(self.tmp_dir, name), osp.join(self.out_dir, name))
        shutil.rmtree(self.tmp_dir)
        self.metric.results.clear()
        trainer.strategy.barrier()  # every rank's files are in place when the tool returns

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)  # no partial files left behind
