"""perf.models: the one model builder of the measuring tools. Swin-T comes from whichever library is installed
(mmdet on the test machine, timm or torchvision on a GPU machine without mm packages): the sources must be the
same architecture, or the reports' "vs Swin-T" columns would compare different baselines."""

import ast
import warnings
from pathlib import Path

import pytest
import torch

from backbones import FAMILIES
from perf.models import NAMES, PlainPath, build, swin_t
from perf.timing import make_step, throughput, time_models, time_phases

from ._tools import REPO


@pytest.mark.parametrize("shrunk", [True, False])
def test_swin_t_is_the_same_architecture_from_mmdet_and_torchvision(shrunk):
    pytest.importorskip("mmdet")
    mm, tv = swin_t(shrunk=shrunk, source="mmdet"), swin_t(shrunk=shrunk, source="torchvision")
    # the same weights but for the LayerNorms: mmdet normalises every stage output, torchvision only the last one
    params = [
        sum(p.numel() for mod in m.modules() if not isinstance(mod, torch.nn.LayerNorm) for p in mod.parameters(False))
        for m in (mm, tv)
    ]
    assert params[0] == params[1]
    x = torch.randn(1, 3, 64, 96)
    mm.eval(), tv.eval()  # mmdet's train() returns None: not chained
    with torch.no_grad():
        shapes = [[tuple(o.shape) for o in m(x)] for m in (mm, tv)]
    assert shapes[0] == shapes[1] and len(shapes[0]) == 4
    assert shapes[0][0] == (1, 32 if shrunk else 96, 16, 24)  # NCHW at stride 4


def test_timing_helpers_take_mmdets_swin_t_whose_train_returns_none():
    # the GPU report's throughput rows with mmdet installed: nothing may chain model.eval() / model.train()
    pytest.importorskip("mmdet")
    model, x = swin_t(shrunk=True, source="mmdet"), torch.randn(1, 3, 64, 64)
    assert throughput(model, x, warmup=0, repeat=1) > 0 and not model.training
    (seconds,) = time_models({"swin": model}, x, "train", "fp32", warmup=0, repeat=1).values()
    assert seconds > 0 and model.training


def test_a_training_step_times_its_forward_and_backward_apart():
    model, x = build("ours", "hatnet", "shrunk"), torch.randn(1, 3, 64, 64)
    step = make_step(model, x, "train", "fp32")
    step.forward()  # the model and its loss: a graph, no gradient yet
    assert all(p.grad is None for p in model.parameters())
    step.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with pytest.raises(RuntimeError, match="without a step.forward"):
        step.backward()  # the loss went with the first backward
    assert make_step(model, x, "infer", "fp32").backward is None
    (phases,) = time_phases({"ours": model}, x, "fp32", warmup=0, repeat=2).values()
    assert 0 < phases["forward"] < phases["step"] and 0 < phases["backward"] < phases["step"]


def test_mmdet_swin_t_leaves_the_default_scope_as_it_was():
    # built after an mmseg model in the same process (the benchmark tests do), with mmdet's own registry: no
    # "register_all_modules will force the current default scope" warning, and the mmseg scope stays
    pytest.importorskip("mmdet")
    from mmengine.registry import DefaultScope

    from tasks.config.scopes import register_scope

    register_scope("mmseg")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swin_t(shrunk=True, source="mmdet")
    assert DefaultScope.get_current_instance().scope_name == "mmseg"


def test_reference_is_ours_on_the_plain_path_with_the_same_weights():
    ours, ref = build("ours", "hatnet", "shrunk"), build("reference", "hatnet", "shrunk")
    assert isinstance(ref, PlainPath)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.backbone.state_dict().values()))
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        for a, b in zip(ours.eval()(x), ref.eval()(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown model 'swin-b'; choose one of " + ", ".join(NAMES)):
        build("swin-b")
    with pytest.raises(ValueError, match="Swin-T source 'keras'"):
        swin_t(source="keras")


def test_named_settings_are_the_configs_variables():
    # one value: a family's named setting is what its configs write as `<setting>_<option>` (STViT's "dense" rows
    # measure the COCO configs' dense_stoken_size); the reports read it from the record, the configs from themselves
    found = []
    for family in FAMILIES.values():
        for setting, options in family.settings.items():
            for option, value in options.items():
                name = f"{setting}_{option}"
                for path in sorted(Path(REPO, "configs").rglob("*.py")):
                    for node in ast.parse(path.read_text()).body:
                        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                            assert list(ast.literal_eval(node.value)) == list(value), (path, name)
                            found.append(path.name)
    assert "mask-rcnn_stvit-s_fpn_1x_coco.py" in found
