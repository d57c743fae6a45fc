"""Glue that runs mmdet's / mmseg's own analysis scripts (``tools/analysis_tools/`` inside the installed packages)
on our configs and ``tools/test.py --dump`` outputs; ``tools/analyze.py`` is its command line.

The scripts run in the calling process (``runpy``); the configs' ``custom_imports = ['backbones']`` needs the
repository importable, as for every tool. Two scripts need glue:

* mmdet's ``analyze_results.py`` builds an mmengine Runner (for its visualizer), which requires complete val /
  test loops and builds the test evaluator; our configs set ``val_evaluator`` / ``test_evaluator`` to None
  (tasks/evaluation/ evaluates), so it gets a child config naming mmdet's ``CocoMetric`` there
  (``runner_config``), never run.
* mmseg's ``confusion_matrix.py`` counts wrong in mmseg 1.2.2: it subtracts 1 from the ground truth of a
  ``reduce_zero_label`` dataset (ADE20K) that the pipeline's ``LoadAnnotations`` has reduced already, and it
  computes the bin of each pixel (``n * gt + prediction``) in uint8, which wraps around from 16 classes on. It
  also draws 2 inches per class at 300 dpi (150 classes: 90000 x 72000 px, more memory than a machine has).
  ``seg_confusion_matrix`` reads its command line with its own ``parse_args``, counts the matrix with
  tasks/evaluation/segmentation.py's evaluator on the ground truth as the test pipeline loads it (reduced
  once), draws it with its own ``plot_confusion_matrix`` (at most ``plot_classes`` classes:
  ``plotted_classes``) and saves the whole matrix as ``confusion_matrix.npy``.
"""

from __future__ import annotations

import importlib.util
import os
import os.path as osp
import runpy
import sys

import numpy as np
import torch
from PIL import Image

from backbones.checkpoints.atomic import atomic_write, write_text

PLOT_CLASSES = 10  # mmseg's figure is 2 inches per class at 300 dpi: 10 classes are 6000 x 4800 px


def script_path(library: str, name: str) -> str:
    """The path of ``library``'s ``tools/analysis_tools/NAME`` as installed with the package (``.mim``).

    Args:
        library: ``'mmdet'`` or ``'mmseg'``.
        name: the script's file name, e.g. ``'confusion_matrix.py'``.
    """
    spec = importlib.util.find_spec(library)
    path = osp.join(spec.submodule_search_locations[0], ".mim", "tools", "analysis_tools", name)
    if not osp.isfile(path):
        raise FileNotFoundError(f"{path} not found: the installed {library} ships without its tools (reinstall it)")
    return path


def config_scope(config: str) -> str:
    """The config's ``default_scope`` (``'mmdet'`` / ``'mmseg'``); a ``ConfigError`` for a path that is not a
    config file or a config of neither library."""
    from mmengine.config import Config

    from ..config.keys import ConfigError
    from ..config.load import check_config_path

    check_config_path(config)
    scope = Config.fromfile(config).get("default_scope")
    if scope not in ("mmdet", "mmseg"):
        raise ConfigError(f"{config}: default_scope is {scope!r}; the analysis tools are mmdet's or mmseg's")
    return scope


def check_inputs(command: str, args: list[str], scope: str | None) -> None:
    """Raise a ``DumpPathError`` (``ConfigError`` for the config) naming the input and the fix when an input of
    ``tools/analyze.py COMMAND ARGS`` is missing or of the wrong kind, before the library's script reads it.

    Args:
        command: ``'confusion-matrix'``, ``'analyze-results'`` or ``'coco-error-analysis'``.
        args: the script's arguments (positional ones first).
        scope: the config's scope (``config_scope``); None for ``coco-error-analysis``, which takes no config.
    """
    from .dump import DumpPathError, check_dump_path

    if command == "coco-error-analysis":
        if not osp.isfile(args[0]):
            raise DumpPathError(
                f"results file not found: {args[0]!r}; tools/test.py CONFIG CKPT --out-dir DIR writes "
                "DIR/results.bbox.json"
            )
        return
    config, dump = args[0], args[1]
    check_dump_path(dump, scope)  # a .pkl for mmdet, a folder for mmseg
    found = osp.isfile(dump) if scope == "mmdet" else osp.isdir(dump)
    if not found:
        raise DumpPathError(
            f"predictions not found: {dump!r}; write them with tools/test.py {config} CHECKPOINT --dump {dump}"
        )


def run_script(path: str, args: list[str]) -> None:
    """Run the script at ``path`` as ``__main__`` with ``args`` as its command line."""
    saved = sys.argv
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = saved


