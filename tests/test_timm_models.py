"""The families' official classification models as timm models (backbones/timm_models.py): registered by
``import backbones`` once timm is imported; logits equal to the official code's (tests/data/official_logits.pt,
made from the official model files, tests/data/README.md) through ``pretrained_cfg_overlay=dict(file=...)`` on a
release-style file; timm's dense-prediction contract against our backbones; the ``timm`` export through
``local-dir:``; transformers' TimmBackbone and Mask2Former on our names."""

import argparse
import ast
import json
import subprocess
import sys

import pytest
import timm
import torch

from backbones import FAMILIES, load_pretrained
from backbones.errors import CheckpointError
from backbones.timm_models import TimmModel, model_names
from tests._tools import GOLDEN_CASES, assert_close, load_tool

NAMES = sorted(name for family in FAMILIES.values() for name in model_names(family))


def test_import_backbones_registers_the_seven_models_once_timm_is_imported():
    """``import backbones`` leaves timm unimported; transformers' find_spec('timm') imports nothing; the first
    ``import timm`` registers them."""
    code = (
        "import importlib.util, sys, backbones\n"
        "assert 'timm' not in sys.modules\n"
        "assert importlib.util.find_spec('timm') is not None and 'timm' not in sys.modules\n"
        "import timm\n"
        "print(timm.list_models(module='timm_models'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    names = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert (
        names
        == NAMES
        == [f"hatnet_{v}" for v in ("large", "medium", "small", "tiny")]
        + [f"stvit_{v}" for v in ("base", "large", "small")]
    )
    cfg = timm.get_pretrained_cfg("hatnet_small.in1k")
    assert cfg.url.endswith("/v2.0/HAT-Net_Small.pth") and cfg.input_size == (3, 224, 224)
    assert (cfg.first_conv, cfg.classifier) == ("backbone.patch_embed.0", "head.fc")


@pytest.fixture(scope="module", params=sorted(GOLDEN_CASES))
def release(request, reference_dir, tmp_path_factory):
    """A golden case as a release as downloaded (DeiT-style: ``model``, a different ``model_ema``, ``args`` as an
    argparse.Namespace), with the timm arguments of its arch and the official logits."""
    data = torch.load(reference_dir / request.param, weights_only=True)
    sd = data["state_dict"]
    path = tmp_path_factory.mktemp("release") / "release.pth"
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in sd.items()}
    torch.save({"model": sd, "model_ema": ema, "args": argparse.Namespace(drop=0.0), "epoch": 299}, path)
    cls, arch = GOLDEN_CASES[request.param]
    family = FAMILIES[cls.family]
    kwargs = dict(arch=arch, head_args={"projection": sd["proj.weight"].shape[0]} if "proj.weight" in sd else None)
    logits = torch.load(reference_dir / "official_logits.pt", weights_only=True)[request.param]
    return dict(path=path, cls=cls, arch=arch, name=model_names(family)[0], kwargs=kwargs, data=data, logits=logits)


def _create(release, **kwargs):
    overlay = dict(file=str(release["path"]))
    model = timm.create_model(
        release["name"], pretrained=True, pretrained_cfg_overlay=overlay, **release["kwargs"], **kwargs
    )
    return model.eval()


def test_logits_equal_the_official_models(release):
    model = _create(release)
    with torch.no_grad():
        for x, expected in zip(release["data"]["inputs"], release["logits"]):
            assert_close(model(x), expected, f"{release['name']} {tuple(x.shape)} logits")


