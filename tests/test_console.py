"""What a normal run prints: the metric tables, the model summary and where the outputs went; no Python warning
(the session's training runs of tests/conftest.py already run with warnings as errors), no library chatter."""

import json
import logging
import os
import sys

import pytest

from tasks.training.summary import ParamsSummary
from tests._tools import load_tool, warnings_as_errors


def _test_run(run, tmp_path, capfd, *extra) -> tuple[dict, str]:
    out = tmp_path / "metrics.json"
    capfd.readouterr()
    with warnings_as_errors():
        load_tool("test").main([run.config, run.ckpt, "--work-dir", str(tmp_path), "--out", str(out), *extra])
    captured = capfd.readouterr()
    return json.loads(out.read_text()), captured.out + captured.err


def test_testing_a_detector_prints_metrics_and_no_library_chatter(det_run, tmp_path, capfd):
    metrics, console = _test_run(det_run, tmp_path, capfd)
    assert "bbox_mAP" in metrics and "bbox_mAP" in console
    for chatter in ("loading annotations into memory", "creating index", "Warning", "Tip:", "Be aware"):
        assert chatter not in console, chatter


def test_testing_a_segmentor_prints_metrics_and_no_library_chatter(seg_run, tmp_path, capfd, log_lines):
    metrics, console = _test_run(seg_run, tmp_path, capfd)
    assert "mIoU" in metrics and "mIoU" in console
    for chatter in ("Warning", "Tip:", "Be aware", "deprecated"):
        assert chatter not in console, chatter
    # the run's saved config holds its trainer.max_steps=2 beside the demo's train_cfg: no training-length notes
    assert not [line for line in log_lines if "is not used" in line]


def _outputs(tmp_path, dump: str) -> list:
    # every output of tools/test.py: the prediction dump, the submission files and the overlays
    return ["--dump", str(tmp_path / dump), "--out-dir", str(tmp_path / "files"), "--show-dir", str(tmp_path / "vis")]


# what the libraries printed on the way: pycocotools reading the annotation file for --out-dir, mmdet naming the
# temporary folder of the submission files, mmengine's note on the metrics used to write --dump / --out-dir
CHATTER = ("loading annotations into memory", "creating index", "results are saved", "prefix is not set", ".partial")


def test_testing_a_detector_with_every_output_prints_no_warning_or_chatter(det_run, tmp_path, capfd):
    _, console = _test_run(det_run, tmp_path, capfd, "--score-thr", "0", *_outputs(tmp_path, "det.pkl"))
    for chatter in (*CHATTER, "Warning", "WARNING"):
        assert chatter not in console, chatter
    assert f"predictions dumped to {tmp_path / 'det.pkl'}" in console
    assert sorted(os.listdir(tmp_path / "files")) == ["results.bbox.json", "results.segm.json"]


def test_testing_a_segmentor_with_tta_and_every_output_prints_no_warning_or_chatter(seg_run, tmp_path, capfd):
    _, console = _test_run(seg_run, tmp_path, capfd, "--tta", *_outputs(tmp_path, "pred"))
    for chatter in (*CHATTER, "Warning", "WARNING"):
        assert chatter not in console, chatter
    assert f"predictions dumped to {tmp_path / 'pred'}" in console


def test_the_training_summary_lists_parameters_without_a_flops_column():
    # Lightning's summary counts FLOPs only through an example_input_array, which mm batches cannot be (it read 0)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lightning.pytorch.callbacks.model_summary")
    logger.addHandler(handler)
    rows = [("Name", ["model", "evaluator"]), ("Type", ["MaskRCNN", "DetectionEvaluator"]), ("FLOPs", ["0", "0"])]
    try:
        ParamsSummary.summarize(rows, 3_000_000, 2_900_000, 12.0, {"train": 5, "eval": 0}, total_flops=0)
    finally:
        logger.removeHandler(handler)
    text = records[0].getMessage()
    assert "MaskRCNN" in text and "2.9 M" in text and "FLOPs" not in text


