"""Predictions on your own images (``tools/infer.py``): mmdet's ``DetInferencer`` / mmseg's ``MMSegInferencer``
(their test pipeline, batching, forward, drawing and result dicts) fed with our weights.

The weights (``CKPT``) may be:

* a Lightning checkpoint of ``tools/train.py`` or an mm-format model (``tools/export_model.py``, mm's own
  releases): read by ``tasks.deploy.checkpoints.read_training_checkpoint``, checked against the config's model
  (same keys, same shapes) before they are loaded;
* a backbone export (``tools/export_backbone.py``; ``.pth``, ``.safetensors`` or the official layout): loaded into
  the config's backbone by ``backbones.load_pretrained`` (family and arch checked). The neck and heads are not in
  such a file: they keep the config's initialisation, and a warning says so.

Outputs, in ``DetInferencer``'s layout, one of each per image, written atomically: ``vis/<image file name>``, the
image with the predictions drawn by the library's visualizer, and ``preds/<image stem>.json``, the inferencer's
result dict: mmdet ``{'labels', 'scores', 'bboxes', 'masks'}`` (``DetInferencer.pred2dict``: boxes x1, y1, x2, y2
in input pixels, masks as COCO RLE), mmseg ``{'sem_seg': H x W class indices}`` (``MMSegInferencer.postprocess``),
which also writes the class-index map as ``preds/<image stem>.png``, mmseg's prediction file.
"""

from __future__ import annotations

import io
import json
import os
import os.path as osp
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from functools import partial

import torch
from mmengine.dataset import pseudo_collate
from PIL import Image

from backbones import load_pretrained
from backbones.checkpoints.atomic import atomic_write, check_writable
from backbones.checkpoints.weights import check_checkpoint_path, load_state_dict_checked
from backbones.errors import CheckpointError

from ..config.load import check_config_path, load_config
from ..config.scopes import register_scope
from ..data.module import without_annotation_loading
from ..figures.predictions import drawable_detections, drawable_segmentation
from .checkpoints import read_training_checkpoint
from .export import check_against_model, dataset_meta
from .images import InputError, find_images


# --- weights ---------------------------------------------------------------------------------------------
def load_weights(model: torch.nn.Module, checkpoint: str, config_path: str) -> str:
    """Load ``checkpoint`` (a file or an http(s) URL) into the mm ``model`` built from the config; returns what it
    was (``'lightning'``, ``'mm'`` or ``'backbone'``). A file that does not fit the config raises
    ``CheckpointError``."""
    # a missing file, a failed download: said once, before trying what the file holds; a URL becomes its cached file
    checkpoint = check_checkpoint_path(checkpoint)
    try:
        ckpt = read_training_checkpoint(checkpoint)
    except CheckpointError as not_a_model:
        backbone = getattr(model, "backbone", None)
        if getattr(backbone, "family", None) is None:
            raise
        try:
            backbone.init_cfg = None  # the other modules' own initialisation; the backbone's weights come next
            model.init_weights()
            load_pretrained(backbone, checkpoint)
        except CheckpointError as not_a_backbone:
            raise CheckpointError(
                f"{checkpoint!r} is neither a model checkpoint ({not_a_model}) nor a backbone export for this "
                f"config ({not_a_backbone})"
            ) from not_a_backbone
        warnings.warn(
            f"{checkpoint!r} is a backbone export: only model.backbone is loaded; the neck and heads keep the "
            f"initialisation of {config_path} (random unless its init_cfg loads them). Use a Lightning "
            "checkpoint or tools/export_model.py's file for trained predictions.",
            stacklevel=2,
        )
        return "backbone"
    fix = f"Pass the config the model was trained with instead of {config_path}."
    check_against_model(ckpt.state_dict, model, repr(checkpoint), fix=fix)  # names the backbone's family and arch
    load_state_dict_checked(model, ckpt.state_dict, repr(checkpoint), strict=True)
    return ckpt.kind


