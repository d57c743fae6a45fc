#!/usr/bin/env python
"""Evaluate a checkpoint on the config's test set (``test_dataloader``), with Lightning.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE.json] [--show-dir DIR]
                         [--tta] [--format-only] [--out-dir DIR] [--dump PATH] [--cfg-options KEY=VALUE ...]

CHECKPOINT is a Lightning ``.ckpt`` from tools/train.py, or a plain mmdet / mmseg checkpoint of the
same model (``state_dict`` keys without the ``model.`` prefix), or an http(s) URL of one (downloaded once into
torch.hub's cache; ``URL#sha256=<hex>`` verifies it). Prints a metrics table and writes them as
one JSON object to ``--out`` (default ``WORK_DIR/test_metrics.json``). ``--show-dir`` writes one PNG per
image with the predictions drawn by mmdet's / mmseg's visualizer. Runs on the devices of the config's
``trainer`` section (``--cfg-options trainer.devices=1`` to override); every image is evaluated once.
A checkpoint of a run with model EMA (``custom_hooks = [dict(type='EMAHook', ...)]``) is tested on its averaged
weights, as mmengine's EMAHook does.

``--tta``: test-time augmentation with the config's ``tta_model`` (mmseg ``SegTTAModel``: multi-scale + flip,
softmax averaged; mmdet ``DetTTAModel``: boxes merged by NMS, box-only detectors) on the config's
``tta_pipeline``. Sliding-window inference (mmseg) is a config setting:
``--cfg-options model.test_cfg.mode=slide 'model.test_cfg.crop_size=(512,512)' 'model.test_cfg.stride=(341,341)'``.

``--out-dir DIR``: test-server submission files (tasks/deploy/submission.py): ``DIR/results.bbox.json`` and
``DIR/results.segm.json`` (COCO results format), or one label PNG per image (ADE20K). ``--format-only``
writes only these, without metrics, and loads no ground truth (the test pipeline's ``LoadAnnotations`` steps are
left out, and so is an annotation directory): COCO's ``image_info_test-dev2017.json``, or ADE20K's test images
(``test_dataloader.dataset.data_prefix.img_path=release_test/testing``).

``--dump PATH``: the raw predictions where mmdet's / mmseg's analysis tools read them (tasks/evaluation/dump.py;
tools/analyze.py runs the tools): a ``.pkl`` in mmdet's ``DumpDetResults`` format, or a folder of label PNGs
(mmseg's ``confusion_matrix.py`` input). With or without metrics (``--format-only``).
"""

from __future__ import annotations

import argparse
import os.path as osp

from backbones.atomic import check_writable, write_json
from backbones.weights import check_checkpoint_path, load_state_dict_checked
from tasks import build_task
from tasks.config.load import add_cfg_options, default_work_dir, load_config
from tasks.data.module import without_annotation_loading
from tasks.deploy.checkpoints import read_training_checkpoint
from tasks.deploy.submission import SubmissionWriter
from tasks.evaluation.dump import PredictionDump, check_dump_path
from tasks.evaluation.tables import format_per_class_table, format_table
from tasks.evaluation.tta import enable_tta
from tasks.figures.predictions import PredictionWriter
from tasks.runtime.cli import command_line
from tasks.training.trainer import build_trainer, releasing_process_group


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="mmengine config file")
    parser.add_argument("checkpoint", help="Lightning .ckpt or plain mm checkpoint, a path or an http(s) URL")
    parser.add_argument("--work-dir", help="output directory (default: work_dirs/<config stem>)")
    parser.add_argument("--out", help="metrics JSON file (default: WORK_DIR/test_metrics.json)")
    parser.add_argument("--show-dir", help="write prediction overlays (PNG) here")
    parser.add_argument("--score-thr", type=float, default=0.3, help="detection score threshold for --show-dir")
    parser.add_argument(
        "--tta", action="store_true", help="test-time augmentation with the config's tta_model and tta_pipeline"
    )
    parser.add_argument("--out-dir", help="write submission files here (COCO results json / label PNGs)")
    parser.add_argument(
        "--format-only",
        action="store_true",
        help="only write the --out-dir submission files: no ground truth, no metrics",
    )
    parser.add_argument(
        "--dump", help="save the predictions for mm's analysis tools: FILE.pkl (mmdet) or a PNG folder (mmseg)"
    )
    add_cfg_options(parser)
    return parser.parse_args(argv)


@releasing_process_group()
@command_line
def main(argv=None, callbacks=()) -> dict:
    args = parse_args(argv)
    if args.format_only and not args.out_dir:
        raise SystemExit("--format-only writes submission files only: give the directory with --out-dir DIR")
    return test(args, callbacks)


def test(args: argparse.Namespace, callbacks=()) -> dict:
    """Evaluate as ``args`` (``parse_args``) say, with extra Lightning ``callbacks``; return the metrics."""
    cfg = load_config(args.config, args.cfg_options, training=False)
    if args.dump:
        check_dump_path(args.dump, cfg.default_scope)  # before the model is built
    if args.format_only:  # no ground truth: none loaded, none needed on disk
        dataset = cfg.test_dataloader.dataset
        dataset.pipeline = without_annotation_loading(dataset.pipeline)
        (dataset.get("data_prefix") or {}).pop("seg_map_path", None)
    # a directory is a sharded Lightning checkpoint; a file (or an http(s) URL, downloaded once and verified) is
    # read safely (weights_only + allow-list) by backbones.weights; checked before any output folder is made
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


if __name__ == "__main__":
    main()
