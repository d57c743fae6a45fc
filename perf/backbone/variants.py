"""The released variants against the papers: parameters and GMACs at 224x224 (with the classification head the
backbones leave out), and inference throughput."""

from __future__ import annotations

import dataclasses
import sys

import torch

from backbones import create
from backbones.families import get

from ..flops import count_gmacs
from ..models import Setting, model_and_input
from ..timing import throughput

# The papers' figures (params in M, GMACs at 224x224, classification models including their heads).
PAPER = {
    ("stvit", "small"): (25, 4.4),
    ("stvit", "base"): (52, 9.9),
    ("stvit", "large"): (95, 15.6),
    ("hatnet", "tiny"): (12.7, 2.0),
    ("hatnet", "small"): (25.7, 4.3),
    ("hatnet", "medium"): (42.9, 8.3),
    ("hatnet", "large"): (63.1, 11.5),
}
# Inference throughput the STViT paper reports at 224x224 (images/s, its GPU, classification models).
PAPER_THROUGHPUT = {("stvit", "small"): 677, ("stvit", "base"): 361, ("stvit", "large"): 269}


def classifier_head(family: str, channels: int) -> tuple[int, int]:
    """(params, MACs at 224) of the official classification head that the backbone leaves out (the family's
    ``head_cost``; (0, 0) for a family without one)."""
    cost = get(family).head_cost
    return cost(channels) if cost else (0, 0)


def variants_table() -> str:
    """Params and GMACs of every variant of ``PAPER`` at 224x224, alone and with the official head."""
    lines = [
        "| variant | backbone params (M) | backbone GMACs | + official head: params (M) / GMACs "
        "| paper: params (M) / GMACs |",
        "|---|---|---|---|---|",
    ]
    for (family, arch), (p_params, p_gmacs) in PAPER.items():
        model = create(family, arch)
        params = sum(p.numel() for p in model.parameters())
        macs = count_gmacs(model, torch.randn(1, 3, 224, 224)) * 1e9
        head_params, head_macs = classifier_head(family, model.stage_channels[-1])
        lines.append(
            f"| {family}-{arch} | {params / 1e6:.1f} | {macs / 1e9:.2f} | "
            f"{(params + head_params) / 1e6:.1f} / {(macs + head_macs) / 1e9:.2f} | {p_params} / {p_gmacs} |"
        )
    return "\n".join(lines)


def throughput_table(s: Setting) -> str:
    """Images per second of every released variant of ``s.family`` (inference, ``s.batch``, ``s.size``,
    ``s.device``, ``s.precision``), next to the paper's figure where it gives one (at 224x224). Backbones
    only: no classifier head. On CUDA give ``warmup`` and ``repeat`` enough iterations for the kernels'
    autotuning to settle."""
    lines = [
        "| backbone | input | batch | device | precision | images/s | paper images/s (224x224) |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, arch in PAPER:
        if family != s.family:
            continue
        a = dataclasses.replace(s, arch=arch, mode="infer", stoken_size=None)
        model, x = model_and_input("ours", a)
        images_per_s = throughput(model, x, a.warmup, a.repeat, a.precision)
        del model, x
        paper = PAPER_THROUGHPUT.get((family, arch)) if tuple(a.size) == (224, 224) else None
        lines.append(
            f"| {family}-{arch} | {a.size[0]}x{a.size[1]} | {a.batch} | {a.device} | {a.precision} "
            f"| {images_per_s:.4g} | {paper if paper else 'n/a'} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)
