"""tools/browse_dataset.py: one picture per image of the split, drawn on the pipeline's output, with the
ground-truth boxes on the objects."""

from pathlib import Path

import cv2
import numpy as np

from tasks.config.load import load_config, parse_cfg_options
from tasks.data.module import MMDataModule
from tasks.figures.browse import annotations_first, browse_dataset, packed_image
from tests._tools import DET_CFG, SEG_CFG, load_tool


def test_browse_detection_draws_boxes_on_objects(tiny_data, data_opts, tmp_path):
    opts = data_opts("tiny_coco", "train_dataloader.dataset.pipeline.3.prob=0.0")  # no random flip: comparable
    written = load_tool("browse_dataset").main(
        [DET_CFG, "--out-dir", str(tmp_path), "--no-progress", "--cfg-options", *opts]
    )
    cfg = load_config(DET_CFG, parse_cfg_options(opts))
    dataset = MMDataModule(cfg, "mmdet").dataset("train")
    assert len(written) == len(dataset) == len(list(tmp_path.glob("*.png")))  # one picture per image
    for i, path in enumerate(written):
        item = dataset[i]
        assert Path(path).stem == Path(item["data_samples"].img_path).stem
        raw = packed_image(item)  # the pipeline's image (resized), as the model gets it
        drawn = cv2.imread(path)[..., ::-1]
        assert drawn.shape == raw.shape
        changed = np.abs(drawn.astype(int) - raw.astype(int)).max(-1) > 30
        inside = np.zeros(changed.shape, bool)
        boxes = item["data_samples"].gt_instances.bboxes.tensor.round().int().tolist()
        assert boxes
        for x1, y1, x2, y2 in boxes:
            inside[max(y1 - 2, 0) : y2 + 3, max(x1 - 2, 0) : x2 + 3] = True  # the box, its line width
            assert changed[y1:y2, x1:x2].mean() > 0.2  # mask overlay and box lines on the object
        # outside the boxes hardly anything changes (the class-name labels may reach out of a small box)
        assert changed[~inside].mean() < 0.05


def test_browse_segmentation_val(tiny_data, data_opts, tmp_path):
    opts = data_opts("tiny_ade20k")
    cfg = load_config(SEG_CFG, parse_cfg_options(opts))
    written = browse_dataset(cfg, str(tmp_path), phase="val", n=2, progress=False)
    # the val pipeline resizes before it loads the annotations; the tool loads them first, so they match the image
    cfg.val_dataloader.dataset.pipeline = annotations_first(cfg.val_dataloader.dataset.pipeline)
    dataset = MMDataModule(cfg, "mmseg").dataset("val")
    assert len(written) == 2 and all(Path(p).is_file() for p in written)
    item = dataset[0]
    raw, drawn = packed_image(item), cv2.imread(written[0])[..., ::-1]
    assert drawn.shape == raw.shape
    labelled = item["data_samples"].gt_sem_seg.data[0].numpy() != 255
    assert labelled.shape == raw.shape[:2]
    changed = np.abs(drawn.astype(int) - raw.astype(int)).max(-1) > 10
    assert changed[labelled].mean() > 0.5  # the class map is blended over the labelled pixels
