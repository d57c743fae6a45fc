"""The models of the whole-model benchmark (``perf.whole_model.bench``) as training builds them, with their inputs:
``build_subject`` makes a config's model, its optimizer, one ready batch of ``size`` with random ground truth, and
its test dataloader, and gives detectors the same work per image (``keep_max_detections``); ``baseline_config``
names the Swin-T config of a task."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import logging
from pathlib import Path

import torch

from ..flops import fake_batch

SWIN_T = {
    "mmdet": "swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py",
    "mmseg": "swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py",
}
# Images of the timed training step: the detection papers' 2 per GPU; 1 cannot train UperNet (its pyramid pooling
# normalises a 1x1 map, which BatchNorm refuses for a single image).
TRAIN_BATCH = 2
_LOGGERS = itertools.count()


def keep_max_detections(cfg) -> int | None:
    """Set a detector config's RoI-head score threshold to zero, so that every model keeps its ``max_per_img``
    detections (returned; None for a config without an RoI head's test config, which is left as it is).

    At random weights the class scores decide how many boxes pass the usual 0.05 threshold, and the mask head
    runs on each: at COCO scale a random STViT-S Mask R-CNN kept 100 boxes and the random Swin-T 8, so their
    inference times compared different work. A trained COCO model keeps 100 on most images: the work that
    counts. A score threshold given in ``--cfg-options`` is overridden too."""
    rcnn = (cfg.model.get("test_cfg") or {}).get("rcnn")
    if not rcnn or "score_thr" not in rcnn:
        return None
    rcnn.score_thr = 0.0
    return rcnn.get("max_per_img")


def baseline_config(scope: str) -> str:
    """The path of the Swin-T baseline config of ``scope`` ('mmdet' or 'mmseg') in the installed package."""
    import importlib

    package = Path(importlib.import_module(scope).__file__).parent
    return str(package / ".mim" / "configs" / SWIN_T[scope])


def default_size(cfg) -> tuple[int, int]:
    """(H, W) of the config's test scale: the segmentor's data-preprocessor size (the crop it is trained and
    tested on), else the first ``Resize`` scale of the test pipeline as (short side, long side)."""
    size = (cfg.model.get("data_preprocessor") or {}).get("size")
    if size:
        return tuple(size)
    for step in cfg.test_dataloader.dataset.get("pipeline", []):
        if step.get("type") == "Resize" and step.get("scale"):
            scale = step["scale"]
            return (min(scale), max(scale)) if step.get("keep_ratio") else (scale[1], scale[0])
    raise ValueError(
        "no test scale in the config (model.data_preprocessor.size or a test-pipeline Resize): give --size"
    )


def synthetic_targets(samples: list, scope: str, num_classes: int, objects: int = 5) -> list:
    """``samples`` with random ground truth for a loss: ``objects`` boxes with their box-filling masks
    (detection), or a random class map (segmentation). Seeded: both models get the same targets."""
    g = torch.Generator().manual_seed(0)
    h, w = samples[0].metainfo["img_shape"]
    for sample in samples:
        if scope == "mmdet":
            from mmdet.structures.mask import BitmapMasks
            from mmengine.structures import InstanceData

            xy = torch.rand(objects, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
            wh = (0.1 + 0.3 * torch.rand(objects, 2, generator=g)) * torch.tensor([w, h])
            boxes = torch.cat([xy, xy + wh], 1)
            masks = torch.zeros(objects, h, w, dtype=torch.uint8)
            for m, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
                m[y1:y2, x1:x2] = 1
            gt = InstanceData(bboxes=boxes, labels=torch.randint(num_classes, (objects,), generator=g))
            gt.masks = BitmapMasks(masks.numpy(), h, w)
            sample.gt_instances = gt
        else:
            from mmengine.structures import PixelData

            sample.gt_sem_seg = PixelData(data=torch.randint(num_classes, (1, h, w), generator=g))
    return samples


@dataclasses.dataclass
class Subject:
    """One measured model: its name, config, built mm model, optimizer and the inputs of its steps."""

    name: str
    config: str
    cfg: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: tuple
    train_batch: tuple
    loader: object  # the test dataloader (batch 1), or a str saying why there is none
    detections: int | None = None  # boxes kept by the last inference on the ready batch (detectors)

    def infer(self) -> None:
        self.model.eval()
        with torch.no_grad():
            (result,) = self.model(*self.batch, mode="predict")
        instances = result.get("pred_instances")
        self.detections = None if instances is None else len(instances)

    def infer_loaded(self) -> None:
        """One image through the dataloader, the data preprocessor and the model."""
        self.model.eval()
        batch = next(self._images)
        with torch.no_grad():
            data = self.model.data_preprocessor(batch, False)
            self.model(**data, mode="predict")

    def train(self) -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, _ = self.model.parse_losses(self.model(*self.train_batch, mode="loss"))
        loss.backward()
        self.optimizer.step()

    def start_loading(self) -> None:
        # the loader again and again for any number of rounds (itertools.cycle would replay cached batches)
        self._images = (batch for _ in itertools.count() for batch in self.loader)


@contextlib.contextmanager
def _no_build_notes():
    """Building a task logs, at INFO, what it makes of the config for training (which evaluator serves
    ``val_evaluator``, ...): one line per model built here, none of it about speed. Warnings still print."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch.utilities.rank_zero", "tasks")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def build_subject(name: str, config: str, size, device: str, cfg_options=None, data_from=None) -> Subject:
    """The config's model (random weights, seeded; a detector keeping ``max_per_img`` boxes), its optimizer from
    ``optim_wrapper`` as training builds it, a ready batch of one image of ``size``, a training batch of
    ``TRAIN_BATCH`` such images with synthetic targets, and the test dataloader at batch 1.

    Args:
        name: the row's name.
        config: the config's path.
        size: (H, W) of the ready batch.
        device: 'cpu' or 'cuda'.
        cfg_options: ``--cfg-options`` overrides.
        data_from: a config whose ``test_dataloader`` replaces this one's (the baseline reads our images).
    """
    from mmengine.logging import MMLogger

    from tasks import build_task
    from tasks.config.load import load_config
    from tasks.runtime.quiet import quiet_mm_console
    from tasks.training.optim import build_optimizer

    # a new current logger at WARNING: mmengine's optimizer builder reports every parameter's options at INFO,
    # and without its frozen-parameter notes (HAT-Net's non-affine attention norms), as training does
    logger = MMLogger.get_instance(f"perf.whole_model.bench.{next(_LOGGERS)}", log_level="WARNING")
    for handler in logger.handlers:
        quiet_mm_console(handler)

    cfg = load_config(config, cfg_options)
    keep_max_detections(cfg)
    if data_from is not None:
        cfg.test_dataloader = data_from.test_dataloader
    cfg.test_dataloader.batch_size = 1
    cfg.test_dataloader.num_workers = 0
    torch.manual_seed(0)
    with _no_build_notes():
        module, data = build_task(cfg, init_weights=False)
    model = module.model.to(device)
    optimizer = build_optimizer(model, cfg.optim_wrapper)
    inputs, samples = fake_batch(model, cfg.default_scope, tuple(size))
    head = model.roi_head.bbox_head if cfg.default_scope == "mmdet" else model.decode_head
    targets = synthetic_targets(
        [copy.deepcopy(samples[0]) for _ in range(TRAIN_BATCH)], cfg.default_scope, head.num_classes
    )
    train_batch = (inputs.expand(TRAIN_BATCH, -1, -1, -1).contiguous().to(device), [t.to(device) for t in targets])
    try:
        loader = data.test_dataloader()
        len(loader.dataset)
    except FileNotFoundError as e:  # no data here: the loaded row says so
        loader = f"no test data ({str(e).splitlines()[0]})"
    batch = (inputs.to(device), [s.to(device) for s in samples])
    return Subject(name, config, cfg, model, optimizer, batch, train_batch, loader)
