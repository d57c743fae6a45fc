"""tools/infer.py and tasks/deploy/inference.py on the tiny data: predictions from a Lightning checkpoint equal mmdet's
DetInferencer / mmseg's MMSegInferencer on the model exported by tools/export_model.py; a folder of held-out images
gives one overlay and one JSON per image; bad inputs and checkpoints that do not fit are refused by name."""

import glob
import json
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from backbones.errors import CheckpointError
from tasks.deploy.export import export_backbone, export_model
from tasks.deploy.images import InputError, find_images
from tasks.deploy.inference import build_inferencer
from tests._tools import load_tool, warnings_as_errors

infer_tool = load_tool("infer")
# every detection in the JSON, so that the comparison has boxes and masks to compare after two training steps
DET_OPTS = ["model.test_cfg.rcnn.score_thr=0.0"]


def _outputs(out_dir):
    names = lambda sub, ext: sorted(osp.basename(p) for p in glob.glob(osp.join(out_dir, sub, f"*{ext}")))  # noqa: E731
    return names("vis", ""), names("preds", ".json")


def test_detection_equals_det_inferencer_on_the_exported_model(det_run, tiny_data, tmp_path):
    from mmdet.apis import DetInferencer

    from tasks.config.load import load_config

    ckpt, config = det_run.ckpt, det_run.config
    folder = str(tiny_data / "tiny_coco" / "val2017")  # held out: not trained on
    images = sorted(os.listdir(folder))
    ours = str(tmp_path / "ours")
    args = ["--batch-size", "2", "--device", "cpu", "--score-thr", "0", "--cfg-options", *DET_OPTS]
    infer_tool.main([config, ckpt, folder, "--out-dir", ours, *args])
    assert _outputs(ours) == (images, [osp.splitext(f)[0] + ".json" for f in images])  # one of each per image

    exported = str(tmp_path / "model.pth")
    export_model(ckpt, exported, config)
    cfg = load_config(config, {"model.test_cfg.rcnn.score_thr": 0.0})  # DET_OPTS
    theirs = str(tmp_path / "theirs")
    inferencer = DetInferencer(cfg, exported, device="cpu", show_progress=False)
    inferencer(folder, batch_size=2, out_dir=theirs, no_save_pred=False)
    for name in _outputs(ours)[1]:
        mine, reference = (json.load(open(osp.join(d, "preds", name))) for d in (ours, theirs))
        assert mine == reference, name
        assert set(mine) == {"labels", "scores", "bboxes", "masks"} and len(mine["bboxes"]) > 0
        assert all(set(m) == {"size", "counts"} for m in mine["masks"])  # COCO RLE
    for name in images:  # the image with the predictions drawn (mmdet jitters mask colours at random: no equality)
        image, overlay = (np.asarray(Image.open(osp.join(d, name)), float) for d in (folder, osp.join(ours, "vis")))
        assert image.shape == overlay.shape and np.abs(image - overlay).mean() > 1.0


def test_segmentation_equals_mmseg_inferencer_on_the_exported_model(seg_run, tiny_data, tmp_path):
    from mmseg.apis import MMSegInferencer

    ckpt, config = seg_run.ckpt, seg_run.config
    folder = str(tiny_data / "tiny_ade20k" / "images" / "validation")
    images = sorted(os.listdir(folder))
    ours = str(tmp_path / "ours")
    # batches of 2 (mmseg batches one image size at a time) against mmseg's one image at a time
    infer_tool.main(
        [config, ckpt, f"{folder}/*.jpg", "--out-dir", ours, "--batch-size", "2", "--device", "cpu", "--no-progress"]
    )
    assert _outputs(ours) == (images, [osp.splitext(f)[0] + ".json" for f in images])

    exported = str(tmp_path / "model.pth")
    export_model(ckpt, exported, config)
    reference = MMSegInferencer(config, exported, device="cpu")([osp.join(folder, f) for f in images])["predictions"]
    for name, expected in zip(images, reference):
        stem = osp.splitext(name)[0]
        with open(osp.join(ours, "preds", f"{stem}.json")) as f:
            sem_seg = np.array(json.load(f)["sem_seg"])
        np.testing.assert_array_equal(sem_seg, expected)
        np.testing.assert_array_equal(np.asarray(Image.open(osp.join(ours, "preds", f"{stem}.png"))), expected)
        assert Image.open(osp.join(folder, name)).size == Image.open(osp.join(ours, "vis", name)).size


def test_backbone_export_loads_only_the_backbone_with_a_warning(det_run, tmp_path):
    import torch

    ckpt, config = det_run.ckpt, det_run.config
    export = str(tmp_path / "stvit.safetensors")
    export_backbone(ckpt, export, config=config)
    with pytest.warns(UserWarning, match=r"is a backbone export: only model.backbone is loaded"):
        inferencer = build_inferencer(config, export, device="cpu")
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    for key, value in inferencer.model.backbone.state_dict().items():
        assert torch.equal(value, trained[f"model.backbone.{key}"]), key
    assert inferencer.weights_kind == "backbone"


def test_checkpoint_that_does_not_fit_the_config_is_refused(det_run, seg_run, tmp_path):
    det_config = det_run.config
    seg_ckpt, seg_config = seg_run.ckpt, seg_run.config
    with pytest.raises(CheckpointError, match=r"Checkpoint file not found: '.*missing.ckpt'"):
        build_inferencer(det_config, str(tmp_path / "missing.ckpt"), device="cpu")
    with pytest.raises(CheckpointError, match=r"does not match the config's model.*trained with instead of"):
        build_inferencer(det_config, seg_ckpt, device="cpu")
    export = str(tmp_path / "hatnet.pth")
    export_backbone(seg_ckpt, export, config=seg_config)
    with pytest.raises(CheckpointError, match=r"neither a model checkpoint.*nor a backbone export.*hatnet"):
        build_inferencer(det_config, export, device="cpu")


