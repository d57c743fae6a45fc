"""One switch for every speed path of the backbones (timm's ``set_fused_attn`` idea, for all of them at once).

With fast paths on (the default) the backbones take the kernels that measure faster or leaner on the machine they
run on: oneDNN-GEMM attention on AVX-512 CPUs, row chunks of the widest activations, the recomputing STViT MLP and
HAT-Net inverted residual, STViT's residual depthwise convolutions as one convolution, NCHW dense convolutions on
AVX2 CPUs, and whatever is added later (``Limits`` holds the per-CPU defaults). With them off, every module
computes the plain formulation of the paper instead. Both compute the same values and gradients
(``tests/test_fast_kernels_match_plain.py``, ``tests/test_golden.py``); the plain path is the one to read, to
export and to count FLOPs on.

Switching selects the op set (``table.OpSet``) that the model files call from their next forward on, in every
model already built; the size thresholds (``Limits``) are part of the set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from . import table
from .limits import Limits


def fast_paths_enabled() -> bool:
    """Whether the fast paths are on."""
    return table.active().fast


def set_fast_paths(enabled: bool) -> bool:
    """Switch every fast path on or off for all models; returns the previous setting."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_fast_paths expects True or False; got {enabled!r}")
    return table.activate(table.select(enabled, table.active().limits)).fast


@contextmanager
def fast_paths(enabled: bool, **limits: int) -> Iterator[Limits]:
    """``with fast_paths(False): ...`` runs the plain formulation inside the block and restores the previous
    setting after it. Keyword arguments override fields of ``Limits`` for the block (e.g.
    ``fast_paths(True, row_chunk_bytes=4096)`` to make a small input take the row chunks in a test)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"fast_paths expects True or False; got {enabled!r}")
    fields = [f.name for f in dataclasses.fields(Limits)]
    unknown = sorted(set(limits) - set(fields))
    if unknown:
        raise TypeError(f"fast_paths: unknown limits {unknown}; valid: {fields}")
    chosen = dataclasses.replace(table.active().limits, **limits)
    previous = table.activate(table.select(enabled, chosen))
    try:
        yield chosen
    finally:
        table.activate(previous)
