"""Checks for the paper configs in ``configs/`` (``configs/demo/`` has its own tests).

For every config: it loads with mmengine, its ``trainer`` / ``checkpoint_callback`` only hold
``lightning.Trainer`` / ``ModelCheckpoint`` keyword arguments consistent with the inherited mm
``train_cfg``, the optimizer / schedule / GPU count follow the file name and the recipe, the
data pipelines build, the real-size backbone's ``out_channels`` match the neck / decode head,
and the model -- with the backbone shrunk to the backbones' 'shrunk' presets -- builds through
the mmdet / mmseg registry and runs one ``loss`` (+ backward) and one ``predict`` step on a tiny
synthetic batch. mmdet's Mask R-CNN R-50 and mmseg's UperNet R-50 configs with only the backbone
swapped for ours are run the same way.

Models whose shrunk form is identical (e.g. the 1x and 3x Mask R-CNN, or the base / large
variants, which differ only in arch, drop path and weights) are run once and shared.
"""

import copy
import functools
import inspect
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.logging import MMLogger
from mmengine.registry import DefaultScope

ROOT = Path(__file__).resolve().parents[1]

from backbones import FAMILIES  # noqa: E402  (the import registers the families in the mm registries)
from tests._tools import FAMILY_DATA, config_family  # noqa: E402

CONFIG_DIR = ROOT / "configs"
PAPER_CONFIGS = sorted(
    p
    for p in CONFIG_DIR.rglob("*.py")
    if "demo" not in p.relative_to(CONFIG_DIR).parts and "_base_" not in p.relative_to(CONFIG_DIR).parts
)
DEMO_CONFIGS = sorted((CONFIG_DIR / "demo").rglob("*.py")) if (CONFIG_DIR / "demo").is_dir() else []
# The 2021 protocol's detectors and segmentors; DINO and Mask2Former have their recipe, drift and training tests in
# tests/test_query_configs.py and share the generic checks here (Lightning sections, schedules, pipelines, channels).
CONFIGS_2021 = [p for p in PAPER_CONFIGS if not p.name.startswith(("dino-", "mask2former_"))]


def _id(path):
    return str(path.relative_to(CONFIG_DIR))


# The backbones' 'shrunk' presets, with STViT's layer scale switched on in the last two stages (as in the base /
# large presets) so that the gamma parameters are exercised too.
STVIT_SHRUNK, HATNET_SHRUNK = FAMILIES["stvit"].sizes["shrunk"], FAMILIES["hatnet"].sizes["shrunk"]
SHRUNK_ARCH = {"STViT": {**STVIT_SHRUNK, "layerscale": [False, False, True, True]}, "HATNet": HATNET_SHRUNK}
assert STVIT_SHRUNK["embed_dims"] == HATNET_SHRUNK["dims"]
SHRUNK_CHANNELS = HATNET_SHRUNK["dims"]

# Released variants: family -> name letter -> (arch, stage channels).
VARIANTS = {
    "stvit": dict(s=("small", [64, 128, 320, 512]), b=("base", [96, 192, 384, 512]), l=("large", [96, 192, 448, 640])),
    "hatnet": dict(
        t=("tiny", [48, 96, 240, 384]),
        s=("small", [64, 128, 320, 512]),
        m=("medium", [64, 128, 320, 512]),
        l=("large", [64, 128, 320, 640]),
    ),
}

DET_HW = (64, 96)  # one image
SEG_HW = (64, 64)  # two images (UperNet's 1x1 pyramid-pooling BN needs more than one value)
NUM_SEG_CLASSES = 150


@functools.lru_cache(maxsize=None)
def load(path):
    return Config.fromfile(str(path))


def is_seg(cfg):
    return cfg.default_scope == "mmseg"


def registry(scope):
    if scope == "mmdet":
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    return MODELS