def test_inputs_files_folders_globs_and_their_errors(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for folder, names in ((a, ("x.jpg", "y.png")), (b, ("x.jpg",))):
        for name in names:
            Image.new("RGB", (8, 8)).save(folder / name)
    (a / "notes.txt").write_text("not an image")
    assert find_images([str(a)]) == [str(a / "x.jpg"), str(a / "y.png")]  # a folder: its images only
    assert find_images([str(a / "*.png"), str(a / "y.png")]) == [str(a / "y.png")]  # a glob; a repeat counts once
    with pytest.raises(InputError, match=r"no images matched \[.*\*\.bmp'\]"):
        find_images([str(a), str(a / "*.bmp")])
    with pytest.raises(InputError, match=r"missing\.jpg': no such file or folder"):
        find_images([str(tmp_path / "missing.jpg")])
    with pytest.raises(InputError, match=r"same name would overwrite.*'x'"):
        find_images([str(a), str(b)])
    (b / "x.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(InputError, match=r"cannot read 1 image.*b/x\.jpg"):
        find_images([str(b)])


@pytest.mark.parametrize("size", [(1, 1), (7, 3)])
def test_images_under_8_px_a_side_are_readable_inputs(size, tmp_path):
    # the check of readability decoded at 1/8 size, which OpenCV refuses for them with an exception of its resize
    Image.new("RGB", size, (10, 20, 30)).save(tmp_path / "small.png")
    assert find_images([str(tmp_path)]) == [str(tmp_path / "small.png")]
    (tmp_path / "small.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(InputError, match=r"cannot read 1 image.*small\.png"):
        find_images([str(tmp_path)])


def test_tool_reports_bad_input_without_a_traceback(det_run, tmp_path, monkeypatch):
    ckpt, config = det_run.ckpt, det_run.config
    pattern = str(tmp_path / "*.jpg")
    monkeypatch.setattr("sys.argv", ["infer.py", config, ckpt, pattern, "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:  # the command line: the message, no traceback
        infer_tool.main()
    assert str(exit_info.value).startswith(f"error: no images matched [{pattern!r}] (image files end in .jpg")


@pytest.mark.parametrize("run", ["det_run", "seg_run"])
def test_a_normal_run_prints_no_warning_and_no_library_chatter(run, tiny_data, tmp_path, capfd, request):
    # mmengine warned at every start that mmdet / mmseg have no 'function' registry, and mmengine's drawing
    # warned for every box that reaches the image's right or bottom edge (mmdet clips boxes to x = W, y = H)
    folder = tiny_data / ("tiny_coco/val2017" if run == "det_run" else "tiny_ade20k/images/validation")
    image, run = sorted(glob.glob(str(folder / "*.jpg")))[0], request.getfixturevalue(run)
    capfd.readouterr()
    with warnings_as_errors():
        infer_tool.main([run.config, run.ckpt, image, "--out-dir", str(tmp_path), "--score-thr", "0", "--no-progress"])
    out = capfd.readouterr()
    console = out.out + out.err
    assert console.strip() == f"1 image(s): overlays in {tmp_path}/vis, predictions in {tmp_path}/preds"


def test_a_one_pixel_image_is_segmented_and_drawn(seg_run, tmp_path):
    # mmseg's visualizer indexed the overlay with a one-element torch mask, which numpy reads as the index 1
    Image.new("RGB", (1, 1), (10, 200, 30)).save(tmp_path / "dot.png")
    with warnings_as_errors():
        infer_tool.main([seg_run.config, seg_run.ckpt, str(tmp_path / "dot.png"), "--out-dir", str(tmp_path / "out")])
    label_map = np.array(Image.open(tmp_path / "out/preds/dot.png"))
    in_json = json.loads((tmp_path / "out/preds/dot.json").read_text())["sem_seg"]
    assert label_map.shape == (1, 1) and label_map.tolist() == in_json
    assert Image.open(tmp_path / "out/vis/dot.png").size[1] == 1  # the overlay, one pixel high


@pytest.mark.parametrize("scope", ["mmdet", "mmseg"])
def test_the_private_inferencer_method_we_override_is_still_called_as_we_assume(scope):
    # build_inferencer overrides _load_weights_to_model, a private method of mmengine's BaseInferencer (no public
    # hook loads weights through our checks before the visualizer takes dataset_meta): a change in mm fails here.
    import inspect

    from mmengine.infer import BaseInferencer

    base = __import__(f"{scope}.apis", fromlist=["x"])
    cls = base.DetInferencer if scope == "mmdet" else base.MMSegInferencer
    assert list(inspect.signature(cls._load_weights_to_model).parameters) == ["self", "model", "checkpoint", "cfg"]
    assert cls._init_model is BaseInferencer._init_model
    source = inspect.getsource(BaseInferencer._init_model)
    assert "self._load_weights_to_model(model, checkpoint, cfg)" in source
    assert source.index("_load_weights_to_model(") < source.index("model.to(device)")
    # _init_collate too (the batches are pseudo_collate's without mmengine's registry look-up)
    assert list(inspect.signature(cls._init_collate).parameters) == ["self", "cfg"]
    assert "self.collate_fn = self._init_collate(cfg)" in inspect.getsource(BaseInferencer.__init__)
