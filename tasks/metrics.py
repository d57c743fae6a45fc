"""torchmetrics-based evaluators fed with mmdet / mmseg data samples.

Both are ``torchmetrics.Metric`` subclasses: hold them as child modules, call ``update(data_samples)`` in
every validation step and ``compute()`` (on every rank: it syncs states across processes) at epoch end, then
``reset()``. Ranks may hold different numbers of images.
``compute()`` returns plain floats under the names logged by the project (see docs/DESIGN.md).
"""
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics.classification import MulticlassJaccardIndex
from torchmetrics.detection import MeanAveragePrecision

# torchmetrics result key for each of our key suffixes (COCO stats 0-5)
_MAP_KEYS = {'': 'map', '_50': 'map_50', '_75': 'map_75',
             '_s': 'map_small', '_m': 'map_medium', '_l': 'map_large'}


def _box_tensor(boxes: Any) -> Tensor:
    return boxes.tensor if hasattr(boxes, 'tensor') else boxes  # mmdet HorizontalBoxes or (N, 4) tensor


def _mask_tensor(masks: Any) -> Tensor:
    # mmdet BitmapMasks / PolygonMasks (rasterised here) or a (N, H, W) tensor
    if hasattr(masks, 'to_tensor'):
        return masks.to_tensor(dtype=torch.bool, device='cpu')
    return masks.detach().bool().cpu()


def _mask_area(masks: Any) -> Tensor:
    # BitmapMasks: pixel count; PolygonMasks: polygon (shoelace) area, like COCO's float `area` of polygons
    areas = masks.areas if hasattr(masks, 'areas') else masks.flatten(1).sum(1).cpu()
    return torch.as_tensor(np.asarray(areas, dtype=np.float32)).reshape(-1)


class DetectionEvaluator(MeanAveragePrecision):
    """COCO box (and mask) mAP of mmdet ``DetDataSample``s, computed by torchmetrics with faster_coco_eval.

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

    Ground-truth ``area`` (COCO's small/medium/large split) is the mask area whenever gt masks are present,
    else the box area. COCO's json ``area`` is the segmentation area: the pixel count for RLE (crowd)
    annotations, the polygon area for polygon ones (within a few pixels of the rasterised count that
    ``BitmapMasks`` give). Only the s/m/l numbers depend on it; a box-only config that does not load gt masks
    bins by box area instead.

    ``compute()`` returns floats ``bbox_mAP``, ``bbox_mAP_50``, ``bbox_mAP_75``, ``bbox_mAP_s``,
    ``bbox_mAP_m``, ``bbox_mAP_l`` and, with masks, ``segm_mAP``, ``segm_mAP_50``, ``segm_mAP_75``
    (COCO's -1 when there is no ground truth).
    """

    def __init__(self, with_masks: bool = True, **kwargs: Any) -> None:
        iou_type = ('bbox', 'segm') if with_masks else ('bbox',)
        # torchmetrics' default thresholds come from float32 torch.linspace (0.550000011..., recall 0.2999999...),
        # which moves IoU / recall ties and shifts mAP by ~1e-3 on small sets; use COCOeval's float64 ones.
        kwargs.setdefault('iou_thresholds', np.linspace(0.5, 0.95, 10).tolist())
        kwargs.setdefault('rec_thresholds', np.linspace(0.0, 1.0, 101).tolist())
        super().__init__(iou_type=iou_type, backend='faster_coco_eval', **kwargs)
        self.with_masks = with_masks
        self.add_state('image_ids', default=[], dist_reduce_fx=None)

    def update(self, data_samples: Sequence[Any]) -> None:  # type: ignore[override]
        preds, targets = [], []
        for sample in data_samples:
            pred = sample.pred_instances
            preds.append(dict(boxes=pred.bboxes.detach().float().cpu(),
                              scores=pred.scores.detach().float().cpu(),
                              labels=pred.labels.detach().long().cpu()))
            if self.with_masks:
                # MeanAveragePrecision RLE-encodes masks right away and keeps only the RLEs
                preds[-1]['masks'] = pred.masks.detach().bool()

            parts = [sample.gt_instances]
            ignored = sample.get('ignored_instances')
            if ignored is not None and 'labels' in ignored:
                parts.append(ignored)
            labels = [p.labels.long().cpu().reshape(-1) for p in parts]
            boxes = torch.cat([_box_tensor(p.bboxes).float().cpu().reshape(-1, 4) for p in parts])
            iscrowd = torch.cat([torch.full_like(x, i) for i, x in enumerate(labels)])  # 0: gt, 1: ignored
            target = dict(boxes=boxes, labels=torch.cat(labels), iscrowd=iscrowd)
            if all('masks' in p for p in parts):
                target['area'] = torch.cat([_mask_area(p.masks) for p in parts])
            else:
                target['area'] = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            if self.with_masks:
                target['masks'] = torch.cat([_mask_tensor(p.masks) for p in parts])
            targets.append(target)
            img_id = sample.metainfo.get('img_id', -1)
            img_id = int(img_id) if isinstance(img_id, (int, np.integer)) else -1
            self.image_ids.append(torch.tensor([img_id]))
        super().update(preds, targets)

    def compute(self) -> dict[str, float]:  # type: ignore[override]
        self._dedup_and_sort_images()
        res = super().compute()
        out = {}
        for iou_type in self.iou_type:
            prefix = f'{iou_type}_' if len(self.iou_type) > 1 else ''
            suffixes = list(_MAP_KEYS) if iou_type == 'bbox' else ['', '_50', '_75']
            out.update({f'{iou_type}_mAP{s}': float(res[prefix + _MAP_KEYS[s]]) for s in suffixes})
        return out

    def _dedup_and_sort_images(self) -> None:
        # Keep the first sample of each img_id (id -1: always kept), in img_id order. COCOeval breaks score
        # ties between images by image order, so this makes results independent of update / rank order and
        # equal to the official evaluation (which sorts image ids). Idempotent: editing the states is safe.
        ids = [int(i) for i in self.image_ids]
        first: dict[int, int] = {}
        keep = [k for k, i in enumerate(ids) if i < 0 or first.setdefault(i, k) == k]
        keep.sort(key=lambda k: ids[k])
        for name in self._defaults:
            states = getattr(self, name)
            if states:  # per-image lists; mask lists stay empty without 'segm'
                assert len(states) == len(ids), name
                setattr(self, name, [states[k] for k in keep])

    def _sync_dist(self, dist_sync_fn: Optional[Any] = None, process_group: Optional[Any] = None) -> None:
        # MeanAveragePrecision gathers its per-image lists one tensor at a time, which needs the same number
        # of images on every rank (otherwise it hangs or drops images). Gather each rank's lists as one object
        # instead (CPU tensors, so that they unpickle on any rank).
        group = process_group or self.process_group
        local = {name: [s.cpu() if isinstance(s, Tensor) else s for s in getattr(self, name)]
                 for name in self._defaults}
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, local, group=group)
        for name in self._defaults:
            setattr(self, name, [s for rank_states in gathered for s in rank_states[name]])


