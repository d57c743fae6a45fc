"""``val_evaluator`` / ``test_evaluator`` honoured (tasks/evaluation/select.py, mm_metric.py): tools/test.py on the
session's demo runs with the metrics a config asks for. Our evaluators where they compute exactly that (the
default, numbers unchanged), mm's own metric classes otherwise, whose numbers must equal the same class fed by
this test with the same predictions (their gather under DDP: tests/test_distributed.py); an unknown metric type
and a monitor that no metric produces are refused."""

import json

import lightning as L
import numpy as np
import pytest
import torch

from tests._tools import DET_CFG, flat_metrics, load_cfg, load_tool

pytestmark = pytest.mark.slow  # several tools/test.py runs of the demo models


class Predictions(L.Callback):
    """Keeps every test batch's predictions (the samples the evaluator was fed), as plain dicts on the CPU."""

    def __init__(self) -> None:
        self.samples: list[dict] = []
        self.metainfo: dict = {}
        self.dataset = None

    def on_test_start(self, trainer, pl_module) -> None:
        self.dataset = trainer.datamodule.dataset("test")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.samples += [sample.cpu().to_dict() for sample in outputs]


def _test_tool(run, tmp_path, *opts):
    """tools/test.py on a session run's checkpoint with ``opts``: (metrics, the written JSON, the predictions)."""
    predictions = Predictions()
    out = tmp_path / "metrics.json"
    argv = [run.config, run.ckpt, "--work-dir", str(tmp_path), "--out", str(out), "--cfg-options", *run.opts, *opts]
    metrics = load_tool("test").main(argv, callbacks=[predictions])
    return metrics, json.loads(out.read_text()), predictions


def _mm_metric(metric, predictions: Predictions) -> dict:
    """mm's metric fed directly by the test (no registry, no Evaluator, no task code) with the same samples."""
    metric.dataset_meta = predictions.dataset.metainfo
    metric.process({}, predictions.samples)
    return {k: float(v) for k, v in metric.evaluate(len(predictions.samples)).items()}


def test_default_path_is_ours_with_unchanged_numbers(det_run, seg_run, tmp_path, caplog):
    # the demo configs state mm's base evaluators; ours computes them, under the project's names
    for run, line, names in (
        (
            det_run,
            "ours (DetectionEvaluator) for CocoMetric(metric=['bbox', 'segm']",
            {"bbox_mAP", "bbox_mAP_l", "segm_mAP_75"},
        ),
        (seg_run, "ours (SegmentationEvaluator) for IoUMetric(iou_metrics=['mIoU'])", {"mIoU", "aAcc", "mAcc"}),
    ):
        cfg = load_cfg(run.config, run.opts)
        assert cfg.test_evaluator.type == {"mmdet": "CocoMetric", "mmseg": "IoUMetric"}[cfg.default_scope]
        metrics, written, _ = _test_tool(run, tmp_path / cfg.default_scope)
        assert f"evaluation (val_evaluator, test_evaluator): {line}" in caplog.text
        assert names <= set(metrics) and "per_class" in metrics and written == metrics
        # the checkpoint was written after the run's last validation, on the same images: the same numbers
        assert flat_metrics(metrics) == pytest.approx(flat_metrics(run.metrics), abs=1e-9, nan_ok=True)


def test_iou_metric_dice_fscore_equals_mmseg(seg_run, tmp_path, caplog):
    from mmseg.evaluation import IoUMetric

    asks = ["mIoU", "mDice", "mFscore"]
    metrics, written, predictions = _test_tool(seg_run, tmp_path, f"test_evaluator.iou_metrics={asks}")
    assert "evaluation (test_evaluator): mmseg's own IoUMetric(iou_metrics=['mIoU', 'mDice', 'mFscore'])" in (
        caplog.text
    )
    expected = _mm_metric(IoUMetric(iou_metrics=asks), predictions)
    assert set(expected) >= {"aAcc", "mIoU", "mDice", "mFscore", "mPrecision", "mRecall"}
    # mmseg's names, its percentages (2 decimals) as fractions: the unit of ours on the default path
    fractions = {name: round(value / 100, 4) for name, value in expected.items()}
    assert metrics == fractions and written == fractions
    assert metrics["mIoU"] == pytest.approx(seg_run.metrics["mIoU"], abs=5e-5)


