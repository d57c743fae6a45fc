"""tools/make_tiny_data.py and tasks/data/tiny.py: COCO / ADE20K layouts, annotation consistency, determinism, mm
loaders."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks.data import tiny as mtd
from tests._tools import load_tool

make_tiny_data = load_tool("make_tiny_data")

COUNTS = dict(coco_train=12, coco_val=6, ade_train=6, ade_val=4)


def _generate(out, seed=0):
    return make_tiny_data.main(
        [
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--coco-train",
            str(COUNTS["coco_train"]),
            "--coco-val",
            str(COUNTS["coco_val"]),
            "--ade-train",
            str(COUNTS["ade_train"]),
            "--ade-val",
            str(COUNTS["ade_val"]),
        ]
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("tiny"))


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _split_ann(coco_root: Path, split: str) -> Path:
    return coco_root / "annotations" / f"instances_{split}2017.json"


@pytest.mark.parametrize("option, value", [("--coco-train", "0"), ("--ade-val", "-1"), ("--coco-val", "x")])
def test_image_counts_below_one_are_refused(option, value, tmp_path, capsys):
    # a count of 0 wrote a split that no run can use; -1 was printed as "-1 val images"
    with pytest.raises(SystemExit) as exit_:
        make_tiny_data.main(["--out", str(tmp_path), option, value])
    assert exit_.value.code == 2 and not list(tmp_path.iterdir())
    assert f"argument {option}: '{value}' is not a number of images (1 or more)" in capsys.readouterr().err


def test_layout(data):
    coco, ade = data
    for split, n in (("train", COUNTS["coco_train"]), ("val", COUNTS["coco_val"])):
        assert _split_ann(coco, split).is_file()
        assert len(list((coco / f"{split}2017").glob("*.jpg"))) == n
    for split, n in (("training", COUNTS["ade_train"]), ("validation", COUNTS["ade_val"])):
        imgs = sorted(p.stem for p in (ade / "images" / split).glob("*.jpg"))
        segs = sorted(p.stem for p in (ade / "annotations" / split).glob("*.png"))
        assert len(imgs) == n and imgs == segs


@pytest.mark.parametrize("split", ["train", "val"])
def test_coco_annotations(data, split):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    coco_root = data[0]
    coco = COCO(str(_split_ann(coco_root, split)))
    cats = {c["id"]: c for c in coco.loadCats(coco.getCatIds())}
    assert sorted(cats) != list(range(len(cats))), "category ids should not be 0..N-1"
    colours = {cid: np.array(colour) for cid, _, colour in mtd.COCO_CATEGORIES}
    n_crowd = n_empty = 0
    for img_id in coco.getImgIds():
        info = coco.loadImgs(img_id)[0]
        img = np.asarray(Image.open(coco_root / f"{split}2017" / info["file_name"]).convert("RGB"))
        assert img.shape[:2] == (info["height"], info["width"])
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img_id))
        n_empty += not anns
        for ann in anns:
            m = coco.annToMask(ann)
            assert m.shape == img.shape[:2]
            assert ann["area"] == m.sum() > 0
            ys, xs = np.nonzero(m)
            x, y, w, h = ann["bbox"]
            assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
            if ann["iscrowd"]:
                n_crowd += 1
                seg = ann["segmentation"]
                assert isinstance(seg["counts"], list) and seg["size"] == [info["height"], info["width"]]
                assert sum(seg["counts"]) == info["height"] * info["width"]
                assert (mask_utils.decode(mask_utils.frPyObjects(seg, *seg["size"])) == m).all()
            else:
                assert isinstance(ann["segmentation"], list) and len(ann["segmentation"][0]) >= 6
                # The pixels under the mask have the class colour (JPEG noise and jitter aside).
                mean = img[m.astype(bool)].mean(0)
                assert np.abs(mean - colours[ann["category_id"]]).max() < 30, (ann, mean)
    assert n_crowd >= 1 and n_empty >= 1


def test_ade_annotations(data):
    ade = data[1]
    colours = {label: np.array(colour) for label, (_, _, colour) in mtd.ADE_SHAPES.items()}
    seen = set()
    for seg_path in sorted((ade / "annotations").rglob("*.png")):
        png = Image.open(seg_path)
        assert png.mode == "L"  # single channel, no palette
        seg = np.asarray(png)
        img = np.asarray(Image.open(ade / "images" / seg_path.parent.name / f"{seg_path.stem}.jpg"))
        assert seg.shape == img.shape[:2]
        values = set(np.unique(seg).tolist())
        assert values <= set(mtd.ADE_LABELS) and {0, mtd.ADE_WALL, mtd.ADE_FLOOR} <= values
        seen |= values
        for label in values & set(colours):
            assert np.abs(img[seg == label].mean(0) - colours[label]).max() < 30
    assert len(seen & set(mtd.ADE_SHAPES)) >= 2


def test_deterministic_and_replaces(tmp_path, data):
    # Same seed -> byte-identical; regenerating over an existing dir replaces it and leaves no temp dirs.
    for root in _generate(tmp_path / "a"):
        assert _tree(root) == _tree(data[0].parent / root.name)
    coco, _ = _generate(tmp_path / "a", seed=1)
    assert _tree(coco) != _tree(data[0])
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["tiny_ade20k", "tiny_coco"]


def test_interrupted_run_keeps_old_dataset(tmp_path, monkeypatch):
    coco = mtd.make_coco(tmp_path, 3, 2, seed=0)
    before = _tree(coco)
    calls = []

    def failing_save(img, path):
        calls.append(path)
        if len(calls) == 3:
            raise RuntimeError("interrupted")

    monkeypatch.setattr(mtd, "_save_jpeg", failing_save)
    with pytest.raises(RuntimeError, match="interrupted"):
        mtd.make_coco(tmp_path, 3, 2, seed=5)
    assert _tree(coco) == before
    assert [p.name for p in tmp_path.iterdir()] == ["tiny_coco"]


def _mm_ready():
    pytest.importorskip("mmcv.ops", reason="mmcv with compiled ops is needed by mmdet / mmseg datasets")


def test_mmdet_coco_dataset(data):
    _mm_ready()
    from mmdet.datasets import CocoDataset
    from mmengine.registry import DefaultScope

    coco_root = data[0]
    for split in ("train", "val"):
        gt = json.loads(_split_ann(coco_root, split).read_text())
        classes = tuple(c["name"] for c in gt["categories"])
        cat2label = {c["id"]: i for i, c in enumerate(gt["categories"])}
        with DefaultScope.overwrite_default_scope("mmdet"):
            ds = CocoDataset(
                data_root=str(coco_root),
                ann_file=f"annotations/instances_{split}2017.json",
                data_prefix=dict(img=f"{split}2017/"),
                metainfo=dict(classes=classes),
                filter_cfg=dict(filter_empty_gt=False),
                test_mode=False,
                pipeline=[
                    dict(type="LoadImageFromFile"),
                    dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
                    dict(type="PackDetInputs"),
                ],
            )
        assert len(ds) == len(gt["images"])
        n_ignored = 0
        for i in range(len(ds)):
            sample = ds[i]["data_samples"]
            anns = [a for a in gt["annotations"] if a["image_id"] == sample.img_id]
            objs = [a for a in anns if not a["iscrowd"]]
            crowds = [a for a in anns if a["iscrowd"]]
            gi, ig = sample.gt_instances, sample.ignored_instances
            assert gi.labels.tolist() == [cat2label[a["category_id"]] for a in objs]
            assert ig.labels.tolist() == [cat2label[a["category_id"]] for a in crowds]
            assert gi.masks.areas.tolist() == [a["area"] for a in objs]
            assert ig.masks.areas.tolist() == [a["area"] for a in crowds]
            assert ds[i]["inputs"].shape[1:] == sample.ori_shape
            n_ignored += len(ig)
        assert n_ignored >= 1  # crowd regions reach the model as ignored instances


def test_mmseg_ade20k_dataset(data):
    _mm_ready()
    from mmengine.registry import DefaultScope
    from mmseg.datasets import ADE20KDataset

    ade = data[1]
    expected = {255} | {v - 1 for v in mtd.ADE_LABELS if v}  # reduce_zero_label: 0 -> 255, v -> v - 1
    for split, n in (("training", COUNTS["ade_train"]), ("validation", COUNTS["ade_val"])):
        with DefaultScope.overwrite_default_scope("mmseg"):
            ds = ADE20KDataset(
                data_root=str(ade),
                data_prefix=dict(img_path=f"images/{split}", seg_map_path=f"annotations/{split}"),
                pipeline=[dict(type="LoadImageFromFile"), dict(type="LoadAnnotations"), dict(type="PackSegInputs")],
            )
        assert len(ds) == n
        for i in range(n):
            out = ds[i]
            seg = out["data_samples"].gt_sem_seg.data
            png = np.asarray(Image.open(out["data_samples"].seg_map_path))
            assert tuple(seg.shape[1:]) == png.shape == tuple(out["inputs"].shape[1:])
            values = set(seg.unique().tolist())
            assert values <= expected and {255, mtd.ADE_WALL - 1, mtd.ADE_FLOOR - 1} <= values
            assert (seg[0].numpy() == (png.astype(np.int64) - 1) % 256).all()