def build_inferencer(config: str, checkpoint: str, device: str | None = None, cfg_options: dict | None = None):
    """mmdet's ``DetInferencer`` or mmseg's ``MMSegInferencer`` (by the config's ``default_scope``) with the model
    of ``config`` and the weights of ``checkpoint``.

    Args:
        config: the mmengine config file (the one the model was trained with).
        checkpoint: a Lightning checkpoint, an mm-format model or a backbone export (see the module docstring).
        device: ``'cpu'``, ``'cuda'``, ``'cuda:1'``...; None: a GPU when there is one.
        cfg_options: ``--cfg-options`` overrides of the config.
    """
    cfg = load_config(config, cfg_options, training=False)
    register_scope(cfg.default_scope)
    # The inferencer reads these from the config it is given: no ground truth for the user's images (mmseg's
    # inferencer drops LoadAnnotations too, mmdet's does not), and no storage backends (the overlays are files
    # written through out_file; the configs' LocalVisBackend has no save_dir here, and the library would warn).
    cfg.test_dataloader.dataset.pipeline = without_annotation_loading(cfg.test_dataloader.dataset.pipeline)
    cfg.visualizer.vis_backends = None
    if cfg.default_scope == "mmdet":
        from mmdet.apis import DetInferencer as Base
    else:
        from mmseg.apis import MMSegInferencer as Base

    class Inferencer(Base):
        # A private method of mmengine's BaseInferencer (its _init_model calls it with the checkpoint it read
        # through mmengine's own loader): the only place to put our weights in before the model goes to the device
        # and the visualizer takes its dataset_meta. The public route (weights=PATH) would skip our checks (keys and
        # shapes against the config, backbone exports, URLs with hashes). tests/test_infer.py checks the signature
        # and the call, so a change in mm fails there.
        def _init_collate(self, cfg):
            # mmengine looks the test loader's collate_fn up in the scope's 'function' registry, which mmdet and
            # mmseg do not have: a WARNING at every start. The batches are pseudo_collate's, as tools/test.py's
            # (MMDataModule) and mmengine's default.
            return pseudo_collate

        def _load_weights_to_model(self, model, _checkpoint, cfg) -> None:
            self.weights_kind = load_weights(model, checkpoint, config)  # checked against the model, strict
            # The library's own loading of an mm checkpoint then sets the class names and palette (as
            # tools/export_model.py records them) and its palette rules; the tensors are the ones just loaded.
            meta = {"dataset_meta": dataset_meta(cfg)}
            super()._load_weights_to_model(model, {"state_dict": model.state_dict(), "meta": meta}, cfg)

    return Inferencer(model=cfg, weights=None, device=device)


# --- running ---------------------------------------------------------------------------------------------
def _write_png(path: str, label_map) -> None:
    png = io.BytesIO()
    Image.fromarray(label_map.astype("uint8")).save(png, format="PNG")  # as MMSegInferencer writes its pred files
    atomic_write(path, lambda f: f.write(png.getvalue()))


def _write_json(path: str, obj: dict) -> None:
    text = json.dumps(obj)  # as mmengine.dump writes the inferencer's own files
    atomic_write(path, lambda f: f.write(text.encode()))


def _forward_by_size(inferencer, batch: dict) -> list:
    """mmseg's data preprocessor batches only images of one size at test time (it pads only when training): run
    each size of the batch apart, and give the predictions back in the batch's order."""
    by_size: dict[tuple, list[int]] = {}
    for i, image in enumerate(batch["inputs"]):
        by_size.setdefault(tuple(image.shape), []).append(i)
    preds = [None] * len(batch["inputs"])
    for indices in by_size.values():
        part = {key: [batch[key][i] for i in indices] for key in ("inputs", "data_samples")}
        for i, pred in zip(indices, inferencer.forward(part)):
            preds[i] = pred
    return preds


def _inside_image(pred, line_width: int, score_thr: float):
    return drawable_detections(pred, pred.ori_shape, score_thr, line_width)


