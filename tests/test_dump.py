"""tools/test.py --dump (tasks/evaluation/dump.py) and mmdet's / mmseg's own analysis scripts run on the dumps
through tools/analyze.py, on the session's tiny demo runs (conftest.py's ``det_run`` and ``seg_run``)."""

import io
import json
import os
import pickle
import runpy
from pathlib import Path

import lightning as L
import mmcv
import mmengine
import numpy as np
import pytest
import torch
from mmseg import datasets as mmseg_datasets
from PIL import Image
from torchvision.ops import box_iou

from tasks.evaluation.analysis import script_path
from tasks.evaluation.dump import write_pickled_list
from tests._tools import DET_CFG, SEG_CFG, load_tool

pytestmark = pytest.mark.slow  # test runs and analysis scripts: long, scheduled first (conftest.py)


class Collect(L.Callback):
    """The predictions of every test batch, on CPU."""

    def __init__(self):
        self.samples = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.samples += [s.cpu() for s in outputs]


def analyze(*args):
    """tools/analyze.py's ``main`` in this process: it runs the library's script in the calling process anyway
    (runpy, tasks/evaluation/analysis.py), so a child process would only add its imports."""
    load_tool("analyze").main([str(a) for a in args])


@pytest.fixture(scope="module")
def det_dump(det_run, run_once):
    """tools/test.py --format-only --out-dir --dump on the detection run (no metrics), and mmdet's own
    DumpDetResults (its process and mmengine's collect_results + dump) fed with the same predictions."""

    def make(folder):
        collect = Collect()
        args = [det_run.config, det_run.ckpt, "--work-dir", str(folder), "--format-only"]
        args += ["--out-dir", f"{folder}/files", "--dump", f"{folder}/dump/det.pkl", "--cfg-options", *det_run.opts]
        load_tool("test").main(args, callbacks=[collect])
        from mmdet.evaluation.metrics import DumpDetResults

        reference = DumpDetResults(out_file_path=f"{folder}/reference.pkl")
        reference.process({}, [s.to_dict() for s in collect.samples])
        reference.evaluate(len(collect.samples))
        return {"dir": str(folder), "num_images": len(collect.samples)}

    return run_once("dump_det", make)


@pytest.fixture(scope="module")
def seg_dump(seg_run, run_once):
    """tools/test.py --dump on the segmentation run, with metrics."""

    def make(folder):
        args = [seg_run.config, seg_run.ckpt, "--work-dir", str(folder), "--dump", f"{folder}/pred"]
        metrics = load_tool("test").main([*args, "--cfg-options", *seg_run.opts])
        return {"dir": str(folder), "metrics": {k: v for k, v in metrics.items() if k != "per_class"}}

    return run_once("dump_seg", make)


def test_write_pickled_list_is_one_pickle_of_the_list():
    # > one MARK ... APPENDS group (1000 items), items sharing objects inside themselves (memo references)
    shared = {"a": torch.arange(3)}
    items = [{"i": i, "x": [shared, shared], "t": torch.full((2,), float(i))} for i in range(2345)]
    for n in (0, 1, 1000, 2345):
        out = io.BytesIO()
        assert write_pickled_list(out, (pickle.dumps(x, protocol=2) for x in items[:n])) == n
        loaded = pickle.loads(out.getvalue())
        assert len(loaded) == n and [x["i"] for x in loaded] == list(range(n))
        assert all(x["x"][0] is x["x"][1] and torch.equal(x["t"], torch.full((2,), float(x["i"]))) for x in loaded)
    with pytest.raises(ValueError, match="protocol-2"):
        write_pickled_list(io.BytesIO(), [pickle.dumps(1, protocol=5)])


def test_det_dump_equals_mmdet_dump_det_results(det_dump, det_run):
    folder = Path(det_dump["dir"])
    ours, reference = mmengine.load(folder / "dump/det.pkl"), mmengine.load(folder / "reference.pkl")
    assert len(ours) == len(reference) == det_dump["num_images"] == 3
    for a, b in zip(ours, reference):
        assert a.keys() == b.keys() and "gt_instances" not in a
        assert {k: v for k, v in a.items() if k != "pred_instances"} == {
            k: v for k, v in b.items() if k != "pred_instances"
        }
        pa, pb = a["pred_instances"], b["pred_instances"]
        assert pa.keys() == pb.keys() == {"bboxes", "scores", "labels", "masks"}
        assert all(torch.equal(pa[k], pb[k]) and pa[k].device.type == "cpu" for k in ("bboxes", "scores", "labels"))
        assert pa["masks"] == pb["masks"] and isinstance(pa["masks"][0]["counts"], bytes)  # RLE, as mmdet's
    # in dataset order (CocoDataset's: the annotation file's), and nothing else left in the folder
    ds = mmengine.Config.fromfile(det_run.config).test_dataloader.dataset
    ann = json.loads(Path(ds.data_root, ds.ann_file).read_text())
    assert [r["img_id"] for r in ours] == [image["id"] for image in ann["images"]]
    assert os.listdir(folder / "dump") == ["det.pkl"]


