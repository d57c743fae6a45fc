"""Backbone and model export (tools/export_backbone.py, tools/export_model.py, tasks/deploy/export.py,
backbones/checkpoints/export.py), end to end on CPU: train two steps on the tiny data, export in every format, load the
exports back through ``init_cfg=dict(type='Pretrained')``, an official-layout stand-in model, mmdet's
``init_detector`` and mmseg's ``init_model``, and check the errors that name the problem."""

import argparse
import json
import os
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config

from backbones import FAMILIES, HATNet, STViT, load_pretrained
from backbones.checkpoints.export import ExportError, read_export, tensor_sha256, verify_export
from backbones.errors import CheckpointError
from tasks.deploy.export import export_backbone, export_model
from tests._tools import DET_CFG, FAMILY_DATA, GOLDEN_CASES, flat_metrics, load_tool

EYE = torch.eye(9).reshape(9, 1, 3, 3)


export_backbone_tool, export_model_tool = load_tool("export_backbone"), load_tool("export_model")


def _lightning_module(config, ckpt):
    from tasks import build_task
    from tasks.config.load import load_config

    module, datamodule = build_task(load_config(config), init_weights=False)
    module.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"])
    return module.eval(), datamodule


@pytest.fixture(scope="module")
def det_exports(det_run, tmp_path_factory):
    ckpt, config = det_run.ckpt, det_run.config
    out = tmp_path_factory.mktemp("exports")
    paths = {
        "pth": str(out / "stvit.pth"),
        "safetensors": str(out / "stvit.safetensors"),
        "official": str(out / "stvit_official.pth"),
    }
    metas = {fmt: export_backbone(ckpt, path, fmt, config=config) for fmt, path in paths.items()}
    return paths, metas


# ---- backbone exports -------------------------------------------------------------------------------------
def test_exports_load_through_init_cfg_with_identical_outputs(det_run, det_exports):
    from mmdet.registry import MODELS

    from tasks.config.load import load_config

    ckpt, config, metrics = det_run.ckpt, det_run.config, det_run.metrics
    paths, metas = det_exports
    module, _ = _lightning_module(config, ckpt)
    x = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = module.model.backbone(x)
    for fmt, path in paths.items():
        cfg = load_config(config)
        cfg.model.backbone.init_cfg = dict(type="Pretrained", checkpoint=path)
        detector = MODELS.build(cfg.model)
        detector.init_weights()
        detector.eval()
        with torch.no_grad():
            got = detector.backbone(x)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), fmt
        # and the pure backbone reports what it loaded / skipped
        report = load_pretrained(STViT(metas[fmt]["arch"]), path)
        assert set(report.loaded) == set(module.model.backbone.state_dict()), fmt
        assert (fmt == "official") == bool(report.skipped)  # official: the constant unfold/fold kernels
        assert all(k.endswith("fold.weights") for k in report.skipped)

    # meta: family, full arch, provenance, last validation metric, hash
    meta = metas["pth"]
    assert meta["family"] == "stvit" and meta["arch"] == module.model.backbone.arch
    assert meta["out_indices"] == [0, 1, 2, 3] and meta["backbone_cfg"]["type"] == "STViT"
    assert meta["step"] == 2 and meta["epoch"] == 0
    assert flat_metrics(meta["metrics"]) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    assert meta["config"]["path"] == config and "'type': 'STViT'" in meta["config"]["text"]
    assert meta["sha256"] == verify_export(paths["pth"])["sha256"] == verify_export(paths["safetensors"])["sha256"]
    assert verify_export(paths["official"])["sha256"] == metas["official"]["sha256"]


