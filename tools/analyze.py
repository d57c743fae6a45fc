#!/usr/bin/env python
"""Run mmdet's / mmseg's own analysis scripts (shipped in the installed packages) on our configs and dumps.

    python tools/analyze.py confusion-matrix CONFIG DUMP OUT_DIR [--plot-classes N] [SCRIPT OPTIONS]
    python tools/analyze.py analyze-results CONFIG DUMP SHOW_DIR [--topk N] [--cfg-options ...]
    python tools/analyze.py coco-error-analysis RESULTS.bbox.json OUT_DIR --ann ANN_FILE [--types bbox segm]

DUMP comes from ``tools/test.py --dump``, RESULTS.bbox.json from ``tools/test.py --out-dir`` (or
``--format-only``). Every option after the positional arguments goes to the script unchanged (``--cfg-options``
included).

* ``confusion-matrix``: mmdet's ``confusion_matrix.py`` (CONFIG's scope mmdet: DUMP a ``.pkl``) or mmseg's
  (scope mmseg: DUMP a folder of label PNGs); writes ``OUT_DIR/confusion_matrix.png``. mmseg: also the whole
  matrix as ``OUT_DIR/confusion_matrix.npy``; ``--plot-classes N`` (default 10) draws the N occurring classes
  with the most ground-truth pixels and one ``other`` row and column.
* ``analyze-results``: mmdet's ``analyze_results.py``: the ``--topk`` best and worst images by box mAP, drawn
  with their ground truth and predictions in ``SHOW_DIR/good/`` and ``SHOW_DIR/bad/``.
* ``coco-error-analysis``: mmdet's ``coco_error_analysis.py``: precision-recall curves with the COCO error
  breakdown (localisation, similar / other classes, background, missed) per class in ``OUT_DIR/bbox/``.

The glue (tasks/evaluation/analysis.py): mmseg's ground truth reduced once for ``reduce_zero_label`` datasets, a
picture that fits in memory for 150 classes, the evaluators analyze_results.py's Runner requires.
"""

from __future__ import annotations

import argparse

from tasks.evaluation.analysis import (
    PLOT_CLASSES,
    check_inputs,
    config_scope,
    run_script,
    runner_config,
    script_path,
    seg_confusion_matrix,
)
from tasks.runtime.cli import command_line

SCRIPTS = {  # command -> (library, script); confusion-matrix: the config's library
    "confusion-matrix": (None, "confusion_matrix.py"),
    "analyze-results": ("mmdet", "analyze_results.py"),
    "coco-error-analysis": ("mmdet", "coco_error_analysis.py"),
}
USAGE = {
    "confusion-matrix": "CONFIG DUMP OUT_DIR",
    "analyze-results": "CONFIG DUMP SHOW_DIR",
    "coco-error-analysis": "RESULTS.bbox.json OUT_DIR",
}


@command_line
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(SCRIPTS), help="which analysis script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    ns = parser.parse_args(argv)
    args = list(ns.args)
    needed = len(USAGE[ns.command].split())
    if len(args) < needed or any(a.startswith("-") for a in args[:needed]):
        parser.error(f"{ns.command}: give {USAGE[ns.command]} first (then the script's options)")
    library, script = SCRIPTS[ns.command]
    scope = None if ns.command == "coco-error-analysis" else config_scope(args[0])
    check_inputs(ns.command, args, scope)
    if ns.command == "confusion-matrix":
        library = scope
        if library == "mmseg":
            ours = argparse.ArgumentParser(prog=f"{ns.command} (mmseg)", add_help=False)
            ours.add_argument("--plot-classes", type=int, default=PLOT_CLASSES)
            extra, args = ours.parse_known_args(args)
            seg_confusion_matrix(args, extra.plot_classes)
            return
    if ns.command == "analyze-results":
        args[0] = runner_config(args[0], args[2])
    run_script(script_path(library, script), args)


if __name__ == "__main__":
    main()
