"""backbones.set_fast_paths / backbones.fast_paths: one public switch that every speed path reads."""

import pytest
import torch

import backbones
from backbones import fast_paths, set_fast_paths
from backbones.stvit import Attention, Mlp


def _grad_fns(y: torch.Tensor) -> set[str]:
    """Names of every autograd node that produced y."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn.name() not in seen:
            seen.add(fn.name())
            todo += [f for f, _ in fn.next_functions]
    return seen


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
        fast = _grad_fns(mlp(x)) | _grad_fns(attn(t))
    with fast_paths(False, **forcing):
        plain = _grad_fns(mlp(x)) | _grad_fns(attn(t))
    assert {"_OverlappingRowsBackward", "_MlpTailBackward", "_OneDnnAttentionBackward"} <= fast
    assert not any(name.startswith("_") for name in plain), plain
