"""Which evaluator computes what a config's ``val_evaluator`` / ``test_evaluator`` asks for.

The key holds what mmengine's Runner accepts: one metric config (``dict(type='CocoMetric', ...)``), a list of
them, or ``dict(metrics=[...])``; None (or absent) means the project's default. Ours (``DetectionEvaluator``,
``SegmentationEvaluator``: torchmetrics, bounded in memory) runs where it computes exactly what is asked:

* mmdet ``CocoMetric`` with ``metric`` among ``'bbox'`` / ``'segm'`` and otherwise default options
  (``ann_file``, ``backend_args``, ``collect_device``, ``use_mp_eval`` and ``sort_categories`` change no number);
* mmseg ``IoUMetric`` with ``iou_metrics=['mIoU']`` and otherwise default options (``ignore_index`` is passed on).

Anything else (``classwise``, ``proposal_nums``, ``metric_items``, ``iou_thrs``, ``prefix``, ``'proposal'``,
mDice / mFscore, several metrics, any other registered metric) goes to mm's own metric classes through
``mmengine.evaluator.Evaluator`` (tasks/evaluation/mm_metric.py). ``choose`` says which; ``build_evaluators``
logs it in one line per key.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, NamedTuple

from lightning.pytorch.utilities import rank_zero_info

# Options of the two metrics that change no number: any value is accepted on our path.
_ANY_VALUE = {
    "CocoMetric": {"type", "ann_file", "backend_args", "collect_device", "use_mp_eval", "sort_categories"},
    "IoUMetric": {"type", "collect_device", "ignore_index"},
}
# Options that ours computes only at their default value.
_DEFAULTS = {
    "CocoMetric": dict(
        classwise=False,
        proposal_nums=[100, 300, 1000],
        iou_thrs=None,
        metric_items=None,
        format_only=False,
        outfile_prefix=None,
        prefix=None,
        file_client_args=None,
    ),
    "IoUMetric": dict(iou_metrics=["mIoU"], nan_to_num=None, beta=1, output_dir=None, format_only=False, prefix=None),
}
OURS_FOR = {"mmdet": "CocoMetric", "mmseg": "IoUMetric"}  # the mm metric that each scope's evaluator equals


class Choice(NamedTuple):
    """What evaluates a split.

    Attributes:
        ours: the keyword arguments of our evaluator (``with_masks`` / ``ignore_index``), or None for mm's.
        metrics: the metric configs for mm's ``Evaluator`` (None when ours runs).
        what: what the config asks for, in words (the logged line).
    """

    ours: dict | None
    metrics: list[dict] | None
    what: str


def metric_configs(spec: Any, key: str) -> list[dict] | None:
    """The metric configs of a ``val_evaluator`` / ``test_evaluator`` value, as a list of plain dicts.

    Args:
        spec: the config value: None, a metric dict, a list of them, or ``dict(metrics=[...])``.
        key: the config key, for the error message.
    """
    if spec is None:
        return None
    if isinstance(spec, dict) and "type" not in spec and "metrics" in spec:  # mmengine's Evaluator form
        spec = spec["metrics"]
    items = [spec] if isinstance(spec, dict) else spec
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(m, dict) for m in items):
        raise ValueError(
            f"{key}: expected a metric dict (e.g. dict(type='CocoMetric', metric=['bbox'])), a non-empty list of "
            f"them, dict(metrics=[...]) or None (the project's default evaluator), got {spec!r}"
        )
    for m in items:
        if not m.get("type"):
            raise ValueError(f"{key}: every metric needs a 'type' (a registered metric class), got {dict(m)!r}")
    return [_plain(m) for m in items]


def _plain(value: Any) -> Any:
    # mmengine ConfigDict / tuple -> dict / list, so that option values compare with the defaults
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _type_name(metric: dict, scope: str) -> str | None:
    """The metric's class name when it names a class of ``scope`` (``'CocoMetric'``, ``'mmdet.CocoMetric'``)."""
    kind = metric["type"]
    if not isinstance(kind, str):
        return None
    owner, _, name = kind.rpartition(".")
    return name if owner in ("", scope) else None


def ours_options(metric: dict, scope: str, with_masks: bool) -> dict | None:
    """Our evaluator's keyword arguments when it computes exactly what ``metric`` asks for, else None.

    Args:
        metric: one metric config (plain dict).
        scope: ``'mmdet'`` or ``'mmseg'``.
        with_masks: the detector predicts instance masks.
    """
    name = _type_name(metric, scope)
    if name is None or name != OURS_FOR.get(scope):
        return None
    if metric.get("_scope_", scope) != scope:  # mmengine marks dicts inherited from an mm:: base with their scope
        return None
    options = {k: v for k, v in metric.items() if k not in _ANY_VALUE[name] and k != "_scope_"}
    defaults = _DEFAULTS[name]
    if any(k not in defaults or v != defaults[k] for k, v in options.items() if k != "metric"):
        return None
    if name == "IoUMetric":
        return {"ignore_index": metric["ignore_index"]} if "ignore_index" in metric else {}
    asked = metric.get("metric", "bbox")
    asked = [asked] if isinstance(asked, str) else list(asked)
    if not asked or not set(asked) <= {"bbox", "segm"} or len(set(asked)) != len(asked):
        return None
    if "segm" in asked and not with_masks:
        raise ValueError(
            f"{metric!r} asks for 'segm' (mask mAP), but the model predicts no masks; ask for metric=['bbox']"
        )
    return {"with_masks": "segm" in asked}


