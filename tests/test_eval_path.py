"""Process memory of the evaluation paths, measured by the perf package on real runs in child
processes: the segmentation evaluator at ADE20K image size against mmseg's IoUMetric, ``tools/test.py`` on the
demo Mask R-CNN with 100 masks per image against the same run with mmdet's CocoMetric, and validation inside
``tools/train.py``. Bounds are wide (memory is steadier than time on a shared machine); each sits well above
what the evaluators' state holds and well below what the fragmenting code grew by."""

import pytest
import torch
from mmengine.structures import PixelData
from mmseg.structures import SegDataSample

from perf.eval import path as eval_path
from perf.eval import seg as eval_seg
from tasks.evaluation.segmentation import SegmentationEvaluator

MIB = 1 / 1024  # GiB


@pytest.mark.slow
def test_segmentation_evaluator_memory_at_ade20k_size():
    # 40 maps of 512x683, 150 classes; the state is one 150x150 confusion matrix (176 KiB): ours grew by 4 MiB.
    # Updating with whole maps grew the process by 1.4 MiB per image (docs/evaluation.md), ~56 MiB here, as
    # mmseg's IoUMetric (whole maps too) grows by 72 MiB on these images (perf.eval.seg's "mm").
    (ours,) = eval_seg.measure(images=40, rounds=1, batch=4, impls=("ours",))
    assert ours["loop_growth"] < 24 * MIB, ours


def test_segmentation_evaluator_pieces_equal_whole_maps():
    # maps larger than one update piece, with ignored pixels, in two calls: the confusion matrix of one pass
    samples = eval_seg.make_samples(seed=1, start=0, stop=3)
    evaluator = SegmentationEvaluator(eval_seg.NUM_CLASSES)
    evaluator.update(samples[:1])
    evaluator.update(samples[1:])
    target = torch.cat([s.gt_sem_seg.data.reshape(-1) for s in samples])
    pred = torch.cat([s.pred_sem_seg.data.reshape(-1) for s in samples])
    keep = target != 255
    expected = torch.bincount(target[keep] * eval_seg.NUM_CLASSES + pred[keep], minlength=eval_seg.NUM_CLASSES**2)
    assert torch.equal(evaluator.confmat.reshape(-1), expected)


@pytest.mark.parametrize("field", ["gt_sem_seg", "pred_sem_seg"])
def test_segmentation_evaluator_names_a_label_out_of_range(field):
    sample = SegDataSample(metainfo=dict(img_path="a.jpg"))
    sample.gt_sem_seg = PixelData(data=torch.zeros(1, 4, 5, dtype=torch.long))
    sample.pred_sem_seg = PixelData(data=torch.zeros(1, 4, 5, dtype=torch.long))
    getattr(sample, field).data[0, 1, 2] = 7
    what = "ground truth" if field == "gt_sem_seg" else "prediction"
    with pytest.raises(ValueError, match=f"a.jpg: {what} label 7 outside 0..4"):
        SegmentationEvaluator(5).update([sample])


@pytest.mark.slow
def test_validation_inside_training_does_not_grow(tmp_path):
    # tools/train.py, 3 epochs of one step each, a validation after each on 8 images with 100 masks per image:
    # the process after the third validation within 10 % of itself after the first
    result = eval_path.measure_validation(images=8, epochs=3, work=str(tmp_path), train_images=4)
    assert result["error"] is None
    assert len(result["after_validation"]) == 3 and all(e["images"] == 8 for e in result["epochs"])
    assert result["ratio_last_first"] <= 1.10, result


@pytest.mark.slow
def test_test_tool_memory_with_100_masks_per_image(tmp_path):
    # tools/test.py on the demo Mask R-CNN keeping 100 detections (masks at image size) per image: the process
    # does not grow with the images, and the epoch's peak, COCOeval included, stays near the start
    (ours,) = eval_path.measure_test("det", images=12, rounds=1, work=str(tmp_path), impls=("ours",))
    assert ours["error"] is None and ours["images"] == 12
    assert ours["dets_per_image"] == 100
    assert ours["loop_growth"] < 32 * MIB, ours
    assert ours["peak_growth"] < 256 * MIB, ours
    assert ours["metrics"]["segm_mAP"] >= 0
