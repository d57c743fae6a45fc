"""tools/test.py's evaluation protocols against mmseg / mmdet run directly on the same weights and images:
--tta (mmseg's SegTTAModel, mmdet's DetTTAModel), sliding-window inference, and --format-only submission files
(COCO results json on an image-info-only test set, ADE20K label PNGs)."""

import json
import os
import os.path as osp
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from mmengine.config import ConfigDict
from PIL import Image

from tasks import build_task
from tasks.config.scopes import register_scope
from tasks.evaluation.tta import enable_tta
from tests._tools import DET_CFG, IMAGE_INFO, REPO, SEG_CFG, load_cfg, load_tool, random_checkpoint

SLIDE = ["model.test_cfg.mode=slide", "model.test_cfg.crop_size=(64,64)", "model.test_cfg.stride=(43,43)"]
RETINANET_CFG = osp.join(REPO, "configs/stvit/retinanet_stvit-s_fpn_1x_coco.py")
# The paper RetinaNet config with the shrunk STViT and small test-time scales.
RETINANET_TINY = f"""
_base_ = {RETINANET_CFG!r}
model = dict(
    backbone=dict(arch='shrunk', stoken_size=None, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256], out_channels=32),
    bbox_head=dict(num_classes=3, in_channels=32, feat_channels=32, stacked_convs=1),
    test_cfg=dict(score_thr=0.005))  # random weights score about 0.01 (the focal-loss prior)
metainfo = dict(classes=('square', 'disc', 'triangle'))
test_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(metainfo=metainfo))
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=s, keep_ratio=True) for s in [(192, 192), (128, 128)]],
        [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
        [dict(type='LoadAnnotations', with_bbox=True)],
        [dict(type='PackDetInputs',
              meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor', 'flip', 'flip_direction'))],
    ]),
]
trainer = dict(accelerator='cpu', devices=1, precision='32-true', sync_batchnorm=False)
"""


@pytest.fixture(scope="module")
def seg_ckpt(data_opts, tmp_path_factory):
    return random_checkpoint(SEG_CFG, data_opts("tiny_ade20k"), tmp_path_factory.mktemp("seg") / "w.pth")


class Collect(L.Callback):
    """The predictions tools/test.py's test steps return."""

    def __init__(self):
        self.samples = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.samples += [s.cpu() for s in outputs]


def run_tool(args, tmp_path):
    collect = Collect()
    metrics = load_tool("test").main([*args[:2], "--work-dir", str(tmp_path), *args[2:]], callbacks=[collect])
    return collect.samples, metrics


def mm_predictions(config, opts, ckpt, tta=False):
    """The library's own prediction: the model (or ``tta_model`` wrapping it) built from the config by the mm
    registry, the checkpoint loaded by mmengine, the test set loaded by mmengine's Runner, ``test_step``."""
    from mmengine.runner import Runner, load_checkpoint

    cfg = load_cfg(config, opts)
    register_scope(cfg.default_scope)
    from mmengine.registry import MODELS

    if tta:
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        model = MODELS.build(ConfigDict(**cfg.tta_model, module=cfg.model))
        load_checkpoint(model.module, ckpt, map_location="cpu")
    else:
        model = MODELS.build(cfg.model)
        load_checkpoint(model, ckpt, map_location="cpu")
    model.eval()
    loader = Runner.build_dataloader(cfg.test_dataloader)
    with torch.no_grad():
        return [s for batch in loader for s in model.test_step(batch)], loader.dataset


def seg_maps(samples):
    return {osp.basename(s.img_path): s.pred_sem_seg.data for s in samples}


def assert_same_maps(ours, ref, count):
    assert sorted(ours) == sorted(ref) and len(ours) == count
    for name in ref:
        assert torch.equal(ours[name], ref[name]), name


def test_seg_tta_equals_mmseg_seg_tta_model(data_opts, seg_ckpt, tmp_path, capsys):
    opts = [*data_opts("tiny_ade20k"), "test_dataloader.dataset.indices=1"]  # 12 views: one image
    ours, metrics = run_tool([SEG_CFG, seg_ckpt, "--tta", "--cfg-options", *opts], tmp_path)
    ref, _ = mm_predictions(SEG_CFG, opts, seg_ckpt, tta=True)
    assert_same_maps(seg_maps(ours), seg_maps(ref), 1)
    assert 0 <= metrics["mIoU"] <= 1
    # per-class IoU / Acc in the metrics JSON (null: not in the ground truth) and in the printed table
    saved = json.loads((tmp_path / "test_metrics.json").read_text())
    iou, acc = saved["per_class"]["IoU"], saved["per_class"]["Acc"]
    # the demo config's classes, with their ADE20K label values; null where the image's ground truth has none
    ade_labels = {"wall": 1, "floor": 4, "windowpane": 9, "plant": 18, "ball": 120}
    assert set(iou) == set(acc) == set(ade_labels)
    data_root = next(o.split("=", 1)[1] for o in opts if o.startswith("test_dataloader.dataset.data_root="))
    gt = np.array(Image.open(sorted(Path(data_root, "annotations/validation").iterdir())[0]))
    absent = {name for name, label in ade_labels.items() if not (gt == label).any()}
    assert absent and absent == {n for n in iou if iou[n] is None} == {n for n in acc if acc[n] is None}
    table = capsys.readouterr().out
    assert any(line.split()[:1] == ["wall"] and f"{iou['wall']:.4f}" in line for line in table.splitlines())
    # the views were merged: the prediction is not the single-scale one
    plain, _ = mm_predictions(SEG_CFG, opts, seg_ckpt)
    assert any(not torch.equal(a, b) for a, b in zip(seg_maps(ours).values(), seg_maps(plain).values()))


