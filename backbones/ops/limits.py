"""The input sizes from which the fast kernels engage (used by ``table`` and the kernel modules)."""

import dataclasses

import torch

# The CPU kind decides three defaults, each measured on both kinds (figures: docs/kernels.md):
# with AVX-512 oneDNN's GEMMs outran MKL's, the oneDNN attention kernel beat SDPA and the row chunks were tuned at
# 8 MiB; on an AVX2 CPU (no AVX-512) SDPA was the faster, dense 3x3 convolutions ran forward and backward faster
# in NCHW than in channels_last, and 32 MiB row chunks (fewer, larger GEMMs) ran the step faster than 8 MiB ones.
_AVX512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
_NEVER = 2**62


@dataclasses.dataclass(frozen=True)
class Limits:
    """Input sizes from which each fast path engages (see docs/kernels.md for why these values).

    Attributes:
        row_chunk_bytes: hidden layers larger than twice this are computed in row chunks of about this size
            (by default 8 MiB on CPUs with AVX-512, 32 MiB elsewhere).
        mlp_recompute_numel: hidden activations of STViT's MLP and HAT-Net's inverted residual of at least
            this many elements are recomputed in backward instead of kept (0 = always, a huge value = never).
        attention_min_keys: the oneDNN attention kernel serves attention over at least this many keys (by
            default 256 on CPUs with AVX-512, never elsewhere: SDPA serves it).
        attention_max_calls: ... and at most this many (batch x heads) GEMM pairs.
        attention_max_probs_bytes: up to this size the attention probabilities are kept for backward; above
            it, query chunks are recomputed.
        attention_chunk_bytes: probabilities per query chunk of the chunked attention kernel.
        dense_conv_nchw: the stems' and downsamplings' dense 3x3 convolutions run on CPU tensors in contiguous
            NCHW, their results going back to channels_last (by default on CPUs without AVX-512).
    """

    row_chunk_bytes: int = (8 if _AVX512 else 32) * 2**20
    mlp_recompute_numel: int = 2**23
    attention_min_keys: int = 256 if _AVX512 else _NEVER
    attention_max_calls: int = 64
    attention_max_probs_bytes: int = 64 * 2**20
    attention_chunk_bytes: int = 4 * 2**20
    dense_conv_nchw: bool = not _AVX512