def head_in_channels(model_cfg):
    """The channel list the backbone has to produce: the neck's input (detection, Semantic FPN, DINO), the
    decode head's input (UperNet, Mask2Former on ADE20K) or the panoptic head's (Mask2Former on COCO)."""
    if model_cfg.get("neck") is not None:
        return list(model_cfg.neck.in_channels)
    if model_cfg.get("panoptic_head") is not None:
        return list(model_cfg.panoptic_head.in_channels)
    return list(model_cfg.decode_head.in_channels)


# --------------------------------------------------------------------------------------------
# config contents


@pytest.mark.parametrize("path", CONFIGS_2021, ids=_id)
def test_config_contents(path):
    cfg = load(path)
    family, letter = config_family(path)
    arch, channels = VARIANTS[family.name][letter]

    assert cfg.custom_imports == dict(imports=["backbones"], allow_failed_imports=False)
    assert cfg.default_scope in ("mmdet", "mmseg")
    assert cfg.default_scope == ("mmseg" if "ade20k" in path.name else "mmdet")

    bb = cfg.model.backbone
    assert bb.type == family.type_name
    assert bb.arch == arch
    assert bb.init_cfg == dict(type="Pretrained", checkpoint=f"pretrained/{family.name}_{arch}.pth")
    assert 0.0 < bb.drop_path_rate < 0.5
    assert bb.get("norm_out", False) is False
    assert "pretrained" not in bb and cfg.model.get("pretrained") is None

    expected = [channels[i] for i in bb.out_indices]
    assert head_in_channels(cfg.model) == expected
    if cfg.model.get("auxiliary_head") is not None:
        aux = cfg.model.auxiliary_head
        assert aux.in_channels == channels[bb.out_indices[aux.in_index]]

    # optimizer: AdamW in a plain OptimWrapper (Lightning handles AMP), no decay on norms / biases
    ow = cfg.optim_wrapper
    assert ow.type == "OptimWrapper" and ow.optimizer.type == "AdamW"
    assert ow.get("clip_grad") is None
    assert ow.paramwise_cfg.norm_decay_mult == 0 and ow.paramwise_cfg.bias_decay_mult == 0
    opt = ow.optimizer
    recipe = FAMILY_DATA[family.name]["recipe"]
    for key in recipe["no_decay_keys"]:
        assert ow.paramwise_cfg.custom_keys[key] == dict(decay_mult=0.0)
    assert (opt.lr, opt.weight_decay) in recipe["optimizers"]
    if path.name.startswith("upernet_"):
        assert (opt.lr, opt.weight_decay, tuple(opt.betas)) == (6e-5, 0.01, (0.9, 0.999))
    if path.name.startswith("fpn_"):
        assert (opt.lr, opt.weight_decay) == (1e-4, 1e-4)

    sched = cfg.param_scheduler
    trainer = cfg.trainer
    assert trainer.accelerator == "auto" and trainer.strategy == "ddp" and trainer.num_nodes == 1
    if is_seg(cfg):
        m = re.search(r"_(\d+)xb(\d+)-(\d+)k_", path.name)
        gpus, per_gpu, kiters = map(int, m.groups())
        assert trainer.devices == gpus and cfg.train_dataloader.batch_size == per_gpu
        assert cfg.train_cfg.type == "IterBasedTrainLoop"
        assert cfg.train_cfg.max_iters == trainer.max_steps == kiters * 1000
        assert cfg.train_cfg.val_interval == trainer.val_check_interval
        assert "check_val_every_n_epoch" in trainer and trainer.check_val_every_n_epoch is None
        assert "max_epochs" not in trainer
        assert sched[-1].type == "PolyLR" and sched[-1].end == cfg.train_cfg.max_iters
        assert all(not s.by_epoch for s in sched)
        assert cfg.checkpoint_callback.monitor == "mIoU"
        assert cfg.model.data_preprocessor.size == (512, 512)
    else:
        # mmdet convention: 8 GPUs x 2 images
        assert trainer.devices == 8 and cfg.train_dataloader.batch_size == 2
        assert cfg.train_cfg.type == "EpochBasedTrainLoop"
        assert trainer.max_epochs == cfg.train_cfg.max_epochs
        assert trainer.check_val_every_n_epoch == cfg.train_cfg.val_interval
        assert "max_steps" not in trainer
        epochs = {"1x": 12, "ms-3x": 36}[re.search(r"_(1x|ms-3x)_", path.name).group(1)]
        assert cfg.train_cfg.max_epochs == epochs
        assert cfg.train_dataloader.dataset.type == "CocoDataset"  # no RepeatDataset
        assert sched[0].type == "LinearLR" and not sched[0].by_epoch
        assert sched[-1].type == "MultiStepLR" and sched[-1].end == epochs
        assert sched[-1].milestones == ([8, 11] if epochs == 12 else [27, 33])
        assert cfg.checkpoint_callback.monitor == "bbox_mAP"
        metrics = cfg.val_evaluator.metric
        if "mask" in cfg.model.type.lower() or "mask_head" in cfg.model.get("roi_head", {}):
            assert "segm" in metrics and "bbox" in metrics
    assert cfg.checkpoint_callback.mode == "max" and cfg.checkpoint_callback.save_last is True
    # --auto-scale-lr: the base batch is the recipe's total batch, so on the paper's GPU count it changes nothing
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=trainer.devices * cfg.train_dataloader.batch_size)
    # AMP for STViT detection (as Swin's detection code), fp32 elsewhere (Swin / PVT segmentation, PVT)
    assert trainer.precision == ("32-true" if is_seg(cfg) else recipe["det_precision"])
    # Synchronised BN wherever there is BatchNorm: STViT's own, and the heads whose mm norm_cfg is
    # SyncBN (tasks/training/module.py reverts mm SyncBN to BN and leaves synchronisation to Lightning).
    # HAT-Net has only GroupNorms, Mask R-CNN / RetinaNet heads no norms.
    assert trainer.sync_batchnorm is (recipe["batchnorm"] or "SyncBN" in str(cfg.model))