@pytest.mark.parametrize(
    "opts, metric_kwargs",
    [
        (["test_evaluator.classwise=True"], dict(metric=["bbox", "segm"], classwise=True)),
        (
            ["test_evaluator.metric=[bbox,proposal]", "test_evaluator.proposal_nums=(1,10,100)"],
            dict(metric=["bbox", "proposal"], proposal_nums=(1, 10, 100)),
        ),
    ],
    ids=["classwise", "proposal"],
)
def test_coco_metric_options_equal_mmdet(det_run, tmp_path, caplog, opts, metric_kwargs):
    from mmdet.evaluation import CocoMetric

    metrics, written, predictions = _test_tool(det_run, tmp_path, *opts)
    assert "evaluation (test_evaluator): mmdet's own CocoMetric(" in caplog.text
    expected = _mm_metric(CocoMetric(ann_file=predictions.dataset.ann_file, **metric_kwargs), predictions)
    assert len(predictions.samples) == 3 and "coco/bbox_mAP" in expected
    if metric_kwargs.get("classwise"):
        assert {"coco/segm_mAP", "coco/square_precision"} <= set(expected)
    else:
        assert {"coco/bbox_mAP_50", "coco/AR@100", "coco/AR_l@1000"} <= set(expected)  # mmdet's fixed AR names
    # mmdet's values under the names of ours: without the default prefix coco/
    renamed = {name.removeprefix("coco/"): value for name, value in expected.items()}
    assert metrics == pytest.approx(renamed, abs=0, nan_ok=True) and set(written) == set(renamed)
    if metric_kwargs.get("classwise"):  # mmdet's 3 decimals against ours on the default path
        assert metrics["bbox_mAP"] == pytest.approx(det_run.metrics["bbox_mAP"], abs=5e-4)


def test_unknown_metric_type_names_the_registered_ones(seg_run, tmp_path):
    with pytest.raises(KeyError, match=r"test_evaluator: unknown type 'IouMetric'.*Did you mean .*'IoUMetric'"):
        _test_tool(seg_run, tmp_path, "test_evaluator.type=IouMetric")


def test_proposal_fast_refused_before_the_loop(det_run, tmp_path):
    # mmdet 3.3's eval_recalls cannot run with this numpy (checked below): refused at once, naming the fix
    from mmdet.evaluation.functional import eval_recalls

    with pytest.raises(ValueError, match="inhomogeneous"):
        eval_recalls([np.zeros((2, 4)), np.zeros((1, 4))], [np.zeros((3, 4)), np.zeros((3, 4))], [1], 0.5)
    with pytest.raises(ValueError, match=r"test_evaluator: CocoMetric\(metric='proposal_fast'\).*metric='proposal'"):
        _test_tool(det_run, tmp_path, "test_evaluator.metric=proposal_fast")


