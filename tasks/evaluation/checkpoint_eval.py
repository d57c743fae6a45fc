"""What tools/test.py does with its parsed arguments: the config's model with a checkpoint's weights, tested by
Lightning on the config's test set, every output path checked before the model runs."""

from __future__ import annotations

import argparse
import os.path as osp

from backbones.checkpoints.atomic import check_writable, write_json
from backbones.checkpoints.weights import check_checkpoint_path, load_state_dict_checked

from .. import build_task
from ..config.load import default_work_dir, load_config
from ..data.module import without_annotation_loading
from ..deploy.checkpoints import read_training_checkpoint
from ..deploy.submission import SubmissionWriter
from ..figures.predictions import PredictionWriter
from ..training.trainer import build_trainer
from .dump import PredictionDump, check_dump_path
from .tables import format_per_class_table, format_table
from .tta import enable_tta


def evaluate_checkpoint(args: argparse.Namespace, callbacks=()) -> dict:
    """Evaluate as tools/test.py's parsed ``args`` say (its docstring tells what each flag does), with extra
    Lightning ``callbacks``; return the metrics."""
    cfg = load_config(args.config, args.cfg_options, training=False)
    if args.dump:
        check_dump_path(args.dump, cfg.default_scope)  # before the model is built
    if args.format_only:  # no ground truth: none loaded, none needed on disk
        dataset = cfg.test_dataloader.dataset
        dataset.pipeline = without_annotation_loading(dataset.pipeline)
        (dataset.get("data_prefix") or {}).pop("seg_map_path", None)
    # a directory is a sharded Lightning checkpoint; a file (or an http(s) URL, downloaded once and verified) is
    # read safely (weights_only + allow-list) by backbones.checkpoints.weights; checked before any output folder is made
    checkpoint = args.checkpoint if osp.isdir(args.checkpoint) else check_checkpoint_path(args.checkpoint)
    work_dir = args.work_dir or default_work_dir(cfg, args.config)
    # every output is checked before the model runs: an unwritable path would fail only at the end
    if not args.format_only:
        check_writable(args.out or osp.join(work_dir, "test_metrics.json"))
    for folder in (args.show_dir, args.out_dir):
        if folder:
            check_writable(folder, folder=True)
    if args.dump and cfg.default_scope == "mmdet":
        check_writable(args.dump)
    elif args.dump:  # mmseg's PNG folder appears complete at the end: only its parent is made now
        check_writable(osp.dirname(osp.abspath(args.dump)), folder=True)
    module, datamodule = build_task(cfg, init_weights=False)  # the checkpoint provides every weight
    if args.tta:
        enable_tta(cfg, module, args.config)
    ckpt = None if osp.isdir(checkpoint) else read_training_checkpoint(checkpoint)
    if ckpt is not None:  # the weights only: testing restores no training state (Lightning's ckpt_path would)
        load_state_dict_checked(module.model, ckpt.state_dict, repr(args.checkpoint), strict=True)
    ema = ckpt is not None and ckpt.raw_state_dict is not None  # state_dict holds the average (mm's EMAHook layout)
    ckpt_is_dir = ckpt is None  # a sharded Lightning checkpoint: Lightning's strategy reassembles it
    del ckpt
    module.evaluate_test = not args.format_only
    callbacks = list(callbacks)
    if args.show_dir:
        callbacks.append(PredictionWriter(args.show_dir, cfg.default_scope, args.score_thr))
    if args.out_dir:
        callbacks.append(SubmissionWriter(args.out_dir, cfg.default_scope))
    if args.dump:
        callbacks.append(PredictionDump(args.dump, cfg.default_scope))
    trainer = build_trainer(cfg, work_dir, callbacks=callbacks, for_test=True)
    if ema and trainer.is_global_zero:
        print("the checkpoint holds model EMA: testing the EMA weights")
    trainer.test(module, datamodule=datamodule, ckpt_path=checkpoint if ckpt_is_dir else None, verbose=False)
    metrics = module.test_metrics
    if args.format_only:
        if trainer.is_global_zero:
            print(f"submission files written to {args.out_dir} (--format-only: no metrics)")
        return metrics
    if trainer.is_global_zero:
        if metrics.get("per_class"):
            print(format_per_class_table(metrics["per_class"]))
        print(format_table(metrics))
        out = args.out or osp.join(work_dir, "test_metrics.json")
        write_json(out, metrics)
        print(f"metrics written to {out}")
    return metrics
