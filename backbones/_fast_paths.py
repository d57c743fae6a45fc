"""One switch for every speed path of the backbones (timm's ``set_fused_attn`` idea, for all of them at once).

With fast paths on (the default) the backbones take the kernels that measure faster or leaner on the
machine they run on: oneDNN-GEMM attention on CPU, row chunks of the widest activations, the recomputing
STViT MLP, and whatever is added later. With them off, every module computes the plain formulation of the
paper instead. Both compute the same values and gradients (``tests/test_perf_equivalence.py``,
``tests/test_golden.py``); the plain path is the one to read, to export and to count FLOPs on.

Each fast path reads ``enabled()`` (and its size threshold from ``LIMITS``) when it runs, so switching takes
effect on the next forward of any model already built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.utils.checkpoint import noop_context_fn


@dataclasses.dataclass
class Limits:
    """Input sizes from which each fast path engages (see docs/performance.md, "Fast paths", for why these values).

    Attributes:
        row_chunk_bytes: hidden layers larger than twice this are computed in row chunks of about this size.
        mlp_recompute_numel: STViT MLP hidden activations of at least this many elements are recomputed in
            backward instead of kept (0 = always, a huge value = never).
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


LIMITS = Limits()
_ENABLED = [True]


def enabled() -> bool:
    """Whether the fast paths are on."""
    return _ENABLED[0]


def set_fast_paths(enabled: bool) -> bool:
    """Switch every fast path on or off for all models; returns the previous setting."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_fast_paths expects True or False; got {enabled!r}")
    previous, _ENABLED[0] = _ENABLED[0], enabled
    return previous


@contextmanager
def fast_paths(enabled: bool, **limits: int) -> Iterator[Limits]:
    """``with fast_paths(False): ...`` runs the plain formulation inside the block and restores the previous
    setting after it. Keyword arguments override fields of ``Limits`` for the block (e.g.
    ``fast_paths(True, row_chunk_bytes=4096)`` to make a small input take the row chunks in a test)."""
    unknown = sorted(set(limits) - {f.name for f in dataclasses.fields(Limits)})
    if unknown:
        raise TypeError(f"fast_paths: unknown limits {unknown}; valid: {[f.name for f in dataclasses.fields(Limits)]}")
    saved = dataclasses.replace(LIMITS)
    previous = set_fast_paths(enabled)
    try:
        for name, value in limits.items():
            setattr(LIMITS, name, value)
        yield LIMITS
    finally:
        set_fast_paths(previous)
        for f in dataclasses.fields(Limits):
            setattr(LIMITS, f.name, getattr(saved, f.name))


def same_paths_in_recomputation():
    """A ``context_fn`` for ``torch.utils.checkpoint``: the recomputation in backward takes the paths that this
    forward takes, even if the switch or the limits have changed by then. (A compiled graph has its paths
    fixed already.)"""
    if torch.compiler.is_compiling():
        return noop_context_fn
    state, limits = enabled(), dataclasses.asdict(LIMITS)
    return lambda: (nullcontext(), fast_paths(state, **limits))
