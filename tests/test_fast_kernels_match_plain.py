"""The speed / memory code paths compute exactly what the plain formulation (fast paths off) computes, forward and
gradients: STViT's recomputing MLP tail (``_MlpTail``), the row chunks, the NHWC unfold / fold of the super-token
association, the oneDNN attention kernels and the channels_last layout."""

import pytest
import torch
import torch.nn.functional as F

from backbones import FAMILIES, STViT, fast_paths
from backbones.models import stvit_ops
from backbones.models.hatnet import InvertedResidual
from backbones.models.stvit import Mlp
from backbones.models.stvit_ops import _MlpTail
from backbones.ops import kernels, table
from backbones.ops.limits import Limits
from tests._fast_vs_plain import outputs_and_grads
from tests._tools import assert_close, grad_fns


def _plain_mlp(m: torch.nn.Module, x):
    with fast_paths(False):
        return m(x)


@pytest.mark.parametrize("frozen", [False, True])
def test_mlp_tail_equals_plain(frozen):
    torch.manual_seed(0)
    m = Mlp(16, 64)
    if frozen:
        m.conv.requires_grad_(False)
    x = torch.randn(2, 16, 9, 11).contiguous(memory_format=torch.channels_last).requires_grad_()
    params = [p for p in m.parameters() if p.requires_grad]
    with fast_paths(True, mlp_recompute_numel=0):  # always take the recomputing path
        y = m(x)
    y_ref = _plain_mlp(m, x)
    assert_close(y, y_ref, "mlp out")
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, [x] + params, g), torch.autograd.grad(y_ref, [x] + params, g)):
        assert_close(a, b, "mlp grad")


@pytest.mark.parametrize("kernel", [3, 5])
def test_mlp_tail_gradcheck(kernel):
    args = [
        torch.randn(1, 6, 4, 5),
        torch.randn(6, 1, kernel, kernel),
        torch.randn(6),
        torch.randn(3, 6, 1, 1),
        torch.randn(3),
    ]
    conv_args = ((1, 1), (kernel // 2, kernel // 2), (1, 1), 6)
    inputs = [a.double().requires_grad_() for a in args]
    assert torch.autograd.gradcheck(lambda *a: _MlpTail.apply(*a, conv_args), inputs)


@pytest.mark.parametrize(
    "conv",
    [
        torch.nn.Conv2d(6, 6, 3, padding=1, groups=6),
        torch.nn.Conv2d(6, 6, 5, padding=4, dilation=2, groups=6, bias=False),
        torch.nn.Conv2d(6, 6, (3, 5), padding=(1, 2), groups=6),
    ],
    ids=["3x3", "5x5-dilated", "3x5"],
)
def test_residual_depthwise_conv_is_one_convolution_with_the_same_values_and_gradients(conv):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 7, 9, dtype=torch.double).contiguous(memory_format=torch.channels_last)
    conv = conv.double()
    assert stvit_ops._identity_tap(conv.weight, kernels.conv_args(conv)) is not None
    params = list(conv.parameters())
    ys = []
    for fast in (False, True):
        with fast_paths(fast):
            xs = x.clone().requires_grad_()
            y = stvit_ops.residual_dwconv(conv, xs)
            ys.append((y, *torch.autograd.grad(y, [xs, *params], torch.ones_like(y))))
    for a, b in zip(*ys):
        torch.testing.assert_close(a, b)
    weight, bias, args = conv.weight.detach(), conv.bias, kernels.conv_args(conv)
    tap = stvit_ops._identity_tap(weight, args)
    inputs = [x.clone().requires_grad_(), weight.clone().requires_grad_()]
    assert torch.autograd.gradcheck(lambda a, w: stvit_ops._residual_conv(a, w, bias, args, tap), inputs)


@pytest.mark.parametrize(
    "conv",
    [
        torch.nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6),  # a smaller map: no pixel reads itself
        torch.nn.Conv2d(6, 6, 3, padding=1, groups=3),  # not depthwise
        torch.nn.Conv2d(6, 6, 2, padding=1, groups=6),  # no centre tap
        torch.nn.Conv2d(6, 6, 3, padding=2, groups=6),  # the centre tap reads another pixel
    ],
    ids=["strided", "grouped", "even", "off-centre"],
)
def test_residual_of_other_convolutions_is_the_plain_sum(conv):
    assert stvit_ops._identity_tap(conv.weight, kernels.conv_args(conv)) is None
    x = torch.randn(1, 6, 8, 8)
    if conv.stride == (1, 1) and conv(x).shape == x.shape:
        with fast_paths(True):
            torch.testing.assert_close(stvit_ops.residual_dwconv(conv, x), x + conv(x), rtol=0, atol=0)


