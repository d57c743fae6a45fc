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

from backbones.families import get

from ..lineup import Entry, entries
from ..models import build, ours_and_official
from ..official import load_official
from ..report import Failure

__all__ = [
    "FULL",
    "QUICK",
    "Budget",
    "Models",
    "Plan",
    "attempt",
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
    shrunk: bool  # the 'shrunk' archs instead of the measured variants (and a shrunk Swin-T)
    compile_all: bool  # every model's torch.compile row, or only the first one's (Models.compile_keys)
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
    shrunk=False,
    compile_all=True,
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
    shrunk=True,
    compile_all=False,
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


class Models:
    """The report's models by key: every row of ``perf.lineup.entries`` (``'stvit-s'``, ``'stvit-s-dense'``, ...),
    the official model of each family whose file is given (``'official-stvit-s'``, ...) and ``'swin-t'``, built
    seeded on the CPU by ``perf.models.build``.

    Args:
        official: official model files, at most one per family (``perf.official.load_official`` tells whose).
        shrunk: the 'shrunk' archs (and a shrunk Swin-T) instead of the measured variants.
        families: the names of the families with rows (None: every registered one).
    """

    def __init__(self, official=(), shrunk=False, families=None):
        self.shrunk = shrunk
        self.entries = {e.key: e for e in entries(families)}
        self.official = {}
        for path in official:
            module, family = load_official(path)
            if family in self.official:
                raise SystemExit(f"--official {path}: another {get(family).title} model file; give one per family")
            self.official[family] = module

    def ours_keys(self) -> list[str]:
        return list(self.entries)

    def keys(self) -> list[str]:
        ours = self.ours_keys()
        official = [f"official-{key}" for key in ours if self.family(key) in self.official]
        return ours + official + ["swin-t"]

    def entry(self, key) -> Entry:
        return self.entries[key.removeprefix("official-")]

    def family(self, key) -> str:
        return self.entry(key).family

    def variants(self) -> list[tuple]:
        """(name, family, arch) of the throughput rows: every released variant of every family (its measured one
        if none is released), or each family's shrunk arch."""
        families = dict.fromkeys(e.family for e in self.entries.values())
        if self.shrunk:
            return [(f"{f}-shrunk", f, "shrunk") for f in families]
        released = {f: get(f).released or (get(f).measured_variant(),) for f in families}
        return [(f"{f}-{a}", f, a) for f in families for a in released[f]]

    def compile_keys(self, every: bool) -> list[str]:
        """The torch.compile rows (``every``: all of ours, else only the first): the named settings first (the
        configs' own options), then the families without settings, then the presets of those with settings."""
        ranked = self.ours_keys()
        with_settings = {e.family for e in self.entries.values() if e.setting}
        ranked.sort(key=lambda k: 0 if self.entry(k).setting else 2 if self.family(k) in with_settings else 1)
        return ranked if every else ranked[:1]

    def shrunk_for(self, key) -> bool:
        """Shrunk in --quick, except where the official model is given: its weights need the measured variant."""
        return (
            self.shrunk
            and not key.startswith("official")
            and (key == "swin-t" or self.family(key) not in self.official)
        )

    def label(self, key) -> str:
        if key == "swin-t":
            return "Swin-T" + (" (shrunk)" if self.shrunk_for(key) else "")
        e = self.entry(key)
        name = ("official " if key.startswith("official-") else "") + e.label
        return " ".join(filter(None, (name + (" (shrunk)" if self.shrunk_for(key) else ""), e.values())))

    def build(self, key, size=None, family_arch=None):
        """The model of ``key``, or with ``family_arch`` = (family, arch) that variant of ours."""
        if family_arch:
            return build("ours", *family_arch)
        arch = "shrunk" if self.shrunk_for(key) else None
        if key == "swin-t":
            return build("swin-t", arch=arch, size=size)
        e = self.entry(key)
        if key.startswith("official-"):
            return build("official", e.family, e.arch, e.kwargs(), official=self.official[e.family])
        return build("ours", e.family, arch or e.arch, e.kwargs())

    def with_official_weights(self, key):
        """(ours, official or None): ours carries the official model's weights when the official file is given."""
        e = self.entry(key)
        if e.family not in self.official:
            return self.build(key), None
        return ours_and_official(self.official[e.family], e.family, e.arch, e.kwargs())
