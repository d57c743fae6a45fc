"""The training process before its trainer exists: its rank, and mm's logger set up so that mm's INFO reports go
to the work dir and the console stays Lightning's."""

from __future__ import annotations

import logging
import os
import os.path as osp

from lightning.fabric.utilities.rank_zero import rank_zero_only
from mmengine.logging import MMLogger

from ..runtime.quiet import quiet_mm_console


def setup_mm_logger(work_dir: str) -> None:
    """mm's INFO reports (per-parameter init and paramwise options) go to WORK_DIR/mm.log, only
    warnings to the console, which belongs to Lightning's progress bar. Ranks > 0 (known from the
    launcher's env before Lightning starts) write no file."""
    name = osp.abspath(work_dir)
    if MMLogger.check_instance_created(name):
        # main() again in this process on the same work dir (a notebook resuming the run): its logger, as it is
        # (arguments for an existing instance are ignored, with a warning)
        logger = MMLogger.get_instance(name)
    elif rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", 0)) == 0:
        os.makedirs(work_dir, exist_ok=True)
        logger = MMLogger.get_instance(name, log_file=osp.join(work_dir, "mm.log"), log_level="INFO")
    else:
        logger = MMLogger.get_instance(name, log_level="WARNING")
    for handler in logger.handlers:
        if type(handler) is logging.StreamHandler:
            handler.setLevel(logging.WARNING)
            quiet_mm_console(handler)


def process_rank() -> int:
    """This process's global rank: Lightning's once a trainer exists, else the launcher's environment."""
    if rank_zero_only.rank:  # set by Lightning to the global rank once the trainer exists
        return rank_zero_only.rank
    for var in ("RANK", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0