def test_pth_and_safetensors_hold_bit_identical_tensors(det_run, det_exports):
    paths, metas = det_exports
    ckpt = torch.load(det_run.ckpt, map_location="cpu", weights_only=True)["state_dict"]
    trained = {k[len("model.backbone.") :]: v for k, v in ckpt.items() if k.startswith("model.backbone.")}
    pth, pth_meta = read_export(paths["pth"])
    st, st_meta = read_export(paths["safetensors"])
    assert list(pth) == sorted(trained) and set(st) == set(trained)
    for k, v in trained.items():
        assert pth[k].dtype == st[k].dtype == v.dtype and torch.equal(pth[k], v) and torch.equal(st[k], v), k
    assert {**pth_meta, "format": None} == {**st_meta, "format": None}
    assert tensor_sha256(pth) == tensor_sha256(st) == pth_meta["sha256"]
    # the pth export is plain tensors + builtins: torch.load(weights_only=True) reads it without an allow-list
    assert set(torch.load(paths["pth"], weights_only=True)) == {"state_dict", "meta"}


def test_exporting_twice_gives_identical_bytes(det_run, det_exports):
    ckpt, config = det_run.ckpt, det_run.config
    paths, _ = det_exports
    for fmt, path in paths.items():
        before = open(path, "rb").read()
        meta = export_backbone_tool.main([ckpt, "--out", path, "--format", fmt, "--config", config])
        assert open(path, "rb").read() == before, fmt
        assert meta["format"] == fmt
    assert [f for f in os.listdir(osp.dirname(paths["pth"])) if f.endswith(".tmp")] == []  # no temp files


class OfficialStandIn(nn.Module):
    """A module whose state dict has exactly the keys / shapes of an official model's manifest."""

    def __init__(self, manifest: dict):
        super().__init__()
        for key, shape in manifest.items():
            owner = self
            *path, leaf = key.split(".")
            for name in path:
                if not hasattr(owner, name):
                    owner.add_module(name, nn.Module())
                owner = getattr(owner, name)
            owner.register_buffer(
                leaf, torch.zeros(shape, dtype=torch.long if leaf == "num_batches_tracked" else torch.float32)
            )


def _is_head(key, family):
    """Whether ``key`` is one of the official classification head's tensors (the record's official key prefixes)."""
    return key.startswith(tuple(FAMILIES[family].classifier.official_keys))


def _official_export(tmp_path, backbone, type_name, arch, **kwargs):
    """Write {'state_dict': {'backbone.*'}} + a config for ``backbone``, export 'official', return it."""
    ckpt, config, out = tmp_path / "mm.pth", tmp_path / "cfg.py", tmp_path / "official.pth"
    torch.save(
        {
            "state_dict": {"backbone." + k: v for k, v in backbone.state_dict().items()},
            "meta": {"epoch": 12, "iter": 1000},
        },
        ckpt,
    )
    extra = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    config.write_text(f"model = dict(backbone=dict(type={type_name!r}, arch={arch!r}{extra}))\n")
    export_backbone(ckpt, out, "official", config=config)
    return out, torch.load(out, weights_only=True)


def _assert_official_load(sd, manifest, family):
    official = OfficialStandIn(manifest)
    result = official.load_state_dict(sd, strict=False)  # raises on any shape mismatch
    assert result.unexpected_keys == []
    assert result.missing_keys and all(_is_head(k, family) for k in result.missing_keys)
    assert {k: list(v.shape) for k, v in sd.items()} == {
        k: list(s) for k, s in manifest.items() if not _is_head(k, family)
    }


@pytest.mark.parametrize("variant", ["stvit_small", "hatnet_tiny"])
def test_official_export_matches_released_key_manifest(variant, reference_dir, tmp_path):
    manifest = json.loads((reference_dir / "official_keys.json").read_text())[variant]["keys"]
    family, arch = variant.split("_")
    model = FAMILIES[family].cls(arch)
    out, obj = _official_export(tmp_path, model, FAMILIES[family].type_name, arch)
    assert set(obj) == {"model", "meta"} and obj["meta"]["format"] == "official"
    _assert_official_load(obj["model"], manifest, family)
    fold = [k for k in obj["model"] if k.endswith("fold.weights")]
    assert len(fold) == FAMILY_DATA[family]["official_folds_per_block"] * sum(model.arch["depths"])
    assert all(torch.equal(obj["model"][k], EYE) for k in fold)
    load_pretrained(model, out)  # and it comes back in


