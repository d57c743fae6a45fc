"""Backbone behaviour beyond the golden vectors: sizes, padding, freezing, input checks, checkpoints."""

import math
import os

import pytest
import torch

from backbones import FAMILIES, HATNet, STViT, fast_paths, load_pretrained
from backbones.errors import CheckpointError
from backbones.models.hatnet import Attention as HATAttention
from tests._tools import FAMILY_DATA, SHRUNK, assert_close, official_file

# Each input size with the size it stands for. The fast paths engage by input size (backbones' Limits: row chunks,
# recomputed MLP hidden layers, oneDNN and chunked attention). A quarter of the side, with the limits that grow
# with the pixels scaled down by 16 (and the attention probabilities' by 16^2), takes the kernels the full size
# takes with the default limits (the same kinds of autograd nodes), at a sixteenth of the work: 200 x 333 for COCO's
# 800 x 1333, 128 x 128 for a 512 x 512 segmentation crop. 83 x 129 (no side a multiple of any stride) and
# 32 x 32 (the smallest input) run as they are.
SIZES = {(128, 128): (512, 512), (200, 333): (800, 1333), (83, 129): (83, 129), (32, 32): (32, 32)}


def limits_for(size, stands_for):
    """The fast paths' size limits under which ``size`` takes the paths that ``stands_for`` takes by default."""
    r = stands_for[0] * stands_for[1] / (size[0] * size[1])  # pixels, and the keys of global attention
    with fast_paths(True) as d:  # the limits in force
        pass
    return dict(
        row_chunk_bytes=int(d.row_chunk_bytes / r),
        mlp_recompute_numel=int(d.mlp_recompute_numel / r),
        attention_min_keys=int(d.attention_min_keys / r),
        attention_max_probs_bytes=int(d.attention_max_probs_bytes / r**2),  # keys x queries
        attention_chunk_bytes=int(d.attention_chunk_bytes / r**2),
    )


