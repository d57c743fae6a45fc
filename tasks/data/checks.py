"""Checks of the data a config names, apart from the data module that loads it.

Bad data fails with the file named: a ``data_root`` / ``ann_file`` / ``data_prefix`` that does not exist
(``check_dataset_paths``, before anything is built), a missing or unreadable image, a truncated JPEG (no
end-of-image marker), a segmentation map with labels >= num_classes other than the ignore index (an error, not
a silent remap: such pixels would corrupt the loss and mIoU), a segmentation map of another size than its
image (``CheckedDataset``); a split without samples (``build_dataset``). A COCO annotation file is
checked while mmdet reads it (``build_dataset`` / ``check_coco_file``): annotations whose ``category_id`` is not
in the file's ``categories``, and config ``metainfo.classes`` none of which is a category name of the file, are
errors (mmdet would drop those objects silently). Grayscale, RGBA and 16-bit images are read as 8-bit 3-channel
BGR by mmcv's ``LoadImageFromFile`` (``color_type='color'``). Training images without objects are dropped by
mmdet's ``filter_cfg=dict(filter_empty_gt=True)`` (the mmdet base configs' default); ``build_dataset`` logs how
many.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import os.path as osp

from torch.utils.data import Dataset

from backbones.errors import UserError

log = logging.getLogger(__name__)


def _data_paths(ds_cfg: dict):
    """Yield (description, path) for what must exist before ``ds_cfg`` can be built."""
    if "datasets" in ds_cfg:  # ConcatDataset
        for sub in ds_cfg["datasets"]:
            yield from _data_paths(sub)
        return
    if "dataset" in ds_cfg:  # RepeatDataset, ClassBalancedDataset, MultiImageMixDataset
        yield from _data_paths(ds_cfg["dataset"])
        return
    root = ds_cfg.get("data_root") or ""
    if root:
        yield "data_root", root
    if ds_cfg.get("ann_file"):
        yield "ann_file", osp.join(root, ds_cfg["ann_file"])
    for key, prefix in (ds_cfg.get("data_prefix") or {}).items():
        if prefix:
            yield f"data_prefix.{key}", osp.join(root, prefix)


class DataPathError(UserError, FileNotFoundError):
    """A dataset path of the config that does not exist; the message names the key, the path and the fix."""


def check_dataset_paths(ds_cfg: dict, section: str) -> None:
    """Raise ``DataPathError`` (a ``FileNotFoundError``) naming the config key, the path and the fix for a
    ``data_root``, ``ann_file`` or ``data_prefix`` of ``ds_cfg`` (wrappers included) that does not exist."""
    for what, path in _data_paths(ds_cfg):
        if "://" not in path and not osp.exists(path):
            raise DataPathError(
                f"{section}.dataset.{what} '{path}' does not exist. For the demo data run "
                f"`python tools/make_tiny_data.py --out data`; for your own copy pass "
                f"`--cfg-options {section}.dataset.data_root=DIR` (and the other *_dataloader sections)."
            )


class DataError(UserError, RuntimeError):
    """A sample that cannot be used; the message names the file."""

    def __init__(self, message: str = "") -> None:
        # torch re-raises a loader worker's exception as type(e)("Caught ... Original Traceback ...: <message>"): the
        # user reads the message, not a traceback of the worker
        worker, _, original = message.partition(f"\n{__name__}.DataError: ")
        super().__init__(original.strip() if worker.startswith("Caught DataError") and original else message)


def _jpeg_truncated(path: str) -> bool:
    """No JPEG end-of-image marker (FFD9) in the last KiB: cut off, e.g. by an interrupted copy. OpenCV
    decodes such files without an error, filling the missing rows with grey."""
    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":  # not a JPEG stream (e.g. a PNG named .jpg): mmcv decodes by content
            return False
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 1024))
        return b"\xff\xd9" not in f.read()


class CheckedDataset(Dataset):
    """Wraps an mm dataset: a sample that cannot be used raises a ``DataError`` naming its file."""

    def __init__(self, dataset, split: str):
        self.dataset, self.split = dataset, split
        classes = (getattr(dataset, "metainfo", None) or {}).get("classes")
        self.num_classes = len(classes) if classes is not None and hasattr(dataset, "ignore_index") else None
        self.ignore_index = getattr(dataset, "ignore_index", 255)

    def __len__(self):
        return len(self.dataset)

    def files(self, idx: int) -> list[str]:
        """The file names of sample ``idx`` (image, label map), where the dataset names them."""
        try:
            info = self.dataset.get_data_info(idx)
        except Exception:  # noqa: BLE001 - wrappers without get_data_info: no file names to check
            return []
        return [info[k] for k in ("img_path", "seg_map_path") if isinstance(info.get(k), str)]

    def __getitem__(self, idx: int):
        files = self.files(idx)
        for path in files:
            if "://" in path:
                continue
            if not osp.isfile(path):
                raise DataError(f"{self.split} sample {idx}: file {path} does not exist")
            if path.lower().endswith((".jpg", ".jpeg")) and _jpeg_truncated(path):
                raise DataError(
                    f"{self.split} sample {idx}: {path} is a truncated JPEG (no end-of-image "
                    "marker); re-copy or remove it"
                )
        try:
            data = self.dataset[idx]
        except DataError:
            raise
        except Exception as e:
            raise DataError(
                f"{self.split} sample {idx} ({', '.join(files) or 'no file name'}) could not be "
                f"loaded: {type(e).__name__}: {e}"
            ) from e
        if self.num_classes is not None:
            self._check_map_size(files)
            self._check_labels(data, files)
        return data

    def _check_map_size(self, files: list[str]) -> None:
        # A map of another size than its image is not caught by mmseg: training rescales and crops both (pixels
        # labelled with another place's class), and validation fails after the training, deep in the metric.
        if len(files) != 2 or any("://" in f for f in files):
            return
        from PIL import Image  # reads the header only

        with Image.open(files[0]) as img, Image.open(files[1]) as seg:
            if img.size != seg.size:
                raise DataError(
                    f"{self.split}: segmentation map {files[1]} is {seg.size[0]}x{seg.size[1]} px, its image "
                    f"{files[0]} {img.size[0]}x{img.size[1]}: a map must label every pixel of its image at the "
                    "same size; fix or remove the pair"
                )

    def _check_labels(self, data: dict, files: list[str]) -> None:
        sample = data.get("data_samples")
        seg = getattr(getattr(sample, "gt_sem_seg", None), "data", None)
        if seg is None:
            return
        bad = (seg >= self.num_classes) & (seg != self.ignore_index)
        if bad.any():
            values = sorted({int(v) for v in seg[bad].unique()[:10]})
            raise DataError(
                f"{self.split}: segmentation map {files[-1] if files else '?'} has labels {values} "
                f"(after reduce_zero_label / label_map) outside 0..{self.num_classes - 1} and not the "
                f"ignore index {self.ignore_index}: fix the map or the dataset classes"
            )


def _file_categories(coco) -> str:
    return ", ".join(f"{cat['id']} {cat.get('name')!r}" for cat in coco.cats.values()) or "none"


def check_coco_file(coco, dataset, section: str, sections: tuple[str, ...]) -> None:
    """Checks of a COCO annotation file, on the ``COCO`` index that mmdet's ``CocoDataset`` reads it into.

    mmdet matches ``metainfo.classes`` to the file's category names and silently drops every annotation of
    another category: with none of the names matching, every image is dropped and mmengine fails later with
    "need at least one array to concatenate". It also drops annotations whose ``category_id`` is not among the
    file's ``categories`` (a wrong id mapping would lose objects unnoticed). Both are refused here, naming
    the file and the fix; classes of the config that the file lacks are logged.

    Args:
        coco: mmdet's ``COCO`` api object of the file (categories in ``cats``, annotations in ``anns``).
        dataset: the ``CocoDataset`` being loaded (``ann_file``, ``metainfo``).
        section: the dataloader section of the dataset, e.g. ``'train_dataloader'``.
        sections: every dataloader section of the config (each needs the same classes override).
    """
    ann_file = dataset.ann_file
    unknown = set(coco.cat_img_map) - set(coco.cats)  # the index lists every category id annotations use
    if unknown:
        ann_ids: dict = {cid: [] for cid in unknown}
        for ann in coco.anns.values():
            if ann.get("category_id") in unknown:
                ann_ids[ann["category_id"]].append(ann.get("id"))
        desc = ", ".join(
            f"{cid} (annotation ids {ids[:5]}{'...' if len(ids) > 5 else ''})"
            for cid, ids in sorted(ann_ids.items(), key=str)
        )
        raise DataError(
            f"{section}: {ann_file} has annotations with category_id not listed in its 'categories' "
            f"{sorted(coco.cats)}: {desc}"
        )
    classes = tuple(dataset.metainfo.get("classes") or ())
    names = [cat.get("name") for cat in coco.cats.values()]
    missing = [c for c in classes if c not in names]
    if len(missing) == len(classes):
        listed = repr(tuple(names))
        value = listed if len(listed) <= 200 else "NAMES"
        override = " ".join(f'"{s}.dataset.metainfo.classes={value}"' for s in sections)
        spaces = any(" " in str(n) for n in names)
        raise DataError(
            f"{section}: none of the config's classes {classes} is a category name of {ann_file}, whose "
            f"categories (id name) are: {_file_categories(coco)}. mmdet keeps only the annotations of the classes "
            f"named in metainfo.classes, so every image would be dropped. Set the classes to the names to train "
            f"and evaluate on in every dataloader section (and the model heads' num_classes to their number): "
            f"--cfg-options {override}"
            + ("" if value == listed else f" with NAMES = {listed}")
            + (
                ". mmengine's --cfg-options removes the spaces inside values: for names with spaces, put this in "
                f"a config that inherits yours instead: metainfo = dict(classes={value}), and "
                + ", ".join(f"{s} = dict(dataset=dict(metainfo=metainfo))" for s in sections)
                if spaces
                else ""
            )
        )
    if missing:
        log.warning(
            "%s: classes %s of the config are not category names of %s (its categories: %s); they have no annotations",
            section,
            missing,
            ann_file,
            _file_categories(coco),
        )


def build_dataset(ds_cfg: dict, section: str, sections: tuple[str, ...], check_coco=None):
    """``DATASETS.build(ds_cfg)``; a dataset without samples (none found, or all dropped by ``filter_cfg``) is a
    ``DataError`` naming the section and its paths; a COCO-format dataset is checked with ``check_coco_file`` on
    the index mmdet builds while it loads the file (one parse of the JSON), and the images ``filter_cfg`` dropped
    are logged. ``check_coco(coco, dataset)``: called on that index instead of ``check_coco_file`` (the data scan,
    tasks/data/scan.py, collects every problem rather than stopping at the first)."""
    from mmengine.dataset import BaseDataset
    from mmengine.registry import DATASETS  # the default scope routes to mmdet/mmseg's registry

    with DATASETS.switch_scope_and_registry(None) as registry:
        cls = registry.get(ds_cfg["type"]) if isinstance(ds_cfg.get("type"), str) else ds_cfg.get("type")
    if ds_cfg.get("lazy_init") or not (isinstance(cls, type) and issubclass(cls, BaseDataset)):
        return DATASETS.build(ds_cfg)
    dataset = DATASETS.build({**ds_cfg, "lazy_init": True})
    filter_data = dataset.filter_data

    def filter_and_check():  # full_init's step between reading the samples and storing them
        read_samples = len(dataset.data_list)
        kept = filter_data()
        if not kept:  # mmengine would fail next with "need at least one array to concatenate"
            where = ", ".join(f"{what} '{path}'" for what, path in _data_paths(ds_cfg)) or "its config"
            dropped = f" ({read_samples} read, all dropped by filter_cfg={ds_cfg.get('filter_cfg')})"
            raise DataError(
                f"{section}: the dataset has no samples{dropped if read_samples else ''}: {where}. Put the images "
                f"(and their annotations) there, or point --cfg-options {section}.dataset.data_root=DIR at a "
                "dataset that has them"
            )
        return kept

    dataset.filter_data = filter_and_check  # an instance attribute over the class's, removed again below
    if not hasattr(cls, "COCOAPI"):
        try:
            dataset.full_init()
        finally:
            del dataset.filter_data
        return dataset
    read, n_images = dataset.COCOAPI, []

    def read_and_check(path):  # mmdet's load_data_list reads the file with ``self.COCOAPI(path)``
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints four progress lines per file
            coco = read(path)
        if check_coco is None:
            check_coco_file(coco, dataset, section, sections)
        else:
            check_coco(coco, dataset)
        n_images.append(len(coco.imgs))
        return coco

    dataset.COCOAPI = read_and_check  # an instance attribute over the class's, removed again below
    try:
        dataset.full_init()
    finally:
        del dataset.COCOAPI, dataset.filter_data
    if n_images and not dataset.test_mode and len(dataset) < n_images[0]:
        log.warning(
            "%s: %d of %d images of %s skipped by filter_cfg=%s (no objects of the dataset classes, "
            "or smaller than min_size)",
            section,
            n_images[0] - len(dataset),
            n_images[0],
            dataset.ann_file,
            dict(dataset.filter_cfg or {}),
        )
    return dataset
