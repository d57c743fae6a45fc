"""ONNX export of a backbone: onnxruntime computes what PyTorch computes, at sizes other than the traced one."""

import json

import onnx
import onnxruntime as ort
import pytest
import torch

from backbones import HATNet
from backbones.checkpoints.export import export_onnx
from tests._tools import DET_CFG, SHRUNK, assert_close, load_tool, warnings_as_errors

# 96x128 divides by every grid; 100x140 by none (STViT pads to whole super tokens, HAT-Net has partial
# border windows and pooled cells)
SIZES = [(1, 96, 128), (2, 100, 140)]


def _run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x.numpy()})


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_onnxruntime_equals_pytorch_at_sizes_other_than_the_export_size(cls, arch, tmp_path):
    torch.manual_seed(0)
    model = cls(arch, out_indices=(0, 1, 2, 3)).train()
    path = tmp_path / "backbone.onnx"
    with warnings_as_errors():  # the tracer's notes are expected and filtered in export_onnx, nothing else
        names = export_onnx(model, path, example_size=(64, 96))  # traced at a third size
    assert names == ["stage0", "stage1", "stage2", "stage3"] and model.training  # mode restored
    graph = onnx.load(str(path))
    assert [i.name for i in graph.graph.input] == ["image"] and [o.name for o in graph.graph.output] == names
    model.eval()
    for batch, h, w in SIZES:
        x = torch.randn(batch, 3, h, w)
        with torch.no_grad():
            expected = model(x)
        outs = _run(path, x)
        assert [o.shape for o in outs] == [tuple(e.shape) for e in expected]
        for i, (o, e) in enumerate(zip(outs, expected)):
            assert_close(torch.from_numpy(o), e, f"{cls.__name__} {h}x{w} stage {i}")  # 1e-4 of the tensor's scale


def test_selected_stages_only(tmp_path):
    torch.manual_seed(0)
    model = HATNet("shrunk", out_indices=(1, 3)).eval()
    path = tmp_path / "two.onnx"
    assert export_onnx(model, path) == ["stage1", "stage3"]
    x = torch.randn(1, 3, 100, 140)
    with torch.no_grad():
        expected = model(x)
    for o, e in zip(_run(path, x), expected):
        assert_close(torch.from_numpy(o), e, "stage")


def test_export_backbone_tool_writes_onnx_from_a_checkpoint(tmp_path):
    """tools/export_backbone.py CKPT --format onnx --out FILE.onnx on an mm-format checkpoint of the demo
    detector's backbone: the graph computes that backbone, and carries the export's meta."""
    from tasks.config.load import load_config
    from tasks.deploy.export import backbone_config, build_backbone

    family, bcfg = backbone_config(load_config(DET_CFG))
    torch.manual_seed(1)
    model = build_backbone(family, bcfg).eval()
    ckpt = tmp_path / "det.pth"
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in model.state_dict().items()}}, ckpt)
    out = tmp_path / "stvit.onnx"
    meta = load_tool("export_backbone").main([str(ckpt), "--format", "onnx", "--out", str(out), "--config", DET_CFG])
    assert meta["format"] == "onnx" and meta["family"] == family
    stored = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(stored["meta"])["sha256"] == meta["sha256"]
    x = torch.randn(1, 3, 100, 140)
    with torch.no_grad():
        expected = model(x)
    outs = _run(out, x)
    assert len(outs) == len(expected)
    for o, e in zip(outs, expected):
        assert_close(torch.from_numpy(o), e, "stage")
