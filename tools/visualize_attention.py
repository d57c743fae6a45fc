#!/usr/bin/env python
"""Draw what the backbone attends to on an image: STViT's super tokens, HAT-Net's window and global attention,
another family's attention maps.

    python tools/visualize_attention.py CONFIG CHECKPOINT IMAGE [IMAGE ...] --out-dir DIR
        [--stages I ...] [--point X Y] [--stoken INDEX ...] [--device cpu|cuda]

CONFIG: the training config (its ``model.backbone`` builds the backbone; its test pipeline and data
preprocessor prepare each image exactly as tools/test.py feeds it to the model: resize, normalisation,
padding). CHECKPOINT: a Lightning ``.ckpt`` (tools/train.py), an mm-format checkpoint (tools/export_model.py),
a backbone export (tools/export_backbone.py: .pth / .safetensors / official layout) or an official ImageNet
release: only the backbone's weights are used (``backbones.load_pretrained``).

The maps are the ones the backbone computes in its forward pass (``backbones.models.attention_maps``), from the last
block of each stage, averaged over heads, drawn over the original image (mapped back through the pipeline's
scale factor and padding), one labelled PNG per image in DIR:

- STViT, ``<image>_stvit_supertokens.png``, for each stage with super tokens (``stoken_size`` > 1):
  top: every pixel assigned to the super token (among its 9 neighbours) with the highest affinity, drawn
  as region boundaries; bottom: the soft association (affinity) of every pixel to one super token: the one
  under ``--point`` (default the image centre), or ``--stoken`` (flat row-major index in that stage's grid,
  one value per drawn stage or one for all).
- HAT-Net, ``<image>_hatnet_attention.png``, for the query pixel ``--point X Y`` (original-image pixels,
  default the image centre), one column per stage: top: its attention inside its grid_size window; bottom:
  its global attention over the pooled map (over all positions in a stage without windows).
- A family whose records are of another kind (``Family.picture``), ``<image>_<family>_maps.png``: every map its
  records hold over a stage's positions (one row per record entry, averaged over heads), or an error saying that
  they hold none.
"""

from __future__ import annotations

import argparse

from backbones.checkpoints.atomic import check_writable
from tasks.config.load import add_cfg_options, load_config, torch_device
from tasks.figures.attention_run import draw_attention
from tasks.runtime.cli import command_line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="training config (mmengine); model.backbone must be a backbone family's type")
    parser.add_argument(
        "checkpoint", help="Lightning .ckpt, mm-format checkpoint, backbone export or official ImageNet release"
    )
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--out-dir", required=True, help="directory for the PNGs (created if missing)")
    parser.add_argument(
        "--stages",
        nargs="+",
        type=int,
        metavar="I",
        help="stages to draw, 0-3 (default: every stage with a map, e.g. STViT's with super tokens)",
    )
    parser.add_argument(
        "--point",
        nargs=2,
        type=float,
        metavar=("X", "Y"),
        help="query point in original-image pixels (default: the image centre)",
    )
    parser.add_argument(
        "--stoken",
        nargs="+",
        type=int,
        metavar="INDEX",
        help="STViT: super token whose soft association is drawn, as a flat row-major index in "
        "the stage's super-token grid; one per drawn stage, or one for all "
        "(default: the super token under --point)",
    )
    parser.add_argument(
        "--device", type=torch_device, default="cpu", help="torch device, e.g. 'cpu' or 'cuda' (default: cpu)"
    )
    add_cfg_options(parser)
    return parser.parse_args(argv)


@command_line
def main(argv=None) -> list[str]:
    """Writes the PNGs and returns their paths."""
    args = parse_args(argv)
    cfg = load_config(args.config, args.cfg_options, training=False)
    check_writable(args.out_dir, folder=True)
    return draw_attention(
        cfg, args.checkpoint, args.images, args.out_dir, args.stages, args.point, args.stoken, args.device
    )


if __name__ == "__main__":
    main()
