"""mmdet's ``CocoMetric`` as the COCO evaluation benchmark (``perf.coco.compare``) runs it: its flat results and its
logged classwise tables, captured and returned under our names."""

from __future__ import annotations

import logging

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
