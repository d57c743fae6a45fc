"""mm's own metric classes (mmdet's / mmseg's ``METRICS`` registry) behind the evaluator interface of the task
module, driven as mmengine's Runner drives them: ``Evaluator.process(data_samples, data_batch)`` per batch,
``Evaluator.evaluate(size)`` at the epoch end.

Under DDP, mmengine's ``BaseMetric.evaluate`` gathers every rank's results on rank 0 through ``mmengine.dist``
(the process group Lightning's strategy created), computes there and broadcasts the metrics to every rank. It
interleaves the ranks' results and keeps the first ``size``: the project's eval sampler gives every image to
exactly one rank without padding, so with ``size`` the length of the split each image counts once.

A metric has one name and one unit whichever evaluator computes it (``project_names``): mmdet's ``CocoMetric``
without a ``prefix`` of the config's logs ``bbox_mAP``, not its default ``coco/bbox_mAP``, and mmseg's
``IoUMetric`` logs fractions, not percentages, as our evaluators do. A monitor then works with either.
"""

from __future__ import annotations

from typing import Any, Sequence

from lightning.pytorch.utilities import rank_zero_info

from ..config.load import build_from_registry
from ..runtime.quiet import no_metric_prefix_notes


def metrics_registry(scope: str):
    """mmdet's or mmseg's ``METRICS`` registry (children of mmengine's)."""
    if scope == "mmdet":
        from mmdet.registry import METRICS
    elif scope == "mmseg":
        from mmseg.registry import METRICS
    else:
        raise ValueError(f"unknown scope {scope!r}, expected 'mmdet' or 'mmseg'")
    return METRICS


class MMEvaluator:
    """mm's metric classes built from configs, with ``update`` / ``compute`` / ``reset`` like our evaluators.

    ``compute()`` returns the metrics under the project's names (``project_names``: mmdet's ``bbox_mAP``,
    ``coco/bbox_mAP`` only with ``prefix='coco'`` in the config; mmseg's ``mIoU``, ``mDice`` as fractions), numeric
    values as floats; values that are not numbers are left out (and named in the log).

    Args:
        metrics: the metric configs (plain dicts with ``type``), built from ``scope``'s ``METRICS`` registry.
        scope: ``'mmdet'`` or ``'mmseg'``.
        key: the config key they come from, for error messages.

    Attributes:
        takes_batch: True: ``update`` also takes the data batch (mm's ``process(data_batch, data_samples)``).
        size: the number of images of the evaluated split (``set_dataset``); mm's ``evaluate(size)``.
    """

    takes_batch = True

    def __init__(self, metrics: Sequence[dict], scope: str, key: str) -> None:
        from mmengine.evaluator import Evaluator

        self.scope = scope
        self.key = key
        self.configs = [dict(m) for m in metrics]
        for cfg in self.configs:
            _refuse_proposal_fast(cfg, key)
        registry = metrics_registry(scope)
        with no_metric_prefix_notes():
            self.evaluator = Evaluator([build_from_registry(registry, dict(m), what=key) for m in self.configs])
        self.registry = registry
        self.size: int | None = None
        self._ann_file: str | None = None

    def set_dataset(self, dataset: Any) -> None:
        """Point the metrics at the evaluated split: its ``metainfo`` (mm's ``dataset_meta``) and length.

        mmdet's ``CocoMetric`` reads the ground truth from an annotation file (the samples do not carry the raw
        annotations); one configured without ``ann_file`` is rebuilt with the dataset's.
        """
        self.size = len(dataset)
        ann_file = getattr(dataset, "ann_file", None)
        if ann_file and ann_file != self._ann_file and any(self._needs_ann_file(c) for c in self.configs):
            from mmengine.evaluator import Evaluator

            configs = [{**c, "ann_file": ann_file} if self._needs_ann_file(c) else c for c in self.configs]
            with no_metric_prefix_notes():
                self.evaluator = Evaluator([build_from_registry(self.registry, c, self.key) for c in configs])
            self._ann_file = ann_file
        self.evaluator.dataset_meta = dict(dataset.metainfo)

    @staticmethod
    def _needs_ann_file(cfg: dict) -> bool:
        return str(cfg["type"]).rpartition(".")[2] == "CocoMetric" and not cfg.get("ann_file")

    def update(self, data_samples: Sequence[Any], data_batch: Any = None) -> None:
        """mm's ``Evaluator.process``: every sample converted with ``to_dict()``, handed to each metric.

        Args:
            data_samples: the model's predictions (mmdet / mmseg data samples with ground truth).
            data_batch: the batch they were predicted from.
        """
        self.evaluator.process(data_samples, data_batch)

    def compute(self) -> dict[str, float]:
        """mm's ``Evaluator.evaluate(size)`` on every rank (it gathers the results on rank 0 and broadcasts the
        metrics); the per-rank results are cleared."""
        size = self.size if self.size is not None else sum(len(m.results) for m in self.evaluator.metrics)
        metrics, dropped = {}, []
        # mmengine's Evaluator.evaluate, metric by metric: each one's names are made the project's
        for cfg, metric in zip(self.configs, self.evaluator.metrics):
            for name, value in project_names(metric.evaluate(size), cfg).items():
                if name in metrics:
                    raise ValueError(
                        f"{self.key}: two metrics log {name!r}; give the metrics different prefixes (prefix='...')"
                    )
                try:
                    metrics[name] = float(value)
                except (TypeError, ValueError):
                    dropped.append(name)
        if dropped:
            rank_zero_info(f"evaluation ({self.key}): not numbers, not logged: {', '.join(dropped)}")
        return metrics

    def reset(self) -> None:
        """Drop the results of an epoch that was not computed (``compute`` clears them itself)."""
        for metric in self.evaluator.metrics:
            metric.results.clear()