@functools.lru_cache(maxsize=None)
def _trainer_params():
    import lightning
    from lightning.pytorch.callbacks import ModelCheckpoint

    def names(fn):
        return {
            n
            for n, p in inspect.signature(fn).parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }

    return names(lightning.Trainer.__init__), names(ModelCheckpoint.__init__), ModelCheckpoint


@pytest.mark.parametrize("path", PAPER_CONFIGS + DEMO_CONFIGS, ids=_id)
def test_lightning_kwargs(path):
    cfg = load(path)
    trainer_params, ckpt_params, ModelCheckpoint = _trainer_params()
    if path in DEMO_CONFIGS and "trainer" not in cfg:
        pytest.skip("demo config without a trainer section")
    assert set(cfg.trainer) <= trainer_params, set(cfg.trainer) - trainer_params
    if path in PAPER_CONFIGS or "checkpoint_callback" in cfg:
        ckpt = cfg.checkpoint_callback.to_dict()
        assert set(ckpt) <= ckpt_params, set(ckpt) - ckpt_params
        assert ckpt["monitor"] in ("bbox_mAP", "segm_mAP", "mIoU")
        callback = ModelCheckpoint(**ckpt)  # the kwargs are accepted together
        name = callback.format_checkpoint_name(
            {"epoch": torch.tensor(3), "step": torch.tensor(1000), ckpt["monitor"]: torch.tensor(0.5)}
        )
        assert "{" not in name and "None" not in name, name


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_id)
def test_task_trainer_and_schedules(path):
    """The training tools accept the sections: tasks/training/trainer.py resolves the trainer kwargs and
    tasks/training/optim.py builds every param_scheduler entry over the run length."""
    from tasks.training.optim import build_schedulers
    from tasks.training.trainer import trainer_kwargs

    cfg = load(path)
    kwargs = trainer_kwargs(cfg)
    # torch's SyncBatchNorm runs on GPUs only: on a machine without one, BatchNorm stays per process
    assert kwargs["sync_batchnorm"] == (cfg.trainer.sync_batchnorm and torch.cuda.is_available())
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim_wrapper.optimizer.lr)
    schedulers = build_schedulers(
        optimizer,
        cfg.param_scheduler,
        max_epochs=kwargs.get("max_epochs"),
        max_steps=kwargs.get("max_steps", -1),
        epoch_length=lambda: 1000,
    )
    entries = [cfg.param_scheduler] if isinstance(cfg.param_scheduler, dict) else cfg.param_scheduler
    assert [s["interval"] for s in schedulers] == ["step" if not s.get("by_epoch", True) else "epoch" for s in entries]
    # warm-up starts from the configured fraction of the base lr
    first = cfg.param_scheduler if isinstance(cfg.param_scheduler, dict) else cfg.param_scheduler[0]
    factor = first.get("start_factor", 1.0) if first.type == "LinearLR" else 1.0
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optim_wrapper.optimizer.lr * factor)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_id)
def test_pipelines_build(path):
    cfg = load(path)
    from mmengine.dataset import Compose

    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
            ds = cfg[loader].dataset
            while "pipeline" not in ds:  # RepeatDataset & co.
                ds = ds.dataset
            Compose(ds.pipeline)
        if cfg.get("tta_pipeline") is not None:  # tools/test.py --tta
            Compose(cfg.tta_pipeline)


