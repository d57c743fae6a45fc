"""tools/benchmark.py --config: the whole detector / segmentor timed next to the Swin-T baseline, on the demo
configs at a small input with one round. Peak memory (a child process per model on a CPU) is measured in the run
without a baseline: the Swin-T Mask R-CNN's child alone took longer than the rest of the test."""

import json
import logging
import os

import pytest

from perf.whole_model.subject import baseline_config, default_size, keep_max_detections
from tasks.config.load import load_config
from tests._tools import DET_CFG, SEG_CFG, load_tool


def test_baselines_and_default_sizes():
    assert default_size(load_config(DET_CFG)) == (192, 192)  # the demo's test Resize scale
    assert default_size(load_config(SEG_CFG)) == (128, 128)  # the demo's crop size
    det, seg = (load_config(baseline_config(scope)) for scope in ("mmdet", "mmseg"))
    assert det.model.backbone.type == "SwinTransformer" and det.model.type == "MaskRCNN"
    assert seg.model.backbone.type == "SwinTransformer" and seg.model.decode_head.type == "UPerHead"
    assert default_size(det) == (800, 1333) and default_size(seg) == (512, 512)
    assert keep_max_detections(det) == 100 and det.model.test_cfg.rcnn.score_thr == 0.0
    assert keep_max_detections(seg) is None and "rcnn" not in (seg.model.get("test_cfg") or {})


class _Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.slow
def test_whole_model_against_swin_t(data_opts, tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--config", DET_CFG, "--size", "64x64", "--warmup", "0", "--repeat", "1", "--json", str(out)]
    lines_logged = _Recorder()
    logging.getLogger("lightning.pytorch").addHandler(lines_logged)  # where Lightning's INFO lines go
    try:
        load_tool("benchmark").main([*argv, "--no-memory", "--cfg-options", *data_opts("tiny_coco")])
    finally:
        logging.getLogger("lightning.pytorch").removeHandler(lines_logged)
    text = capsys.readouterr().out
    # building the two models says nothing of their training (which evaluator serves the config, ...)
    assert not [m for m in lines_logged.messages if m.startswith("evaluation (")], lines_logged.messages
    ours, swin = json.loads(out.read_text())
    assert (ours["model"], swin["model"]) == ("ours", "Swin-T") and swin["params_m"] > 40 > ours["params_m"]
    for row in (ours, swin):
        assert row["train"]["median"] > 0 and row["peak_gib"] is None
        assert row["infer"]["median"] > 0 and row["infer_loaded"]["median"] > 0  # the tiny test images loaded
    # the same work per image: at random weights the usual score threshold kept 100 boxes of ours, none of Swin-T's
    assert ours["detections"] == swin["detections"] == load_config(DET_CFG).model.test_cfg.rcnn.max_per_img
    lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert {"ours", "Swin-T", "ours / Swin-T"} <= set(lines) and ", 100 detections per image," in text
    ratios = [c.strip() for c in lines["ours / Swin-T"].split("|")[2:-1]]
    assert ratios[1] == f"{ours['infer']['median'] / swin['infer']['median']:.2f}x"
    assert ratios[3] == f"{ours['train']['median'] / swin['train']['median']:.2f}x"
    assert ratios[4] == "n/a"  # --no-memory


@pytest.mark.slow
def test_whole_model_alone_without_data_with_its_peak_memory(tmp_path, capsys):
    missing = os.path.join(tmp_path, "nowhere/")
    out = tmp_path / "rows.json"
    argv = ["--config", SEG_CFG, "--size", "64x64", "--warmup", "0", "--repeat", "1", "--baseline", "none"]
    argv += ["--json", str(out)]
    load_tool("benchmark").main([*argv, "--cfg-options", f"test_dataloader.dataset.data_root={missing}"])
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == ["model", "ours"]  # no baseline row, no ratio
    # the cell says why in short; the missing path follows the table, once
    assert rows[1].split("|")[4].strip() == "no test data" and missing not in rows[1]
    (note,) = [line for line in text.splitlines() if missing in line]
    assert note.startswith("infer + loading img/s: no test data: ")
    (ours,) = json.loads(out.read_text())
    # the child process's peak: the interpreter with torch and mm imported, then the model's steps
    assert 0.2 < ours["peak_gib"] < 8 and rows[1].split("|")[6].strip() == f"{ours['peak_gib']:.2f}"
