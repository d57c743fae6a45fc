"""tools/benchmark_eval.py at a tiny size: both evaluators run in child processes on the same generated set, agree
on every metric, and every figure of the table is measured."""

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from perf.coco import compare as coco_eval
from tests._tools import load_tool

bench = load_tool("benchmark_eval")


def test_generated_samples_match_the_ann_file():
    coco = coco_eval.coco_json(seed=3, images=4)
    samples = coco_eval.make_samples(seed=3, start=0, stop=4, dets=30)
    anns = coco["annotations"]
    for img, sample in zip(coco["images"], samples, strict=True):
        h, w = img["height"], img["width"]
        assert sample.metainfo["img_id"] == img["id"] and sample.metainfo["ori_shape"] == (h, w)
        pred = sample.pred_instances
        assert pred.masks.shape == (30, h, w) and pred.masks.dtype.is_floating_point is False
        assert pred.masks.numpy().flags.c_contiguous  # as mmdet's predict returns them
        # boxes: the masks' extents (exclusive), jittered by about a pixel
        for mask, box in zip(pred.masks.numpy()[:5], pred.bboxes.numpy()[:5], strict=True):
            ys, xs = np.nonzero(mask)
            assert np.abs(box - [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).max() < 6
        own = [a for a in anns if a["image_id"] == img["id"]]
        gt = [a for a in own if not a["iscrowd"]]
        assert len(sample.gt_instances) == len(gt) and len(sample.ignored_instances) == len(own) - len(gt)
        for ann, mask, box in zip(
            gt, sample.gt_instances.masks.masks, sample.gt_instances.bboxes.tensor.numpy(), strict=True
        ):
            rle = mask_utils.frPyObjects(ann["segmentation"], h, w)[0]
            np.testing.assert_array_equal(mask, mask_utils.decode(rle))  # the polygon of the json, rasterised
            assert ann["area"] == mask.sum()
            np.testing.assert_allclose(
                box, [*ann["bbox"][:2], ann["bbox"][0] + ann["bbox"][2], ann["bbox"][1] + ann["bbox"][3]], atol=1e-4
            )


@pytest.mark.slow
def test_tool_runs_both_evaluators_and_they_agree():
    result = bench.main(["--images", "6", "--dets", "10", "--repeats", "1", "--batch", "3"])
    for name in coco_eval.EVALUATORS:
        (run,) = result["runs"][name]
        assert run["update_s"] > 0 and run["compute_s"] > 0
        assert run["total_s"] == pytest.approx(run["update_s"] + run["compute_s"])
        assert 0.1 < run["peak_gib"] < 4 and -0.5 < run["growth_gib"] < run["peak_gib"]
        assert run["metrics"]["segm_mAP"] > 0.01  # the jittered copies are found
    assert set(result["ratios"]) == set(coco_eval.KEYS)
    assert result["max_diff"] <= 5e-4  # mmdet's rounding to 3 decimals