@pytest.mark.parametrize("name", ["stvit_tiny_s8411.pt", "hatnet_tiny_g8771.pt"])
def test_official_export_reproduces_the_official_state_dict(name, reference_dir, tmp_path):
    """Shrunk archs: the official models' own state dicts (golden files) minus the head are reproduced
    exactly, key for key, shape for shape and value for value (the identity unfold/fold kernels included)."""
    cls, arch = GOLDEN_CASES[name]
    official_sd = torch.load(reference_dir / name, weights_only=True)["state_dict"]
    model = cls(arch)
    load_pretrained(model, official_sd)
    _, obj = _official_export(tmp_path, model, cls.__name__, arch)
    family = model.family
    _assert_official_load(obj["model"], {k: list(v.shape) for k, v in official_sd.items()}, family)
    for k, v in obj["model"].items():
        assert v.dtype == official_sd[k].dtype and torch.equal(v, official_sd[k]), k


def test_released_official_checkpoint_loads_through_init_cfg(reference_dir, tmp_path):
    """A release as the DeiT-style scripts save it: {'model', 'optimizer', 'epoch', 'args': Namespace}."""
    from mmdet.registry import MODELS

    import backbones  # noqa: F401  (registers the mm adapters)

    _, arch = GOLDEN_CASES["stvit_tiny_s8411.pt"]
    sd = torch.load(reference_dir / "stvit_tiny_s8411.pt", weights_only=True)["state_dict"]
    path = tmp_path / "release.pth"
    torch.save({"model": sd, "optimizer": {}, "epoch": 299, "args": argparse.Namespace(model="stvit")}, path)
    backbone = MODELS.build(dict(type="STViT", arch=arch, init_cfg=dict(type="Pretrained", checkpoint=str(path))))
    backbone.init_weights()
    assert torch.equal(
        backbone.state_dict()["layers.3.blocks.0.attn.stoken_refine.qkv.weight"],
        sd["layers.3.blocks.0.attn.stoken_refine.qkv.weight"],
    )


# ---- mm-format model exports ------------------------------------------------------------------------------
def _assert_same_det(a, b):
    for x, y in zip(a, b):
        for key in ("bboxes", "scores", "labels", "masks"):
            assert torch.equal(x.pred_instances[key], y.pred_instances[key]), key


def test_export_model_loads_in_init_detector_and_predicts_the_same(det_run, tmp_path):
    from mmdet.apis import inference_detector, init_detector

    ckpt, config, metrics = det_run.ckpt, det_run.config, det_run.metrics
    out = str(tmp_path / "det.pth")
    meta = export_model_tool.main([ckpt, "--out", out, "--config", config])
    again = export_model(ckpt, tmp_path / "det2.pth", config)
    assert meta == again and open(out, "rb").read() == open(tmp_path / "det2.pth", "rb").read()
    module, datamodule = _lightning_module(config, ckpt)
    detector = init_detector(config, out, device="cpu")
    assert detector.dataset_meta["classes"] == ("square", "disc", "triangle")
    assert [tuple(c) for c in detector.dataset_meta["palette"]] == [(215, 40, 40), (40, 185, 60), (45, 75, 220)]
    loaded = torch.load(out, weights_only=True)
    assert loaded["meta"]["iter"] == 2 and flat_metrics(loaded["meta"]["metrics"]) == pytest.approx(
        flat_metrics(metrics), nan_ok=True
    )
    assert set(loaded["state_dict"]) == set(detector.state_dict())
    # an mm-format checkpoint carries its config (meta['cfg']): its backbone exports without --config
    bb_meta = export_backbone(out, tmp_path / "from_mm.pth")
    assert bb_meta["config"]["source"] == "checkpoint" and bb_meta["source"]["kind"] == "mm"
    assert bb_meta["sha256"] == export_backbone(ckpt, tmp_path / "from_ckpt.pth", config=config)["sha256"]
    assert bb_meta["step"] == 2 and bb_meta["metrics"] == meta["metrics"]
    batch = next(iter(datamodule.val_dataloader()))
    with torch.no_grad():
        feats = detector.backbone(detector.data_preprocessor(batch, False)["inputs"])
        assert all(f.is_contiguous() for f in feats), (
            "the backbone returns channels_last feature maps; mmcv's RoIAlign reads them wrongly, so a detector "
            "built by mmdet itself (init_detector / DetInferencer / mmdet's Runner) predicts differently from "
            "the Lightning module (tasks/training/detection.py works around it with a forward hook)"
        )
        _assert_same_det(detector.test_step(batch), module._predict(batch))
        # mmdet's high-level API on an image file runs too, with the same result
        img = batch["data_samples"][0].img_path
        module.model.cfg = detector.cfg
        _assert_same_det([inference_detector(detector, img)], [inference_detector(module.model, img)])


