"""The model summary printed when training starts: Lightning's, without its FLOPs column.

Lightning counts FLOPs only through the module's ``example_input_array``, which an mm detector's batch (a dict of
images and data samples) cannot be, so its column and total read 0 for every model. ``tools/get_flops.py``
gives the real figures.
"""

from __future__ import annotations

import logging

from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import get_formatted_model_size, get_human_readable_count

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # printed with Lightning's own lines


class ParamsSummary(ModelSummary):
    """``ModelSummary`` listing each top-level module's type, parameters and mode, then the totals."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int = 0,
        **summarize_kwargs,
    ) -> None:
        columns = [(name, [str(v) for v in values]) for name, values in summary_data if name != "FLOPs"]
        widths = [max([len(name), *map(len, values)]) for name, values in columns]
        rows = [[name for name, _ in columns], *zip(*(values for _, values in columns))]
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
        lines.insert(1, "-" * len(lines[0]))
        totals = (
            (get_human_readable_count(trainable_parameters), "trainable params"),
            (get_human_readable_count(total_parameters - trainable_parameters), "non-trainable params"),
            (get_formatted_model_size(model_size), "MB of parameters"),
        )
        lines += [f"{value:<10}{what}" for value, what in totals]
        log.info("\n".join(lines))
