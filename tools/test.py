#!/usr/bin/env python
"""Evaluate a checkpoint on the config's test set (``test_dataloader``), with Lightning.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE.json] [--show-dir DIR]
                         [--cfg-options KEY=VALUE ...]

CHECKPOINT is a Lightning ``.ckpt`` from tools/train.py, or a plain mmdet / mmseg checkpoint of the
same model (``state_dict`` keys without the ``model.`` prefix). Prints a metrics table and writes them as
one JSON object to ``--out`` (default ``WORK_DIR/test_metrics.json``). ``--show-dir`` writes one PNG per
image with the predictions drawn by mmdet's / mmseg's visualizer. Runs on the devices of the config's
``trainer`` section (``--cfg-options trainer.devices=1`` to override); every image is evaluated once.
"""

from __future__ import annotations

import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # run from a checkout, uninstalled

from mmengine.config import DictAction  # noqa: E402

from tasks import build_task  # noqa: E402
from tasks.checkpoint_io import load_checkpoint_safely, write_json  # noqa: E402
from tasks.config import default_work_dir, load_config  # noqa: E402
from tasks.trainer import build_trainer  # noqa: E402
from tasks.visualize import PredictionWriter  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='mmengine config file')
    parser.add_argument('checkpoint', help='Lightning .ckpt or plain mm checkpoint')
    parser.add_argument('--work-dir', help='output directory (default: work_dirs/<config stem>)')
    parser.add_argument('--out', help='metrics JSON file (default: WORK_DIR/test_metrics.json)')
    parser.add_argument('--show-dir', help='write prediction overlays (PNG) here')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detection score threshold for --show-dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={}, metavar='KEY=VALUE',
                        help='override config keys (values parsed as literals)')
    return parser.parse_args(argv)


def load_plain_checkpoint(module, path: str) -> None:
    """Load a non-Lightning checkpoint into the mm model (mmengine / mmdet / mmseg release format)."""
    ckpt = load_checkpoint_safely(path)
    state = ckpt.get('state_dict', ckpt)
    state = {k.removeprefix('module.'): v for k, v in state.items()}
    module.model.load_state_dict(state, strict=True)


def format_table(metrics: dict) -> str:
    width = max([len(k) for k in metrics] + [6])
    lines = [f'{"metric":<{width}}  value', f'{"-" * width}  ------']
    lines += [f'{k:<{width}}  {v:.4f}' for k, v in metrics.items()]
    return '\n'.join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options)
    work_dir = args.work_dir or default_work_dir(cfg, args.config)
    if not osp.exists(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint} does not exist')
    # weights_only + allow-list: a checkpoint holding other Python objects is refused, never unpickled
    is_lightning = osp.isdir(args.checkpoint) or 'pytorch-lightning_version' in load_checkpoint_safely(
        args.checkpoint)

    module, datamodule = build_task(cfg, init_weights=False)  # the checkpoint provides every weight
    if not is_lightning:
        load_plain_checkpoint(module, args.checkpoint)
    callbacks = [PredictionWriter(args.show_dir, cfg.default_scope, args.score_thr)] if args.show_dir else []
    trainer = build_trainer(cfg, work_dir, callbacks=callbacks, for_test=True)
    trainer.test(module, datamodule=datamodule, ckpt_path=args.checkpoint if is_lightning else None,
                 verbose=False)
    metrics = module.test_metrics
    if trainer.is_global_zero:
        print(format_table(metrics))
        out = args.out or osp.join(work_dir, 'test_metrics.json')
        write_json(out, metrics)
        print(f'metrics written to {out}')
    return metrics


if __name__ == '__main__':
    main()