def test_export_model_loads_in_mmseg_init_model_and_predicts_the_same(seg_run, tmp_path):
    from mmseg.apis import init_model

    ckpt, config = seg_run.ckpt, seg_run.config
    out = str(tmp_path / "seg.pth")
    export_model_tool.main([ckpt, "--out", out, "--config", config])
    module, datamodule = _lightning_module(config, ckpt)
    segmentor = init_model(config, out, device="cpu")
    classes = tuple(Config.fromfile(config).test_dataloader.dataset.metainfo["classes"])  # the tiny set's 5
    meta = segmentor.dataset_meta
    assert tuple(meta["classes"]) == classes and len(meta["palette"]) == len(classes)
    batch = next(iter(datamodule.val_dataloader()))
    with torch.no_grad():
        got, expected = segmentor.test_step(batch), module._predict(batch)
    for x, y in zip(got, expected):
        assert torch.equal(x.pred_sem_seg.data, y.pred_sem_seg.data)
        assert torch.equal(x.seg_logits.data, y.seg_logits.data)
    # the backbone export of the segmentor is a HAT-Net one
    meta = export_backbone(ckpt, tmp_path / "hatnet.safetensors", config=config)
    assert meta["family"] == "hatnet" and meta["step"] == 2 and "mIoU" in meta["metrics"]
    load_pretrained(HATNet(meta["arch"]), tmp_path / "hatnet.safetensors")


# ---- errors -------------------------------------------------------------------------------------------------
def test_checkpoint_without_backbone(tmp_path):
    path = tmp_path / "neck_only.ckpt"
    torch.save({"state_dict": {"model.neck.conv.weight": torch.zeros(2, 2)}, "pytorch-lightning_version": "2"}, path)
    with pytest.raises(CheckpointError, match=r"holds no backbone.*'neck\.'"):
        export_backbone(path, tmp_path / "x.pth", config=DET_CFG)
    torch.save({"state_dict": {"neck.conv.weight": torch.zeros(2, 2)}, "meta": {}}, path)
    with pytest.raises(CheckpointError, match="holds no backbone"):
        export_backbone(path, tmp_path / "x.pth", config=DET_CFG)
    with pytest.raises(CheckpointError, match="holds no backbone weights"):
        load_pretrained(STViT("small"), path)


def test_truncated_or_corrupt_files(det_run, det_exports, tmp_path):
    data = open(det_run.ckpt, "rb").read()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        export_backbone(tmp_path / "cut.ckpt", tmp_path / "x.pth", config=det_run.config)
    (tmp_path / "noise.pth").write_bytes(b"this is not a checkpoint\n" * 100)
    with pytest.raises(CheckpointError, match="corrupt"):
        export_backbone(tmp_path / "noise.pth", tmp_path / "x.pth", config=det_run.config)
    paths, metas = det_exports
    arch = metas["pth"]["arch"]
    for fmt in ("pth", "safetensors"):
        data = open(paths[fmt], "rb").read()
        cut = tmp_path / ("cut." + ("pth" if fmt == "pth" else "safetensors"))
        cut.write_bytes(data[: len(data) - 1000])
        with pytest.raises(CheckpointError, match="truncated"):
            load_pretrained(STViT(arch), cut)
    assert not os.path.exists(tmp_path / "x.pth")  # nothing written on failure