def test_unfold_fold_equal_identity_kernel_convs():
    torch.manual_seed(0)
    B, C, h, w = 2, 5, 4, 6
    x = torch.randn(B, C, h, w)
    t = torch.randn(B, h * w, 9, C)
    with fast_paths(False):  # the official identity-kernel convolutions
        ref, ref_fold = stvit_ops.unfold3x3(x.permute(0, 2, 3, 1)), stvit_ops.fold3x3(t, h, w)
    with fast_paths(True):
        fast, fast_fold = stvit_ops.unfold3x3(x.permute(0, 2, 3, 1)), stvit_ops.fold3x3(t, h, w)
        # the switch chose the slice kernels: their own backward nodes, not the convolutions'
        grads = grad_fns(stvit_ops.unfold3x3(x.permute(0, 2, 3, 1).requires_grad_()))
        grads |= grad_fns(stvit_ops.fold3x3(t.clone().requires_grad_(), h, w))
    assert {"_Unfold3x3Backward", "_Fold3x3Backward"} <= grads and not any("Convolution" in g for g in grads)
    torch.testing.assert_close(fast, ref)  # (B, h*w, 9, C)
    torch.testing.assert_close(fast_fold, ref_fold)
    # the official Unfold's order: neighbour k = 3 i + j of token (y, x) is the pixel (y + i - 1, x + j - 1)
    torch.testing.assert_close(ref[:, 2 * w + 3, 5], x[:, :, 2, 4])


def test_unfold_fold_gradients_are_each_others_forward():
    # each kernel's backward is the other's forward (adjoint maps): checked numerically, and against the
    # gradients of the official identity-kernel convolutions
    torch.manual_seed(0)
    h, w, C = 3, 4, 2
    x, t = torch.randn(2, h, w, C, dtype=torch.double), torch.randn(2, h * w, 9, C, dtype=torch.double)
    assert torch.autograd.gradcheck(stvit_ops._Unfold3x3.apply, x.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda a: stvit_ops._Fold3x3.apply(a, h, w), t.clone().requires_grad_())
    gu, gf = torch.randn(2, h * w, 9, C), torch.randn(2, h, w, C)
    grads = {}
    for fast in (False, True):
        xs, ts = x.float().requires_grad_(), t.float().requires_grad_()
        with fast_paths(fast):
            torch.autograd.backward([stvit_ops.unfold3x3(xs), stvit_ops.fold3x3(ts, h, w)], [gu, gf])
        grads[fast] = (xs.grad, ts.grad)
    torch.testing.assert_close(grads[True], grads[False])


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("with_cp", [False, True])
def test_stvit_train_step_equals_reference(recompute, with_cp):
    """Whole model, train mode (BatchNorm batch statistics), both MLP paths, with and without checkpointing."""
    torch.manual_seed(0)
    arch = {**FAMILIES["stvit"].sizes["shrunk"], "stoken_size": [4, 2, 2, 1]}
    model = STViT(arch, with_cp=with_cp).train()
    with fast_paths(True, mlp_recompute_numel=0 if recompute else 2**62):
        outs, ref_outs, grads = outputs_and_grads(model, torch.randn(2, 3, 72, 100))
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        assert_close(a, b, f"stage {i}")
    for n, g, ref_g in grads:
        if n.endswith("downsample.proj.0.bias"):  # conv bias right before a train-mode BN: gradient is 0 + noise
            assert g.abs().max() < 1e-4 * model.layers[0].downsample.proj[0].weight.grad.abs().max()
            continue
        assert_close(g, ref_g, n)


def test_channels_last_is_an_internal_detail():
    model = STViT("shrunk").eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        a = model(x)
        b = model(x.contiguous(memory_format=torch.channels_last))
    for o1, o2 in zip(a, b):
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        assert F.relu(o1).shape == o1.shape