@pytest.mark.parametrize("path", CONFIGS_2021, ids=_id)
def test_tta_where_the_libraries_define_it(path):
    # mmseg's ADE20K bases: multi-scale (0.5-1.75) + flip; mmdet's DetTTAModel merges boxes only, so only the
    # box-only detectors (RetinaNet) get one (mmdet's retinanet_tta.py)
    cfg = load(path)
    tta = cfg.get("tta_model")
    if "ade20k" in str(path):
        assert tta.type == "SegTTAModel"
        resizes = cfg.tta_pipeline[1].transforms[0]
        assert [t.scale_factor for t in resizes] == [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    elif "retinanet" in str(path):
        assert tta.type == "DetTTAModel"
    else:
        assert tta is None and cfg.get("tta_pipeline") is None


# --------------------------------------------------------------------------------------------
# real-size backbones (built once per arch, no forward)


_REAL_BACKBONES = {}


def build_real_backbone(scope, bb_type, arch):
    """Built through the config's registry with its four stages; once per (type, arch) - mmdet's and mmseg's
    registries resolve the same class, and a config's ``out_indices`` select from ``feature_info``."""
    key = (bb_type, arch)
    if key not in _REAL_BACKBONES:
        with DefaultScope.overwrite_default_scope(scope):
            _REAL_BACKBONES[key] = registry(scope).build(
                dict(type=bb_type, arch=arch, out_indices=(0, 1, 2, 3), init_cfg=None)
            )
    return _REAL_BACKBONES[key]


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_id)
def test_real_backbone_channels(path):
    cfg = load(path)
    bb_cfg = cfg.model.backbone
    stages = build_real_backbone(cfg.default_scope, bb_cfg.type, bb_cfg.arch).feature_info
    channels = [stages[i]["num_chs"] for i in bb_cfg.out_indices]
    assert channels == head_in_channels(cfg.model)
    assert [stages[i]["reduction"] for i in bb_cfg.out_indices] == [4 * 2**i for i in bb_cfg.out_indices]
    if cfg.model.get("auxiliary_head") is not None:
        aux = cfg.model.auxiliary_head
        assert channels[aux.in_index] == aux.in_channels


# --------------------------------------------------------------------------------------------
# shrunk models: build + loss/backward + predict