@pytest.mark.parametrize("size", list(SIZES), ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_forward_backward_any_size(cls, arch, size):
    torch.manual_seed(0)
    model = cls(arch, drop_path_rate=0.1).train()
    # batch 2 at 32x32: BatchNorm in train mode needs more than one value per channel (1x1 at stride 32)
    x = torch.randn(2 if min(size) < 64 else 1, 3, *size, requires_grad=True)
    with fast_paths(True, **limits_for(size, SIZES[size])):
        outs = model(x)
        assert [tuple(o.shape[1:]) for o in outs] == model.output_shapes(*size)
        assert [o.shape[-2] for o in outs] == [math.ceil(size[0] / s) for s in model.out_strides]
        sum(o.float().square().mean() for o in outs).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_out_indices_and_shapes():
    model = STViT("shrunk", out_indices=(1, 3)).eval()
    assert model.out_channels == [64, 256] and model.out_strides == [8, 32]
    assert [f["num_chs"] for f in model.feature_info] == [32, 64, 128, 256]
    outs = model(torch.randn(2, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == [(2, 64, 8, 12), (2, 256, 2, 3)]


def _naive_hat_attention(m: HATAttention, x):
    """Literal HAT-Net attention for one image whose size does not divide the grid: each window attends
    over its valid pixels only, and each pooled cell averages its valid pixels."""
    _, C, H, W = x.shape
    g, nh, hd = m.grid_size, m.num_heads, m.head_dim
    q, k, v = m.qkv(m.norm(x))[0].reshape(3, nh, hd, H, W)
    grid = torch.zeros(nh, hd, H, W)
    for i in range(0, H, g):
        for j in range(0, W, g):
            qs, ks, vs = (t[:, :, i : i + g, j : j + g].flatten(2) for t in (q, k, v))  # (nh, hd, n)
            attn = (qs.transpose(1, 2) @ ks * m.scale).softmax(-1)
            grid[:, :, i : i + g, j : j + g] = (
                (vs @ attn.transpose(1, 2))
                .reshape(nh, hd, *qs.shape[-1:])
                .reshape(nh, hd, min(g, H - i), min(g, W - j))
            )
    grid_x = m.grid_norm(x + grid.reshape(1, C, H, W))
    r = m.ds_ratio
    pooled = torch.stack(
        [
            torch.stack([grid_x[0, :, a : a + r, b : b + r].mean((1, 2)) for b in range(0, W, r)], -1)
            for a in range(0, H, r)
        ],
        -2,
    )[None]
    kk, vv = m.kv(m.ds_norm(pooled)).reshape(2, nh, hd, -1)
    qq = m.q(grid_x).reshape(nh, hd, H * W)
    glob = vv @ (kk.transpose(1, 2) @ qq * m.scale).softmax(1)
    return m.proj(glob.reshape(1, C, H, W) + grid_x)


@pytest.mark.parametrize("size", [(16, 16), (13, 19)])
def test_hatnet_padding_is_masked(size):
    torch.manual_seed(0)
    m = HATAttention(dim=16, head_dim=8, grid_size=8, ds_ratio=4).eval()
    x = torch.randn(1, 16, *size)
    with torch.no_grad():
        torch.testing.assert_close(m(x), _naive_hat_attention(m, x), rtol=1e-4, atol=1e-5)


def test_shrunk_preset_is_the_one_definition_of_the_test_and_demo_archs():
    """'shrunk' names the small test / demo models (no released weights, so not a variant that checkpoints are
    matched against); the demo configs build them by that name."""
    from mmengine.config import Config

    for family in FAMILIES.values():
        cls, arch, config = family.cls, family.sizes["shrunk"], FAMILY_DATA[family.name]["demo_config"]
        model = cls("shrunk")
        assert model.arch == cls(dict(arch)).arch and model.out_channels == [32, 64, 128, 256]
        assert "shrunk" not in cls.archs  # released variants only
        assert Config.fromfile(config).model.backbone.arch == "shrunk"


def test_bad_arch_and_inputs():
    with pytest.raises(ValueError, match=r"Unknown STViT arch 'tiny'.*'base', 'large', 'shrunk', 'small'"):
        STViT("tiny")
    with pytest.raises(ValueError, match=r"Unknown HAT-Net arch.*'large', 'medium', 'shrunk', 'small', 'tiny'"):
        HATNet("xl")
    with pytest.raises(ValueError, match="one value per stage"):
        STViT({**FAMILIES["stvit"].sizes["shrunk"], "depths": [1, 1, 1]})
    with pytest.raises(ValueError, match="not divisible by its num_heads"):
        STViT({**FAMILIES["stvit"].sizes["shrunk"], "num_heads": [3, 2, 4, 8]})
    with pytest.raises(ValueError, match="not divisible by head_dim"):
        HATNet({**FAMILIES["hatnet"].sizes["shrunk"], "head_dim": 24})
    with pytest.raises(ValueError, match="missing keys"):
        HATNet({k: v for k, v in FAMILIES["hatnet"].sizes["shrunk"].items() if k != "grid_sizes"})
    with pytest.raises(ValueError, match="out_indices"):
        STViT("shrunk", out_indices=(0, 4))
    model = HATNet("shrunk")
    with pytest.raises(ValueError, match="4-D"):
        model(torch.randn(3, 64, 64))
    with pytest.raises(ValueError, match="3 input channels"):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match="at least 32x32"):
        model(torch.randn(1, 3, 31, 64))


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_frozen_stages_and_norm_eval(cls, arch):
    model = cls(arch, frozen_stages=2, norm_eval=True).train()
    frozen = {id(p) for m in model.frozen_modules() for p in m.parameters()}
    for name, p in model.named_parameters():
        if "proj_norm" in name:  # unused by the official forward: always frozen
            assert not p.requires_grad
            continue
        trainable_stage = name.startswith(
            ("layers.2.blocks", "layers.3", "blocks.2", "blocks.3", "ds3", "ds4", "layers.1.downsample")
        )
        assert p.requires_grad == (id(p) not in frozen), name
        if name.startswith(("patch_embed", "layers.0", "blocks.0", "blocks.1", "ds2")):
            assert not p.requires_grad, name
        if trainable_stage:
            assert p.requires_grad, name
    assert all(not m.training for m in model.frozen_modules())
    assert all(not m.training for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert all(m.training for m in model.stage_modules(3))


def test_with_cp_same_outputs_and_grads():
    torch.manual_seed(0)
    a, b = STViT("shrunk").train(), STViT("shrunk", with_cp=True).train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 64, 64)
    outs = [m(x) for m in (a, b)]
    for o1, o2 in zip(*outs):
        torch.testing.assert_close(o1, o2)
    for o in outs:
        sum(t.sum() for t in o).backward()
    for (n, p1), p2 in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, msg=n)


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_with_cp_per_stage(cls, arch):
    """``with_cp`` as 4 bools checkpoints the chosen stages only (their blocks run again in backward) and keeps
    the outputs and gradients; anything else is rejected with the accepted forms."""
    torch.manual_seed(0)
    a, b = cls(arch).train(), cls(arch, with_cp=[False, False, True, True]).train()
    b.load_state_dict(a.state_dict())
    calls = [0] * 4
    for i in range(4):
        blocks = b.stage_modules(i)[-1]  # the stage's blocks, after the downsampling that starts it
        blocks[0].register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    x = torch.randn(2, 3, 64, 64)
    outs = [m(x) for m in (a, b)]
    for o1, o2 in zip(*outs):
        torch.testing.assert_close(o1, o2)
    for o in outs:
        sum(t.square().sum() for t in o).backward()
    assert calls == [1, 1, 2, 2]  # stages 2 and 3 recomputed in backward
    for (n, p1), p2 in zip(a.named_parameters(), b.parameters()):
        if p1.grad is not None or p2.grad is not None:
            torch.testing.assert_close(p1.grad, p2.grad, msg=n)
    for bad in ([True, False], "yes", [1, 0, 0, 0]):
        with pytest.raises(ValueError, match=r"with_cp must be True, False or a list of 4 bools"):
            cls(arch, with_cp=bad)


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_load_official_release_layout(tmp_path, cls, arch):
    torch.manual_seed(1)
    src = cls(arch).eval()
    path = official_file(src, tmp_path / "release.pth")
    dst = cls(arch, pretrained=str(path)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for o1, o2 in zip(src(x), dst(x)):
            torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    report = load_pretrained(cls(arch), path)
    assert report.skipped and all(k.startswith(("head", "proj", "classifier")) or "fold" in k for k in report.skipped)
    assert "skipped" in str(report)


def test_wrong_family_and_variant_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="hatnet checkpoint.*STViT"):
        load_pretrained(STViT("shrunk"), HATNet("shrunk").state_dict())
    base_like = {k: torch.zeros(v.shape) for k, v in STViT("base").state_dict().items()}
    with pytest.raises(CheckpointError, match=r"looks like stvit_base, the model is stvit_small"):
        load_pretrained(STViT("small"), {"model": base_like})
    sd = STViT("shrunk").state_dict()
    sd["layers.0.blocks.0.extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"Unexpected keys \(1\): layers.0.blocks.0.extra.weight"):
        load_pretrained(STViT("shrunk"), sd)


def test_detector_checkpoint_and_prefix():
    src = HATNet("shrunk")
    det = {
        "state_dict": {
            **{f"backbone.{k}": v for k, v in src.state_dict().items()},
            "neck.lateral_convs.0.conv.weight": torch.zeros(1),
        },
        "meta": {},
    }
    rep = load_pretrained(HATNet("shrunk"), det)
    assert len(rep.loaded) == len(src.state_dict())
    lightning = {"state_dict": {f"model.backbone.{k}": v for k, v in src.state_dict().items()}}
    assert load_pretrained(HATNet("shrunk"), lightning).loaded == rep.loaded
    with pytest.raises(CheckpointError, match="No key starts with prefix 'encoder.'"):
        load_pretrained(HATNet("shrunk"), det, prefix="encoder.")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/pwned_by_checkpoint",))


def test_untrusted_and_corrupt_files_are_refused(tmp_path):
    evil = tmp_path / "evil.pth"
    torch.save({"model": STViT("shrunk").state_dict(), "payload": _Evil()}, evil)
    if os.path.exists("/tmp/pwned_by_checkpoint"):
        os.remove("/tmp/pwned_by_checkpoint")
    with pytest.raises(CheckpointError, match="Refusing to load"):
        load_pretrained(STViT("shrunk"), evil)
    assert not os.path.exists("/tmp/pwned_by_checkpoint")
    good = tmp_path / "good.pth"
    torch.save(STViT("shrunk").state_dict(), good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_pretrained(STViT("shrunk"), truncated)
    with pytest.raises(CheckpointError, match="not found"):
        load_pretrained(STViT("shrunk"), tmp_path / "missing.pth")


def test_norm_out_layers_are_new():
    src = STViT("shrunk")
    model = STViT("shrunk", norm_out=True, out_indices=(2, 3))
    report = load_pretrained(model, src.state_dict())
    assert {k.split(".")[1] for k in report.initialised if k.startswith("out_norms")} == {"2", "3"}
    model(torch.randn(1, 3, 64, 64))[0].square().mean().backward()
    assert model.out_norms[2].weight.grad is not None


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_fast_modules_equal_literal_reference(cls, arch):
    """Forward and gradients of the fast paths equal the plain formulation (fast paths off)."""
    from tests._fast_vs_plain import outputs_and_grads

    size = FAMILY_DATA[cls.family]["fast_size"]
    torch.manual_seed(0)
    model = cls(arch).eval()
    outs, ref_outs, grads = outputs_and_grads(model, torch.randn(1, 3, *size))
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        assert_close(a, b, f"stage {i}")
    for n, g, ref_g in grads:
        if g is not None:
            assert_close(g, ref_g, n)


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_bf16_autocast_and_half_weights(cls, arch):
    torch.manual_seed(0)
    model = cls(arch).train()
    x = torch.randn(2, 3, 96, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = model(x)
    assert all(o.dtype == torch.bfloat16 and torch.isfinite(o).all() for o in outs)
    sum(o.float().mean() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        ref = model.eval()(x)
        half = cls(arch).to(torch.bfloat16).eval()
        half.load_state_dict(model.state_dict())
        for a, b in zip(half(x.bfloat16()), ref):
            assert (a.float() - b).abs().max() <= 0.1 * b.abs().max()


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_outputs_are_contiguous_nchw(cls, arch):
    # Internals may run channels_last; consumers such as mmcv's RoIAlign read memory as NCHW.
    outs = cls(arch, norm_out=True).eval()(torch.randn(1, 3, 64, 96))
    assert all(o.is_contiguous() for o in outs)


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_out_of_range_options_are_refused(cls, arch):
    """Options outside their range are refused by name instead of freezing, dropping or attending silently
    differently: ``frozen_stages`` beyond the 4 stages or below -1, a ``drop_path_rate`` outside [0, 1) (1 drops
    every sample of the last block: NaN outputs in training), a non-integer ``out_indices``, a switch that is not
    a bool (``norm_eval='no'`` counted as True)."""
    for bad in (5, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"frozen_stages must be an int in -1\.\.4"):
            cls(arch, frozen_stages=bad)
    for bad in (-0.1, 1.0, "0.1"):
        with pytest.raises(ValueError, match=r"drop_path_rate must be a number in \[0, 1\)"):
            cls(arch, drop_path_rate=bad)
    with pytest.raises(ValueError, match=r"out_indices must be a sequence of stage indices"):
        cls(arch, out_indices=2)
    for flag in ("norm_eval", "norm_out"):
        with pytest.raises(ValueError, match=rf"{flag} must be True or False; got 'no'"):
            cls(arch, **{flag: "no"})
    assert cls(arch, frozen_stages=4).frozen_stages == 4


def test_bad_stoken_size_is_refused():
    """Super-token sizes must be positive ints or (h, w) pairs of them; 0, negatives or triples were accepted
    and then ran as something else or failed deep inside the forward."""
    for bad in ([0, 4, 2, 1], [-1, 4, 2, 1], [(8, 4, 2), 4, 2, 1], "8421", [8.0, 4, 2, 1]):
        with pytest.raises(ValueError, match=r"STViT stoken_size.*positive int or an \(h, w\) pair"):
            STViT("shrunk", stoken_size=bad)
    assert list(STViT("shrunk", stoken_size=[(8, 4), 4, 2, 1]).arch["stoken_size"][0]) == [8, 4]


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_input_dtype_errors_name_the_fix(cls, arch):
    """A uint8 image batch or a float64 batch into float32 weights failed inside a conv with torch's "Input type
    (unsigned char) and bias type (float) should be the same"; the input check now names the dtypes and the fix.
    Autocast (mixed dtypes by design) still runs."""
    model = cls(arch).eval()
    with pytest.raises(ValueError, match=r"floating-point image batch.*got torch\.uint8.*x\.float\(\)"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"input is torch\.float64 but the weights are torch\.float32.*x\.float\(\)"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.float64))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.zeros(1, 3, 64, 64, dtype=torch.bfloat16))[0].dtype == torch.bfloat16


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_empty_batch_gives_empty_maps_of_the_stated_shapes(cls, arch):
    """A batch of 0 images (an empty shard, a filtered batch) returns empty maps of ``output_shapes``; HAT-Net's
    head split used to fail with "cannot reshape tensor of 0 elements" on both paths."""
    model = cls(arch).eval()
    for fast in (True, False):
        with torch.no_grad(), fast_paths(fast):
            outs = model(torch.zeros(0, 3, 64, 80))
        assert [tuple(o.shape) for o in outs] == [(0, *s) for s in model.output_shapes(64, 80)]


def test_a_checkpoint_with_two_backbones_needs_a_prefix():
    """A checkpoint whose tensors sit under two ``backbone.`` prefixes (a model and its EMA copy, a teacher and
    a student) used to load whichever came last, without a word; it is refused, naming both prefixes, and
    ``prefix=`` picks one."""
    torch.manual_seed(0)
    model, ema = HATNet("shrunk"), HATNet("shrunk")
    ckpt = {
        "state_dict": {
            **{f"model.backbone.{k}": v for k, v in model.state_dict().items()},
            **{f"ema.backbone.{k}": v for k, v in ema.state_dict().items()},
        }
    }
    with pytest.raises(CheckpointError, match=r"several backbones, under \['ema\.backbone\.', 'model\.backbone\.'\]"):
        load_pretrained(HATNet("shrunk"), ckpt)
    loaded = HATNet("shrunk")
    load_pretrained(loaded, ckpt, prefix="model.backbone.")
    for k, v in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_non_finite_weights_are_refused():
    """A checkpoint with NaN / inf values (a diverged run) loaded silently and gave NaN features; it is refused
    with the tensors named, and the model keeps its own weights."""
    sd = STViT("shrunk").state_dict()
    sd["layers.1.blocks.0.norm2.weight"] = torch.full_like(sd["layers.1.blocks.0.norm2.weight"], float("nan"))
    sd["patch_embed.proj.0.bias"][0] = float("inf")
    model = STViT("shrunk")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"NaN or infinite values in 2 tensors: layers\.1\.blocks\.0\.norm2"):
        load_pretrained(model, sd)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_home_relative_checkpoint_path_is_expanded(tmp_path, monkeypatch):
    """``checkpoint='~/weights/x.pth'`` (which mmengine's own loader expands) was "not found"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    src = HATNet("shrunk")
    torch.save(src.state_dict(), tmp_path / "hat.pth")
    model = HATNet("shrunk")
    assert len(load_pretrained(model, "~/hat.pth").loaded) == len(src.state_dict())
    torch.testing.assert_close(model.state_dict(), src.state_dict(), rtol=0, atol=0)


@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_plain_path_runs_wherever_the_model_states_no_size_problem(cls, arch):
    """``plain_size_problem`` is what the measuring tools read to mark a size n/a instead of comparing there."""
    model = cls(arch).eval()
    for size in ((64, 96), (224, 224)):
        if model.plain_size_problem(*size) is None:
            x = torch.randn(1, 3, *size)
            with torch.no_grad(), fast_paths(False):
                plain = model(x)
            with torch.no_grad():
                for i, (fast, ref) in enumerate(zip(model(x), plain, strict=True)):
                    assert_close(fast, ref, f"{cls.__name__} {size} stage {i}")


def test_hatnet_states_the_sizes_its_window_grids_do_not_divide():
    model = HATNet("shrunk")  # grids 8, 7, 7, 1 on the stage maps
    assert model.plain_size_problem(224, 224) is None and model.plain_size_problem(448, 672) is None
    assert model.plain_size_problem(64, 96) == "stage maps not divisible by the grids [8, 7, 7, 1]"
