"""The DINO and Mask2Former configs (``configs/*/dino-*``, ``configs/*/mask2former_*``).

- Their head, neck, encoder / decoder, data pipelines and schedule are mm's own config of the architecture, with
  only the backbone and the first consumer's input channels changed (``test_drift_from_mm``).
- Their recipe: AdamW, the backbone at lr x0.1, no decay on norms and positional parameters, every parameter of a
  real model in the group it should be in (``test_parameter_groups``), total batch 16.
- Every config trains two optimizer steps with ``tools/train.py`` and is evaluated by ``tools/test.py`` on the
  tiny datasets, at a reduced size through ``--cfg-options`` (the shrunk backbone, fewer and narrower transformer
  layers, fewer queries, small images): in this process, one config after the other, as the tools run them.
"""

import functools
import json
import os
import re
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from backbones.families import by_type_name
from tests._tools import FAMILY_DATA, config_family, load_tool, random_checkpoint, warnings_as_errors

ROOT = Path(__file__).resolve().parents[1]
QUERY_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*/*.py") if p.name.startswith(("dino-", "mask2former_")))


def _id(path):
    return f"{path.parent.name}/{path.name}"


def architecture(path) -> str:
    """'dino', 'm2f_coco' or 'm2f_ade' from the file name."""
    if path.name.startswith("dino-4scale_"):
        return "dino"
    return "m2f_ade" if "_ade20k-" in path.name else "m2f_coco"


# mm's own config of each architecture, the one with a Swin backbone where mm has it at 4 scales (mmdet's only Swin
# DINO is 5-scale Swin-L: the R-50 4-scale config is its reference)
MM_CONFIG = {
    "dino": "mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py",
    "m2f_coco": "mmdet::mask2former/mask2former_swin-t-p4-w7-224_8xb2-lsj-50e_coco.py",
    "m2f_ade": "mmseg::mask2former/mask2former_swin-t_8xb2-160k_ade20k-512x512.py",
}
CONSUMER = {"dino": "neck", "m2f_coco": "panoptic_head", "m2f_ade": "decode_head"}


@functools.lru_cache(maxsize=None)
def load(path) -> Config:
    """The config as mmengine reads it, once per test process (the tests only read it)."""
    if str(path).startswith(("mmdet::", "mmseg::")):
        return Config.fromstring(f"_base_ = {str(path)!r}", ".py")  # an mm:: path needs a _base_
    return Config.fromfile(str(path))


def _plain(value):
    """ConfigDict / tuple as dict / list without mmengine's ``_scope_`` marks, for comparisons."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "_scope_"}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _without_backbone(cfg, arch) -> dict:
    model = _plain(cfg.model)
    del model["backbone"]
    del model[CONSUMER[arch]]["in_channels"]
    model.pop("init_cfg", None)  # mm's Swin Mask2Former sets None, the R-50 base has none: no weights either way
    return model


def _pipelines(cfg) -> list:
    return [_plain(cfg[f"{s}_dataloader"].dataset.pipeline) for s in ("train", "val", "test")]


def _schedule(cfg) -> list:
    sched = _plain(cfg.param_scheduler)
    return [sched] if isinstance(sched, dict) else sched


@pytest.mark.parametrize("path", QUERY_CONFIGS, ids=_id)
def test_drift_from_mm(path):
    """Head, neck, decoders, losses, matchers, test settings, data preprocessing and pipelines, the schedule and
    the optimizer's own settings are mm's; what differs is the backbone and the consumer's input channels."""
    arch = architecture(path)
    ours, mm = load(path), load(MM_CONFIG[arch])
    assert _without_backbone(ours, arch) == _without_backbone(mm, arch)
    assert _pipelines(ours) == _pipelines(mm)
    assert _schedule(ours) == _schedule(mm)
    for key in ("max_epochs", "max_iters", "val_interval"):
        assert ours.train_cfg.get(key) == mm.train_cfg.get(key), key
    assert _plain(ours.optim_wrapper.optimizer) == _plain(mm.optim_wrapper.optimizer)
    assert _plain(ours.optim_wrapper.clip_grad) == _plain(mm.optim_wrapper.clip_grad)
    ours_keys, mm_keys = ours.optim_wrapper.paramwise_cfg.custom_keys, mm.optim_wrapper.paramwise_cfg.custom_keys
    for key in ("backbone", "query_embed", "query_feat", "level_embed"):  # mm's keys beyond its backbone's names
        assert _plain(ours_keys.get(key)) == _plain(mm_keys.get(key)), key
    assert ours.get("tta_model") == mm.get("tta_model") and ours.get("tta_pipeline") == mm.get("tta_pipeline")


@pytest.mark.parametrize("path", QUERY_CONFIGS, ids=_id)
def test_recipe(path):
    cfg = load(path)
    arch = architecture(path)
    family, letter = config_family(path)
    assert letter in {size[0] for size in family.released}
    bb = cfg.model.backbone
    assert bb.type == family.type_name
    assert bb.init_cfg == dict(type="Pretrained", checkpoint=f"pretrained/{family.name}_{bb.arch}.pth")
    assert 0.0 < bb.drop_path_rate < 0.5 and bb.get("norm_out", False) is False
    assert "backbones" in cfg.custom_imports.imports and cfg.custom_imports.allow_failed_imports is False
    # the real-size backbone's channels are what the consumer takes
    channels = {"STViT": {"small": [64, 128, 320, 512], "base": [96, 192, 384, 512], "large": [96, 192, 448, 640]},
                "HATNet": {"tiny": [48, 96, 240, 384], "small": [64, 128, 320, 512], "medium": [64, 128, 320, 512],
                           "large": [64, 128, 320, 640]}}[bb.type][bb.arch]  # fmt: skip
    assert list(cfg.model[CONSUMER[arch]].in_channels) == [channels[i] for i in bb.out_indices]
    assert tuple(bb.out_indices) == ((1, 2, 3) if arch == "dino" else (0, 1, 2, 3))

    ow = cfg.optim_wrapper
    assert ow.type == "OptimWrapper" and ow.optimizer.type == "AdamW"
    assert 0 < ow.paramwise_cfg.custom_keys.backbone.lr_mult < 1
    assert ow.paramwise_cfg.norm_decay_mult == 0.0
    # total batch 16: the trainer section's GPUs x the loader's batch, as the file name says
    gpus, per_gpu = map(int, re.search(r"_(\d+)xb(\d+)-", path.name).groups())
    assert (cfg.trainer.devices, cfg.train_dataloader.batch_size) == (gpus, per_gpu) and gpus * per_gpu == 16
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=16)
    trainer = cfg.trainer
    assert trainer.precision == "32-true"  # as mm's configs of these architectures train
    recipe = FAMILY_DATA[family.name]["recipe"]
    assert trainer.sync_batchnorm is recipe["batchnorm"]  # STViT's BatchNorms; HAT-Net and these heads: GroupNorm
    if arch == "dino":
        assert cfg.train_cfg.max_epochs == trainer.max_epochs == 12 and "max_steps" not in trainer
        assert cfg.checkpoint_callback.monitor == "bbox_mAP"
    else:
        iters = {"m2f_coco": 368750, "m2f_ade": 160000}[arch]  # 50 epochs of COCO at 16 images; 160k
        assert cfg.train_cfg.max_iters == trainer.max_steps == iters and "max_epochs" not in trainer
        assert trainer.val_check_interval == cfg.train_cfg.val_interval and trainer.check_val_every_n_epoch is None
        assert cfg.checkpoint_callback.monitor == ("segm_mAP" if arch == "m2f_coco" else "mIoU")
    # COCO configs at STViT's dense-prediction super-token sizes (stage 3 at COCO scale), ADE20K at the preset
    for key, value in recipe["coco_query_options"].items():
        assert bb.get(key) == (None if arch == "m2f_ade" else value)


@pytest.mark.parametrize("path", QUERY_CONFIGS, ids=_id)
def test_variants_share_the_recipe(path):
    """A variant config changes only the backbone's size, drop path, checkpointing and weights, and the channels."""
    s = path.with_name(re.sub(r"-[a-z]_", "-s_", path.name, count=1))
    ours, small = load(path), load(s)
    arch = architecture(path)
    assert _without_backbone(ours, arch) == _without_backbone(small, arch)
    assert _plain(ours.optim_wrapper) == _plain(small.optim_wrapper)
    for key in ("trainer", "train_cfg", "param_scheduler", "checkpoint_callback"):
        assert _plain(ours[key]) == _plain(small[key]), key
    changed = {k for k in set(ours.model.backbone) | set(small.model.backbone) if ours.model.backbone.get(k) !=
               small.model.backbone.get(k)}  # fmt: skip
    assert changed <= {"arch", "drop_path_rate", "with_cp", "init_cfg"}


# ---- the parameter groups of a real model --------------------------------------------------------------------


@pytest.mark.parametrize("path", [p for p in QUERY_CONFIGS if "-s_" in p.name], ids=_id)
def test_parameter_groups(path):
    """Each parameter's lr and weight decay as mmengine's optimizer constructor gives them: the backbone at lr x0.1;
    no decay on every norm (backbone and head), STViT's positional convs and layer-scale gammas, and the query /
    level embeddings where mm's config says so; full decay elsewhere. Built with the shrunk backbone, layer scale
    on (gammas exist)."""
    from tasks import build_task
    from tasks.config.load import load_config, parse_cfg_options
    from tasks.training.optim import build_optimizer

    arch = architecture(path)
    cfg = load_config(str(path), parse_cfg_options(_shrunk_model(arch, path)))
    family = by_type_name(cfg.model.backbone.type)
    recipe = FAMILY_DATA[family.name]["recipe"]
    if recipe["layerscale"]:  # layer scale in the last two stages, as in the base / large presets
        cfg.model.backbone.arch = {**family.sizes["shrunk"], **recipe["layerscale"]}
    model = build_task(cfg, init_weights=False)[0].model
    optimizer = build_optimizer(model, cfg.optim_wrapper)
    base_lr, base_wd = cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay
    group = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)
    norm_params = {id(p) for m in model.modules() if isinstance(m, norms) for p in m.parameters(recurse=False)}
    # mm's Mask2Former exempts its query and level embeddings from decay (mm's DINO does not)
    embeds = {"query_embed", "query_feat", "level_embed"} & set(cfg.optim_wrapper.paramwise_cfg.custom_keys)
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        embed = bool(set(embeds) & set(name.split(".")))
        no_decay = id(p) in norm_params or ".pos_embed." in name or name.endswith((".gamma_1", ".gamma_2")) or embed
        lr = base_lr * (0.1 if name.startswith("backbone.") else 1.0)
        assert group[id(p)] == pytest.approx((lr, 0.0 if no_decay else base_wd)), name
        seen |= {k for k in ("pos_embed", "gamma_1", "norm") if k in name and name.startswith("backbone.")}
    assert "norm" in seen and seen >= {"pos_embed", "gamma_1"} & set(recipe["no_decay_keys"])


# ---- two steps of training and an evaluation, each config -----------------------------------------------------


def _transformer_layers(prefix, dims=None, ffn=128, layers=1, attn=("self_attn_cfg",)):
    out = [f"{prefix}.num_layers={layers}", f"{prefix}.layer_cfg.ffn_cfg.feedforward_channels={ffn}"]
    if dims:
        out += [f"{prefix}.layer_cfg.{a}.embed_dims={dims}" for a in (*attn, "ffn_cfg")]
    return out


def _mask2former_head(p, classes):
    """Mask2Former's head 64 channels wide (256), 20 queries (100), 1 pixel-decoder layer (6), one decoder layer per
    feature level (9)."""
    return [
        f"{p}.num_queries=20",
        f"{p}.feat_channels=64",
        f"{p}.out_channels=64",
        f"{p}.positional_encoding.num_feats=32",
        f"{p}.pixel_decoder.positional_encoding.num_feats=32",
        *_transformer_layers(f"{p}.pixel_decoder.encoder", 64),
        *_transformer_layers(f"{p}.transformer_decoder", 64, layers=3, attn=("self_attn_cfg", "cross_attn_cfg")),
        f"{p}.loss_cls.class_weight={[1.0] * classes + [0.1]}",
    ]


def _shrunk_model(arch, path) -> list:
    """``--cfg-options`` for the shrunk model of ``arch``: the backbones' 'shrunk' preset (stage channels 32-256),
    narrower and fewer transformer layers, fewer queries, the tiny COCO's 3 classes (ADE20K's 150 stay: the tiny
    ADE20K holds real ADE20K labels)."""
    shrunk = config_family(path)[0].sizes["shrunk"]
    chans = [shrunk.get("embed_dims", shrunk.get("dims"))[i] for i in ((1, 2, 3) if arch == "dino" else range(4))]
    opts = ["model.backbone.arch=shrunk", "model.backbone.init_cfg=None", f"model.{CONSUMER[arch]}.in_channels={chans}"]
    if arch == "dino":  # DINO's decoder fixes the width at 256 (its query position encoding has 128 features)
        return opts + [
            *_transformer_layers("model.encoder", ffn=256),
            *_transformer_layers("model.decoder", ffn=256),
            "model.num_queries=30",
            "model.dn_cfg.group_cfg.num_dn_queries=10",
            "model.bbox_head.num_classes=3",
            "model.test_cfg.max_per_img=30",
        ]
    if arch == "m2f_coco":
        return opts + [
            *_mask2former_head("model.panoptic_head", 3),
            "model.panoptic_head.num_things_classes=3",
            "model.panoptic_fusion_head.num_things_classes=3",
            "model.train_cfg.num_points=1024",
            "model.test_cfg.max_per_image=20",
        ]
    return opts + [*_mask2former_head("model.decode_head", 150), "model.decode_head.train_cfg.num_points=1024"]


# Small images through each config's own pipeline steps: (loader, step index, key, value)
SMALL_IMAGES = {
    "dino": [
        ("train", "3.transforms.0.0", "scales", [(96, 160)]),
        ("train", "3.transforms.1.0", "scales", [(80, 4200)]),
        ("train", "3.transforms.1.1", "crop_size", (64, 96)),
        ("train", "3.transforms.1.2", "scales", [(96, 160)]),
        ("val", "1", "scale", (160, 96)),
        ("test", "1", "scale", (160, 96)),
    ],
    "m2f_coco": [
        ("train", "3", "scale", (96, 96)),
        ("train", "4", "crop_size", (96, 96)),
        ("val", "1", "scale", (160, 96)),
        ("test", "1", "scale", (160, 96)),
    ],
    "m2f_ade": [
        ("train", "2", "scales", [96]),
        ("train", "2", "max_size", 256),
        ("train", "3", "crop_size", (96, 96)),
        ("val", "1", "scale", (192, 96)),
        ("test", "1", "scale", (192, 96)),
    ],
}
BATCH_SIZE = {"dino": [], "m2f_coco": ["model.data_preprocessor.batch_augments.0.size=(96,96)"],
              "m2f_ade": ["model.data_preprocessor.size=(96,96)"]}  # fmt: skip


def _opts(arch, path, data_root) -> list:
    coco = arch != "m2f_ade"
    out = []
    for split in ("train", "val", "test"):
        out += [f"{split}_dataloader.dataset.data_root={data_root}/{'tiny_coco' if coco else 'tiny_ade20k'}/",
                f"{split}_dataloader.num_workers=0", f"{split}_dataloader.persistent_workers=False"]  # fmt: skip
        if coco:  # the tiny COCO's category names (its ids 1, 3, 7)
            out.append(f'{split}_dataloader.dataset.metainfo.classes=("square","disc","triangle")')
    out += [f"{s}_dataloader.dataset.pipeline.{step}.{key}={value!r}".replace(" ", "") for s, step, key, value in
            SMALL_IMAGES[arch]]  # fmt: skip
    return (
        out
        + _shrunk_model(arch, path)
        + BATCH_SIZE[arch]
        + [
            "train_dataloader.batch_size=1",
            "trainer.accelerator=cpu",
            "trainer.devices=1",
            "trainer.strategy=auto",
            "trainer.max_steps=2",
            "trainer.limit_val_batches=0",  # tools/test.py evaluates
            "checkpoint_callback.monitor=None",
            "trainer.enable_progress_bar=False",
            "trainer.enable_model_summary=False",
            "trainer.log_every_n_steps=1",
        ]
    )


@pytest.mark.parametrize("path", QUERY_CONFIGS, ids=_id)
def test_trains_two_steps_and_evaluates(path, tiny_data, tmp_path):
    arch = architecture(path)
    opts = _opts(arch, path, tiny_data)
    work = tmp_path / "work"
    with warnings_as_errors():  # a normal run prints no warning
        load_tool("train").main([str(path), "--work-dir", str(work), "--cfg-options", *opts])
        ckpt = torch.load(work / "last.ckpt", map_location="cpu", weights_only=True)
        assert ckpt["global_step"] == 2
        out_dir = tmp_path / "submission"
        metrics = load_tool("test").main(
            [str(path), str(work / "last.ckpt"), "--work-dir", str(work), "--out-dir", str(out_dir), "--cfg-options",
             *opts]
        )  # fmt: skip
    names = {"dino": {"bbox_mAP"}, "m2f_coco": {"bbox_mAP", "segm_mAP"}, "m2f_ade": {"mIoU", "aAcc"}}[arch]
    assert names <= set(metrics) and all(0.0 <= metrics[n] <= 1.0 for n in names), metrics
    assert json.loads((work / "test_metrics.json").read_text()) == metrics
    if arch == "m2f_ade":  # one label PNG per validation image
        assert len(list(out_dir.glob("*.png"))) == len(os.listdir(tiny_data / "tiny_ade20k/images/validation"))
    else:  # COCO results files: boxes, and masks for Mask2Former
        files = {"dino": {"results.bbox.json"}, "m2f_coco": {"results.bbox.json", "results.segm.json"}}[arch]
        assert {p.name for p in out_dir.iterdir()} == files


def test_tta_and_its_refusals(tiny_data, tmp_path):
    """mmseg's ADE20K TTA (multi-scale + flip) runs on Mask2Former; DINO and Mask2Former on COCO, whose mm configs
    define no TTA, are refused in words."""
    from tasks.config.keys import ConfigError

    test = load_tool("test")
    paths = {architecture(p): p for p in QUERY_CONFIGS if "stvit-s_" in p.name}
    ckpt = tmp_path / "random.pth"
    for arch, path in paths.items():
        opts = _opts(arch, path, tiny_data) + ["trainer.limit_test_batches=1"]
        random_checkpoint(str(path), opts, ckpt)
        argv = [str(path), str(ckpt), "--work-dir", str(tmp_path / arch), "--tta", "--cfg-options", *opts]
        if arch == "m2f_ade":
            with warnings_as_errors():
                metrics = test.main(argv)
            assert 0.0 <= metrics["mIoU"] <= 1.0
        else:
            with pytest.raises(ConfigError, match="defines no tta_model / tta_pipeline"):  # error: ..., no traceback
                test.main(argv)


@pytest.mark.parametrize("path", [p for p in QUERY_CONFIGS if "stvit-s_" in p.name], ids=_id)
def test_get_flops_reports_the_backbone_part(path, tmp_path):
    """tools/get_flops.py counts the model by parts (mmseg's Mask2Former head runs with its data samples, as mmseg's
    predict runs it); the shrunk model at a small input here, the real ones in docs/model_table.md."""
    out = tmp_path / "flops.json"
    argv = [
        str(path),
        "--shape",
        "128",
        "128",
        "--out",
        str(out),
        "--cfg-options",
        *_shrunk_model(architecture(path), path),
    ]
    result = load_tool("get_flops").main(argv)
    consumer = {"dino": "encoder", "m2f_coco": "panoptic_head", "m2f_ade": "decode_head"}[architecture(path)]
    assert {"backbone", consumer} <= set(result["parts"]) and all(v > 0 for v in result["parts"].values())
    assert sum(result["parts"].values()) == pytest.approx(result["gflops"], rel=1e-9)
    assert json.loads(out.read_text()) == result
