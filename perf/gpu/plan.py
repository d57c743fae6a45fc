"""The GPU report (tools/gpu_report.py): its plans, its models by key and its time budget. The sections it
measures are ``perf/gpu/sections.py``'s, its Markdown ``perf/gpu/markdown.py``'s (``render``, importable here).
Needs only torch, ``backbones`` and Swin-T's source (mmdet, timm or torchvision): no mm package is imported on
the way."""

from __future__ import annotations

import sys
import time
import traceback
from typing import NamedTuple

import torch

from backbones import FAMILIES

from ..backbone.variants import PAPER
from ..models import build, dense_stoken_size, ours_and_official
from ..official import load_official
from ..report import Failure
from .markdown import EXACT_TOLERANCE, device_name, render, tf32_state

__all__ = [
    "EXACT_TOLERANCE",
    "FULL",
    "MODEL_NAMES",
    "QUICK",
    "Budget",
    "Models",
    "Plan",
    "attempt",
    "device_name",
    "render",
    "tf32_state",
]


class Plan(NamedTuple):
    """Sizes and iteration counts of one run."""

    exact_sizes: tuple  # (H, W): the detection size, one that divides every grid, one that divides none
    train_size: tuple
    train_batch: int
    train_warmup: int
    train_iters: int
    tp_size: tuple
    tp_batch: int
    tp_warmup: int
    tp_iters: int
    variants: tuple  # (name, family, arch) of the throughput rows
    shrunk: bool  # the 'shrunk' archs instead of the small variants (and a shrunk Swin-T)
    compile_models: tuple
    compile_backend: str
    compile_timeout_s: float
    budget_s: float


FULL = Plan(
    exact_sizes=((800, 1344), (896, 1344), (805, 1211)),
    train_size=(800, 1344),
    train_batch=2,
    train_warmup=3,
    train_iters=10,
    tp_size=(224, 224),
    tp_batch=64,
    tp_warmup=50,
    tp_iters=30,
    variants=tuple((f"{f}-{a}", f, a) for f, a in PAPER),
    shrunk=False,
    compile_models=("stvit-s-dense", "hatnet-s", "stvit-s"),
    compile_backend="inductor",
    compile_timeout_s=200,
    budget_s=480,
)
# CPU smoke run: every code path of the full run on the shrunk archs (a CPU has no fast fp16 / bf16 kernels,
# so even the small variants' half-precision steps are slow there), at sizes whose stage maps still exercise the
# padding (72x100 divides no grid). torch.compile with the eager backend: dynamo's graph capture (graph breaks,
# guards) and the child-process plumbing, without inductor's C++ code generation or AOTAutograd (both slow on
# a CPU; docs/measuring.md, "GPU report").
QUICK = Plan(
    exact_sizes=((64, 96), (224, 224), (72, 100)),
    train_size=(64, 96),
    train_batch=1,
    train_warmup=1,
    train_iters=2,
    tp_size=(32, 32),
    tp_batch=2,
    tp_warmup=1,
    tp_iters=2,
    variants=tuple((f"{f}-shrunk", f, "shrunk") for f in ("stvit", "hatnet")),
    shrunk=True,
    compile_models=("stvit-s-dense",),
    compile_backend="eager",
    compile_timeout_s=300,
    budget_s=110,
)


def attempt(notes: list | None, label: str, fn, *args):
    """fn(*args), or a Failure naming the exception (also added to ``notes`` with its traceback, under
    ``label``); out-of-memory frees the cache so that the next row starts clean."""
    try:
        return fn(*args)
    except Exception as e:  # one row's failure (OOM, compile error, unsupported size) must not end the run
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        first = (str(e).strip().splitlines() or [""])[0]
        if notes is not None:
            notes.append(f"{label}: {type(e).__name__}: {first}\n\n```\n{traceback.format_exc(limit=-3)}```")
        return Failure(f"{type(e).__name__}: {first[:90]}")


class Budget:
    """The run's time budget: rows that would start after ``seconds`` are skipped.

    Args:
        seconds: the budget, counted from construction.
    """

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def skip(self) -> Failure | None:
        return Failure(f"skipped: past the {self.seconds:.0f} s time budget") if self.left() <= 0 else None

    def progress(self, what: str) -> None:
        print(f"[{self.elapsed():5.0f} s] {what}", file=sys.stderr, flush=True)


MODEL_NAMES = {
    "stvit-s": "STViT-S",
    "stvit-s-dense": "STViT-S dense",
    "hatnet-s": "HAT-Net-S",
    "official-stvit-s": "official STViT-S",
    "official-stvit-s-dense": "official STViT-S dense",
    "official-hatnet-s": "official HAT-Net-S",
    "swin-t": "Swin-T",
}


class Models:
    """The report's models by key (``MODEL_NAMES``), built seeded on the CPU by ``perf.models.build``.

    Args:
        official_stvit: hhb072/STViT's ``models/stvit.py`` (None: no official STViT rows).
        official_hatnet: yun-liu/HAT-Net's ``HAT_Net.py`` (None: no official HAT-Net rows).
        shrunk: the 'shrunk' archs (and a shrunk Swin-T) instead of the small variants.
    """

    def __init__(self, official_stvit=None, official_hatnet=None, shrunk=False):
        self.dense, self.shrunk = dense_stoken_size(), shrunk
        self.official = {}
        for path, family in ((official_stvit, "stvit"), (official_hatnet, "hatnet")):
            if path:
                module, found = load_official(path)
                if found != family:
                    raise SystemExit(f"--official-{family} {path} is the {found} model file; pass {family}'s")
                self.official[family] = module

    def ours_keys(self):
        return ["stvit-s", "stvit-s-dense", "hatnet-s"]

    def keys(self):
        ours = self.ours_keys()
        official = [f"official-{key}" for key in ours if self.family(key) in self.official]
        return ours + official + ["swin-t"]

    def family(self, key) -> str:
        return next(name for name in FAMILIES if name in key)  # a key names its family: 'official-stvit-s'

    def shrunk_for(self, key) -> bool:
        """Shrunk in --quick, except where the official model is given: its weights need the small variant."""
        return (
            self.shrunk
            and not key.startswith("official")
            and (key == "swin-t" or self.family(key) not in self.official)
        )

    def label(self, key):
        name = MODEL_NAMES[key] + (" (shrunk)" if self.shrunk_for(key) else "")
        return name + f" {','.join(map(str, self.dense))}" if key.endswith("dense") else name

    def stoken(self, key):
        return self.dense if key.endswith("dense") else None

    def build(self, key, size=None, family_arch=None):
        """The model of ``key``, or with ``family_arch`` = (family, arch) that variant of ours."""
        if family_arch:
            return build("ours", *family_arch)
        arch = "shrunk" if self.shrunk_for(key) else "small"
        if key == "swin-t":
            return build("swin-t", arch=arch, size=size)
        family = self.family(key)
        if key.startswith("official-"):
            return build("official", family, "small", self.stoken(key), official=self.official[family])
        return build("ours", family, arch, self.stoken(key))

    def with_official_weights(self, key):
        """(ours, official or None): ours carries the official model's weights when the official file is given."""
        family = self.family(key)
        if family not in self.official:
            return self.build(key), None
        return ours_and_official(self.official[family], family, "small", self.stoken(key))