def test_the_demo_runs_each_step_in_its_process_and_names_a_failing_one(tmp_path, capsys):
    # tools/demo.py prints each step's command and runs the script as __main__ in its own process (no fresh
    # interpreter importing torch, Lightning and mm again): the script's output reaches this process's stdout
    demo, argv = load_tool("demo"), list(sys.argv)
    sizes = ["--coco-train", "1", "--coco-val", "1", "--ade-train", "1", "--ade-val", "1"]
    demo.run("tools/make_tiny_data.py", ["--out", str(tmp_path), *sizes])
    out = capsys.readouterr().out
    assert out.startswith(f"+ {sys.executable} tools/make_tiny_data.py --out {tmp_path} ")
    assert f"written to {tmp_path / 'tiny_coco'}" in out and (tmp_path / "tiny_ade20k").is_dir()
    with pytest.raises(SystemExit, match=r"demo: tools/plot_curves.py failed \(exit status 2; its output is above"):
        demo.run("tools/plot_curves.py", [str(tmp_path)])  # neither --out nor --train-time: a usage error
    assert "give --out" in capsys.readouterr().err
    # a tool's bad-input message leaves the tool as its exit code, printed by no one else: the demo says it
    written = tmp_path / "tiny_coco" / "annotations" / "instances_val2017.json"
    with pytest.raises(SystemExit, match=r"make_tiny_data.py failed \(error: '.*val2017.json' is a file: give a fold"):
        demo.run("tools/make_tiny_data.py", ["--out", str(written)])
    assert sys.argv == argv


def test_prediction_overlays_draw_boxes_at_the_image_border_without_warnings(tmp_path):
    # mmdet's boxes clipped to a W x H image reach x = W, y = H; mmengine's drawing warned "out of bounds" for
    # each such image. The overlay is drawn, and the predictions the other callbacks read are left as they were.
    import mmcv
    import numpy as np
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    from tasks.figures.predictions import PredictionWriter

    image = tmp_path / "img.png"
    mmcv.imwrite(np.full((40, 30, 3), 127, np.uint8), str(image))
    boxes = torch.tensor([[0.0, 0.0, 30.0, 40.0], [28.5, 38.5, 30.0, 40.0], [5.0, 5.0, 10.0, 10.0]])
    pred = InstanceData(bboxes=boxes.clone(), scores=torch.tensor([0.9, 0.8, 0.1]), labels=torch.tensor([0, 1, 0]))
    sample = DetDataSample(metainfo=dict(img_path=str(image)), pred_instances=pred)
    writer = PredictionWriter(str(tmp_path / "show"), "mmdet", score_thr=0.3)
    writer.make_visualizer(dict(classes=("a", "b"), palette=[(255, 0, 0), (0, 255, 0)]), name="border-test")
    with warnings_as_errors():
        out = writer.draw(sample)
    drawn = mmcv.imread(out)
    assert drawn.shape == (40, 30, 3) and (drawn != 127).any()
    assert torch.equal(sample.pred_instances.bboxes, boxes)


def test_segmentation_overlays_of_a_one_pixel_image(tmp_path):
    # mmseg's visualizer paints each class through a torch mask indexing a numpy image: one element acted as the
    # index 1 (an IndexError). The map is drawn beside the image, and the prediction is left as it was.
    import mmcv
    import numpy as np
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    from tasks.figures.predictions import PredictionWriter

    image = tmp_path / "dot.png"
    mmcv.imwrite(np.full((1, 1, 3), 127, np.uint8), str(image))
    label_map = torch.tensor([[[1]]])
    sample = SegDataSample(metainfo=dict(img_path=str(image)), pred_sem_seg=PixelData(data=label_map.clone()))
    writer = PredictionWriter(str(tmp_path / "show"), "mmseg")
    writer.make_visualizer(dict(classes=("a", "b"), palette=[(255, 0, 0), (0, 255, 0)]), name="one-pixel-test")
    with warnings_as_errors():
        out = writer.draw(sample)
    panel = mmcv.imread(out, channel_order="rgb")
    assert panel.shape == (1, 2, 3) and panel[0, 0].tolist() == [127, 127, 127]  # the image | its labelled map
    assert torch.equal(sample.pred_sem_seg.data, label_map)
