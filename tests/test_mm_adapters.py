"""The registry adapters: buildable from mmdet and mmseg, init_cfg=Pretrained == load_pretrained."""

import pytest
import torch

import backbones
from backbones import FAMILIES, HATNet, STViT, load_pretrained
from backbones.checkpoints import download
from backbones.errors import CheckpointError
from tests._tools import official_file

pytest.importorskip("mmcv.ops", reason="mmcv with compiled ops is installed by tools/setup_env.sh")


@pytest.mark.parametrize("registry", ["mmdet", "mmseg"])
@pytest.mark.parametrize("family", backbones.FAMILIES.values(), ids=lambda f: f.name)
def test_build_from_registry_with_pretrained(tmp_path, registry, family):
    type_, cls, arch = family.type_name, family.cls, family.sizes["shrunk"]
    MODELS = __import__(f"{registry}.registry", fromlist=["MODELS"]).MODELS
    torch.manual_seed(0)
    src = cls(arch).eval()
    path = official_file(src, tmp_path / "official.pth")
    model = MODELS.build(
        dict(type=type_, arch=arch, out_indices=(0, 1, 2, 3), init_cfg=dict(type="Pretrained", checkpoint=str(path)))
    )
    assert isinstance(model, cls)
    model.init_weights()
    model.eval()
    ref = cls(arch).eval()
    load_pretrained(ref, path)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        for a, b in zip(model(x), ref(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert list(model.state_dict()) == list(ref.state_dict())


@pytest.mark.parametrize("scope", ["mmdet", "mmseg"])
@pytest.mark.parametrize("family", backbones.FAMILIES.values(), ids=lambda f: f.name)
def test_scoped_type_names_build_in_their_library(scope, family):
    type_, cls, arch = family.type_name, family.cls, family.sizes["shrunk"]
    # type='mmdet.STViT' (mm's cross-library form) searches mmdet's registry alone, not the root one
    from tasks.config.scopes import register_scope

    register_scope(scope)
    MODELS = __import__(f"{scope}.registry", fromlist=["MODELS"]).MODELS
    model = MODELS.build(dict(type=f"{scope}.{type_}", arch=arch, out_indices=(3,)))
    assert isinstance(model, cls) and model.out_indices == (3,)


def test_detector_keys_are_backbone_keys_with_prefix(tmp_path):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope
    from mmengine.runner import save_checkpoint

    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope("mmdet"):  # another test of this process may have left mmseg's
        det = _build_retinanet(MODELS)
    pure = STViT("shrunk", out_indices=(1, 2, 3))
    det_keys = [k[len("backbone.") :] for k in det.state_dict() if k.startswith("backbone.")]
    assert det_keys == list(pure.state_dict())
    # A whole-detector checkpoint feeds a backbone through init_cfg with prefix='backbone.'.
    ckpt = tmp_path / "det.pth"
    save_checkpoint({"state_dict": det.state_dict(), "meta": {}}, str(ckpt))
    bb = backbones.mm.ADAPTERS["stvit"](
        arch="shrunk", out_indices=(1, 2, 3), init_cfg=dict(type="Pretrained", checkpoint=str(ckpt), prefix="backbone.")
    )
    bb.init_weights()
    for k, v in bb.state_dict().items():
        torch.testing.assert_close(v, det.state_dict()[f"backbone.{k}"], rtol=0, atol=0)


def _mmseg_stock_with_our_backbone(pretrained=...):
    """mmseg's own UperNet R-50 config (model.pretrained='open-mmlab://resnet50_v1c') with only the
    backbone swapped for a shrunk HAT-Net."""
    from mmengine.config import Config, ConfigDict

    cfg = Config.fromstring("_base_ = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'", ".py")
    model = cfg.model
    assert model.pretrained == "open-mmlab://resnet50_v1c"  # what the stock config forwards to the backbone
    if pretrained is not ...:
        model.pretrained = pretrained
    model.backbone = ConfigDict(type="HATNet", arch="shrunk", init_cfg=None)
    model.decode_head.update(in_channels=FAMILIES["hatnet"].sizes["shrunk"]["dims"], channels=16)
    model.auxiliary_head.update(in_channels=FAMILIES["hatnet"].sizes["shrunk"]["dims"][2], channels=16)
    return model


def _build_mmseg(model_cfg):
    from mmengine.registry import DefaultScope
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope("mmseg"):
        return MODELS.build(model_cfg)


@pytest.mark.parametrize(
    "pretrained",
    [
        "stock",
        "torchvision://resnet50",
        "https://example.org/r50.pth",
        "pretrained/missing_resnet50.pth",
        "resnet_file",
    ],
)
def test_forwarded_model_pretrained_is_refused_naming_it_and_the_fix(tmp_path, monkeypatch, pretrained):
    # the URL's download fails here (no network); its retries' back-off (14 s) is tests/test_download.py's subject
    monkeypatch.setattr(download, "BACKOFF_S", 0.0)
    if pretrained == "resnet_file":  # an existing checkpoint, of another network
        pretrained = str(tmp_path / "resnet50.pth")
        torch.save({"state_dict": {"conv1.weight": torch.zeros(64, 3, 7, 7)}}, pretrained)
    model_cfg = _mmseg_stock_with_our_backbone(... if pretrained == "stock" else pretrained)
    shown = model_cfg.pretrained
    with pytest.raises(CheckpointError) as info:
        _build_mmseg(model_cfg)
    msg = str(info.value)
    assert f"pretrained={shown!r}" in msg and "model.pretrained" in msg and "model.pretrained=None" in msg, msg
    assert "init_cfg=dict(type='Pretrained', checkpoint=" in msg, msg


def test_the_named_fix_builds_and_loads_through_init_cfg(tmp_path):
    """model.pretrained=None and the backbone's weights through backbone.init_cfg, as the error says."""
    src = official_file(HATNet("shrunk"), tmp_path / "hatnet.pth")
    model_cfg = _mmseg_stock_with_our_backbone(None)
    model_cfg.backbone.init_cfg = dict(type="Pretrained", checkpoint=str(src))
    seg = _build_mmseg(model_cfg)
    seg.backbone.init_weights()
    ref = HATNet("shrunk")
    load_pretrained(ref, src)
    for k, v in ref.state_dict().items():
        assert torch.equal(seg.backbone.state_dict()[k], v), k


def test_plain_backbone_pretrained_url_is_refused_clearly():
    with pytest.raises(
        CheckpointError,
        match=r"'open-mmlab://resnet50_v1c' is a URL .*cannot fetch.*local files and http\(s\):// URLs",
    ):
        STViT("shrunk", pretrained="open-mmlab://resnet50_v1c")


def _build_retinanet(models):
    """A tiny RetinaNet around the shrunk STViT."""
    return models.build(
        dict(
            type="RetinaNet",
            data_preprocessor=dict(type="DetDataPreprocessor", mean=[0, 0, 0], std=[1, 1, 1], bgr_to_rgb=True),
            backbone=dict(type="STViT", arch="shrunk", out_indices=(1, 2, 3)),
            neck=dict(
                type="FPN",
                in_channels=[64, 128, 256],
                out_channels=32,
                start_level=0,
                add_extra_convs="on_input",
                num_outs=5,
            ),
            bbox_head=dict(
                type="RetinaHead",
                num_classes=3,
                in_channels=32,
                feat_channels=32,
                anchor_generator=dict(
                    type="AnchorGenerator",
                    octave_base_scale=4,
                    scales_per_octave=3,
                    ratios=[0.5, 1.0, 2.0],
                    strides=[8, 16, 32, 64, 128],
                ),
                bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4, target_stds=[1.0] * 4),
                loss_cls=dict(type="FocalLoss", use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=1.0),
                loss_bbox=dict(type="L1Loss", loss_weight=1.0),
            ),
        )
    )


def test_pretrained_in_an_init_cfg_list_goes_through_the_checked_loader(tmp_path):
    """mm accepts ``init_cfg`` as a list; a Pretrained entry there used to reach mmengine's non-strict
    ``load_checkpoint``, so another family's checkpoint loaded nothing without an error. It now loads through
    ``load_pretrained`` like the dict form (refusals included), after the list's other initialisers."""
    from mmdet.registry import MODELS

    torch.manual_seed(0)
    src = STViT("shrunk").eval()
    path = official_file(src, tmp_path / "official.pth")
    other = tmp_path / "hatnet.pth"
    torch.save(HATNet("shrunk").state_dict(), other)
    init = [dict(type="Normal", layer="Conv2d", std=0.01), dict(type="Pretrained", checkpoint=str(path))]
    model = MODELS.build(dict(type="STViT", arch="shrunk", init_cfg=init))
    model.init_weights()
    for k, v in src.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)
    model = MODELS.build(dict(type="STViT", arch="shrunk", init_cfg=[dict(type="Pretrained", checkpoint=str(other))]))
    with pytest.raises(CheckpointError, match=r"hatnet\.pth is a hatnet checkpoint .*, but the model is STViT\. "):
        model.init_weights()
    model = MODELS.build(dict(type="STViT", arch="shrunk", init_cfg=dict(type="Pretrained")))
    with pytest.raises(ValueError, match=r"init_cfg=dict\(type='Pretrained'\) needs checkpoint="):
        model.init_weights()


def test_an_init_cfg_of_another_form_is_refused_by_name():
    """``init_cfg='x.pth'`` (a path where mm wants a dict) failed with a bare AssertionError inside mmengine's
    ``init_weights``; it is refused when the backbone is built, with the accepted forms."""
    from mmdet.registry import MODELS

    with pytest.raises(TypeError, match=r"STViT: init_cfg must be None, a dict or a list of dicts.*got 'x\.pth'"):
        MODELS.build(dict(type="STViT", arch="shrunk", init_cfg="x.pth"))