@pytest.mark.parametrize("chunked", [False, True])
# 257 queries: the last chunk is one row (its probabilities are a (1, N_k) matrix read transposed by oneDNN)
@pytest.mark.parametrize("shape", [(2, 3, 300, 300, 16), (1, 2, 1000, 260, 32), (1, 2, 257, 260, 16)])
def test_onednn_attention_equals_sdpa(shape, chunked):
    """The CPU oneDNN attention kernels (kept probabilities / query chunks with recomputation): same outputs
    and q/k/v gradients as SDPA, on strided views as in the models."""
    # chunked: several chunks of 64 queries, and the dispatch picks the chunked kernel
    limits = dict(attention_max_probs_bytes=0, attention_chunk_bytes=64 * 4 * 300) if chunked else {}
    with fast_paths(True, attention_min_keys=256, **limits) as chosen:
        _check_onednn_attention(shape, chunked, chosen)


def _check_onednn_attention(shape, chunked, limits):
    from backbones.ops import attention_kernels

    B, nh, n_q, n_k, d = shape
    torch.manual_seed(0)
    qkv = torch.randn(B, n_q, 3, nh, d).permute(2, 0, 3, 1, 4)  # strided (B, heads, N, d) views
    q = qkv[0].clone().requires_grad_()
    k = torch.randn(B, nh, n_k, d).mul(2).requires_grad_()
    v = torch.randn(B, n_k, nh, d).transpose(1, 2).requires_grad_()
    q_view = q * 1
    kernel = attention_kernels._onednn_kernel(q_view, k, limits)
    assert kernel is (attention_kernels._OneDnnChunkedAttention if chunked else attention_kernels._OneDnnAttention)
    if chunked:
        assert len(kernel._chunks(n_q, n_k, limits.attention_chunk_bytes)) > 3
    scale = d**-0.5
    out = table.attention(q_view, k, v, scale)
    ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    assert_close(out, ref, "out")
    g = torch.randn_like(out)
    for a, b, n in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g), "qkv"):
        assert_close(a, b, f"grad {n}")


def test_attention_dispatch():
    from backbones.ops.attention_kernels import _onednn_kernel, _OneDnnAttention, _OneDnnChunkedAttention

    limits = Limits(attention_min_keys=256)  # the default on CPUs with AVX-512
    cpu = torch.zeros(1, 5, 1176, 64)
    assert _onednn_kernel(cpu, cpu, limits) is _OneDnnAttention
    assert _onednn_kernel(cpu[:, :, :100], cpu[:, :, :100], limits) is None  # few keys: SDPA
    assert _onednn_kernel(cpu.bfloat16(), cpu.bfloat16(), limits) is None  # reduced precision: SDPA
    big = torch.zeros(1, 5, 4200, 64)
    assert _onednn_kernel(big, big, limits) is _OneDnnChunkedAttention  # 350 MiB of probabilities: not kept
    small = torch.zeros(120, 1, 300, 8)
    assert _onednn_kernel(small, small, limits) is None  # many small calls
    # elsewhere (e.g. AVX2) SDPA measured faster: the kernel is not used by default
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    assert (_onednn_kernel(cpu, cpu, Limits()) is _OneDnnAttention) == avx512


def test_to_nchw_hands_the_gradient_back_in_the_source_layout():
    # the dense convolutions' NCHW detour: an NCHW gradient reaching the channels_last blocks made every gradient
    # accumulation there mix layouts
    x = torch.randn(2, 3, 5, 7).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = kernels.to_nchw(x)
    assert y.is_contiguous() and torch.equal(y, x)
    g = torch.randn(2, 3, 5, 7)
    y.backward(g)
    assert x.grad.is_contiguous(memory_format=torch.channels_last) and torch.equal(x.grad, g)


