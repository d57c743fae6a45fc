"""The released variants against the papers: parameters and GMACs at 224x224 (with the classification head the
backbones leave out), and inference throughput. The papers' figures are the family records' (``Family.paper``)."""

from __future__ import annotations

import dataclasses
import sys

import torch

from backbones import FAMILIES, create
from backbones.families import get

from ..flops import count_gmacs
from ..models import Setting, model_and_input
from ..timing import throughput


def classifier_head(family: str, channels: int) -> tuple[int, int]:
    """(params, MACs at 224) of the official classification head that the backbone leaves out (the family's
    ``head_cost``; (0, 0) for a family without one)."""
    cost = get(family).head_cost
    return cost(channels) if cost else (0, 0)


def paper_throughput(family: str, arch) -> float | None:
    """The images/s at 224x224 that ``family``'s paper gives for ``arch`` (None: none given)."""
    paper = get(family).paper.get(arch) if isinstance(arch, str) else None
    return paper.images_per_s if paper else None


def variants_table() -> str:
    """Params and GMACs of every released variant of every registered family at 224x224, alone and with the
    official head, next to the paper's figures where the family's record gives them."""
    lines = [
        "| variant | backbone params (M) | backbone GMACs | + official head: params (M) / GMACs "
        "| paper: params (M) / GMACs |",
        "|---|---|---|---|---|",
    ]
    for family, arch in [(f.name, arch) for f in FAMILIES.values() for arch in f.released]:
        paper = get(family).paper.get(arch)
        model = create(family, arch)
        params = sum(p.numel() for p in model.parameters())
        macs = count_gmacs(model, torch.randn(1, 3, 224, 224)) * 1e9
        head_params, head_macs = classifier_head(family, model.stage_channels[-1])
        lines.append(
            f"| {family}-{arch} | {params / 1e6:.1f} | {macs / 1e9:.2f} | "
            f"{(params + head_params) / 1e6:.1f} / {(macs + head_macs) / 1e9:.2f} | "
            + (f"{paper.params_m} / {paper.gmacs} |" if paper else "n/a |")
        )
    return "\n".join(lines)


def throughput_table(s: Setting) -> str:
    """Images per second of every released variant of ``s.family`` (its measured one if none is released)
    (inference, ``s.batch``, ``s.size``, ``s.device``, ``s.precision``), next to the paper's figure where its
    record gives one (at 224x224). Backbones only: no classifier head. On CUDA give ``warmup`` and ``repeat``
    enough iterations for the kernels' autotuning to settle."""
    lines = [
        "| backbone | input | batch | device | precision | images/s | paper images/s (224x224) |",
        "|---|---|---|---|---|---|---|",
    ]
    family = get(s.family)
    for arch in family.released or (family.measured_variant(),):
        a = dataclasses.replace(s, arch=arch, mode="infer", options={})
        model, x = model_and_input("ours", a)
        images_per_s = throughput(model, x, a.warmup, a.repeat, a.precision)
        del model, x
        paper = paper_throughput(s.family, arch) if tuple(a.size) == (224, 224) else None
        lines.append(
            f"| {s.family}-{arch} | {a.size[0]}x{a.size[1]} | {a.batch} | {a.device} | {a.precision} "
            f"| {images_per_s:.4g} | {paper if paper else 'n/a'} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)
