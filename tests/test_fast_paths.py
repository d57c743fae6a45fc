"""backbones.set_fast_paths / backbones.fast_paths: one public switch that every speed path reads."""

import pytest
import torch

import backbones
from backbones import FAMILIES, fast_paths, set_fast_paths
from backbones.models.stvit import Attention, Mlp
from tests._tools import grad_fns


def test_set_fast_paths_returns_the_previous_setting():
    assert backbones.fast_paths_enabled()
    try:
        assert set_fast_paths(False) is True
        assert not backbones.fast_paths_enabled()
        assert set_fast_paths(False) is False
    finally:
        assert set_fast_paths(True) is False
    with pytest.raises(TypeError, match="True or False"):
        set_fast_paths(0)


def test_context_manager_restores_switch_and_limits_after_an_error():
    before = backbones.fast_paths_enabled()
    with pytest.raises(RuntimeError, match="inside"):
        with fast_paths(False, row_chunk_bytes=123) as limits:
            assert not backbones.fast_paths_enabled() and limits.row_chunk_bytes == 123
            raise RuntimeError("inside")
    assert backbones.fast_paths_enabled() is before
    with fast_paths(True) as limits:
        assert limits.row_chunk_bytes != 123
    with pytest.raises(TypeError, match="unknown limits.*row_chunks"):
        with fast_paths(True, row_chunks=1):
            pass


def test_every_fast_path_reads_the_switch():
    """With limits that make a tiny input take every fast path, switching off leaves only the plain ops."""
    torch.manual_seed(0)
    mlp, attn = Mlp(8, 32).train(), Attention(16, 2).train()
    x = torch.randn(1, 8, 12, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    t = torch.randn(1, 16, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()
    forcing = dict(row_chunk_bytes=2 * 32 * 10 * 4 * 2, mlp_recompute_numel=0, attention_min_keys=1)
    with fast_paths(True, **forcing):
        fast = grad_fns(mlp(x)) | grad_fns(attn(t))
    with fast_paths(False, **forcing):
        plain = grad_fns(mlp(x)) | grad_fns(attn(t))
    assert {"_OverlappingRowsBackward", "_MlpTailBackward", "_OneDnnAttentionBackward"} <= fast
    assert not any(name.startswith("_") for name in plain), plain


@pytest.mark.parametrize("family", FAMILIES.values(), ids=lambda f: f.name)
def test_checkpoint_recomputation_takes_the_paths_of_its_forward(family):
    """with_cp recomputes each block in backward with the op set its forward used, even when the switch has
    changed by then: the gradients are bit-identical to a backward under the forward's setting (recomputing on
    the other path would change the saved tensors' layout or count, which checkpointing rejects, or round
    differently)."""
    torch.manual_seed(0)
    model = family.cls(family.sizes["shrunk"], with_cp=True).train()
    x = torch.randn(2, 3, 72, 100)
    forcing = dict(row_chunk_bytes=4096, mlp_recompute_numel=0, attention_min_keys=1)
    grads = []
    for backward_fast in (True, False):
        model.zero_grad()
        with fast_paths(True, **forcing):
            outs = model(x)
        with fast_paths(backward_fast):
            sum(o.square().sum() for o in outs).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_model_files_hold_no_switch_reads():
    """The model files call the ops of ``backbones.ops.table`` and their own ops file, and never read the switch
    themselves."""
    import ast
    import inspect

    for name, family in FAMILIES.items():
        tree = ast.parse(inspect.getsource(inspect.getmodule(family.cls)))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & {"enabled", "fast_paths_enabled", "is_tracing", "recorder_for"}, name
        assert not any(m and m.endswith("switch") for m in modules), name