def shrink(model_cfg, scope):
    """Shrunk copy of a model config: test arch, matching head widths, no pretrained weights,
    few RoIs. Everything else (heads, losses, drop path, with_cp, ...) is kept."""
    cfg = copy.deepcopy(model_cfg)
    bb = cfg.backbone
    bb.arch = copy.deepcopy(SHRUNK_ARCH[bb.type])
    bb.init_cfg = None
    chans = [SHRUNK_CHANNELS[i] for i in bb.out_indices]
    if scope == "mmseg":
        cfg.pretrained = None
        cfg.data_preprocessor.size = SEG_HW
        if cfg.get("neck") is not None:  # Semantic FPN
            cfg.neck.in_channels = chans
            cfg.neck.out_channels = 32
            cfg.decode_head.in_channels = [32] * len(chans)
            cfg.decode_head.channels = 32
        else:  # UperNet
            cfg.decode_head.in_channels = chans
            cfg.decode_head.channels = 64
        if cfg.get("auxiliary_head") is not None:
            cfg.auxiliary_head.in_channels = chans[cfg.auxiliary_head.in_index]
            cfg.auxiliary_head.channels = 32
    else:
        cfg.neck.in_channels = chans
        # FPN and head widths 256 -> 64 (and the box heads' fc 1024 -> 256), everywhere after the
        # backbone: the same model, 16x cheaper on a CPU.
        for key in ("neck", "rpn_head", "roi_head", "bbox_head"):
            if cfg.get(key) is not None:
                cfg[key] = _narrow(cfg[key])
        train_cfg, test_cfg = cfg.train_cfg, cfg.test_cfg
        if "rpn_proposal" in train_cfg:  # two-stage
            train_cfg.rpn_proposal.update(nms_pre=300, max_per_img=100)
            rcnn = train_cfg.rcnn if isinstance(train_cfg.rcnn, list) else [train_cfg.rcnn]
            for stage in rcnn:
                stage.sampler.num = 32
            test_cfg.rpn.update(nms_pre=300, max_per_img=50)
            # score_thr 0 so that the (untrained) model returns boxes and runs the mask head
            test_cfg.rcnn.update(score_thr=0.0, max_per_img=10)
        else:  # RetinaNet
            test_cfg.update(nms_pre=300, score_thr=0.0, max_per_img=10)
    return cfg


_NARROW = {
    "in_channels": (256, 64),
    "out_channels": (256, 64),
    "feat_channels": (256, 64),
    "conv_out_channels": (256, 64),
    "fc_out_channels": (1024, 256),
}


def _narrow(node):
    """Copy of a detector head / neck config with the 256-wide FPN features narrowed to 64."""
    if isinstance(node, list):
        return [_narrow(v) for v in node]
    if isinstance(node, dict):
        return type(node)(
            {k: (_NARROW[k][1] if k in _NARROW and v == _NARROW[k][0] else _narrow(v)) for k, v in node.items()}
        )
    return node


def det_batch():
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    h, w = DET_HW
    g = torch.Generator().manual_seed(0)
    sample = DetDataSample(
        metainfo=dict(img_id=0, img_path="synthetic.jpg", img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0))
    )
    boxes = torch.tensor([[4.0, 6.0, 40.0, 50.0], [30.0, 10.0, 90.0, 60.0]])
    masks = np.zeros((2, h, w), dtype=np.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.long().tolist()):
        masks[i, y1:y2, x1:x2] = 1
    sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 7]), masks=BitmapMasks(masks, h, w))
    sample.ignored_instances = InstanceData(bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
    img = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    return dict(inputs=[img], data_samples=[sample])


def seg_batch():
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    h, w = SEG_HW
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for i in range(2):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8))
        label = torch.randint(0, NUM_SEG_CLASSES, (1, h, w), generator=g)
        label[:, :4] = 255  # some ignored pixels
        sample = SegDataSample(
            metainfo=dict(
                img_path=f"synthetic_{i}.jpg", img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0), flip=False
            )
        )
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def check_weight_decay(model, optim_wrapper_cfg):
    """No decay on norms, biases, STViT's positional convs and layer-scale gammas; full decay
    elsewhere."""
    from mmengine.optim import build_optim_wrapper

    wrapper = build_optim_wrapper(model, copy.deepcopy(optim_wrapper_cfg))
    base_wd = optim_wrapper_cfg.optimizer.weight_decay
    wd = {id(p): group["weight_decay"] for group in wrapper.optimizer.param_groups for p in group["params"]}
    norm_types = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)
    norm_params = {id(p) for m in model.modules() if isinstance(m, norm_types) for p in m.parameters(recurse=False)}
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = (
            id(p) in norm_params
            or name.endswith(".bias")
            or ".pos_embed." in name
            or name.endswith((".gamma_1", ".gamma_2"))
        )
        assert wd[id(p)] == (0.0 if no_decay else base_wd), name
        seen.update(k for k in ("pos_embed", "gamma_1") if k in name)
    expected = {"pos_embed", "gamma_1"} & set(FAMILY_DATA[model.backbone.family]["recipe"]["no_decay_keys"])
    assert seen == expected, "the backbone's param names changed (custom_keys would miss them)"