def det_ground_truth(config):
    """{img_path: (boxes xyxy, labels)} read from the test set's COCO annotation file."""
    cfg = mmengine.Config.fromfile(config)
    ds = cfg.test_dataloader.dataset
    ann = json.loads(Path(ds.data_root, ds.ann_file).read_text())
    classes = list(ds.metainfo["classes"])
    label = {c["id"]: classes.index(c["name"]) for c in ann["categories"]}
    out = {}
    for image in ann["images"]:
        anns = [a for a in ann["annotations"] if a["image_id"] == image["id"]]
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)]).reshape(-1, 4)
        out[str(Path(ds.data_root, ds.data_prefix.img, image["file_name"]))] = (
            boxes.float(),
            [label[a["category_id"]] for a in anns],
        )
    return out, len(classes)


def expected_confusion_matrix(dump, gt, n, score_thr, iou_thr=0.5):
    """mmdet's definition, counted here from the predictions and the annotation file: (gt class, det class) for
    each pair with IoU >= iou_thr, (background, det class) for a detection without such a pair, (gt class,
    background) for a ground truth without a detection of its class."""
    matrix = np.zeros((n + 1, n + 1))
    for result in dump:
        boxes, labels = gt[result["img_path"]]
        pred = result["pred_instances"]
        keep = pred["scores"] >= score_thr
        ious = box_iou(pred["bboxes"][keep], boxes)
        found = [False] * len(labels)
        for d, det_label in enumerate(pred["labels"][keep].tolist()):
            pairs = (ious[d] >= iou_thr).nonzero().flatten().tolist()
            for j in pairs:
                matrix[labels[j], det_label] += 1
                found[j] |= labels[j] == det_label
            if not pairs:
                matrix[-1, det_label] += 1
        for j, ok in enumerate(found):
            matrix[labels[j], -1] += not ok
    return matrix


def test_mmdet_confusion_matrix_on_det_dump(det_dump, det_run, tmp_path):
    dump = f"{det_dump['dir']}/dump/det.pkl"
    analyze("confusion-matrix", det_run.config, dump, tmp_path, "--score-thr", "0.05")
    image = mmcv.imread(str(tmp_path / "confusion_matrix.png"))
    assert image.shape[0] > 100 and image.shape[1] > 100
    # the values the script drew: its own function on the dump; the dataset's image i is the dump's item i
    script = runpy.run_path(script_path("mmdet", "confusion_matrix.py"))
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    init_default_scope("mmdet")
    dataset = DATASETS.build(mmengine.Config.fromfile(det_run.config).test_dataloader.dataset)
    results = mmengine.load(dump)
    assert [r["img_path"] for r in results] == [dataset.get_data_info(i)["img_path"] for i in range(len(dataset))]
    matrix = script["calculate_confusion_matrix"](dataset, results, score_thr=0.05)
    gt, n = det_ground_truth(det_run.config)
    expected = expected_confusion_matrix(results, gt, n, score_thr=0.05)
    np.testing.assert_array_equal(matrix, expected)
    assert matrix[:, :n].sum() >= int(sum((r["pred_instances"]["scores"] >= 0.05).sum() for r in results))
    assert matrix[:n, :].sum() >= sum(len(v[1]) for v in gt.values())  # every ground truth counted


def test_mmdet_analyze_results_on_det_dump(det_dump, det_run, tmp_path):
    analyze("analyze-results", det_run.config, f"{det_dump['dir']}/dump/det.pkl", tmp_path, "--topk", "1")
    stems = {Path(r["img_path"]).stem for r in mmengine.load(f"{det_dump['dir']}/dump/det.pkl")}
    best, worst = (sorted(os.listdir(tmp_path / d)) for d in ("good", "bad"))
    assert len(best) == len(worst) == 1  # --topk 1: one image each, drawn as '<stem>_<mAP>.jpg'
    (best_stem, best_map), (worst_stem, worst_map) = (Path(f[0]).stem.rsplit("_", 1) for f in (best, worst))
    assert {best_stem, worst_stem} <= stems and float(best_map) >= float(worst_map)
    assert mmcv.imread(str(tmp_path / "good" / best[0])).ndim == 3


def test_coco_error_analysis_on_format_only_json(det_dump, det_run, tmp_path):
    ds = mmengine.Config.fromfile(det_run.config).test_dataloader.dataset
    results = f"{det_dump['dir']}/files/results.bbox.json"
    analyze("coco-error-analysis", results, tmp_path, "--ann", Path(ds.data_root, ds.ann_file))
    names = set(os.listdir(tmp_path / "bbox"))
    for name in [*ds.metainfo["classes"], "allclass"]:
        assert {f"bbox-{name}-{area}.png" for area in ("allarea", "small", "medium", "large")} <= names