def test_classwise_trains_with_the_configs_monitor_and_mm_names_are_refused(det_run, tmp_path):
    train = load_tool("train")
    opts = [*det_run.opts, "val_evaluator.classwise=True"]
    # mmdet's own name: refused before any step, naming the project's
    with pytest.raises(
        ValueError, match=r"monitor='coco/bbox_mAP' is not a metric.*checkpoint_callback.monitor=bbox_mAP"
    ):
        train.main(
            [
                DET_CFG,
                "--work-dir",
                str(tmp_path / "a"),
                "--cfg-options",
                *opts,
                "checkpoint_callback.monitor=coco/bbox_mAP",
            ]
        )
    assert not list((tmp_path / "a").glob("*.ckpt"))
    # the demo config's own monitor (bbox_mAP): validation during training runs mmdet's CocoMetric, whose metrics
    # are logged, stored and ranked by under the same names as ours, and its numbers are those of tools/test.py
    # with the same metric on the last checkpoint
    work = tmp_path / "b"
    metrics = train.main([DET_CFG, "--work-dir", str(work), "--cfg-options", *opts])
    assert load_cfg(DET_CFG, opts).checkpoint_callback.monitor == "bbox_mAP"
    assert {"bbox_mAP", "segm_mAP", "square_precision"} <= set(metrics)
    assert not [name for name in metrics if name.startswith("coco/")]
    assert len(list(work.glob("best_bbox_mAP_*.ckpt"))) == 1
    assert torch.load(work / "last.ckpt", weights_only=True)["val_metrics"] == metrics
    run = det_run._replace(ckpt=str(work / "last.ckpt"))
    tested, _, _ = _test_tool(run, tmp_path / "test", "test_evaluator.classwise=True")
    assert tested == pytest.approx(metrics, abs=0, nan_ok=True)


def test_mm_metrics_build_without_console_warnings():
    # mmseg's IoUMetric has no default prefix, for which mmengine's BaseMetric logs a WARNING on the console at
    # every build: with mmseg's own names (mIoU, mDice...) that is the normal case, not a defect of the config
    import logging

    from mmengine.logging import MMLogger
    from mmengine.registry import DefaultScope

    from tasks.evaluation.mm_metric import MMEvaluator

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        with DefaultScope.overwrite_default_scope("mmseg"):  # as the segmentation task builds it
            evaluator = MMEvaluator([dict(type="IoUMetric", iou_metrics=["mIoU", "mDice"])], "mmseg", "val_evaluator")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []
    assert evaluator.evaluator.metrics[0].prefix is None  # mmseg's own names: mIoU, not <prefix>/mIoU


def test_format_only_validation_has_no_metric_to_monitor(tmp_path):
    # mm's format_only=True writes the results and computes nothing: no name of it can be monitored
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from tasks.evaluation.mm_metric import MMEvaluator
    from tasks.evaluation.select import check_monitor

    metric = dict(type="CocoMetric", metric=["bbox"], format_only=True, outfile_prefix=str(tmp_path / "results"))
    with DefaultScope.overwrite_default_scope("mmdet"):
        evaluator = MMEvaluator([metric], "mmdet", "val_evaluator")
    with pytest.raises(ValueError, match=r"monitor='bbox_mAP'.*logs no metric \(format_only=True writes.*monitor=None"):
        check_monitor(Config(dict(checkpoint_callback=dict(monitor="bbox_mAP"))), evaluator, "mmdet")
    check_monitor(Config(dict(checkpoint_callback=dict(monitor=None))), evaluator, "mmdet")


class CountValidations(L.Callback):
    def __init__(self) -> None:
        self.count = 0

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.count += not trainer.sanity_checking


def test_format_only_validation_runs_once_and_writes_the_results(data_opts, tmp_path):
    # a format_only validation logs no metric: tools/train.py took that for "validation never ran" and validated
    # (and wrote the result files) once more after fit
    from tests._runs import run_here, seg_opts
    from tests._tools import SEG_CFG

    out, counter = tmp_path / "results", CountValidations()
    opts = seg_opts(
        data_opts,
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1",
        "val_evaluator.format_only=True",
        f"val_evaluator.output_dir={out}",
    )
    metrics = run_here(
        "train", [SEG_CFG, "--work-dir", str(tmp_path / "run"), "--cfg-options", *opts], callbacks=[counter]
    )
    assert metrics == {} and counter.count == 1
    written = [p.suffix for p in out.iterdir()]
    assert written and set(written) == {".png"}  # the validation batch's label maps
