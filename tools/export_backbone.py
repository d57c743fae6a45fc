#!/usr/bin/env python
"""Export the backbone of a trained detector / segmentor, for sharing or for initialising another model.

    python tools/export_backbone.py CHECKPOINT --out FILE [--format pth|safetensors|official|onnx|timm]
                                    [--config CONFIG] [--raw-weights]

CHECKPOINT: a Lightning ``.ckpt`` from tools/train.py, an mm-format checkpoint (``state_dict`` with
``backbone.*`` keys, e.g. from tools/export_model.py), or an official release as downloaded (``{'model': ...}``,
its variant read from its shapes). The backbone's family and arch come from the config stored in the checkpoint
or from ``--config`` (the training config; ``model.backbone``).

Formats (default: from the extension of FILE):
  pth          .pth/.pt          {'state_dict': backbone tensors (official key names), 'meta': {...}}
  safetensors  .safetensors      the same tensors; meta as JSON under the metadata key "meta"
  official     .pth/.pt          {'model': ..., 'meta': ...} in the official classification model's layout
                                 (STViT: constant unfold/fold kernels added; head keys absent, to be filled)
  onnx         .onnx             an ONNX graph of the backbone (plain path, eval mode): input "image"
                                 (batch, 3, height, width), outputs "stage0".."stage3" (the selected stages'
                                 feature maps, strides 4..32), batch / height / width dynamic; meta as JSON
                                 in the graph's metadata "meta" (backbones.checkpoints.export.export_onnx)
  timm         a folder          what timm's hub tools write: config.json (architecture, model_args,
                                 pretrained_cfg; meta under "meta") and model.safetensors, for
                                 timm.create_model('local-dir:FOLDER', pretrained=True); an official release
                                 keeps its classification head
meta records family, arch, out_indices, the config, step, epoch, the last validation metrics and the
tensors' sha256. Any of the first three loads with ``backbones.load_pretrained`` or
``init_cfg=dict(type='Pretrained', checkpoint=FILE)``.

From a checkpoint of a run with model EMA (``custom_hooks = [dict(type='EMAHook', ...)]``) the averaged weights are
exported, ``--raw-weights``: the raw ones; meta ``weights`` records which (``'ema'`` / ``'raw'``).
"""

from __future__ import annotations

import argparse

from backbones.checkpoints.export import FORMATS
from tasks.deploy.export import WEIGHTS, export_backbone, format_metrics
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="Lightning .ckpt, mm-format checkpoint or official release: path or URL")
    parser.add_argument(
        "--out", required=True, help="output file (.pth / .pt / .safetensors / .onnx), a folder for timm"
    )
    parser.add_argument("--format", choices=FORMATS, help="default: inferred from the extension of --out")
    parser.add_argument("--config", help="training config (needed when the checkpoint does not store it)")
    parser.add_argument(
        "--raw-weights",
        action="store_true",
        help="from a checkpoint with model EMA (custom_hooks EMAHook), the raw trained weights instead of the average",
    )
    return parser.parse_args(argv)


@command_line
def main(argv=None) -> dict:
    args = parse_args(argv)
    meta = export_backbone(args.checkpoint, args.out, args.format, args.config, raw_weights=args.raw_weights)
    metrics = format_metrics(meta["metrics"])
    print(
        f"wrote {args.out} ({meta['format']}): {meta['family']} backbone, {WEIGHTS[meta['weights']]}, "
        f"{meta['num_tensors']} tensors, "
        f"{meta['num_params']:,} values, step {meta['step']}, epoch {meta['epoch']}"
        f"{', ' + metrics if metrics else ''}\nsha256 of the tensors: {meta['sha256']}"
    )
    return meta


if __name__ == "__main__":
    main()