def test_slide_inference_equals_mmseg_and_ade_label_pngs(tiny_data, data_opts, seg_ckpt, tmp_path):
    opts = [*data_opts("tiny_ade20k"), "test_dataloader.dataset.indices=2", *SLIDE]
    out_dir = tmp_path / "pngs"
    # as on ADE20K's test images: images only, no annotation directory (--format-only loads no ground truth)
    shutil.copytree(tiny_data / "tiny_ade20k/images/validation", tmp_path / "ade_test/images/testing")
    ours, metrics = run_tool(
        [
            SEG_CFG,
            seg_ckpt,
            "--format-only",
            "--out-dir",
            str(out_dir),
            "--cfg-options",
            *opts,
            f"test_dataloader.dataset.data_root={tmp_path}/ade_test",
            "test_dataloader.dataset.data_prefix.img_path=images/testing",
        ],
        tmp_path,
    )
    assert all("gt_sem_seg" not in s for s in ours)
    ref, dataset = mm_predictions(SEG_CFG, opts, seg_ckpt)
    assert_same_maps(seg_maps(ours), seg_maps(ref), 2)
    whole, _ = mm_predictions(SEG_CFG, opts[: -len(SLIDE)], seg_ckpt)
    assert any(not torch.equal(a, b) for a, b in zip(seg_maps(ref).values(), seg_maps(whole).values())), (
        "slide mode was not applied"
    )

    # --format-only: one label PNG per image, ADE20K's values (reduce_zero_label undone), no metrics
    assert metrics == {} and not osp.exists(tmp_path / "test_metrics.json")
    assert dataset.reduce_zero_label
    images = sorted(osp.splitext(osp.basename(s.img_path))[0] + ".png" for s in ref)
    assert sorted(os.listdir(out_dir)) == images
    for s in ref:
        png = np.asarray(Image.open(out_dir / (osp.splitext(osp.basename(s.img_path))[0] + ".png")))
        assert png.dtype == np.uint8
        np.testing.assert_array_equal(png, s.pred_sem_seg.data[0].numpy() + 1)


def coco_format_only_reference(config, opts, ckpt, out_prefix):
    """mmdet's own conversion: its CocoMetric in format-only mode over the detector's predictions."""
    from mmdet.evaluation import CocoMetric

    samples, dataset = mm_predictions(config, opts, ckpt)
    metric = CocoMetric(
        ann_file=dataset.ann_file, metric=["bbox", "segm"], format_only=True, outfile_prefix=str(out_prefix)
    )
    metric.dataset_meta = dataset.metainfo
    metric.process({}, [s.to_dict() for s in samples])
    metric.evaluate(len(dataset))
    return samples


def test_coco_format_only_on_image_info_test_set_equals_mmdet(tiny_data, data_opts, tmp_path):
    from pycocotools.coco import COCO

    opts = [*data_opts("tiny_coco"), f"test_dataloader.dataset.ann_file={IMAGE_INFO}"]
    ckpt = random_checkpoint(DET_CFG, opts, tmp_path / "w.pth")
    out_dir = tmp_path / "submission"
    _, metrics = run_tool([DET_CFG, ckpt, "--format-only", "--out-dir", str(out_dir), "--cfg-options", *opts], tmp_path)
    assert metrics == {} and not osp.exists(tmp_path / "test_metrics.json")
    assert sorted(os.listdir(out_dir)) == ["results.bbox.json", "results.segm.json"]

    samples = coco_format_only_reference(DET_CFG, opts, ckpt, tmp_path / "mmdet" / "results")
    assert sum(len(s.pred_instances) for s in samples) > 0
    val = COCO(str(tiny_data / "tiny_coco/annotations/instances_val2017.json"))
    for iou_type in ("bbox", "segm"):
        ours = json.loads((out_dir / f"results.{iou_type}.json").read_text())
        assert ours == json.loads((tmp_path / "mmdet" / f"results.{iou_type}.json").read_text())
        assert {r["category_id"] for r in ours} <= {1, 3, 7} and {r["image_id"] for r in ours} <= set(val.getImgIds())
        assert len(val.loadRes(str(out_dir / f"results.{iou_type}.json")).getAnnIds()) == len(ours)
    assert all(isinstance(r["segmentation"]["counts"], str) for r in ours)


