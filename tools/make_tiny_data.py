"""Write two tiny synthetic datasets in the real COCO / ADE20K layouts.

    python tools/make_tiny_data.py [--out data] [--seed 0] [--coco-train 48] [--coco-val 16]
                                   [--ade-train 48] [--ade-val 16]

* ``OUT/tiny_coco/``: ``annotations/instances_{train,val}2017.json`` + ``{train,val}2017/*.jpg``. Three
  classes with non-contiguous COCO ids (1 square / red, 3 disc / green, 7 triangle / blue), polygon
  instances, some ``iscrowd=1`` regions as uncompressed RLE (as in real COCO) and a few images without
  objects. ``area`` / ``bbox`` come from the pycocotools rasterisation of the segmentation, and the
  image pixels are painted from that very mask, so images and annotations agree exactly.
* ``OUT/tiny_ade20k/``: ``images/{training,validation}/*.jpg`` + ``annotations/.../*.png``; the PNGs are
  single-channel uint8 with ADE20K label values (0 = unlabeled, read as 255 after reduce_zero_label):
  1 wall (background), 4 floor (bottom band), 9 windowpane (rectangle), 18 plant (triangle),
  120 ball (disc), with 1-px unlabeled outlines around the shapes as in real ADE annotations.

Every split draws from its own RNG stream derived from (seed, dataset, split), so the output is
byte-identical for a given seed, and changing e.g. ``--coco-val`` does not change the train split.
Each dataset is written to a temporary sibling directory and renamed into place at the end.
"""

from __future__ import annotations

import argparse

from backbones.checkpoints.atomic import check_writable
from tasks.data.tiny import make_ade20k, make_coco
from tasks.runtime.cli import command_line


def positive_int(text: str) -> int:
    """An image count: a split without images cannot be trained or evaluated on."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of images (1 or more)")
    return value


@command_line
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data", help="output directory (default: data/)")
    p.add_argument(
        "--seed", type=int, default=0, help="random seed of the generated images and annotations (default: 0)"
    )
    for name, dataset, count in (
        ("coco-train", "tiny_coco", 48),
        ("coco-val", "tiny_coco", 16),
        ("ade-train", "tiny_ade20k", 48),
        ("ade-val", "tiny_ade20k", 16),
    ):
        split = name.split("-")[1]
        p.add_argument(
            f"--{name}", type=positive_int, default=count, help=f"{split} images of {dataset} (default: {count})"
        )
    a = p.parse_args(argv)
    check_writable(a.out, folder=True)  # a folder that cannot be written is named, not a traceback from mkdir
    coco = make_coco(a.out, a.coco_train, a.coco_val, a.seed)
    print(f"COCO-format dataset ({a.coco_train} train / {a.coco_val} val images) written to {coco}")
    ade = make_ade20k(a.out, a.ade_train, a.ade_val, a.seed)
    print(f"ADE20K-format dataset ({a.ade_train} train / {a.ade_val} val images) written to {ade}")
    return coco, ade


if __name__ == "__main__":
    main()
