"""The detection evaluator's per-image state, packed into large append-only blocks.

``pack`` appends one image's record (``DetectionEvaluator._record``) and ``unpack`` rebuilds it; the evaluator
keeps ``images`` (one small tuple per image) and ``blocks`` (numpy byte blocks), gathered across ranks as objects.
"""

import numpy as np

# Why the state is packed: ``update`` runs between the caller's large temporaries (each image's (N, H, W) mask
# stack, ~30 MiB at COCO size, and pycocotools' buffers). Once the caller has freed one such stack, glibc
# raises its mmap threshold to that size (up to 32 MiB), so the following stacks come from the brk heap. Any
# small long-lived allocation that lands between or inside them (a numpy array's data, an RLE ``bytes`` over
# 512 bytes: ~10 to 100 per image if each image keeps its own) pins the heap: the freed stacks' holes can no
# longer be trimmed nor hold the next stack, and the process grows by megabytes per image (measured in
# tests/test_metrics.py and tools/benchmark_eval.py). So every image's arrays and RLE counts are copied into
# large append-only blocks of at least _BLOCK_BYTES, which glibc always maps apart from the heap (its mmap
# threshold never exceeds 32 MiB), and only their pages written are resident; what stays per image is one small
# tuple (Python's own small-object allocator, not the heap). The per-image dicts are rebuilt in compute().
_BLOCK_BYTES = 32 << 20
_DT_COLUMNS = 7  # x, y, w, h, score, label, mask area
_GT_COLUMNS = 7  # x, y, w, h, label, crowd, area


def _used_bytes(images: list) -> int:
    return images[-1][3] if images else 0  # the last image's end in the last block


def pack(images: list, blocks: list, record: dict) -> None:
    """Append ``record`` (``DetectionEvaluator._record``) to the packed state: its arrays and counts into the
    last block (a new one when full), ``(img_id, block, start, end, n_dt, n_gt, *size)`` to ``images``."""
    n_dt, n_gt = len(record["dt_labels"]), len(record["gt_labels"])
    dt_areas = record.get("dt_mask_areas", np.zeros(n_dt))
    dt = np.column_stack([record["dt_boxes"], record["dt_scores"], record["dt_labels"], dt_areas])
    gt = np.column_stack([record["gt_boxes"], record["gt_labels"], record["gt_crowd"], record["gt_areas"]])
    counts = [*record.get("dt_masks", ()), *record.get("gt_masks", ())]
    parts = [dt.astype(np.float64).tobytes(), gt.astype(np.float64).tobytes()]
    if "dt_masks" in record:
        parts += [np.array([len(c) for c in counts], np.int64).tobytes(), *counts]
    size = sum(len(p) for p in parts)
    start = (_used_bytes(images) + 7) // 8 * 8  # 8-aligned: the arrays are read back as views
    if not blocks or start + size > len(blocks[-1]):
        blocks.append(np.empty(max(_BLOCK_BYTES, size), np.uint8))
        start = 0
    block, pos = blocks[-1], start
    for part in parts:
        block[pos : pos + len(part)] = np.frombuffer(part, np.uint8)
        pos += len(part)
    images.append((record["img_id"], len(blocks) - 1, start, pos, n_dt, n_gt, *record["size"]))


def unpack(entry: tuple, blocks: list, with_masks: bool) -> dict:
    """The record dict of one packed image (arrays are views into its block; counts are ``bytes``)."""
    img_id, b, start, end, n_dt, n_gt, *size = entry
    data = blocks[b][start:end]
    dt_end = n_dt * _DT_COLUMNS * 8
    gt_end = dt_end + n_gt * _GT_COLUMNS * 8
    dt = data[:dt_end].view(np.float64).reshape(n_dt, _DT_COLUMNS)
    gt = data[dt_end:gt_end].view(np.float64).reshape(n_gt, _GT_COLUMNS)
    record = dict(
        img_id=img_id,
        size=size,
        dt_boxes=dt[:, :4],
        dt_scores=dt[:, 4],
        dt_labels=dt[:, 5].astype(np.int64),
        gt_boxes=gt[:, :4],
        gt_labels=gt[:, 4].astype(np.int64),
        gt_crowd=gt[:, 5].astype(np.int64),
        gt_areas=gt[:, 6],
    )
    if with_masks:
        record["dt_mask_areas"] = dt[:, 6]
        lens_end = gt_end + (n_dt + n_gt) * 8
        lens = data[gt_end:lens_end].view(np.int64)
        ends = lens_end + np.cumsum(lens)
        starts = ends - lens  # (not ends shifted by one: an image may have no masks at all)
        counts = [data[i:j].tobytes() for i, j in zip(starts.tolist(), ends.tolist(), strict=True)]
        record["dt_masks"], record["gt_masks"] = counts[:n_dt], counts[n_dt:]
    return record