@pytest.mark.parametrize("family", FAMILIES.values(), ids=lambda f: f.name)
def test_dense_convs_in_nchw_equal_channels_last(family):
    """Limits.dense_conv_nchw: the stem's and the downsamplings' dense convolutions see contiguous NCHW inputs,
    and the whole model's outputs and gradients equal those of the channels_last path and the plain reference."""
    torch.manual_seed(0)
    model = family.cls(family.sizes["shrunk"]).train()
    first = model.get_submodule(family.classifier.first_conv)  # the stem's dense convolution
    seen = []
    first.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    x = torch.randn(2, 3, 72, 100)
    results = {}
    for nchw in (True, False):
        model.zero_grad(set_to_none=True)
        with fast_paths(True, dense_conv_nchw=nchw):
            results[nchw] = outputs_and_grads(model, x)
    assert seen[0] is True and seen[2] is False  # [nchw fast, nchw plain, channels_last fast, ...plain]
    for nchw, (outs, ref_outs, grads) in results.items():
        for i, (a, b) in enumerate(zip(outs, ref_outs)):
            assert_close(a, b, f"stage {i} (dense_conv_nchw={nchw})")
            assert a.is_contiguous()  # outputs are NCHW either way
        for n, g, ref_g in grads:
            if ref_g is None:  # a parameter the input size leaves unused
                assert g is None, n
            elif not n.endswith("downsample.proj.0.bias"):  # STViT's conv bias before a train-mode BN: 0 + noise
                assert_close(g, ref_g, n)


def _inverted_residual(kernel):
    """HAT-Net's inverted residual and its first 1x1 conv."""
    m = InvertedResidual(8, 32, kernel)
    return m, m.conv1[1]


def _mlp(kernel):
    """STViT's MLP (its depthwise conv is 3x3) and its first 1x1 conv."""
    m = Mlp(8, 32)
    return m, m.fc1