_RUN_CACHE = {}


def run_shrunk(model_cfg, scope, optim_wrapper_cfg=None):
    """Build the shrunk model through the registry, run loss + backward and predict. Identical
    shrunk configs are run once."""
    cfg = shrink(model_cfg, scope)
    key = json.dumps([scope, _signature(cfg.to_dict()), optim_wrapper_cfg], sort_keys=True, default=str)
    if key in _RUN_CACHE:
        return _RUN_CACHE[key]
    torch.manual_seed(0)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # init_weights() logs every parameter at INFO level
    try:
        log_vars = _run(cfg, model_cfg, scope, optim_wrapper_cfg)
    finally:
        logger.setLevel(level)
    _RUN_CACHE[key] = log_vars
    return log_vars


def _run(cfg, model_cfg, scope, optim_wrapper_cfg):
    with DefaultScope.overwrite_default_scope(scope):
        model = registry(scope).build(cfg)
        model.init_weights()
        batch = det_batch() if scope == "mmdet" else seg_batch()

        model.train()
        data = model.data_preprocessor(copy.deepcopy(batch), True)
        losses = model(**data, mode="loss")
        loss, log_vars = model.parse_losses(losses)
        assert torch.isfinite(loss), log_vars
        loss.backward()
        grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
        assert any(g is not None and g.abs().sum() > 0 for g in grads), "no gradient reached the backbone"

        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(copy.deepcopy(batch), False)
            results = model(**data, mode="predict")
        if scope == "mmdet":
            pred = results[0].pred_instances
            assert len(pred) > 0 and pred.bboxes.shape[1] == 4
            if "mask" in model_cfg.type.lower() or model_cfg.get("roi_head", {}).get("mask_head"):
                assert pred.masks.shape[-2:] == DET_HW
        else:
            assert len(results) == 2
            assert results[0].pred_sem_seg.data.shape == (1, *SEG_HW)
        if optim_wrapper_cfg is not None:
            check_weight_decay(model, optim_wrapper_cfg)
    return sorted(log_vars)


def _signature(d):
    """Shrunk model config minus what cannot change the computation graph's shape."""
    d = copy.deepcopy(d)
    d["backbone"].pop("drop_path_rate", None)
    return d


@pytest.mark.parametrize("path", CONFIGS_2021, ids=_id)
def test_shrunk_model_loss_predict(path):
    cfg = load(path)
    log_vars = run_shrunk(cfg.model, cfg.default_scope, cfg.optim_wrapper)
    assert "loss" in log_vars


MM_CONFIGS = {
    "mmdet": "mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py",
    "mmseg": "mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py",
}


@pytest.mark.parametrize("bb_type", ["STViT", "HATNet"])
@pytest.mark.parametrize("scope", ["mmdet", "mmseg"])
def test_mm_config_with_our_backbone(scope, bb_type):
    """mmdet's / mmseg's own R-50 config with only the backbone swapped for ours."""
    cfg = Config.fromstring(f"_base_ = {MM_CONFIGS[scope]!r}", ".py")  # 'mmdet::' needs a _base_
    model_cfg = cfg.model
    model_cfg.backbone = ConfigDict(type=bb_type, out_indices=(0, 1, 2, 3), init_cfg=None)
    # shrink() sets the shrunk arch and the neck / decode-head input channels
    log_vars = run_shrunk(model_cfg, scope)
    assert "loss" in log_vars