def test_mmseg_confusion_matrix_on_seg_dump(seg_dump, seg_run, tmp_path):
    pred_dir = Path(seg_dump["dir"]) / "pred"
    cfg = mmengine.Config.fromfile(seg_run.config)
    ds = cfg.test_dataloader.dataset
    img_dir, ann_dir = Path(ds.data_root, ds.data_prefix.img_path), Path(ds.data_root, ds.data_prefix.seg_map_path)
    stems = sorted(p.stem for p in img_dir.iterdir())
    assert sorted(os.listdir(pred_dir)) == [f"{s}.png" for s in stems]  # one label PNG per image, nothing else
    analyze("confusion-matrix", seg_run.config, pred_dir, tmp_path, "--plot-classes", "4")
    assert mmcv.imread(str(tmp_path / "confusion_matrix.png")).shape[0] > 100
    matrix = np.load(tmp_path / "confusion_matrix.npy")
    n = matrix.shape[0]
    # counted here from the PNGs: ADE20K's labels reduced once (0 unlabelled, ignored; c -> c - 1), then mapped to the
    # config's classes (a subset of ADE20K's, in their order)
    ade20k = mmseg_datasets.ADE20KDataset.METAINFO["classes"]
    to_class = np.full(256, -1)
    to_class[[ade20k.index(name) + 1 for name in ds.metainfo["classes"]]] = np.arange(len(ds.metainfo["classes"]))
    expected = np.zeros((n, n))
    for s in stems:
        gt = to_class[np.array(Image.open(ann_dir / f"{s}.png")).astype(np.int64).ravel()]
        pred = np.array(Image.open(pred_dir / f"{s}.png")).astype(np.int64).ravel()
        assert pred.max() < n
        expected += np.bincount(n * gt[gt >= 0] + pred[gt >= 0], minlength=n * n).reshape(n, n)
    np.testing.assert_array_equal(matrix, expected)
    # mmseg's matrix on the dump gives the metrics of our evaluator on the same run
    diag, union = np.diag(matrix), matrix.sum(0) + matrix.sum(1) - np.diag(matrix)
    metrics = seg_dump["metrics"]
    assert metrics["aAcc"] == pytest.approx(diag.sum() / matrix.sum(), abs=1e-6)
    assert metrics["mIoU"] == pytest.approx((diag[union > 0] / union[union > 0]).mean(), abs=1e-6)


def test_dump_path_checked_before_the_run(tmp_path):
    test = load_tool("test")
    with pytest.raises(ValueError, match=r"--dump .*det\.json.*\.pkl or \.pickle"):
        test.main([DET_CFG, "missing.ckpt", "--dump", str(tmp_path / "det.json")])
    with pytest.raises(ValueError, match=r"--dump .*seg\.pkl.*folder of label PNGs.*directory"):
        test.main([SEG_CFG, "missing.ckpt", "--dump", str(tmp_path / "seg.pkl")])


def test_the_command_line_names_a_wrong_dump_path_without_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["test.py", DET_CFG, "missing.ckpt", "--dump", str(tmp_path / "det.json")])
    with pytest.raises(SystemExit, match=r"^error: --dump .*det\.json: mmdet's analysis tools read a pickle"):
        load_tool("test").main()


class Crash(L.Callback):
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 1:
            raise RuntimeError("crash in the middle of the test set")


def test_a_crash_leaves_no_partial_dump(det_run, tmp_path):
    # --format-only: the metrics' evaluator stays empty; a partly filled one makes Lightning's teardown fail with
    # its own error (torchmetrics cannot hash its numpy states), which would hide the crash raised here
    (tmp_path / "dump").mkdir()
    args = [det_run.config, det_run.ckpt, "--work-dir", str(tmp_path), "--dump", str(tmp_path / "dump/det.pkl")]
    args += ["--format-only", "--out-dir", str(tmp_path / "files")]
    with pytest.raises(RuntimeError, match="crash in the middle"):
        load_tool("test").main([*args, "--cfg-options", *det_run.opts], callbacks=[Crash()])
    assert os.listdir(tmp_path / "dump") == []  # neither the pickle nor the spool


@pytest.mark.parametrize(
    "args, message",
    [
        (["confusion-matrix", DET_CFG, "{tmp}/missing.pkl"], r"predictions not found: '.*missing\.pkl'; write them"),
        (["confusion-matrix", SEG_CFG, "{tmp}/pred.pkl"], r"mmseg's confusion_matrix\.py reads a folder"),
        (["analyze-results", DET_CFG, "{tmp}"], r"mmdet's analysis tools read a pickle"),
        (["confusion-matrix", "{tmp}/missing.py", "{tmp}/d.pkl"], r"config file not found: '.*missing\.py'"),
        (["coco-error-analysis", "{tmp}/results.bbox.json"], r"results file not found: '.*results\.bbox\.json'"),
    ],
)
def test_analyze_names_a_missing_or_wrong_input_without_a_traceback(args, message, tmp_path, monkeypatch):
    # the library's script raised from inside mmengine.load (a missing pickle) or counted nothing
    argv = [a.format(tmp=tmp_path) for a in args] + [str(tmp_path / "out")]
    monkeypatch.setattr("sys.argv", ["analyze.py", *argv])
    with pytest.raises(SystemExit, match="^error: (--dump .*: )?" + message):
        load_tool("analyze").main()
    assert not (tmp_path / "out").exists()