def seg_confusion_matrix(args: list[str], plot_classes: int = PLOT_CLASSES) -> np.ndarray:
    """mmseg's ``confusion_matrix.py`` on its command line ``args`` (CONFIG PNG_DIR SAVE_DIR [options]), counted
    right (module docstring) and drawn by its own ``plot_confusion_matrix`` with at most ``plot_classes``
    classes. Writes ``SAVE_DIR/confusion_matrix.png`` and the whole matrix (ground truth in rows, predictions in
    columns, the dataset's class order) as ``SAVE_DIR/confusion_matrix.npy``, and returns that matrix.

    Args:
        args: the script's arguments.
        plot_classes: the most classes drawn (``plotted_classes``).
    """
    path = script_path("mmseg", "confusion_matrix.py")
    script = runpy.run_path(path)  # its functions, without running its main
    saved = sys.argv
    sys.argv = [path, *args]
    try:
        opts = script["parse_args"]()  # the script's own command line
    finally:
        sys.argv = saved
    from mmengine.config import Config
    from mmengine.structures import PixelData
    from mmseg.registry import DATASETS

    from .dump import DumpPathError
    from .segmentation import SegmentationEvaluator

    cfg = Config.fromfile(opts.config)
    if opts.cfg_options is not None:
        cfg.merge_from_dict(opts.cfg_options)
    dataset = DATASETS.build(cfg.test_dataloader.dataset)
    classes = list(dataset.metainfo["classes"])
    counter = SegmentationEvaluator(len(classes), ignore_index=dataset.ignore_index)
    for i in range(len(dataset)):
        sample = dataset[i]["data_samples"]  # the ground truth as the test pipeline loads it (reduced once)
        png = osp.join(opts.prediction_path, osp.splitext(osp.basename(sample.img_path))[0] + ".png")
        if not osp.isfile(png):
            raise DumpPathError(
                f"{png}: no prediction for test image {sample.img_path}; dump the test set of this config "
                "with tools/test.py --dump"
            )
        sample.pred_sem_seg = PixelData(data=torch.from_numpy(np.array(Image.open(png), dtype=np.int64))[None])
        counter.update([sample])
    matrix = counter.confmat.numpy().astype(np.float64)
    atomic_write(osp.join(opts.save_dir, "confusion_matrix.npy"), lambda f: np.save(f, matrix))
    small, labels = plotted_classes(matrix, classes, plot_classes)
    # a class that is predicted but absent from the ground truth has an empty row: the script's normalisation
    # divides it by 0 and draws its NaNs as -1, which is the intended picture
    with np.errstate(invalid="ignore"):
        script["plot_confusion_matrix"](
            small, labels, save_dir=opts.save_dir, show=opts.show, title=opts.title, color_theme=opts.color_theme
        )
    return matrix


def plotted_classes(matrix: np.ndarray, classes: list[str], limit: int) -> tuple[np.ndarray, list[str]]:
    """The rows and columns of the classes that occur (in the ground truth or the predictions), at most ``limit``
    of them, those with the most ground-truth pixels; the others summed into a last ``other`` row and column.

    Args:
        matrix: the confusion matrix, ground truth in rows, predictions in columns, in ``classes`` order.
        classes: the class names.
        limit: the most classes drawn (mmseg draws 2 inches per class at 300 dpi).
    """
    gt = matrix.sum(axis=1)
    occurring = [c for c in np.argsort(-gt, kind="stable") if gt[c] + matrix[:, c].sum() > 0]
    keep = sorted(occurring[:limit])
    rest = [c for c in range(len(classes)) if c not in keep]
    if not rest:
        return matrix, classes
    groups = [[c] for c in keep] + [rest]  # the kept classes, then 'other'
    small = np.array([[matrix[np.ix_(rows, cols)].sum() for cols in groups] for rows in groups])
    return small, [classes[c] for c in keep] + ["other"]


def runner_config(config: str, out_dir: str) -> str:
    """``config``, or a child config of it in ``out_dir`` that names mmdet's ``CocoMetric`` as ``val_evaluator`` /
    ``test_evaluator`` where it has none (for ``analyze_results.py``'s Runner: module docstring).

    Args:
        config: the config file.
        out_dir: where the child config is written.
    """
    from mmengine.config import Config

    cfg = Config.fromfile(config)
    missing = [f"{split}_evaluator" for split in ("val", "test") if cfg.get(f"{split}_evaluator") is None]
    if not missing:
        return config
    path = osp.join(out_dir, f"analyze_{osp.basename(config)}")
    lines = [f"_base_ = [{osp.abspath(config)!r}]"] + [
        f"{key} = dict(type='CocoMetric', _delete_=True)" for key in missing
    ]
    os.makedirs(out_dir, exist_ok=True)
    write_text(path, "\n".join(lines) + "\n")
    return path