class SegmentationEvaluator(MulticlassJaccardIndex):
    """Semantic segmentation ``mIoU``, ``aAcc``, ``mAcc`` (fractions) as mmseg's ``IoUMetric`` defines them.

    ``update(data_samples)`` takes mmseg ``SegDataSample``s: ``pred_sem_seg.data`` (1, H, W) class indices at
    original size and ``gt_sem_seg.data`` (1, H, W) (after ``reduce_zero_label``); ``ignore_index`` pixels are
    skipped. As in mmseg, a class absent from both prediction and ground truth is left out of mIoU
    (torchmetrics' macro average gives it weight 0), a class predicted but absent from the ground truth counts
    with IoU 0, and mAcc averages only the classes present in the ground truth. The state is one (C, C)
    confusion matrix, summed across processes.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255, **kwargs: Any) -> None:
        super().__init__(num_classes=num_classes, ignore_index=ignore_index, average='macro', **kwargs)
        self._per_class: Optional[dict[str, Tensor]] = None

    def update(self, data_samples: Sequence[Any]) -> None:  # type: ignore[override]
        preds = torch.cat([s.pred_sem_seg.data.reshape(-1) for s in data_samples]).to(self.device)
        target = torch.cat([s.gt_sem_seg.data.reshape(-1) for s in data_samples]).to(self.device)
        super().update(preds.long(), target.long())

    def compute(self) -> dict[str, float]:  # type: ignore[override]
        confmat = self.confmat.double()  # rows: ground truth, columns: prediction
        tp, gt_area, pred_area = confmat.diag(), confmat.sum(1), confmat.sum(0)
        # 0 / 0 = NaN marks the classes mmseg excludes (its nanmean)
        self._per_class = dict(IoU=tp / (gt_area + pred_area - tp), Acc=tp / gt_area)
        return {'mIoU': float(super().compute()), 'aAcc': float(tp.sum() / gt_area.sum()),
                'mAcc': float(self._per_class['Acc'].nanmean())}

    def per_class_iou(self) -> Tensor:
        """Per-class IoU (NaN: class absent from prediction and ground truth) of the last ``compute()``."""
        if self._per_class is None:
            raise RuntimeError('call compute() first')
        return self._per_class['IoU']

    def per_class_acc(self) -> Tensor:
        """Per-class accuracy (NaN: class absent from the ground truth) of the last ``compute()``."""
        if self._per_class is None:
            raise RuntimeError('call compute() first')
        return self._per_class['Acc']

    def reset(self) -> None:
        super().reset()
        self._per_class = None
