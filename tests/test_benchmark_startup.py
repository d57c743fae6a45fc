"""tools/benchmark_startup.py at a tiny size: the generated file is a valid COCO file of train2017's make-up,
and both set-ups (mmdet's plain build, the project's train loader) run on it in child processes."""

import json

import pytest

from perf.training.startup import COCO_IDS
from tests._tools import load_tool

bench = load_tool("benchmark_startup")


@pytest.mark.slow
def test_generated_file_and_both_setups(tmp_path):
    result = bench.main(["--images", "300", "--anns", "2100", "--repeats", "1", "--cache", str(tmp_path)])
    ann_file = next(tmp_path.rglob("instances_train2017.json"))
    data = json.loads(ann_file.read_text())
    assert len(data["images"]) == 300 and len(data["annotations"]) == 2100
    assert [c["id"] for c in data["categories"]] == COCO_IDS and len(COCO_IDS) == 80
    portrait = sum(i["width"] < i["height"] for i in data["images"])
    assert 0.1 < portrait / 300 < 0.3  # a third drawn upright, of which 3 in 5 sizes are not square
    n_points = [len(a["segmentation"][0]) // 2 for a in data["annotations"]]
    assert min(n_points) == 6 and max(n_points) == 23
    for a in data["annotations"][:50]:  # polygons inside their boxes, boxes inside their images
        x, y, w, h = a["bbox"]
        xs, ys = a["segmentation"][0][::2], a["segmentation"][0][1::2]
        assert x - 0.02 <= min(xs) and max(xs) <= x + w + 0.02 and y - 0.02 <= min(ys) and max(ys) <= y + h + 0.02

    with_objects = len({a["image_id"] for a in data["annotations"]})
    for kind in ("mmdet", "project"):
        (run,) = result["runs"][kind]
        assert run["images"] == with_objects  # filter_empty_gt: the same images kept by both
        assert run["seconds"] > 0 and run["cpu_seconds"] > 0 and run["peak_gib"] > 0.1
    assert set(result["ratios"]) == {"seconds", "cpu_seconds", "peak_gib"}