def test_format_must_match_extension(det_run, det_exports, tmp_path):
    ckpt, config = det_run.ckpt, det_run.config
    with pytest.raises(ExportError, match=r"'safetensors' does not match the extension.*\.safetensors"):
        export_backbone(ckpt, tmp_path / "x.pth", "safetensors", config=config)
    with pytest.raises(ExportError, match=r"'official' does not match the extension.*\.pth or \.pt"):
        export_backbone(ckpt, tmp_path / "x.safetensors", "official", config=config)
    with pytest.raises(ExportError, match="Cannot infer the export format"):
        export_backbone(ckpt, tmp_path / "x.bin", config=config)
    with pytest.raises(ExportError, match=r"name it \.pth or \.pt"):
        export_model(ckpt, tmp_path / "x.safetensors", config)
    # a file whose content does not match its name, on the loading side
    paths, metas = det_exports
    renamed = {"pth": tmp_path / "st.pth", "safetensors": tmp_path / "pth.safetensors"}
    renamed["pth"].write_bytes(open(paths["safetensors"], "rb").read())
    renamed["safetensors"].write_bytes(open(paths["pth"], "rb").read())
    with pytest.raises(CheckpointError, match="is a safetensors file.*rename it to .safetensors"):
        load_pretrained(STViT(metas["pth"]["arch"]), renamed["pth"])
    with pytest.raises(CheckpointError, match=r"is a PyTorch \(torch.save\) checkpoint.*Rename it to .pth"):
        load_pretrained(STViT(metas["pth"]["arch"]), renamed["safetensors"])


def test_export_into_another_family_or_variant(det_exports):
    paths, metas = det_exports
    hatnet = HATNet("shrunk")
    stvit_small = STViT("small")
    for path in paths.values():
        with pytest.raises(CheckpointError, match="is an export of a stvit backbone; the model is HATNet"):
            load_pretrained(hatnet, path)
        with pytest.raises(
            CheckpointError,
            match=r"exported from a stvit with embed_dims=\[32, 64, 128, 256\].*"
            r"the model has embed_dims=\[64, 128, 320, 512\]",
        ):
            load_pretrained(stvit_small, path)


def test_config_errors(det_run, seg_run, tmp_path):
    ckpt = det_run.ckpt
    # A checkpoint without the config that tools/train.py stores (e.g. written by other code): --config needed.
    obj = torch.load(ckpt, map_location="cpu", weights_only=True)
    del obj["mm_config"]
    bare = tmp_path / "work" / "last.ckpt"
    bare.parent.mkdir()
    torch.save(obj, bare)
    with pytest.raises(ExportError, match=r"does not record its config.*--config"):
        export_backbone(bare, tmp_path / "x.pth")
    with pytest.raises(CheckpointError, match="holds a stvit backbone, but the config describes HATNet"):
        export_backbone(ckpt, tmp_path / "x.pth", config=seg_run.config)


def test_config_and_metrics_stored_in_the_lightning_checkpoint_are_used(det_run, tmp_path):
    """tools/train.py's checkpoints carry the resolved config text ('mm_config') and the last validation
    metrics ('val_metrics'), plain types that weights_only loading accepts: no --config needed."""
    ckpt, config, metrics = det_run.ckpt, det_run.config, det_run.metrics
    obj = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert isinstance(obj["mm_config"], str) and flat_metrics(obj["val_metrics"]) == pytest.approx(
        flat_metrics(metrics), nan_ok=True
    )
    meta = export_backbone(ckpt, tmp_path / "bb.safetensors")
    assert meta["config"]["source"] == "checkpoint" and meta["config"]["path"] is None
    assert flat_metrics(meta["metrics"]) == pytest.approx(flat_metrics(metrics), nan_ok=True)
    assert meta["metrics_source"] == "checkpoint['val_metrics']" and meta["best"]["monitor"] == "bbox_mAP"
    assert meta["sha256"] == export_backbone(ckpt, tmp_path / "bb2.pth", config=config)["sha256"]


def test_official_export_refuses_output_norms(tmp_path):
    arch = dict(
        embed_dims=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        num_heads=[1, 2, 3, 4],
        n_iter=[1, 1, 1, 1],
        stoken_size=[8, 4, 1, 1],
        layerscale=[False] * 4,
        init_values=1e-5,
    )
    with pytest.raises(ExportError, match=r"output norms \(norm_out=True.*--format pth or safetensors"):
        _official_export(tmp_path, STViT(arch, norm_out=True), "STViT", arch, norm_out=True)
    assert not (tmp_path / "official.pth").exists()