def test_features_only_and_forward_intermediates_equal_the_backbone(release):
    """At a size that does not divide by 32: features_only = our backbone loaded from the same file;
    forward_intermediates = features_only, its final output = forward_features."""
    ours = release["cls"](release["arch"]).eval()
    load_pretrained(ours, release["path"])
    features = _create(release, features_only=True, out_indices=(0, 2, 3))
    model = _create(release)
    assert features.feature_info.channels() == [ours.stage_channels[i] for i in (0, 2, 3)]
    for info in model.feature_info:
        model.get_submodule(info["module"])  # names a real module
    x = torch.randn(1, 3, 100, 140, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ours(x)
        got = features(x)
        final, inter = model.forward_intermediates(x, indices=[0, 2, 3])
        nhwc = model.forward_intermediates(x, indices=2, output_fmt="NHWC", intermediates_only=True)
        last = model.forward_features(x)
    for e, f, i in zip([expected[k] for k in (0, 2, 3)], got, inter):
        torch.testing.assert_close(f, e, rtol=0, atol=0)
        torch.testing.assert_close(i, e, rtol=0, atol=0)
    torch.testing.assert_close(final, last, rtol=0, atol=0)
    torch.testing.assert_close(nhwc[1], expected[3].permute(0, 2, 3, 1), rtol=0, atol=0)


def test_classifier_interface_checkpointing_and_pruning(release):
    model = _create(release, num_classes=10)  # the release's 1000-class classifier is left out, the rest loads
    assert model.get_classifier().out_features == 10 and model.num_classes == 10
    key = next(k for k in release["data"]["state_dict"] if k.startswith("patch_embed."))
    assert torch.equal(model.backbone.state_dict()[key], release["data"]["state_dict"][key])
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    runs = []
    for cp in (False, True):  # activation checkpointing: the same outputs and gradients
        model.set_grad_checkpointing(cp)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        runs.append((out.detach(), [p.grad.clone() for p in model.backbone.parameters() if p.grad is not None]))
    assert model.backbone.with_cp is True
    torch.testing.assert_close(runs[0][0], runs[1][0])
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b)
    pre = model.forward_head(model.forward_features(x), pre_logits=True)
    assert pre.shape == (2, model.head_hidden_size)
    model.reset_classifier(0, "")
    assert model.eval()(x).dim() == 4 and model.num_classes == 0
    with pytest.raises(ValueError, match="global_pool='' .* needs num_classes=0"):
        model.reset_classifier(5, "")
    take = model.prune_intermediate_layers([0, 1])
    assert take == [0, 1] and len(model.feature_info) == 2 and not list(model.head.parameters())
    with torch.no_grad():
        assert [t.shape[1] for t in model.forward_intermediates(x, intermediates_only=True)] == [
            i["num_chs"] for i in model.feature_info
        ]
    with pytest.raises(ValueError, match="in_chans must be 3"):
        timm.create_model(release["name"], in_chans=1)


def test_a_file_of_another_variant_is_named(release):
    other = next(model_names(f)[0] for f in FAMILIES.values() if f.cls is not release["cls"])  # another family's
    with pytest.raises(CheckpointError, match="does not fit"):
        timm.create_model(other, pretrained=True, pretrained_cfg_overlay=dict(file=str(release["path"])))