def _describe(metric: dict, name: str) -> str:
    shown = {k: v for k, v in metric.items() if k not in ("type", "_scope_") and k not in _ANY_VALUE.get(name, ())}
    options = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return f"{metric['type']}({options})"


def choose(spec: Any, key: str, scope: str, *, with_masks: bool = False) -> Choice:
    """Our evaluator or mm's metric classes for the config value ``spec`` of ``key``.

    Args:
        spec: the ``val_evaluator`` / ``test_evaluator`` value (see ``metric_configs``).
        key: ``'val_evaluator'`` or ``'test_evaluator'`` (for messages).
        scope: ``'mmdet'`` or ``'mmseg'``.
        with_masks: the detector predicts instance masks.
    """
    metrics = metric_configs(spec, key)
    if metrics is None:
        return Choice({}, None, f"{key} not set (the project's default)")
    if len(metrics) == 1:
        ours = ours_options(metrics[0], scope, with_masks)
        if ours is not None:
            return Choice(ours, None, _describe(metrics[0], OURS_FOR[scope]))
    return Choice(None, metrics, ", ".join(_describe(m, str(m["type"])) for m in metrics))


def build_evaluators(cfg: Any, scope: str, build_ours: Callable[..., Any], *, with_masks: bool) -> tuple[Any, Any]:
    """The validation and test evaluators of a config, each logged in one line ("evaluation (val_evaluator): ours
    (DetectionEvaluator) for CocoMetric(metric=['bbox', 'segm'])"). One object serves both when the two keys ask
    for the same metrics.

    Args:
        cfg: the mmengine config (``val_evaluator``, ``test_evaluator``).
        scope: ``'mmdet'`` or ``'mmseg'``.
        build_ours: builds our evaluator from ``Choice.ours`` keyword arguments (the task module's
            ``build_evaluator``).
        with_masks: the detector predicts instance masks.
    """
    from .mm_metric import MMEvaluator

    keys = ("val_evaluator", "test_evaluator")
    same = metric_configs(cfg.get(keys[0]), keys[0]) == metric_configs(cfg.get(keys[1]), keys[1])
    built: list[Any] = []
    for key in keys[:1] if same else keys:
        choice = choose(cfg.get(key), key, scope, with_masks=with_masks)
        if choice.ours is not None:
            evaluator = build_ours(**choice.ours)
            line = f"ours ({type(evaluator).__name__}) for {choice.what}"
        else:
            evaluator = MMEvaluator(choice.metrics, scope, key)
            line = f"{scope}'s own {choice.what}, through mmengine's Evaluator"
        rank_zero_info(f"evaluation ({', '.join(keys) if same else key}): {line}")
        built.append(evaluator)
    if same:
        built.append(built[0])
    return built[0], built[1]


# Our evaluators' flat metric names (DetectionEvaluator / SegmentationEvaluator ``compute()``).
_OURS_AP = ("mAP", "mAP_50", "mAP_75", "mAP_s", "mAP_m", "mAP_l")


def produced_names(evaluator: Any, scope: str) -> set[str] | None:
    """The flat metric names ``evaluator.compute()`` returns (``fnmatch`` patterns where they depend on the
    classes), or None where only the computation tells.

    Args:
        evaluator: ours or an ``MMEvaluator``.
        scope: ``'mmdet'`` or ``'mmseg'``.
    """
    from .mm_metric import MMEvaluator, expected_names

    if isinstance(evaluator, MMEvaluator):
        return expected_names(evaluator.configs, scope)
    if scope == "mmseg":
        return {"mIoU", "aAcc", "mAcc"}
    names = {f"bbox_{item}" for item in _OURS_AP}
    if getattr(evaluator, "with_masks", False):  # mask mAP by area range only in per_class
        names |= {f"segm_{item}" for item in _OURS_AP[:3]}
    return names


def check_monitor(cfg: Any, evaluator: Any, scope: str) -> None:
    """Refuse, before training, a ``checkpoint_callback.monitor`` that the validation evaluator does not produce
    (training's own ``train/...`` and ``loss`` values pass).

    Args:
        cfg: the mmengine config.
        evaluator: the validation evaluator.
        scope: ``'mmdet'`` or ``'mmseg'``.
    """
    monitor = (cfg.get("checkpoint_callback") or {}).get("monitor")
    names = produced_names(evaluator, scope)
    if not monitor or names is None or monitor == "loss" or monitor.startswith("train/"):
        return
    if any(fnmatch.fnmatchcase(monitor, name) for name in names):  # mmdet's classwise names are a pattern
        return
    if not names:
        raise ValueError(
            f"checkpoint_callback.monitor={monitor!r}: the validation evaluator ({type(evaluator).__name__}) logs no "
            "metric (format_only=True writes the results only). Set --cfg-options checkpoint_callback.monitor=None "
            "(last.ckpt is still written), or validate without format_only"
        )
    near = sorted(n for n in names if n.rpartition("/")[2] == monitor.rpartition("/")[2]) or sorted(names)
    raise ValueError(
        f"checkpoint_callback.monitor={monitor!r} is not a metric of the validation evaluator "
        f"({type(evaluator).__name__}), which logs {', '.join(sorted(names))}. Monitor one of them, e.g. "
        f"--cfg-options checkpoint_callback.monitor={near[0]} (docs/evaluation.md lists the names)"
    )
