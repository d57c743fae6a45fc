#!/usr/bin/env python
"""Turn a Lightning checkpoint from tools/train.py into mm's own checkpoint format.

    python tools/export_model.py CHECKPOINT --out FILE.pth [--config CONFIG]

The output is ``{'state_dict': model tensors (no 'model.' prefix), 'meta': {'dataset_meta': {classes,
palette, ...}, 'cfg': config text, 'epoch', 'iter', 'metrics', ...}}``, the layout mmengine's Runner writes:
with the config it loads in mmdet's ``init_detector`` / ``DetInferencer`` and mmseg's ``init_model`` /
``MMSegInferencer``, which take the class names and palette from ``meta['dataset_meta']``. The tensors
are checked against the model the config builds (same keys, same shapes) before anything is written;
the file is written atomically and exporting twice gives identical bytes.
"""

from __future__ import annotations

import argparse
import copy
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))  # run from a checkout, uninstalled

import torch  # noqa: E402

from backbones.export import (  # noqa: E402
    EXTENSIONS,
    ExportError,
    canonical_state_dict,
    read_training_checkpoint,
    resolve_config,
    save_torch,
    tensor_sha256,
)
from backbones.pretrained import CheckpointError  # noqa: E402


def _safe(obj):
    """Metadata -> types that ``torch.load(weights_only=True)`` accepts (numpy -> Python; tuples kept)."""
    if isinstance(obj, dict):
        return {k: _safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_safe(v) for v in obj)
    if hasattr(obj, 'tolist') and not isinstance(obj, (str, bytes)):  # numpy arrays / scalars, tensors
        return _safe(obj.tolist())
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def dataset_meta(cfg) -> dict:
    """The test dataset's metainfo (classes, palette...), as mmdet's ``init_detector`` computes it: the
    dataset is built with ``lazy_init=True``, so no annotation file is read."""
    from mmengine.registry import DATASETS
    errors = []
    for section in ('test_dataloader', 'val_dataloader', 'train_dataloader'):
        loader = cfg.get(section)
        if loader and loader.get('dataset'):
            dataset_cfg = copy.deepcopy(loader['dataset'])
            dataset_cfg['lazy_init'] = True
            try:
                return _safe(dict(DATASETS.build(dataset_cfg).metainfo))
            except Exception as e:  # e.g. a wrapper dataset without lazy_init
                errors.append(f'{section}: {e}')
    raise ExportError('Cannot get the class names / palette from the config: no dataloader dataset could be '
                      f'built ({"; ".join(errors) or "no dataloader sections"}).')


def check_model(module_sd: dict, model, source: str) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(module_sd))
    unexpected = sorted(set(module_sd) - set(own))
    mismatched = [f'{k}: {tuple(module_sd[k].shape)} vs {tuple(own[k].shape)}'
                  for k in sorted(set(own) & set(module_sd)) if own[k].shape != module_sd[k].shape]
    if missing or unexpected or mismatched:
        raise CheckpointError(f'{source} does not match the model the config builds: missing {len(missing)} '
                              f'{missing[:4]}, unexpected {len(unexpected)} {unexpected[:4]}, shape mismatches '
                              f'{len(mismatched)} {mismatched[:3]}. Pass the training config (--config).')


def export_model(checkpoint: str | os.PathLike, out: str | os.PathLike, config: str | os.PathLike | None = None
                 ) -> dict:
    """Write ``checkpoint``'s model in mm's format to ``out``; returns the meta."""
    from tasks.config import register_scope
    out = os.fspath(out)
    if osp.splitext(out)[1].lower() not in EXTENSIONS['pth']:
        raise ExportError(f'{out!r}: an mm checkpoint is a torch.save file, name it .pth or .pt.')
    ckpt = read_training_checkpoint(checkpoint)
    if not ckpt.state_dict:
        raise CheckpointError(f'{ckpt.path!r} holds no model tensors.')
    cfg, config_info = resolve_config(ckpt, config)
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ExportError(f"The config's default_scope must be 'mmdet' or 'mmseg', got {scope!r}.")
    register_scope(scope)
    from mmengine.registry import MODELS
    model_cfg = copy.deepcopy(cfg.model)
    if isinstance(model_cfg.get('backbone'), dict):
        model_cfg.backbone.init_cfg = None  # the checkpoint provides every weight; load nothing here
    with torch.device('cpu'):
        check_model(ckpt.state_dict, MODELS.build(model_cfg), repr(ckpt.path))
    sd = canonical_state_dict(ckpt.state_dict)
    meta = {
        'dataset_meta': dataset_meta(cfg),
        'cfg': config_info['text'],
        'config_path': config_info.get('path'),
        'epoch': ckpt.epoch,
        'iter': ckpt.step,
        'metrics': _safe(ckpt.metrics),
        'metrics_source': ckpt.metrics_source,
        'best': _safe(ckpt.best),
        'source': {'checkpoint': ckpt.path, 'kind': ckpt.kind},
        'sha256': tensor_sha256(sd),
    }
    save_torch({'state_dict': sd, 'meta': meta}, out)
    return meta


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='Lightning .ckpt from tools/train.py')
    parser.add_argument('--out', required=True, help='output .pth file')
    parser.add_argument('--config', help='training config (needed when the checkpoint does not store it)')
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        meta = export_model(args.checkpoint, args.out, args.config)
    except (CheckpointError, ExportError) as e:
        if argv is not None:
            raise
        sys.exit(f'error: {e}')
    classes = meta['dataset_meta'].get('classes') or ()
    print(f"wrote {args.out}: {len(classes)} classes, step {meta['iter']}, epoch {meta['epoch']}, "
          f"metrics {meta['metrics']}\nsha256 of the tensors: {meta['sha256']}")
    return meta


if __name__ == '__main__':
    main()
