"""The pieces of ``DetectionEvaluator``'s per-image records (``tasks.evaluation.coco``): numpy arrays of tensors,
COCO ``[x, y, w, h]`` boxes, masks encoded once to COCO RLE (``encode_masks_transposed``) and mask areas."""

from typing import Any

import numpy as np
from pycocotools import mask as mask_utils
from torch import Tensor


def as_numpy(x: Any) -> np.ndarray:
    """A tensor (on any device) or an array-like as a numpy array."""
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def boxes_xywh(boxes: Any) -> np.ndarray:
    """(N, 4) float64 COCO ``[x, y, w, h]`` of mmdet ``HorizontalBoxes`` or an (N, 4) xyxy tensor / array."""
    xyxy = as_numpy(boxes.tensor if hasattr(boxes, "tensor") else boxes).astype(np.float64).reshape(-1, 4)
    return np.concatenate([xyxy[:, :2], xyxy[:, 2:] - xyxy[:, :2]], axis=1)


def encode_masks_transposed(masks: Any) -> tuple[list[bytes], list[int]]:
    """COCO RLE ``counts`` of each mask's TRANSPOSE and their RLE size ``[W, H]``, in one pycocotools call and
    without copying the pixels.

    pycocotools encodes column-major (Fortran) arrays; an (N, H, W) C-ordered stack read as (W, H, N) is one,
    so encoding it yields the RLEs of the transposed masks at no copy, where encoding the masks themselves
    would first copy every pixel into Fortran order. Intersections, unions and areas do not change under
    transposition, so these RLEs give COCOeval's mask IoUs and areas exactly, as long as ground truth and
    predictions are both encoded this way. They are not for writing result files (their pixels are
    transposed). Accepts a bool / 0-1 tensor or array (N, H, W), mmdet ``BitmapMasks`` or ``PolygonMasks``
    (rasterised, as mmdet's ``to_ndarray`` does).
    """
    if hasattr(masks, "to_ndarray"):  # mmdet BitmapMasks (uint8 0/1) / PolygonMasks (rasterised here)
        masks = masks.to_ndarray()
    array = as_numpy(masks)
    if array.ndim != 3:
        raise ValueError(f"masks must be (N, H, W), got shape {array.shape}")
    size = [int(array.shape[2]), int(array.shape[1])]
    if len(array) == 0:
        return [], size
    if array.dtype == np.bool_:
        array = array.view(np.uint8)  # same bytes, 0 / 1
    elif array.dtype != np.uint8 or array.max() > 1:
        array = (array != 0).view(np.uint8)  # RLE runs toggle between 0 and 1 only
    array = np.ascontiguousarray(array)
    return [rle["counts"] for rle in mask_utils.encode(array.transpose(2, 1, 0))], size


def mask_areas(masks: Any) -> np.ndarray:
    # BitmapMasks: pixel count; PolygonMasks: polygon (shoelace) area, like COCO's float `area` of polygons
    areas = masks.areas if hasattr(masks, "areas") else as_numpy(masks).reshape(len(masks), -1).sum(1)
    return np.asarray(areas, dtype=np.float64).reshape(-1)
