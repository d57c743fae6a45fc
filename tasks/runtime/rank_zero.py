"""``rank_zero_info`` for the code that runs before a trainer exists, or without one: loading a config and
building the optimizer.

Lightning's own ``rank_zero_info`` would import Lightning (seconds of start-up: docs/measuring.md) into the
tools that only read a config (``print_config.py``, ``browse_dataset.py``, ``get_flops.py``, ``benchmark.py
--config`` and its memory children). So: when Lightning is loaded (training, testing), its function prints the
line, with its rank rule (the strategy's global rank once set up) and its console handler, as before; otherwise
the process has no trainer and one rank, and the line goes to stderr through the ``tasks`` logger.
"""

from __future__ import annotations

import logging
import sys

_log = logging.getLogger("tasks")


def rank_zero_info(message: str) -> None:
    if "lightning.pytorch" in sys.modules:
        from lightning.pytorch.utilities import rank_zero_info as lightning_info

        lightning_info(message)
        return
    if not _log.handlers and not logging.getLogger().hasHandlers():
        # Lightning's own console set-up for its logger: INFO lines, unformatted, unless the application
        # configured logging itself (then they propagate to its handlers).
        _log.setLevel(logging.INFO)
        _log.addHandler(logging.StreamHandler())
        _log.propagate = False
    _log.info(message)