@pytest.mark.parametrize(
    "make,kernel", [(_inverted_residual, 3), (_inverted_residual, 5), (_mlp, 3)], ids=["ir-3", "ir-5", "mlp-3"]
)
def test_row_chunked_hidden_layers_are_exact(make, kernel):
    """The row-chunked MLP / inverted residual (halo rows for the depthwise conv) computes what the whole map
    computes: outputs and gradients of input and parameters, including the first/last rows and odd heights."""
    torch.manual_seed(0)
    m, first_conv = make(kernel)
    x = torch.randn(2, 8, 23, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    whole = m(x)  # small map: computed whole
    calls = []  # the heights that the first 1x1 conv sees
    first_conv.register_forward_pre_hook(lambda _, args: calls.append(args[0].shape[2]))
    with fast_paths(True, row_chunk_bytes=2 * 32 * 10 * 4 * 3):  # ~3 rows per chunk
        chunked = m(x)
    assert len(calls) >= 6 and max(calls) <= 3 + 2 * (kernel // 2) + 1
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
    g = torch.randn_like(whole)
    params = [x] + list(m.parameters())
    for a, b in zip(torch.autograd.grad(chunked, params, g), torch.autograd.grad(whole, params, g)):
        assert_close(a, b, "grad")  # weight grads are summed over chunks: rounding only


def _fast_and_plain_mlp(m: Mlp, x, **limits):
    """Outputs and gradients (input and parameters) of m with fast paths on under ``limits``, and off."""
    results = []
    for fast in (True, False):
        with fast_paths(fast, **limits):
            y = m(x)
        g = torch.ones_like(y).mul_(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
        results.append((y, torch.autograd.grad(y, [x] + list(m.parameters()), g), grad_fns(y)))
    return results


@pytest.mark.parametrize("recompute", [True, False])
def test_mlp_with_a_5x5_depthwise_conv_at_a_chunked_size(recompute):
    """A researcher's larger depthwise kernel: the row chunks' halo and the recomputing backward read the conv's
    own padding (the recomputation once hard-coded padding 1 and crashed on large fp32 training inputs)."""
    from backbones.models.stvit import ResDWC

    torch.manual_seed(0)
    m = Mlp(8, 32)
    m.conv = ResDWC(32, 5)
    x = torch.randn(2, 8, 23, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    heights = []
    m.fc1.register_forward_pre_hook(lambda _, args: heights.append(args[0].shape[2]))
    (y, grads, fns), (y_ref, grads_ref, _) = _fast_and_plain_mlp(
        m, x, row_chunk_bytes=2 * 32 * 10 * 4 * 3, mlp_recompute_numel=0 if recompute else 2**62
    )
    assert ("_MlpTailBackward" in fns) == recompute
    assert len(heights) >= 7 and max(heights[:-1]) <= 3 + 2 * 2 + 1  # chunks with 2 halo rows, then the plain run
    assert_close(y, y_ref, "out")
    for a, b in zip(grads, grads_ref):
        assert_close(a, b, "grad")


@pytest.mark.parametrize("act", [torch.nn.ReLU(), torch.nn.GELU(approximate="tanh")], ids=["relu", "gelu-tanh"])
def test_mlp_with_another_activation(act):
    """Swapping the activation works on the fast path (it once read ``act1.approximate`` of any module) and keeps
    the plain math: the recomputing backward, written for the exact GELU, is not used."""
    torch.manual_seed(0)
    m = Mlp(8, 32)
    m.act1 = act
    x = torch.randn(2, 8, 9, 11).contiguous(memory_format=torch.channels_last).requires_grad_()
    (y, grads, fns), (y_ref, grads_ref, _) = _fast_and_plain_mlp(m, x, mlp_recompute_numel=0)
    assert "_MlpTailBackward" not in fns
    assert_close(y, y_ref, "out")
    for a, b in zip(grads, grads_ref):
        assert_close(a, b, "grad")


@pytest.mark.parametrize("kernel,dw_bias", [(3, False), (5, True)])
def test_inverted_residual_tail_gradcheck(kernel, dw_bias):
    from backbones.models.hatnet_ops import _InvertedResidualTail

    args = [torch.randn(1, 6, 4, 5), torch.randn(6, 1, kernel, kernel), torch.randn(6) if dw_bias else None]
    args.append(torch.randn(3, 6, 1, 1))
    conv_args = ((1, 1), (kernel // 2, kernel // 2), (1, 1), 6)
    inputs = [a.double().requires_grad_() if a is not None else None for a in args]
    assert torch.autograd.gradcheck(lambda *a: _InvertedResidualTail.apply(*a, conv_args), inputs)


def _saved_bytes(fn, *args) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn(*args)`` runs (the activation memory)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total[0]


@pytest.mark.parametrize("frozen", [False, True])
def test_inverted_residual_recomputation_equals_plain_and_keeps_one_hidden_tensor(frozen):
    """HAT-Net's inverted residual with its SiLUs and depthwise conv recomputed in backward, in row chunks:
    the plain outputs and gradients, and one hidden-width tensor kept for backward where plain autograd keeps
    four (h, SiLU(h), the depthwise conv's output, its SiLU)."""
    from backbones.models.hatnet import InvertedResidual

    torch.manual_seed(0)
    m = InvertedResidual(8, 32, 3)
    if frozen:
        m.conv2.requires_grad_(False)
    x = torch.randn(2, 8, 23, 10).contiguous(memory_format=torch.channels_last).requires_grad_()
    hidden_bytes = 2 * 32 * 23 * 10 * 4
    limits = dict(row_chunk_bytes=2 * 32 * 10 * 4 * 3)  # ~3 rows per chunk
    params = [x] + [p for p in m.parameters() if p.requires_grad]
    with fast_paths(True, mlp_recompute_numel=0, **limits):
        y = m(x)
    assert {"_InvertedResidualTailBackward", "_OverlappingRowsBackward"} <= grad_fns(y)
    y_ref = _plain_mlp(m, x)
    assert_close(y, y_ref, "out")
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(y_ref, params, g)):
        assert_close(a, b, "grad")
    # the whole map (no halo rows): h and the narrow tensors (x, the GroupNorms') against four hidden tensors
    with fast_paths(True, mlp_recompute_numel=0):
        recomputed = _saved_bytes(m, x)
    with fast_paths(True, mlp_recompute_numel=2**62):
        kept = _saved_bytes(m, x)
    assert recomputed < 2 * hidden_bytes and kept - recomputed >= 3 * hidden_bytes


@pytest.mark.parametrize("with_cp", [False, True])
def test_hatnet_train_step_with_recomputation_equals_reference(with_cp):
    """Whole HAT-Net, train mode, the recomputing inverted residual in every block, with and without
    checkpointing: the plain outputs and gradients."""
    from backbones import HATNet

    torch.manual_seed(0)
    model = HATNet("shrunk", with_cp=with_cp).train()
    with fast_paths(True, mlp_recompute_numel=0):
        outs, ref_outs, grads = outputs_and_grads(model, torch.randn(2, 3, 72, 100))
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        assert_close(a, b, f"stage {i}")
    for n, g, ref_g in grads:
        if g is not None or ref_g is not None:
            assert_close(g, ref_g, n)
