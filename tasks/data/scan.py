"""Every sample of a config's datasets read once, before a run: all problems in one report (``tools/check_data.py``,
``tools/train.py --check-data``).

The samples are those of the config's own dataset classes (built as training builds them, tasks/data/checks.py's
``build_dataset``): their image and label-map paths, the annotation file's image sizes, mmseg's label mapping. The
files are checked in worker processes (tasks/data/file_checks.py: decoded, not only their headers read), with a
progress bar. A COCO-format annotation file's annotations are checked as mmdet reads them, where mmdet drops the
bad ones silently: boxes outside their image (by more than one pixel) or of zero size, polygons of fewer than three
points, categories that are not among the file's ``categories``, and config classes none of which the file names.
A split that cannot be built at all (a missing path, no samples) is one problem of its own. A split with the same
dataset as an earlier one (``test_dataloader = val_dataloader``) is read once.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from typing import Any

from ..config.scopes import register_scope
from .checks import DataError, DataPathError, build_dataset, check_dataset_paths
from .file_checks import FileTask, check_files

SPLITS = ("train", "val", "test")
_BOX_SLACK = 1.0  # pixels a box may pass the image's border by (COCO's float rounding)


def _problem(split: str, file: str, what: str, fix: str) -> dict:
    return {"split": split, "file": file, "problem": what, "fix": fix}


def coco_problems(coco, ann_file: str, classes, split: str) -> list[dict]:
    """The annotation problems of a COCO file (mmdet's ``COCO`` index ``coco``) that mmdet would drop silently."""
    out = []
    for ann in coco.anns.values():
        img = coco.imgs.get(ann.get("image_id"), {})
        where = f"annotation id {ann.get('id')} (image {img.get('file_name', ann.get('image_id'))})"

        def add(what: str, fix: str) -> None:
            out.append(_problem(split, ann_file, f"{where}: {what}", fix))  # noqa: B023 - called at once

        if ann.get("category_id") not in coco.cats:
            add(f"category_id {ann.get('category_id')} is not in the file's categories", "fix the id or add it")
        x, y, w, h = (list(ann.get("bbox") or []) + [0, 0, 0, 0])[:4]
        if w <= 0 or h <= 0:
            add(f"the box {ann.get('bbox')} has zero size", "remove the annotation or fix its bbox")
        elif "width" in img and (
            x < -_BOX_SLACK
            or y < -_BOX_SLACK
            or x + w > img["width"] + _BOX_SLACK
            or y + h > img["height"] + _BOX_SLACK
        ):
            add(
                f"the box {ann.get('bbox')} (x, y, w, h) leaves its {img['width']}x{img['height']} image",
                "clip the box to the image or fix the image's width / height",
            )
        polygons = ann.get("segmentation")
        if isinstance(polygons, list):  # polygons; a dict is RLE
            for poly in polygons:
                if len(poly) < 6 or len(poly) % 2:
                    add(
                        f"a polygon has {len(poly)} coordinates, fewer than three points",
                        "remove the polygon or the annotation",
                    )
    names = [cat.get("name") for cat in coco.cats.values()]
    if classes and not any(c in names for c in classes):
        out.append(
            _problem(
                split,
                ann_file,
                f"none of the config's classes {tuple(classes)} is a category name of the file ({names})",
                "set metainfo.classes to the file's category names",
            )
        )
    return out


def _tasks(dataset) -> list[FileTask]:
    """One ``FileTask`` per distinct sample of ``dataset`` (an mm dataset, wrappers included) whose files are local
    (a ``backend_args`` store's ``s3://...`` paths are read by its backend, not here)."""
    while not hasattr(dataset, "get_data_info") and hasattr(dataset, "dataset"):  # e.g. MultiImageMixDataset
        dataset = dataset.dataset
    classes = (getattr(dataset, "metainfo", None) or {}).get("classes")
    seg_classes = len(classes) if classes is not None and hasattr(dataset, "ignore_index") else None
    tasks = {}
    for i in range(len(dataset)):
        info = dataset.get_data_info(i)
        size = (info["width"], info["height"]) if "width" in info and "height" in info else None
        task = FileTask(
            img=info["img_path"],
            seg=info.get("seg_map_path") if seg_classes is not None else None,
            size=size,
            num_classes=seg_classes,
            ignore_index=getattr(dataset, "ignore_index", 255),
            reduce_zero_label=bool(info.get("reduce_zero_label")),
            label_map=info.get("label_map"),
        )
        if "://" not in task.img + str(task.seg):
            tasks.setdefault((task.img, task.seg), task)
    return list(tasks.values())


def build_split(cfg, scope: str, split: str) -> tuple[Any, list[dict]]:
    """The split's built dataset (None when it cannot be built) and the problems found while building it."""
    section = f"{split}_dataloader"
    ds_cfg = cfg[section]["dataset"]
    sections = tuple(f"{s}_dataloader" for s in SPLITS if cfg.get(f"{s}_dataloader") is not None)
    problems: list[dict] = []

    def check_coco(coco, dataset):  # instead of build_dataset's check, which stops at the first problem
        problems.extend(coco_problems(coco, dataset.ann_file, dataset.metainfo.get("classes"), split))

    try:
        check_dataset_paths(ds_cfg, section)
        register_scope(scope)
        return build_dataset(ds_cfg, section, sections, check_coco=check_coco), problems
    except (DataPathError, DataError) as e:
        return None, [*problems, _problem(split, ds_cfg.get("ann_file") or ds_cfg.get("data_root") or "", str(e), "")]


def scan(cfg, scope: str, splits=SPLITS, workers: int = 2, progress: bool = True) -> dict:
    """Read every sample of the config's ``splits`` once; the report (JSON-able) lists every problem.

    Args:
        cfg: the loaded config (its ``*_dataloader`` sections).
        scope: ``'mmdet'`` or ``'mmseg'``.
        splits: the splits to read (those the config has).
        workers: processes that check the files (1: in this process).
        progress: show a progress bar (on stderr) per split.

    Returns ``{'splits': {split: {'samples', 'files'}}, 'problems': [{'split', 'file', 'problem', 'fix'}],
    'seconds', 'images_per_second'}``.
    """
    from tqdm import tqdm

    start, report, seen = time.perf_counter(), {"splits": {}, "problems": []}, {}
    for split in splits:
        section = cfg.get(f"{split}_dataloader")
        if section is None:
            continue
        key = repr(section["dataset"])
        if key in seen:
            report["splits"][split] = {"same dataset as": seen[key]}
            continue
        seen[key] = split
        dataset, problems = build_split(cfg, scope, split)
        report["problems"] += problems
        tasks = _tasks(dataset) if dataset is not None else []
        report["splits"][split] = {"samples": len(dataset) if dataset is not None else 0, "files": len(tasks)}
        bar = tqdm(total=len(tasks), desc=f"check_data {split}", unit="img", disable=not progress or not tasks)
        with multiprocessing.Pool(workers, initializer=_default_sigterm) if workers > 1 else _Serial() as pool:
            for found in pool.imap_unordered(check_files, tasks, chunksize=8):
                report["problems"] += [_problem(split, f, what, fix) for f, what, fix in found]
                bar.update()
            pool.close()  # the workers end on their own; leaving the block would kill them (terminate)
            pool.join()
        bar.close()
    report["seconds"] = round(time.perf_counter() - start, 2)
    files = sum(s.get("files", 0) for s in report["splits"].values())
    report["images_per_second"] = round(files / max(report["seconds"], 1e-9), 1)
    return report


def _default_sigterm() -> None:
    """In each pool worker: SIGTERM ends the process again. A forked worker inherits its parent's Python handlers,
    and a handler that only sets a flag (a training process's preemption handler, Lightning's) keeps a worker that
    waits for its next task alive through ``Pool.terminate``, which then waits for it forever."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Serial:
    """``multiprocessing.Pool``'s ``imap_unordered`` in this process (``workers=1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    @staticmethod
    def imap_unordered(fn, items, chunksize=1):
        return map(fn, items)

    def close(self) -> None:
        pass

    def join(self) -> None:
        pass


def summary(report: dict, limit: int = 50) -> list[str]:
    """The report in lines for the console: one per problem (the first ``limit``), then the totals."""
    problems = report["problems"]
    lines = [f"{p['split']}: {p['file']}: {p['problem']}" + (f" ({p['fix']})" if p["fix"] else "") for p in problems]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    files = sum(s.get("files", 0) for s in report["splits"].values())
    lines.append(
        f"{files} samples' files read in {report['seconds']} s ({report['images_per_second']} images/s): "
        + (f"{len(problems)} problem(s)" if problems else "no problem found")
    )
    return lines


def check_before_training(cfg, scope: str, report_path: str, workers: int = 2) -> None:
    """``tools/train.py --check-data``: ``scan`` every split; with a problem, the report goes to ``report_path``
    (JSON) and a ``DataError`` names the first problems and the file."""
    from backbones.checkpoints.atomic import write_json

    report = scan(cfg, scope, workers=workers)
    logging.getLogger("lightning.pytorch").info("--check-data: %s", summary(report)[-1])
    if report["problems"]:
        write_json(report_path, report)
        lines = summary(report, limit=5)
        raise DataError(
            f"--check-data found {len(report['problems'])} problem(s) in the data; the first: "
            + "; ".join(lines[:-1])
            + f". All of them: {report_path}. Fix them, or train with data_errors='skip' (without --check-data), "
            "which leaves out the samples that fail to load"
        )
