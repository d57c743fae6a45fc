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

from tasks.config.load import add_cfg_options
from tasks.evaluation.checkpoint_eval import evaluate_checkpoint
from tasks.runtime.cli import command_line
from tasks.training.trainer import releasing_process_group


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
    return evaluate_checkpoint(args, callbacks)


if __name__ == "__main__":
    main()
