"""Semantic segmentation mIoU / aAcc / mAcc as a torchmetrics ``Metric``, fed with mmseg data samples.

``update(data_samples)`` in every validation step, ``compute()`` on every rank at epoch end (it syncs the
confusion matrix across processes), then ``reset()``. ``compute()`` returns plain floats under the logged names
(docs/DESIGN.md) and ``per_class``.
"""

from typing import Any, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics.classification import MulticlassJaccardIndex

# Pixels per step of SegmentationEvaluator.update on the CPU. A whole ADE20K map is ~350k pixels, and its
# int64 temporaries (the ignore mask, the kept labels, the combined confusion index) are MB-sized blocks. Once
# glibc has raised its dynamic mmap threshold (it does when such a block is first freed), they are carved from
# the heap between small long-lived objects, and the holes they leave are not returned: the process grew with
# every image (docs/evaluation.md, "Evaluation memory"). Pieces of 8192 pixels keep every temporary at 64 KiB,
# below the mmap threshold from the start, reused from the heap's free lists.
_CHUNK = 8192


class SegmentationEvaluator(MulticlassJaccardIndex):
    """Semantic segmentation ``mIoU``, ``aAcc``, ``mAcc`` (fractions) as mmseg's ``IoUMetric`` defines them.

    ``update(data_samples)`` takes mmseg ``SegDataSample``s: ``pred_sem_seg.data`` (1, H, W) class indices at
    original size and ``gt_sem_seg.data`` (1, H, W) (after ``reduce_zero_label``); ``ignore_index`` pixels are
    skipped. As in mmseg, a class absent from both prediction and ground truth is left out of mIoU
    (torchmetrics' macro average gives it weight 0), a class predicted but absent from the ground truth counts
    with IoU 0, and mAcc averages only the classes present in the ground truth. The state is one (C, C)
    confusion matrix, summed across processes.

    ``compute()`` also returns ``per_class = {'IoU': {class name: float | None}, 'Acc': {...}}``, the columns
    of mmseg's per-class table as fractions; None for a class absent from the ground truth (mmseg prints nan
    there, or an IoU of 0 when the class was predicted).

    Args:
        num_classes: number of classes (the decode head's ``num_classes``).
        ignore_index: ground-truth label that is not evaluated.
        class_names: the ``per_class`` keys (the dataset's ``metainfo['classes']``, ``num_classes`` of them; the
            Lightning task sets it from its data module); default: the class indices as strings.
        kwargs: ``torchmetrics.Metric`` options.
    """

    def __init__(
        self, num_classes: int, ignore_index: int = 255, class_names: Optional[Sequence[str]] = None, **kwargs: Any
    ) -> None:
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, average="macro", **kwargs)
        self.class_names = class_names
        self._per_class: Optional[dict[str, Tensor]] = None

    def update(self, data_samples: Sequence[Any]) -> None:  # type: ignore[override]
        counts = self.confmat.view(-1)  # row-major (C, C): index target * C + prediction
        # On the CPU, each image in pieces of _CHUNK pixels (see there); on a GPU, whole (no heap to fragment).
        step = _CHUNK if counts.device.type == "cpu" else None
        ones = torch.ones(step or 1, dtype=counts.dtype, device=counts.device)
        for sample in data_samples:
            pred = sample.pred_sem_seg.data.reshape(-1).to(counts.device)
            target = sample.gt_sem_seg.data.reshape(-1).to(counts.device)
            if pred.numel() != target.numel():
                raise ValueError(
                    f"image {sample.metainfo.get('img_path', '')}: prediction shape "
                    f"{tuple(sample.pred_sem_seg.shape)} differs from the ground truth's "
                    f"{tuple(sample.gt_sem_seg.shape)}; both must be at the original image size"
                )
            size = step or max(1, pred.numel())
            if len(ones) < size:
                ones = ones.new_ones(size)
            for first in range(0, pred.numel(), size):
                t = target[first : first + size].long()
                p = pred[first : first + size].long()
                keep = t != self.ignore_index
                t, p = t[keep], p[keep]
                if len(t):
                    self._check_range(t, p, sample)
                    counts.index_add_(0, t * self.num_classes + p, ones[: len(t)])

    def _check_range(self, target: Tensor, pred: Tensor, sample: Any) -> None:
        for what, values in (("ground truth", target), ("prediction", pred)):
            low, high = torch.aminmax(values)
            if low < 0 or high >= self.num_classes:
                raise ValueError(
                    f"image {sample.metainfo.get('img_path', '')}: {what} label "
                    f"{int(low if low < 0 else high)} outside 0..{self.num_classes - 1} (and not the "
                    f"ignore_index {self.ignore_index}); the decode head's num_classes and the dataset must agree"
                )

    def compute(self) -> dict[str, Any]:  # type: ignore[override]
        confmat = self.confmat.double()  # rows: ground truth, columns: prediction
        tp, gt_area, pred_area = confmat.diag(), confmat.sum(1), confmat.sum(0)
        # 0 / 0 = NaN marks the classes mmseg excludes (its nanmean)
        self._per_class = dict(IoU=tp / (gt_area + pred_area - tp), Acc=tp / gt_area)
        names = self.class_names if self.class_names is not None else [str(c) for c in range(self.num_classes)]
        if len(names) != self.num_classes:
            raise ValueError(
                f"SegmentationEvaluator: {len(names)} class_names for num_classes={self.num_classes}; "
                "the decode head's num_classes and the dataset's metainfo classes must agree"
            )
        present = (gt_area > 0).tolist()
        per_class = {
            metric: {str(n): (float(v) if p else None) for n, v, p in zip(names, values.tolist(), present, strict=True)}
            for metric, values in self._per_class.items()
        }
        return {
            "mIoU": float(super().compute()),
            "aAcc": float(tp.sum() / gt_area.sum()),
            "mAcc": float(self._per_class["Acc"].nanmean()),
            "per_class": per_class,
        }

    def per_class_iou(self) -> Tensor:
        """Per-class IoU (NaN: class absent from prediction and ground truth) of the last ``compute()``."""
        if self._per_class is None:
            raise RuntimeError("call compute() first")
        return self._per_class["IoU"]

    def per_class_acc(self) -> Tensor:
        """Per-class accuracy (NaN: class absent from the ground truth) of the last ``compute()``."""
        if self._per_class is None:
            raise RuntimeError("call compute() first")
        return self._per_class["Acc"]

    def reset(self) -> None:
        super().reset()
        self._per_class = None
