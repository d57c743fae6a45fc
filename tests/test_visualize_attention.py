"""Attention maps recorded from the backbones' own forward pass (backbones/models/attention_maps.py) and the
tools/visualize_attention.py pictures drawn from them."""

import os
import os.path as osp

import numpy as np
import pytest
import torch
from PIL import Image

import backbones
from backbones import FAMILIES, Family, fast_paths, register
from backbones.errors import CheckpointError
from backbones.families import unregister
from backbones.models.attention_maps import (
    attention_modules,
    global_attention_map,
    last_blocks,
    record_attention,
    stoken_assignment,
    stoken_association,
    window_attention_map,
)
from tasks.figures.errors import FigureError
from tests._tools import DET_CFG, FAMILY_DATA, SEG_CFG, load_tool
from tests.test_family_registry import load_toy

# The models: each family's 'shrunk' preset. 100 x 140 input: stage maps 25x35, 13x18, 7x9, 4x5, none a multiple
# of its super-token / window size, so the records include padded super-token cells and partial border windows.
SIZE = (100, 140)


def _model(family, seed=0):
    torch.manual_seed(seed)
    record = backbones.FAMILIES[family]
    model = record.cls(record.sizes["shrunk"])
    for m in model.modules():  # non-trivial BatchNorm statistics, as after training
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1), m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _record(model, x, blocks=None):
    with torch.no_grad(), record_attention(model, blocks) as records:
        out = model(x)
    return out, records


@pytest.fixture(scope="module")
def image():
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", list(backbones.FAMILIES))
def test_recording_runs_the_plain_forward_and_records_every_block(family, image):
    model, x = _model(family), image
    with torch.no_grad(), fast_paths(False):
        plain = model(x)
    recorded, records = _record(model, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded))
    assert backbones.fast_paths_enabled()  # the switch is back after the block
    assert sorted(records) == FAMILY_DATA[family]["recorded_blocks"]
    assert not records or all(v["kind"] in ("stoken", "hat") for v in records.values())
    assert last_blocks(model) == [(0, 0), (1, 0), (2, 1), (3, 0)]  # depths [1, 1, 2, 1]
    _, nothing = _record(model, x, blocks=[])
    assert nothing == {}
    with pytest.raises(KeyError, match="no attention block"):
        _record(model, x, blocks=[(4, 0)])


def test_each_pixel_is_assigned_to_one_of_its_nine_neighbouring_super_tokens(image):
    _, records = _record(_model("stvit"), image)
    for rec in records.values():
        (hh, ww), (h, w), (H, W) = rec["grid"], rec["stoken_size"], rec["size"]
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
    _, records = _record(_model("stvit"), image)
    for rec in records.values():
        affinity, (hh, ww), (h, w), (H, W) = rec["affinity"], rec["grid"], rec["stoken_size"], rec["size"]
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
                    outside[:, i * h : (i + 1) * h, j * w : (j + 1) * w] += affinity[:, cell, :, k].reshape(2, h, w)
        torch.testing.assert_close(total + outside[:, :H, :W], torch.ones(2, H, W))
        interior = torch.zeros(H, W, dtype=torch.bool)
        interior[h : (hh - 1) * h, w : (ww - 1) * w] = True
        torch.testing.assert_close(total[:, interior], torch.ones(2, int(interior.sum())))