def test_config_text_in_a_checkpoint_is_never_executed(det_run, tmp_path):
    """The config stored in a checkpoint is read as literals only: a crafted one cannot run code."""
    ckpt = det_run.ckpt
    marker = tmp_path / "pwned"
    obj = torch.load(ckpt, map_location="cpu", weights_only=True)
    obj["mm_config"] = f"import os\nos.system('touch {marker}')\n" + obj["mm_config"]
    evil = tmp_path / "evil.ckpt"
    torch.save(obj, evil)
    with pytest.raises(ExportError, match="not plain literals.*not executed.*--config"):
        export_backbone(evil, tmp_path / "x.pth")
    assert not marker.exists() and not (tmp_path / "x.pth").exists()


def test_the_export_tools_print_the_metrics_without_the_per_class_results(seg_run, tmp_path, capsys):
    # the meta keeps every class's IoU and Acc (on ADE20K, 150 classes); the summary printed a line of thousands
    # of characters with them
    capsys.readouterr()
    export_backbone_tool.main([seg_run.ckpt, "--out", str(tmp_path / "bb.pth")])
    meta = export_model_tool.main([seg_run.ckpt, "--out", str(tmp_path / "model.pth")])
    out = capsys.readouterr().out
    assert "per_class" in meta["metrics"] and "per_class" not in out
    assert out.count(f"mIoU={seg_run.metrics['mIoU']:.4g}") == 2
    assert max(len(line) for line in out.splitlines()) < 250, out


@pytest.mark.parametrize("fmt", ["pth", "safetensors", "official", "onnx"])
def test_save_backbone_refuses_tensors_that_do_not_fit_the_model(tmp_path, fmt):
    """``save_backbone(sd, model, out)`` with tensors of another model used to write them under the model's
    family and arch (pth, safetensors, official: an export that no model of that arch loads) or fail inside
    torch's ``load_state_dict`` (onnx); it now refuses before writing, naming the keys."""
    from backbones.checkpoints.export import save_backbone

    model = STViT("shrunk")
    sd = HATNet("shrunk").state_dict()
    out = tmp_path / ("x.onnx" if fmt == "onnx" else "x.safetensors" if fmt == "safetensors" else "x.pth")
    with pytest.raises(ExportError, match=r"do not fit the STViT.*Missing keys.*Unexpected keys.*blocks\.0\.0\."):
        save_backbone(sd, model, out, fmt)
    assert not out.exists() and not os.listdir(tmp_path)
    grown = dict(model.state_dict(), **{"patch_embed.proj.0.weight": torch.zeros(1)})
    with pytest.raises(ExportError, match=r"Shape mismatches \(1\): patch_embed\.proj\.0\.weight"):
        save_backbone(grown, model, out, fmt)
    assert not os.listdir(tmp_path)


def test_onnx_export_is_verified_and_refused_as_weights(tmp_path):
    """``verify_export`` on an ONNX export said "corrupt or not a PyTorch checkpoint", and so did
    ``load_pretrained``; the graph is now checked and its meta returned, a damaged graph is named as such, and
    loading weights from it says to use the .pth / .safetensors export."""
    from backbones.checkpoints.export import save_backbone

    # the smallest graph: the export is the slow part
    arch = dict(FAMILIES["stvit"].sizes["shrunk"], depths=[1, 1, 1, 1])
    model = STViT(arch)
    out = tmp_path / "b.onnx"
    meta = save_backbone(model.state_dict(), model, out)
    assert verify_export(out) == meta and meta["format"] == "onnx"
    with pytest.raises(CheckpointError, match=r"b\.onnx' is an ONNX graph.*\.pth or \.safetensors export"):
        load_pretrained(STViT(arch), out)
    data = out.read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.onnx' is not a valid ONNX graph"):
        verify_export(tmp_path / "cut.onnx")
