#!/usr/bin/env python
"""Train an mmdet / mmseg model from an mmengine config, with Lightning running the loop.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--auto-scale-lr] [--check-data]
        [--cfg-options KEY=VALUE ...]

Devices, nodes, strategy, precision... come from the config's ``trainer = dict(...)`` (lightning.Trainer
kwargs), overridable like any key: ``--cfg-options trainer.devices=4 trainer.strategy=ddp``.
The work dir (default ``work_dirs/<config stem>``) receives the resolved config, ``last.ckpt``, the best
checkpoint when ``checkpoint_callback.monitor`` is set, CSV / TensorBoard logs (or the trackers of the config's
``loggers`` section, see tasks/training/trackers.py and docs/training.md) and, at the end, ``metrics.json`` (the last
validation metrics). ``--resume`` alone resumes from ``WORK_DIR/last.ckpt``;
``--resume auto`` does when it exists and starts fresh otherwise (what a requeued or restarted job runs).
The config's ``load_from`` (a whole-model checkpoint or URL) is loaded after the model's initialisation for
fine-tuning: tensors of another shape (heads for another number of classes) are skipped and logged; ``--resume``
wins over it (docs/training.md). ``--auto-scale-lr`` scales the lr to the real total batch size (see
tasks/training/optim.py and docs/training.md). ``--check-data`` first reads every sample of the config's datasets
(tools/check_data.py) and stops if one is bad.

On SIGUSR1 (the config's ``requeue_signal``) or SIGTERM, training stops at the next optimizer step with a
checkpoint, a SLURM job is requeued, and the process exits with status 75 (tasks/training/restart.py).

A process that fails prints ``rank R failed: <error>`` (after the traceback, unless the error is in the config, a
path or a checkpoint, which the message names) and exits with status 1; under Lightning's DDP
launcher the other ranks are then killed (see tasks/training/trainer.py for the process-group timeout).
"""

from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
import traceback

import lightning as L

from backbones.checkpoints.atomic import write_json, write_text
from backbones.errors import UserError
from tasks import build_task
from tasks.config.load import add_cfg_options, config_text, default_work_dir, load_config
from tasks.data.scan import check_before_training
from tasks.training.checkpoint_io import apply_load_from
from tasks.training.disk_space import DiskFullError
from tasks.training.optim import enable_auto_scale_lr
from tasks.training.process import process_rank, setup_mm_logger
from tasks.training.restart import resume_checkpoint, resume_command
from tasks.training.trackers import finish_tracking
from tasks.training.trainer import build_trainer, releasing_process_group

# Errors of the user's input, whose messages name the file or key and the fix: printed without a traceback.


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="mmengine config file")
    parser.add_argument("--work-dir", help="output directory (default: work_dirs/<config stem>)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="last",
        metavar="CKPT",
        help="resume training from CKPT (default: WORK_DIR/last.ckpt); 'auto': from WORK_DIR/last.ckpt when it "
        "exists, else start fresh",
    )
    parser.add_argument(
        "--auto-scale-lr",
        action="store_true",
        help="scale the optimizer's lr by (devices x nodes x train_dataloader.batch_size x gradient accumulation) "
        "/ auto_scale_lr.base_batch_size (the linear scaling rule; mmdet leaves accumulation out)",
    )
    parser.add_argument(
        "--check-data",
        action="store_true",
        help="first read every sample of the config's datasets (tools/check_data.py); stop, with the problems in "
        "WORK_DIR/check_data.json, if one is found",
    )
    add_cfg_options(
        parser,
        "override config keys, e.g. trainer.max_epochs=2 "
        "train_dataloader.dataset.data_root=data/tiny_coco/ (values parsed as literals)",
    )
    return parser.parse_args(argv)


@releasing_process_group()
def main(argv=None, callbacks=()) -> dict:
    """Run training; ``callbacks`` are extra Lightning callbacks (tests use them to inspect ranks)."""
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    if args.auto_scale_lr:
        enable_auto_scale_lr(cfg, args.config)
    work_dir = args.work_dir or default_work_dir(cfg, args.config)
    ckpt = resume_checkpoint(args.resume, work_dir)
    if args.check_data and process_rank() == 0:  # before anything is built; the other ranks start after it
        check_before_training(cfg, cfg.get("default_scope"), osp.join(work_dir, "check_data.json"), os.cpu_count() or 1)

    setup_mm_logger(work_dir)
    L.seed_everything((cfg.get("randomness") or {}).get("seed") or 0, workers=True)
    module, datamodule = build_task(cfg)
    apply_load_from(module.model, cfg.get("load_from"), ckpt)  # after init_weights(), before the first step
    trainer = build_trainer(cfg, work_dir, callbacks=callbacks)
    if trainer.is_global_zero:
        # the resolved config, readable by Config.fromfile; not cfg.dump, whose yapf formatting takes seconds
        write_text(osp.join(work_dir, osp.basename(args.config)), config_text(cfg))
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    except DiskFullError as e:
        e.resume = resume_command(sys.argv[1:] if argv is None else list(argv), work_dir)
        raise
    if not module.val_metrics and not module.validated:  # e.g. resumed a finished run: measure now
        trainer.validate(module, datamodule=datamodule)
    if trainer.is_global_zero:
        write_json(osp.join(work_dir, "metrics.json"), module.val_metrics)
    finish_tracking(trainer, module.val_metrics)
    return module.val_metrics


def cli(argv=None, callbacks=()) -> None:
    """``main`` for the command line: a failure prints ``rank R failed: ...`` and exits with status 1."""
    try:
        main(argv, callbacks)
    except Exception as e:  # noqa: BLE001 - report which process failed, then exit non-zero
        if not isinstance(e, UserError):  # a bad config, path or checkpoint: the message says it all
            traceback.print_exc()
        print(f"rank {process_rank()} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    cli()