def predict(
    inferencer, images: Sequence[str], out_dir: str, batch_size: int = 1, score_thr: float = 0.3, progress: bool = True
) -> list[dict]:
    """Run ``inferencer`` on ``images`` and write one overlay and one JSON per image; returns the result dicts.

    Args:
        inferencer: from ``build_inferencer``.
        images: image files (``find_images``).
        out_dir: the output folder (``vis/`` and ``preds/`` are created in it).
        batch_size: images per forward pass. Detection pads a batch to its largest image, so results can differ
            in the last digits from one image at a time.
        score_thr: detections below this score are not drawn (they are all in the JSON).
        progress: show a progress bar (on stderr).
    """
    from tqdm import tqdm

    detection = hasattr(inferencer, "pred2dict")
    drawable = partial(_inside_image, score_thr=score_thr)
    vis_dir, preds_dir = osp.join(out_dir, "vis"), osp.join(out_dir, "preds")
    os.makedirs(vis_dir, exist_ok=True)
    os.makedirs(preds_dir, exist_ok=True)
    # The visualizers write the overlays themselves (mmcv.imwrite), into a staging folder: a file is moved into
    # vis/ only once it is complete.
    staging = tempfile.mkdtemp(prefix=".partial-", dir=out_dir)
    # mmdet's visualize writes IMG_OUT_DIR/vis/<name>, mmseg's IMG_OUT_DIR/<name>
    draw = (
        dict(pred_score_thr=score_thr, img_out_dir=staging) if detection else {"img_out_dir": osp.join(staging, "vis")}
    )
    results = []
    try:
        with tqdm(total=len(images), unit="img", desc="Inference", disable=not progress) as bar:
            for start in range(0, len(images), batch_size):
                paths = list(images[start : start + batch_size])
                (batch,) = inferencer.preprocess(paths, batch_size=len(paths))  # the test pipeline, collated
                preds = inferencer.forward(batch[1]) if detection else _forward_by_size(inferencer, batch)
                # writes STAGING/vis/<file name>; detection: the boxes drawn inside the image, the JSON keeps them
                drawn = (
                    [drawable(pred, inferencer.visualizer.line_width) for pred in preds]
                    if detection
                    else [drawable_segmentation(pred) for pred in preds]
                )
                inferencer.visualize(paths, drawn, **draw)
                for path, pred in zip(paths, preds):
                    name, stem = osp.basename(path), osp.splitext(osp.basename(path))[0]
                    if detection:
                        result = inferencer.pred2dict(pred)
                    else:
                        label_map = inferencer.postprocess([pred], None)["predictions"]
                        result = {"sem_seg": label_map.tolist()}
                        _write_png(osp.join(preds_dir, f"{stem}.png"), label_map)
                    _write_json(osp.join(preds_dir, f"{stem}.json"), result)
                    os.replace(osp.join(staging, "vis", name), osp.join(vis_dir, name))
                    results.append(result)
                bar.update(len(paths))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return results


def run_inference(
    config: str,
    checkpoint: str,
    inputs: Sequence[str],
    out_dir: str,
    batch_size: int = 1,
    device: str | None = None,
    score_thr: float = 0.3,
    cfg_options: dict | None = None,
    progress: bool = True,
) -> list[str]:
    """``tools/infer.py``: find the images, build the inferencer, predict and write; returns the image files.

    Args:
        config: the mmengine config file.
        checkpoint: a Lightning checkpoint, an mm-format model or a backbone export.
        inputs: image files, folders and glob patterns.
        out_dir: the output folder.
        batch_size: images per forward pass.
        device: ``'cpu'``, ``'cuda'``...; None: a GPU when there is one.
        score_thr: detection score threshold for the overlays.
        cfg_options: config overrides.
        progress: show a progress bar.
    """
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    images = find_images(inputs)  # before the model is built: bad inputs fail fast, and nothing is made for them
    check_config_path(config)
    check_writable(out_dir, folder=True)
    inferencer = build_inferencer(config, checkpoint, device, cfg_options)
    predict(inferencer, images, out_dir, batch_size, score_thr, progress)
    return images
