"""tools/check_data.py and tools/train.py --check-data (tasks/data/scan.py, file_checks.py): copies of the session's
tiny COCO and ADE20K sets with bad entries spread through them, each named in one run's report with what is
wrong; the clean sets pass."""

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from tasks.data.checks import DataError
from tests._tools import DET_CFG, SEG_CFG, load_tool


def _opts(root, dataset):
    return [f"{s}_dataloader.dataset.data_root={root}/{dataset}/" for s in ("train", "val", "test")]


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def bad_coco(tiny_data, tmp_path):
    """tiny COCO with bad train images (cut, empty, missing), val images of another size than their annotation
    says and not an image at all, and bad val annotations; returns (root, {file name: what the report must
    say})."""
    root = tmp_path / "coco"
    shutil.copytree(tiny_data / "tiny_coco", root / "tiny_coco")
    base = root / "tiny_coco"
    train_ann = json.loads((base / "annotations" / "instances_train2017.json").read_text())
    with_objects = {a["image_id"] for a in train_ann["annotations"]}  # the others are not training samples
    train = sorted(base / "train2017" / i["file_name"] for i in train_ann["images"] if i["id"] in with_objects)
    _cut(train[0])
    train[1].write_bytes(b"")
    train[2].unlink()
    ann_file = base / "annotations" / "instances_val2017.json"
    ann = json.loads(ann_file.read_text())
    img0, img1, img2 = ann["images"][:3]
    (base / "val2017" / img2["file_name"]).write_text("a text file named .jpg\n")
    path0 = base / "val2017" / img0["file_name"]
    Image.open(path0).resize((img0["width"] + 8, img0["height"])).save(path0)
    first = next(a for a in ann["annotations"] if a["image_id"] == img1["id"])
    first["bbox"] = [img1["width"] - 5.0, 2.0, 40.0, 10.0]
    extra = dict(image_id=img1["id"], iscrowd=0, area=1.0)
    ann["annotations"] += [
        dict(extra, id=9001, bbox=[3.0, 3.0, 0.0, 5.0], category_id=1, segmentation=[[3, 3, 3, 8, 3, 5]]),
        dict(extra, id=9002, bbox=[3.0, 3.0, 5.0, 5.0], category_id=1, segmentation=[[3, 3, 8, 3]]),
        dict(extra, id=9003, bbox=[3.0, 3.0, 5.0, 5.0], category_id=99, segmentation=[[3, 3, 8, 3, 8, 8]]),
    ]
    ann_file.write_text(json.dumps(ann))
    expected = {
        train[0].name: "corrupt or truncated: image file is truncated",  # the draft-mode decode found it
        train[1].name: "empty: the file has 0 bytes",
        train[2].name: "missing: the file does not exist",
        img2["file_name"]: "not an image",
        img0["file_name"]: f"the image is {img0['width'] + 8}x{img0['height']} px, the annotation file says",
        f"annotation id {first['id']} ": "(x, y, w, h) leaves its",
        "annotation id 9001 ": "has zero size",
        "annotation id 9002 ": "a polygon has 4 coordinates, fewer than three points",
        "annotation id 9003 ": "category_id 99 is not in the file's categories",
    }
    return root, expected


def _found(report, key, says):
    return [p for p in report["problems"] if key in p["file"] + " " + p["problem"] and says in p["problem"]]


def test_every_bad_coco_entry_is_named_in_one_run_and_the_status_is_1(bad_coco, tmp_path, capsys):
    root, expected = bad_coco
    out = tmp_path / "report.json"
    argv = [DET_CFG, "--workers", "2", "--no-progress", "--out", str(out), "--cfg-options", *_opts(root, "tiny_coco")]
    with pytest.raises(SystemExit) as status:
        load_tool("check_data").cli(argv)
    assert status.value.code == 1
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    for key, says in expected.items():
        assert len(_found(report, key, says)) == 1, (key, says, report["problems"])
    assert len(report["problems"]) == len(expected), report["problems"]
    assert report["splits"]["test"] == {"same dataset as": "val"}  # read once
    assert all(p["fix"] for p in report["problems"])
    assert f"{len(expected)} problem(s)" in stdout


def test_train_check_data_stops_before_training_naming_the_problems(bad_coco, tmp_path, log_lines):
    root, expected = bad_coco
    work = tmp_path / "work"
    with pytest.raises(DataError, match=rf"--check-data found {len(expected)} problem\(s\).*data_errors='skip'"):
        load_tool("train").main(
            [DET_CFG, "--work-dir", str(work), "--check-data", "--cfg-options", *_opts(root, "tiny_coco")]
        )
    assert len(json.loads((work / "check_data.json").read_text())["problems"]) == len(expected)
    assert not list(work.glob("*.ckpt"))
    assert [line for line in log_lines if line.startswith("--check-data: ")][-1].endswith(f"{len(expected)} problem(s)")


def test_bad_label_maps_are_named_and_the_clean_sets_pass(tiny_data, tmp_path):
    check = load_tool("check_data")
    for cfg, dataset in ((DET_CFG, "tiny_coco"), (SEG_CFG, "tiny_ade20k")):
        clean = check.main([cfg, "--workers", "2", "--no-progress", "--cfg-options", *_opts(tiny_data, dataset)])
        assert clean["problems"] == [] and clean["splits"]["train"]["files"] > 0
    root = tmp_path / "ade"
    shutil.copytree(tiny_data / "tiny_ade20k", root / "tiny_ade20k")
    maps = sorted((root / "tiny_ade20k" / "annotations" / "training").iterdir())
    seg = np.array(Image.open(maps[0]))
    h, w = seg.shape
    Image.fromarray(seg[:, :-4]).save(maps[0])  # another size than its image
    seg = np.array(Image.open(maps[1]))
    seg[:3, :3] = 201  # 200 after reduce_zero_label: past the 150 ADE20K classes that label_map knows
    Image.fromarray(seg).save(maps[1])
    _cut(maps[2])
    report = check.main([SEG_CFG, "--workers", "2", "--no-progress", "--cfg-options", *_opts(root, "tiny_ade20k")])
    assert len(_found(report, maps[0].name, f"the label map is {w - 4}x{h} px, its image")) == 1
    assert len(_found(report, maps[1].name, "label values [201] are outside the 5 classes")) == 1
    assert len(_found(report, maps[2].name, "corrupt or truncated")) == 1
    assert len(report["problems"]) == 3, report["problems"]


@pytest.mark.timeout(120)
def test_scan_ends_in_a_process_whose_sigterm_handler_only_sets_a_flag(tiny_data):
    """A training process's preemption handler (or Lightning's) is inherited by forked pool workers; with it the
    workers must still end when the scan is done, instead of the scan waiting for them forever."""
    import signal

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        argv = [DET_CFG, "--workers", "2", "--no-progress", "--cfg-options", *_opts(tiny_data, "tiny_coco")]
        report = load_tool("check_data").main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert report["problems"] == [] and report["splits"]["train"]["files"] > 0