def _refuse_proposal_fast(cfg: dict, key: str) -> None:
    """mmdet 3.3's ``CocoMetric(metric='proposal_fast')`` stacks the per-image IoU matrices with ``np.array``
    (``mmdet.evaluation.functional.eval_recalls``), which numpy >= 1.24 refuses for images with different numbers
    of objects: it would fail only after the whole prediction loop."""
    asked = cfg.get("metric", "bbox")
    if str(cfg["type"]).rpartition(".")[2] == "CocoMetric" and "proposal_fast" in (
        [asked] if isinstance(asked, str) else asked
    ):
        import numpy as np

        if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (1, 24):
            raise ValueError(
                f"{key}: CocoMetric(metric='proposal_fast') fails in mmdet's eval_recalls with numpy "
                f"{np.__version__} (it stacks per-image arrays of different shapes); ask for metric='proposal' "
                "(COCO average recall over proposal_nums, class-agnostic) instead"
            )


_PERCENT = ("aAcc", "mIoU", "mAcc", "mDice", "mFscore", "mPrecision", "mRecall")  # mmseg's IoUMetric, in %


def _kind(cfg: dict) -> str:
    return str(cfg["type"]).rpartition(".")[2]


def project_names(result: dict, cfg: dict) -> dict:
    """One mm metric's ``evaluate`` result under the project's names and units (docs/evaluation.md): mmdet's
    ``CocoMetric`` without a ``prefix`` in ``cfg`` loses its default ``coco/`` prefix; mmseg's ``IoUMetric``
    values become fractions (mmseg rounds percentages to 2 decimals: 4 decimals here). Other metrics are left
    as they are.

    Args:
        result: the names and values the metric returned.
        cfg: the metric's config (plain dict).
    """
    kind = _kind(cfg)
    if kind == "CocoMetric" and not cfg.get("prefix"):
        return {name.removeprefix("coco/"): value for name, value in result.items()}
    if kind == "IoUMetric":
        prefix = f"{cfg['prefix']}/" if cfg.get("prefix") else ""
        percent = {prefix + n for n in _PERCENT}
        return {n: round(float(v) / 100, 4) if n in percent else v for n, v in result.items()}
    return result


_AP_ITEMS = ("mAP", "mAP_50", "mAP_75", "mAP_s", "mAP_m", "mAP_l")
_PROPOSAL_ITEMS = ("AR@100", "AR@300", "AR@1000", "AR_s@1000", "AR_m@1000", "AR_l@1000")


def expected_names(metrics: Sequence[dict], scope: str) -> set[str] | None:
    """The metric names ``MMEvaluator.compute`` will return for ``metrics`` (the project's, ``project_names``),
    where they follow from the configs alone (mmdet's ``CocoMetric``, mmseg's ``IoUMetric``); None when they do
    not. ``classwise`` adds the pattern ``*_precision`` (one name per class).

    Args:
        metrics: the metric configs.
        scope: ``'mmdet'`` or ``'mmseg'``.
    """
    names: set[str] = set()
    for cfg in metrics:
        kind = _kind(cfg)
        if cfg.get("format_only") and kind in ("CocoMetric", "IoUMetric"):
            continue  # writes the results, computes nothing
        prefix = f"{cfg['prefix']}/" if cfg.get("prefix") else ""
        if scope == "mmdet" and kind == "CocoMetric":
            prefix = f"{cfg['prefix']}/" if cfg.get("prefix") else ""
            asked = cfg.get("metric", "bbox")
            for metric in [asked] if isinstance(asked, str) else asked:
                if metric == "proposal_fast":
                    names |= {f"{prefix}AR@{n}" for n in cfg.get("proposal_nums", (100, 300, 1000))}
                    continue
                items = cfg.get("metric_items") or (_PROPOSAL_ITEMS if metric == "proposal" else _AP_ITEMS)
                names |= {f"{prefix}{i}" if metric == "proposal" else f"{prefix}{metric}_{i}" for i in items}
            if cfg.get("classwise"):
                names.add(f"{prefix}*_precision")  # one per class of the annotation file (a pattern)
        elif scope == "mmseg" and kind == "IoUMetric":
            names |= {f"{prefix}aAcc"}
            for metric in cfg.get("iou_metrics", ["mIoU"]):
                names |= {
                    f"{prefix}{n}"
                    for n in {"mIoU": ["mIoU", "mAcc"], "mDice": ["mDice", "mAcc"]}.get(
                        metric, ["mFscore", "mPrecision", "mRecall", "mAcc"]
                    )
                }
        else:
            return None
    return names
