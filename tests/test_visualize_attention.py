"""Attention maps recorded from the backbones' own forward pass (backbones/attention_maps.py) and the
tools/visualize_attention.py pictures drawn from them."""
import os.path as osp

import numpy as np
import pytest
import torch

from backbones import HATNet, STViT
from backbones.attention_maps import (
    global_attention_map,
    last_blocks,
    record_attention,
    stoken_assignment,
    stoken_association,
    window_attention_map,
)

# shrunk archs of docs/DESIGN.md
STVIT_ARCH = dict(embed_dims=[32, 64, 128, 256], depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], n_iter=[1, 1, 1, 1],
                  stoken_size=[8, 4, 1, 1], layerscale=[False] * 4, init_values=1e-5)
HATNET_ARCH = dict(dims=[32, 64, 128, 256], head_dim=32, expansions=[4, 4, 4, 4], grid_sizes=[8, 7, 7, 1],
                   ds_ratios=[8, 4, 2, 1], depths=[1, 1, 2, 1], kernel_sizes=[3, 3, 3, 3])
# 100 x 140 input: stage maps 25x35, 13x18, 7x9, 4x5, none a multiple of its super-token / window size, so
# the records include padded super-token cells and partial border windows.
SIZE = (100, 140)


def _model(family, seed=0):
    torch.manual_seed(seed)
    model = STViT(STVIT_ARCH) if family == 'stvit' else HATNet(HATNET_ARCH)
    for m in model.modules():  # non-trivial BatchNorm statistics, as after training
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1), m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _record(model, x, blocks=None):
    with torch.no_grad(), record_attention(model, blocks) as records:
        out = model(x)
    return out, records


@pytest.fixture(scope='module')
def image():
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize('family', ['stvit', 'hatnet'])
def test_recording_leaves_the_outputs_unchanged_and_records_every_block(family, image):
    model, x = _model(family), image
    with torch.no_grad():
        plain = model(x)
    recorded, records = _record(model, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded))
    depths = model.arch['depths']
    if family == 'stvit':  # only stages with super tokens have an association to record
        assert sorted(records) == [(0, 0), (1, 0)]
    else:
        assert sorted(records) == [(i, j) for i in range(4) for j in range(depths[i])]
    assert not records or all(v['kind'] in ('stoken', 'hat') for v in records.values())
    _, nothing = _record(model, x, blocks=[])
    assert nothing == {}
    with pytest.raises(KeyError, match='no attention block'):
        _record(model, x, blocks=[(4, 0)])


def test_each_pixel_is_assigned_to_one_of_its_nine_neighbouring_super_tokens(image):
    _, records = _record(_model('stvit'), image)
    for (stage, _), rec in records.items():
        (hh, ww), (h, w), (H, W) = rec['grid'], rec['stoken_size'], rec['size']
        labels = stoken_assignment(rec)
        assert labels.shape == (2, H, W)
        ti, tj = labels // ww, labels % ww
        ci = torch.arange(H).view(1, H, 1) // h  # the pixel's own grid cell
        cj = torch.arange(W).view(1, 1, W) // w
        assert ((ti - ci).abs() <= 1).all() and ((tj - cj).abs() <= 1).all()
        assert ((ti >= 0) & (ti < hh) & (tj >= 0) & (tj < ww)).all()  # never the zero padding outside the grid
        # the chosen token has the highest association among the pixel's valid neighbours
        assoc = torch.stack([stoken_association(rec, t) for t in range(hh * ww)], -1)  # (B, H, W, tokens)
        best = assoc.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        assert (best >= assoc.amax(-1)).all()
        assert labels.unique().numel() > 1  # not a degenerate picture


def test_association_weights_sum_to_one_per_pixel(image):
    _, records = _record(_model('stvit'), image)
    for rec in records.values():
        affinity, (hh, ww), (h, w), (H, W) = rec['affinity'], rec['grid'], rec['stoken_size'], rec['size']
        assert affinity.shape == (2, hh * ww, h * w, 9) and (affinity >= 0).all()
        torch.testing.assert_close(affinity.sum(-1), torch.ones(affinity.shape[:3]))
        # Spread over the real super tokens, a pixel's weights sum to 1 minus what its cell gives to the
        # zero-padding neighbours beyond the grid border (the official code's unfold padding).
        total = sum(stoken_association(rec, t) for t in range(hh * ww))
        outside = torch.zeros(2, hh * h, ww * w)
        for cell in range(hh * ww):
            i, j = divmod(cell, ww)
            for k in range(9):
                if not (0 <= i + k // 3 - 1 < hh and 0 <= j + k % 3 - 1 < ww):
                    outside[:, i * h:(i + 1) * h, j * w:(j + 1) * w] += affinity[:, cell, :, k].reshape(2, h, w)
        torch.testing.assert_close(total + outside[:, :H, :W], torch.ones(2, H, W))
        interior = torch.zeros(H, W, dtype=torch.bool)
        interior[h:(hh - 1) * h, w:(ww - 1) * w] = True
        torch.testing.assert_close(total[:, interior], torch.ones(2, int(interior.sum())))


def test_window_attention_is_zero_outside_the_query_window(image):
    _, records = _record(_model('hatnet'), image)
    for (stage, _), rec in records.items():
        H, W = rec['size']
        if 'window_probs' not in rec:
            assert stage == 3  # grid_size 1: global attention only
            with pytest.raises(KeyError, match='no windows'):
                window_attention_map(rec, 0, 0)
            continue
        g = rec['grid_size']
        for y, x in [(0, 0), (H // 2, W // 2), (H - 1, W - 1), (H - 1, 0)]:  # incl. partial border windows
            amap = window_attention_map(rec, y, x)
            assert amap.shape == (2, rec['global_probs'].shape[1], H, W)
            inside = torch.zeros(H, W, dtype=torch.bool)
            inside[y // g * g:(y // g + 1) * g, x // g * g:(x // g + 1) * g] = True
            assert (amap[..., ~inside] == 0).all()
            assert (amap[..., inside] > 0).all()
            # all the mass stays on the window's pixels inside the map: padded keys get none
            torch.testing.assert_close(amap.sum((-2, -1)), torch.ones(amap.shape[:2]))


def test_global_attention_covers_the_pooled_map(image):
    _, records = _record(_model('hatnet'), image)
    for (stage, _), rec in records.items():
        H, W = rec['size']
        ds = HATNET_ARCH['ds_ratios'][stage] if stage < 3 else 1
        assert rec['pooled'] == (-(-H // ds), -(-W // ds)) and rec['ds_ratio'] == ds
        gmap = global_attention_map(rec, H - 1, W // 2)
        assert gmap.shape == (2, rec['global_probs'].shape[1], *rec['pooled'])
        torch.testing.assert_close(gmap.sum((-2, -1)), torch.ones(gmap.shape[:2]))
        with pytest.raises(IndexError, match='outside'):
            global_attention_map(rec, H, 0)