def det_tta_setup(data_opts, tmp_path):
    config = tmp_path / "retinanet_tiny.py"
    config.write_text(RETINANET_TINY)
    opts = data_opts("tiny_coco")
    return str(config), opts, random_checkpoint(str(config), opts, tmp_path / "w.pth")


def test_det_tta_equals_mmdet_det_tta_model(data_opts, tmp_path, capsys):
    config, opts, ckpt = det_tta_setup(data_opts, tmp_path)
    ours, metrics = run_tool([config, ckpt, "--tta", "--cfg-options", *opts], tmp_path)
    ref, _ = mm_predictions(config, opts, ckpt, tta=True)
    assert [s.img_id for s in ours] == [s.img_id for s in ref] and len(ref) == 3
    for a, b in zip(ours, ref):
        assert len(b.pred_instances) > 0
        for key in ("bboxes", "scores", "labels"):
            assert torch.equal(a.pred_instances[key], b.pred_instances[key]), key
    assert 0 <= metrics["bbox_mAP"] <= 1
    # per-class AP (mmdet's classwise columns) in the metrics JSON and the printed table
    per_class = json.loads((tmp_path / "test_metrics.json").read_text())["per_class"]
    assert {"bbox_AP", "bbox_AP_50", "bbox_AP_75"} <= set(per_class) and "segm_AP" not in per_class
    assert set(per_class["bbox_AP"]) == {"square", "disc", "triangle"}
    table = capsys.readouterr().out
    for name, ap in per_class["bbox_AP"].items():
        assert any(line.split()[:2] == [name, "-" if ap is None else f"{ap:.4f}"] for line in table.splitlines())


def test_tta_refused_where_it_cannot_work(data_opts, tmp_path):
    ckpt = tmp_path / "never_read.pth"  # the path is checked first; the refusal comes before it is read
    ckpt.touch()
    argv = [DET_CFG, str(ckpt), "--tta", "--work-dir", str(tmp_path), "--cfg-options", *data_opts("tiny_coco")]
    with pytest.raises(ValueError, match="defines no tta_model / tta_pipeline"):
        load_tool("test").main(argv)
    # Mask R-CNN: DetTTAModel would stop with an AssertionError deep inside mmdet
    cfg = load_cfg(DET_CFG, data_opts("tiny_coco"))
    cfg.tta_model = dict(type="DetTTAModel", tta_cfg=dict(nms=dict(type="nms", iou_threshold=0.5), max_per_img=100))
    cfg.tta_pipeline = cfg.test_dataloader.dataset.pipeline
    module, _ = build_task(cfg, init_weights=False)
    with pytest.raises(ValueError, match="no instance masks"):
        enable_tta(cfg, module)


def test_the_command_line_names_a_missing_checkpoint_without_a_traceback(data_opts, tmp_path, monkeypatch):
    ckpt = str(tmp_path / "missing.ckpt")
    monkeypatch.chdir(tmp_path)  # the default work dir, work_dirs/<config>, is made under the current folder
    monkeypatch.setattr("sys.argv", ["test.py", DET_CFG, ckpt, "--cfg-options", *data_opts("tiny_coco")])
    with pytest.raises(SystemExit, match=r"^error: Checkpoint file not found: '.*missing\.ckpt'\. Check the path"):
        load_tool("test").main()
    assert not (tmp_path / "work_dirs").exists()  # nothing made for a run that cannot start


def test_the_command_line_names_a_missing_dataset_path_without_a_traceback(data_opts, seg_ckpt, tmp_path, monkeypatch):
    # the dataset is built inside trainer.test: its check's FileNotFoundError came with Lightning's traceback
    opts = [*data_opts("tiny_ade20k"), f"test_dataloader.dataset.data_root={tmp_path / 'nowhere'}"]
    monkeypatch.setattr("sys.argv", ["test.py", SEG_CFG, seg_ckpt, "--work-dir", str(tmp_path), "--cfg-options", *opts])
    with pytest.raises(SystemExit, match=r"^error: test_dataloader\.dataset\.data_root '.*nowhere' does not exist\."):
        load_tool("test").main()
    browse = [SEG_CFG, "--out-dir", str(tmp_path / "b"), "--phase", "test", "--cfg-options", *opts]
    monkeypatch.setattr("sys.argv", ["browse_dataset.py", *browse])
    with pytest.raises(SystemExit, match=r"^error: test_dataloader\.dataset\.data_root '.*nowhere' does not exist\."):
        load_tool("browse_dataset").main()
