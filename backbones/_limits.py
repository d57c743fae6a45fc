"""The input sizes from which the fast kernels engage (used by ``_ops`` and the kernel modules)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
    """Input sizes from which each fast path engages (see docs/performance.md for why these values).

    Attributes:
        row_chunk_bytes: hidden layers larger than twice this are computed in row chunks of about this size.
        mlp_recompute_numel: hidden activations of STViT's MLP and HAT-Net's inverted residual of at least
            this many elements are recomputed in backward instead of kept (0 = always, a huge value = never).
        attention_min_keys: the oneDNN attention kernel serves attention over at least this many keys.
        attention_max_calls: ... and at most this many (batch x heads) GEMM pairs.
        attention_max_probs_bytes: up to this size the attention probabilities are kept for backward; above
            it, query chunks are recomputed.
        attention_chunk_bytes: probabilities per query chunk of the chunked attention kernel.
    """

    row_chunk_bytes: int = 8 * 2**20
    mlp_recompute_numel: int = 2**23
    attention_min_keys: int = 256
    attention_max_calls: int = 64
    attention_max_probs_bytes: int = 64 * 2**20
    attention_chunk_bytes: int = 4 * 2**20