def test_timm_export_of_a_release_and_of_a_training_run(det_run, reference_dir, tmp_path):
    """``--format timm``: an official release keeps its head, a training run's backbone has none; both build
    and load through ``local-dir:``."""
    tool = load_tool("export_backbone")
    case = "hatnet_tiny_g8771.pt"
    cls, arch = GOLDEN_CASES[case]
    data = torch.load(reference_dir / case, weights_only=True)
    release = tmp_path / "HAT-Net_Tiny.pth"
    torch.save({"model": data["state_dict"], "args": argparse.Namespace(model="HAT_Net_tiny")}, release)
    with pytest.raises(CheckpointError, match="no released variant"):
        tool.main([str(release), "--format", "timm", "--out", str(tmp_path / "t")])

    meta = tool.main([det_run.ckpt, "--format", "timm", "--out", str(tmp_path / "run"), "--config", det_run.config])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json", "model.safetensors"]
    assert config["architecture"] == "stvit_small" and config["model_args"]["with_head"] is False
    assert config["meta"]["sha256"] == meta["sha256"] and config["pretrained_cfg"]["first_conv"]
    model = timm.create_model(f"local-dir:{tmp_path / 'run'}", pretrained=True, features_only=True).eval()
    ours = FAMILIES["stvit"].cls(**{k: v for k, v in meta["backbone_cfg"].items() if k != "type"}).eval()
    load_pretrained(ours, det_run.ckpt)
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        for a, b in zip(model(x), ours(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    tool.main([det_run.ckpt, "--format", "timm", "--out", str(tmp_path / "run"), "--config", det_run.config])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


@pytest.mark.parametrize("variant", ["tiny"])
def test_a_released_variant_round_trips_with_its_head(variant, tmp_path):
    """A release of hatnet_tiny (random weights in the official layout) -> --format timm -> local-dir: the same
    logits as the model loaded from the release."""
    source = timm.create_model(f"hatnet_{variant}", num_classes=1000).eval()
    official = {k.removeprefix("backbone."): v for k, v in source.state_dict().items() if k.startswith("backbone.")}
    official.update({k.replace("head.fc.", "classifier.1."): v for k, v in source.state_dict().items() if "head." in k})
    release = tmp_path / "HAT-Net.pth"
    torch.save({"model": official, "args": argparse.Namespace(model=f"HAT_Net_{variant}")}, release)
    load_tool("export_backbone").main([str(release), "--format", "timm", "--out", str(tmp_path / "timm")])
    model = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), rtol=0, atol=0)


def test_transformers_timm_backbone_and_mask2former_train_on_our_names():
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        TimmBackbone,
        TimmBackboneConfig,
    )

    torch.manual_seed(0)
    backbone = TimmBackbone(TimmBackboneConfig(backbone="hatnet_tiny", out_indices=(1, 2, 3))).eval()
    ours = FAMILIES["hatnet"].cls("tiny", out_indices=(1, 2, 3)).eval()
    ours.load_state_dict({k.removeprefix("model.backbone."): v for k, v in backbone._backbone.state_dict().items()})
    x = torch.randn(1, 3, 80, 112)
    with torch.no_grad():
        for a, b in zip(backbone(x).feature_maps, ours(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert backbone.channels == ours.out_channels

    cfg = Mask2FormerConfig(
        backbone_config=TimmBackboneConfig(backbone="stvit_small", out_indices=(0, 1, 2, 3)),
        num_queries=8, encoder_layers=1, decoder_layers=2, hidden_dim=64, feature_size=64, mask_feature_size=64,
        encoder_feedforward_dim=128, dim_feedforward=128, num_attention_heads=4, train_num_points=256, num_labels=3,
    )  # fmt: skip
    model = Mask2FormerForUniversalSegmentation(cfg).train()
    masks = [torch.randint(0, 2, (2, 96, 128)).float() for _ in range(2)]
    out = model(pixel_values=torch.randn(2, 3, 96, 128), mask_labels=masks, class_labels=[torch.tensor([0, 2])] * 2)
    out.loss.backward()
    encoder = list(model.model.pixel_level_module.encoder.parameters())
    assert torch.isfinite(out.loss) and all(p.grad is not None for p in encoder)


def test_official_files_do_not_replace_ours_in_timms_registry(tmp_path):
    from perf.official import load_official

    official = tmp_path / "stvit.py"
    official.write_text(
        "from timm.models.registry import register_model\n"
        "class STViT: pass\n"
        "class StokenAttention: pass\n"
        "@register_model\n"
        "def stvit_small(args):\n"
        "    return STViT()\n"
    )
    module, family = load_official(official)
    assert family == "stvit" and module.stvit_small.__module__ != "backbones.timm_models"
    assert timm.models.model_entrypoint("stvit_small").__module__ == "backbones.timm_models"
    assert isinstance(timm.create_model("stvit_small", arch="shrunk"), TimmModel)