def test_window_attention_is_zero_outside_the_query_window(image):
    _, records = _record(_model("hatnet"), image)
    for (stage, _), rec in records.items():
        H, W = rec["size"]
        if "window_probs" not in rec:
            assert stage == 3  # grid_size 1: global attention only
            with pytest.raises(KeyError, match="no windows"):
                window_attention_map(rec, 0, 0)
            continue
        g = rec["grid_size"]
        for y, x in [(0, 0), (H // 2, W // 2), (H - 1, W - 1), (H - 1, 0)]:  # incl. partial border windows
            amap = window_attention_map(rec, y, x)
            assert amap.shape == (2, rec["global_probs"].shape[1], H, W)
            inside = torch.zeros(H, W, dtype=torch.bool)
            inside[y // g * g : (y // g + 1) * g, x // g * g : (x // g + 1) * g] = True
            assert (amap[..., ~inside] == 0).all()
            assert (amap[..., inside] > 0).all()
            # all the mass stays on the window's pixels inside the map: padded keys get none
            torch.testing.assert_close(amap.sum((-2, -1)), torch.ones(amap.shape[:2]))


def test_global_attention_covers_the_pooled_map(image):
    _, records = _record(_model("hatnet"), image)
    for (stage, _), rec in records.items():
        H, W = rec["size"]
        ds = FAMILIES["hatnet"].sizes["shrunk"]["ds_ratios"][stage] if stage < 3 else 1
        assert rec["pooled"] == (-(-H // ds), -(-W // ds)) and rec["ds_ratio"] == ds
        gmap = global_attention_map(rec, H - 1, W // 2)
        assert gmap.shape == (2, rec["global_probs"].shape[1], *rec["pooled"])
        torch.testing.assert_close(gmap.sum((-2, -1)), torch.ones(gmap.shape[:2]))
        with pytest.raises(IndexError, match="outside"):
            global_attention_map(rec, H, 0)


def _autograd_nodes(y: torch.Tensor) -> set[str]:
    """Names of the autograd nodes that produced y (every node visited once)."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    return {fn.name() for fn in seen}


@pytest.mark.parametrize("family", list(backbones.FAMILIES))
def test_recording_forces_the_plain_path(family, image):
    """Inside a record block the backbone computes its plain formulation whatever the switch says (the fused
    kernels never form the attention weights): no fast kernel runs, and the records are those of a plain run."""
    model, x = _model(family), image.clone().requires_grad_()  # with grad: the recomputing MLP would engage
    forcing = dict(row_chunk_bytes=4096, mlp_recompute_numel=0, attention_min_keys=1)  # tiny input, every path
    with fast_paths(True, **forcing):
        assert {"_OverlappingRowsBackward", "_OneDnnAttentionBackward"} <= _autograd_nodes(model(x)[-1])
        with record_attention(model) as fast:
            out = model(x)
    assert not any(name.startswith("_") for name in _autograd_nodes(out[-1]))
    with fast_paths(False), record_attention(model) as plain:
        model(x)
    assert fast.keys() == plain.keys() and fast
    for key, rec in fast.items():
        assert rec.keys() == plain[key].keys()
        for name, value in rec.items():
            assert (
                torch.equal(value, plain[key][name]) if isinstance(value, torch.Tensor) else value == plain[key][name]
            )


def test_recorded_association_agrees_with_the_fast_forward(image):
    """The association Q recorded on the plain path agrees to float32 rounding with the Q that the fast forward
    passes through the same probe (channels_last layout, oneDNN kernels, NHWC unfold change only summation
    orders), and the super-token assignment drawn from it is the same."""
    model, x = _model("stvit"), image
    _, records = _record(model, x)
    seen, handles = {}, []
    for key, m in attention_modules(model).items():
        handles.append(m.association.register_forward_hook(lambda _, args, out, key=key: seen.update({key: out})))
    with torch.no_grad(), fast_paths(True, attention_min_keys=1):
        model(x)
    for h in handles:
        h.remove()
    assert records and seen.keys() == records.keys()
    for key, rec in records.items():
        torch.testing.assert_close(rec["affinity"], seen[key])
        _assert_same_assignment(dict(rec, affinity=seen[key]), rec)


def _assert_same_assignment(fast: dict, plain: dict):
    """The same super token for every pixel, but where two tokens tie within float32 rounding (e.g. the zero
    padding, equally similar to all its neighbours)."""
    a_fast, a_plain = stoken_assignment(fast), stoken_assignment(plain)
    association = {}
    for b, y, x in (a_fast != a_plain).nonzero().tolist():
        for token in (int(a_fast[b, y, x]), int(a_plain[b, y, x])):
            association.setdefault(token, stoken_association(plain, token))
        tied = association[int(a_fast[b, y, x])][b, y, x] - association[int(a_plain[b, y, x])][b, y, x]
        assert abs(float(tied)) < 1e-5, (b, y, x)


# ---- tools/visualize_attention.py end to end ------------------------------------------------------------------
viz_tool = load_tool("visualize_attention")


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    """A 150 x 110 image (neither side a multiple of any stride) with two shapes on a gradient."""
    path = tmp_path_factory.mktemp("img") / "shapes.png"
    yy, xx = np.mgrid[:110, :150]
    img = np.stack([xx * 255 // 150, yy * 255 // 110, np.full_like(xx, 90)], -1).astype(np.uint8)
    img[20:60, 15:60] = (220, 40, 40)
    img[(yy - 70) ** 2 + (xx - 105) ** 2 < 25**2] = (40, 200, 60)
    Image.fromarray(img).save(path)
    return str(path)


def _checkpoint(tmp_path, family, layout):
    """A randomly initialised demo backbone saved in one of the layouts the tool reads."""
    model = _model(family, seed=1)
    sd = model.state_dict()
    if layout == "export":  # what tools/export_backbone.py writes (family and arch in the meta)
        from backbones.checkpoints.export import save_backbone

        save_backbone(sd, model, tmp_path / "backbone.safetensors")
        return str(tmp_path / "backbone.safetensors")
    if layout == "mm":  # tools/export_model.py: the detector's state_dict with 'backbone.' keys
        path, obj = tmp_path / "model.pth", {"state_dict": {f"backbone.{k}": v for k, v in sd.items()}}
    else:  # an official ImageNet release: {'model': ...} with the classifier head, no meta
        from backbones.checkpoints.export import official_state_dict

        path, obj = (
            tmp_path / "official.pth",
            {"model": {**official_state_dict(sd, family), "head.weight": torch.zeros(10, 256)}},
        )
    torch.save(obj, path)
    return str(path)


def _png(path):
    assert osp.isfile(path)
    return np.asarray(Image.open(path).convert("RGB"))


@pytest.mark.parametrize("layout", ["export", "official", "mm"])
def test_tool_draws_stvit_super_tokens_for_each_stage(layout, picture, tmp_path):
    out_dir = str(tmp_path / "out")
    ckpt = _checkpoint(tmp_path, "stvit", layout)
    written = viz_tool.main([DET_CFG, ckpt, picture, "--out-dir", out_dir])
    assert written == [osp.join(out_dir, "shapes_stvit_supertokens.png")]
    png = _png(written[0])
    # two stages with super tokens (stoken_size 8, 4) side by side, two rows: each panel >= the image's size
    assert png.shape[0] >= 2 * 110 and png.shape[1] >= 2 * 150
    assert png.std() > 20  # a picture, not a blank canvas
    if layout == "mm":  # another super token gives another heat map; one stage only gives one column
        other = viz_tool.main(
            [DET_CFG, ckpt, picture, "--out-dir", str(tmp_path / "b"), "--stages", "1", "--stoken", "0"]
        )
        png1 = _png(other[0])
        assert png1.shape[1] < png.shape[1] and png1.shape[0] == png.shape[0]


def test_tool_draws_hatnet_attention_from_a_lightning_checkpoint(seg_run, picture, tmp_path):
    """The HAT-Net segmentation demo's checkpoint after two optimizer steps (conftest.py's seg_run)."""
    out_dir, seg_ckpt = str(tmp_path / "out"), seg_run.ckpt
    centre = viz_tool.main([SEG_CFG, seg_ckpt, picture, "--out-dir", out_dir])[0]
    assert osp.basename(centre) == "shapes_hatnet_attention.png"
    png = _png(centre)
    assert png.shape[0] >= 2 * 110 and png.shape[1] >= 4 * 150  # 2 rows x 4 stages
    corner = _png(
        viz_tool.main([SEG_CFG, seg_ckpt, picture, "--out-dir", str(tmp_path / "b"), "--point", "3", "105"])[0]
    )
    assert corner.shape == png.shape and (corner != png).any()  # the query moved: other maps


def test_the_input_is_the_test_pipelines_and_maps_go_back_to_original_pixels(picture):
    from tasks.config.load import load_config
    from tasks.config.scopes import register_scope
    from tasks.figures import attention_run
    from tasks.figures.attention import map_pixel, to_image

    cfg = load_config(DET_CFG)
    register_scope(cfg.default_scope)
    from mmdet.registry import MODELS

    image = attention_run.prepare(
        picture, attention_run.test_pipeline(cfg), MODELS.build(cfg.model.data_preprocessor), "cpu"
    )
    # Resize to fit 192 x 192 keeping the ratio (150 x 110 -> 192 x 141), pad to a multiple of 32
    assert image.original.shape == (110, 150, 3) and image.img_shape == (141, 192)
    assert tuple(image.inputs.shape) == (1, 3, 160, 192)
    assert image.scale == pytest.approx((192 / 150, 141 / 110))
    # normalised by the data preprocessor's mean / std (RGB): the red square's pixel
    mean, std = torch.tensor(cfg.model.data_preprocessor.mean), torch.tensor(cfg.model.data_preprocessor.std)
    y, x = round(40 * image.scale[1]), round(37 * image.scale[0])
    torch.testing.assert_close(
        image.inputs[0, :, y, x], (torch.tensor([220.0, 40, 40]) - mean) / std, atol=0.05, rtol=0
    )
    assert (image.inputs[0, :, 141:] == 0).all()  # padding
    # a stride-8 map whose value is its column index, brought back over the original image
    cols = to_image(torch.arange(24.0).expand(20, 24), 8, image)
    assert cols.shape == (110, 150)
    assert cols[:, 0].max() == 0 and cols[:, -1].min() == (192 - 1) // 8
    assert (np.diff(cols, axis=1) >= 0).all()
    assert map_pixel((149, 109), 8, image) == ((141 - 1) // 8, (192 - 1) // 8)
    assert map_pixel((75, 55), 4, image) == (int(55 * 141 / 110) // 4, int(75 * 192 / 150) // 4)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--point", "150", "10"], "lies outside"),
        (["--stages", "2"], "no super"),
        (["--stoken", "30"], "super tokens"),
        (["--stages", "0", "1", "--stoken", "1", "2", "3"], "one per drawn stage"),
    ],
)
def test_tool_refuses_bad_arguments_with_a_clear_message(args, message, picture, tmp_path):
    ckpt = _checkpoint(tmp_path, "stvit", "mm")
    with pytest.raises(FigureError, match=message):
        viz_tool.main([DET_CFG, ckpt, picture, "--out-dir", str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_tool_refuses_a_checkpoint_of_the_other_family(picture, tmp_path):
    with pytest.raises(CheckpointError, match="(?i)hatnet"):
        viz_tool.main([DET_CFG, _checkpoint(tmp_path, "hatnet", "mm"), picture, "--out-dir", str(tmp_path)])


# ---- a family the figures know nothing of: tests/data/toy.py's (picture None) ------------------
TOY_CFG = f"""_base_ = [{DET_CFG!r}]
toy_s_backbone = dict(type="ToyNet", arch="one", init_cfg=None)
model = dict(backbone=dict(_delete_=True, **toy_s_backbone), neck=dict(in_channels=[8, 16, 32, 64]))
"""


def _toy_run(tmp_path, probes=None):
    """The toy config and an export of a toy backbone; the toy family registered (with other ``probes``: their
    records) until the caller unregisters it."""
    from backbones.checkpoints.export import save_backbone

    family = load_toy().FAMILY  # loading tests/data/toy.py registers it
    if probes is not None:
        unregister(family.name)
        family = register(Family(**{**family.__dict__, "probes": probes}))
    torch.manual_seed(0)
    model = family.cls("one")
    save_backbone(model.state_dict(), model, tmp_path / "toy.pth")
    (tmp_path / "toy_cfg.py").write_text(TOY_CFG)
    return str(tmp_path / "toy_cfg.py"), str(tmp_path / "toy.pth")


def test_a_family_of_another_record_kind_gets_the_maps_its_records_hold(picture, tmp_path):
    try:
        cfg, ckpt = _toy_run(tmp_path)
        written = viz_tool.main([cfg, ckpt, picture, "--out-dir", str(tmp_path / "out"), "--stages", "1", "2"])
        with pytest.raises(FigureError, match="--stoken picks the super token .* the Toy picture has none"):
            viz_tool.main([cfg, ckpt, picture, "--out-dir", str(tmp_path / "b"), "--stoken", "0"])
    finally:
        unregister("toy")
    assert written == [str(tmp_path / "out" / "shapes_toy_maps.png")]
    png = _png(written[0])
    # one row (the record's 'weights' map) of two stages, each panel at least the image's size
    assert png.shape[0] >= 110 and png.shape[1] >= 2 * 150 and png.std() > 20


def test_records_without_a_map_are_refused_in_plain_words(picture, tmp_path, monkeypatch):
    totals = {"weights": lambda m, shape, probs: dict(kind="toy", total=probs.sum(-1), size=tuple(shape[-2:]))}
    try:
        cfg, ckpt = _toy_run(tmp_path, totals)
        monkeypatch.setattr(
            "sys.argv", ["visualize_attention.py", cfg, ckpt, picture, "--out-dir", str(tmp_path / "o")]
        )
        with pytest.raises(SystemExit) as exit_:
            viz_tool.main()  # as on the command line: the message and exit status 1, no traceback
    finally:
        unregister("toy")
    assert str(exit_.value).startswith("error: the Toy backbone's attention records (kind toy: kind, size, total)")
    assert "hold no map over a stage's positions" in str(exit_.value)
    assert not os.listdir(tmp_path / "o")
