#!/usr/bin/env python
"""GPU evidence in one run: exactness, the detection-size training step, throughput and torch.compile, as one
Markdown report (written to --out and printed).

  python tools/gpu_report.py --device cuda --out gpu_report.md \\
      [--official-stvit STViT/models/stvit.py] [--official-hatnet HAT-Net/HAT_Net.py]
  python tools/gpu_report.py --device cpu --quick --out report.md   # smoke run: small sizes, few iterations

It needs only torch, ``backbones`` and (for Swin-T) timm or torchvision: no mmengine / mmcv / mmdet / mmseg,
so it runs on a machine that has PyTorch and nothing of this project installed. The official model files
(hhb072/STViT ``models/stvit.py``, yun-liu/HAT-Net ``HAT_Net.py``) are optional; they are loaded as
``tools/compare_official.py`` loads them.

Sections (rows for STViT-S in its preset and the COCO configs' dense setting, HAT-Net-S, the official models
when given, and Swin-T):
- exactness: fp32 stage outputs (TF32 off) on --device against our CPU fast paths, against the plain
  formulation (explicit N x N attention) on --device, and against the official code on --device;
- training step: forward + backward of the four stage outputs, bf16 / fp16 (GradScaler) / fp32 autocast;
- throughput: inference images/s as the STViT paper's ``throughput()`` measures it, fp32 and bf16;
- torch.compile: the bf16 training step compiled against eager, with the compile time (one child process
  per model, so a compiler crash or hang costs that row only).

Time: CUDA events after warm-up on CUDA (perf_counter on CPU); peak memory: torch.cuda.max_memory_allocated,
reset per row (weights and gradients included). A failing row (out of memory, compile error) is recorded in the
report and the run goes on; rows that would start after --budget-s seconds are skipped with a note.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(TOOLS))

import benchmark  # noqa: E402
import compare_official  # noqa: E402

from backbones import HATNet, STViT, load_pretrained  # noqa: E402

COCO_CONFIG = ROOT / "configs/stvit/mask-rcnn_stvit-s_fpn_1x_coco.py"
PRECISIONS = ("bf16", "fp16", "fp32")
EXACT_TOLERANCE = 1e-4  # max relative difference of fp32 outputs that counts as the same computation


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
    shrunk: bool  # docs/DESIGN.md's shrunk archs instead of the small variants (and a shrunk Swin-T)
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
    variants=tuple((f"{f}-{a}", f, a) for f, a in benchmark.PAPER),
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
# a CPU; figures in docs/performance.md, "GPU report").
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
    variants=tuple((f"{f}-shrunk", f, benchmark.SHRUNK_ARCHS[f]) for f in ("stvit", "hatnet")),
    shrunk=True,
    compile_models=("stvit-s-dense",),
    compile_backend="eager",
    compile_timeout_s=300,
    budget_s=110,
)


def dense_stoken_size(config=COCO_CONFIG) -> list[int]:
    """``dense_stoken_size`` of the COCO config, read as a literal (mmengine is not needed to read it)."""
    for node in ast.parse(Path(config).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "dense_stoken_size" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit(f"{config} has no `dense_stoken_size = [...]`; the dense STViT rows read it from there")


class Failure(str):
    """A cell that could not be measured: the reason, shown in the report instead of a number."""


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


def progress(budget, what: str) -> None:
    print(f"[{budget.elapsed():5.0f} s] {what}", file=sys.stderr, flush=True)


class Budget:
    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def skip(self) -> Failure | None:
        return Failure(f"skipped: past the {self.seconds:.0f} s time budget") if self.left() <= 0 else None


# ---- models ---------------------------------------------------------------------------------------------
def swin_source() -> str:
    try:
        import timm

        return f"timm {timm.__version__}"
    except ImportError:
        import torchvision

        return f"torchvision {torchvision.__version__} (timm not installed)"


class SwinStages(torch.nn.Module):
    """Swin-T's four stage outputs as NCHW maps: timm's model when installed (random weights), else
    torchvision's (the same architecture)."""

    def __init__(self, size, shrunk=False):
        super().__init__()
        arch = dict(embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)) if shrunk else {}
        try:
            import timm
        except ImportError:
            timm = None
        if timm is not None:
            try:
                self.net = timm.create_model(
                    "swin_tiny_patch4_window7_224",
                    features_only=True,
                    img_size=size,
                    pretrained=False,
                    strict_img_size=False,
                    **arch,
                )
            except TypeError:  # older timm: no strict_img_size
                self.net = timm.create_model(
                    "swin_tiny_patch4_window7_224", features_only=True, img_size=size, pretrained=False, **arch
                )
        else:
            import torchvision

            features = (
                torchvision.models.SwinTransformer([4, 4], 32, [1, 1, 2, 1], [1, 2, 4, 8], [7, 7])
                if shrunk
                else torchvision.models.swin_t()
            ).features
            self.net = torch.nn.ModuleList(
                [torch.nn.Sequential(features[0], features[1])]
                + [torch.nn.Sequential(features[i], features[i + 1]) for i in (2, 4, 6)]
            )

    def forward(self, x):
        if isinstance(self.net, torch.nn.ModuleList):
            outs = []
            for stage in self.net:
                x = stage(x)
                outs.append(x)
        else:
            outs = self.net(x)
        return tuple(o.permute(0, 3, 1, 2) for o in outs)  # both return NHWC maps


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
    """Builds every model of the report by key (seeded, on CPU; the caller moves it)."""

    def __init__(self, official_stvit=None, official_hatnet=None, shrunk=False):
        self.dense, self.shrunk = dense_stoken_size(), shrunk
        self.official = {}
        for path, family in ((official_stvit, "stvit"), (official_hatnet, "hatnet")):
            if path:
                module, found = compare_official.load_official(path)
                if found != family:
                    raise SystemExit(f"--official-{family} {path} is the {found} model file; pass {family}'s")
                self.official[family] = module

    def ours_keys(self):
        return ["stvit-s", "stvit-s-dense", "hatnet-s"]

    def keys(self):
        keys = self.ours_keys()
        if "stvit" in self.official:
            keys += ["official-stvit-s", "official-stvit-s-dense"]
        if "hatnet" in self.official:
            keys += ["official-hatnet-s"]
        return keys + ["swin-t"]

    def family(self, key) -> str:
        return "stvit" if "stvit" in key else "hatnet"

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
        torch.manual_seed(0)
        if family_arch:
            family, arch = family_arch
            return benchmark.FAMILIES[family](arch)
        if key == "swin-t":
            return SwinStages(size, self.shrunk)
        family = self.family(key)
        if key.startswith("official-"):
            return compare_official.build_official(self.official[family], family, "small", self.stoken(key))
        arch = benchmark.SHRUNK_ARCHS[family] if self.shrunk_for(key) else "small"
        return STViT(arch, stoken_size=self.stoken(key)) if family == "stvit" else HATNet(arch)

    def with_official_weights(self, key):
        """(ours, official or None): ours carries the official model's weights when the official file is given."""
        ours = self.build(key)
        if self.family(key) not in self.official:
            return ours, None
        official = self.build(f"official-{key}")
        load_pretrained(ours, official.model.state_dict())
        return ours, official


@contextmanager
def plain_formulation(model):
    """The model computed the plain way (explicit N x N attention, official layout) on the same weights: the
    model under ``backbones.fast_paths(False)``."""
    import backbones

    with backbones.fast_paths(False):
        yield model


@contextmanager
def strict_fp32():
    """fp32 without TF32 (cuDNN convolutions use TF32 by default): the exactness rows compare arithmetic."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def build_on(models, device, key, size, family_arch=None):
    return models.build(key, size, family_arch).to(device)


def tf32_state() -> str:
    try:  # torch refuses to read the legacy flags after a mix of its legacy and new TF32 APIs
        return f"matmul {torch.backends.cuda.matmul.allow_tf32}, cuDNN {torch.backends.cudnn.allow_tf32}"
    except RuntimeError as e:
        return f"unknown ({str(e)[:80]})"


def free(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---- sections -------------------------------------------------------------------------------------------
def exactness(models: Models, plan: Plan, device, budget: Budget, notes: list) -> list[dict]:
    rows = []
    for key in models.ours_keys():
        for size in plan.exact_sizes:
            row = dict(model=models.label(key), size=size)
            rows.append(row)
            if skipped := budget.skip():
                row.update(cpu=skipped, plain=skipped, official=skipped)
                continue
            progress(budget, f"exactness: {row['model']} {size[0]}x{size[1]}")
            label = f"exactness {row['model']} {size[0]}x{size[1]}"
            result = attempt(notes, label, _exactness_row, models, key, size, device, notes, label)
            row.update(dict.fromkeys(("cpu", "plain", "official"), result) if isinstance(result, Failure) else result)
            free(device)
    return rows


def _exactness_row(models, key, size, device, notes, label) -> dict:
    ours, official = models.with_official_weights(key)
    ours.eval()
    grids = ours.arch.get("grid_sizes")
    if grids and any(h % g or w % g for (_, h, w), g in zip(ours.output_shapes(*size), grids)):
        # the literal formulation, like the official code, has no border windows
        official = Failure(f"n/a: stage maps not divisible by the grids {grids}")
    torch.manual_seed(1)
    x = torch.randn(1, 3, *size)
    diff = compare_official.max_relative_difference
    row = {}
    with torch.no_grad(), strict_fp32():
        if device.type == "cuda":
            cpu_outs = attempt(notes, label + " CPU", ours, x)
            ours.to(device)
        else:
            cpu_outs = Failure("n/a: --device is cpu")
        xd = x.to(device)
        outs = ours(xd)
        row["cpu"] = cpu_outs if isinstance(cpu_outs, Failure) else diff([o.cpu() for o in outs], cpu_outs)

        def plain():
            with plain_formulation(ours) as plain_model:
                return diff(outs, plain_model.to(device)(xd))

        row["plain"] = official if isinstance(official, Failure) else attempt(notes, label + " plain", plain)
        if isinstance(official, Failure):
            row["official"] = official
        elif official is None:
            row["official"] = Failure("n/a: no official file given")
        else:
            row["official"] = attempt(notes, label + " official", lambda: diff(official.to(device).eval()(xd), outs))
    return row


def training(models: Models, plan: Plan, device, budget: Budget, notes: list) -> list[dict]:
    rows = []
    h, w = plan.train_size
    for key in models.keys():
        model = None
        for precision in PRECISIONS:
            row = dict(model=models.label(key), key=key, precision=precision)
            rows.append(row)
            if skipped := budget.skip():
                row.update(seconds=skipped)
                continue
            progress(budget, f"training step: {row['model']} {precision}")
            if model is None:
                model = attempt(notes, f"build {key}", build_on, models, device, key, plan.train_size)
            if isinstance(model, Failure):
                row.update(seconds=model)
                continue
            row.update(_training_row(model, plan, precision, device, notes, f"training {row['model']} {precision}"))
        del model
        free(device)
    swin = {r["precision"]: r["seconds"] for r in rows if r["key"] == "swin-t"}
    for r in rows:
        base, own = swin.get(r["precision"]), r["seconds"]
        ok = isinstance(base, float) and isinstance(own, float)
        r["vs_swin"] = base / own if ok else Failure("n/a")
    return rows


def _training_row(model, plan, precision, device, notes, label) -> dict:
    def measure():
        torch.manual_seed(1)
        x = torch.randn(plan.train_batch, 3, *plan.train_size, device=device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step = benchmark.make_step(model, x, "train", precision)
        for _ in range(plan.train_warmup):
            step()
        times = [benchmark.timed_call(step, device) for _ in range(plan.train_iters)]
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        finite = bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)
        out = dict(
            seconds=statistics.median(times),
            spread=(min(times), max(times)),
            finite=finite,
            peak=torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else Failure("n/a on CPU"),
        )
        if step.scaler is not None:
            out["scale"] = step.scaler.get_scale()
        model.zero_grad(set_to_none=True)
        return out

    result = attempt(notes, label, measure)
    return dict(seconds=result) if isinstance(result, Failure) else result


def throughput(models: Models, plan: Plan, device, budget: Budget, notes: list) -> list[dict]:
    entries = [(name, (family, arch)) for name, family, arch in plan.variants]
    entries += [(k, None) for k in models.keys() if k.startswith("official") and not k.endswith("dense")]
    entries += [("swin-t", None)]
    rows = []
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as the paper's training script sets it
    try:
        for key, family_arch in entries:
            row = dict(model=key if family_arch else models.label(key))
            paper = (
                benchmark.PAPER_THROUGHPUT.get(family_arch)
                if plan.tp_size == (224, 224) and family_arch and isinstance(family_arch[1], str)
                else None
            )
            row["paper"] = float(paper) if paper else Failure("n/a")
            rows.append(row)
            model = None
            for precision in ("fp32", "bf16"):
                if skipped := budget.skip():
                    row[precision] = skipped
                    continue
                progress(budget, f"throughput: {row['model']} {precision}")
                if model is None:
                    model = attempt(notes, f"build {key}", build_on, models, device, key, plan.tp_size, family_arch)
                if isinstance(model, Failure):
                    row[precision] = model
                    continue
                x = torch.randn(plan.tp_batch, 3, *plan.tp_size, device=device)
                row[precision] = attempt(
                    notes,
                    f"throughput {row['model']} {precision}",
                    benchmark.throughput,
                    model,
                    x,
                    plan.tp_warmup,
                    plan.tp_iters,
                    precision,
                )
            del model
            free(device)
    finally:
        torch.backends.cudnn.benchmark = saved
    return rows


def compile_section(models: Models, plan: Plan, device, budget: Budget, notes: list, argv_common) -> list[dict]:
    rows = []
    for key in plan.compile_models:
        row = dict(model=models.label(key))
        rows.append(row)
        timeout = min(plan.compile_timeout_s, budget.left())
        if timeout < 10:
            row["speedup"] = Failure(f"skipped: past the {budget.seconds:.0f} s time budget")
            continue
        progress(budget, f"torch.compile: {row['model']} (timeout {timeout:.0f} s)")
        free(device)
        cmd = [sys.executable, __file__, *argv_common, "--_compile-row", key]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                },
            )
        except subprocess.TimeoutExpired:
            row["speedup"] = Failure(f"did not finish within {timeout:.0f} s (compile included)")
            continue
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            err = (done.stderr.strip().splitlines() or ["no output"])[-1]
            notes.append(
                f"torch.compile {row['model']}: exit status {done.returncode}\n\n```\n{done.stderr[-3000:]}\n```"
            )
            row["speedup"] = Failure(f"failed: {err[:120]}")
            continue
        result = json.loads(lines[-1])
        if "error" in result:
            notes.append(f"torch.compile {row['model']}: {result['error']}\n\n```\n{result.get('trace', '')}```")
        row.update({k: (Failure(v) if isinstance(v, str) else v) for k, v in result.items() if k != "trace"})
        if isinstance(row.get("eager"), float) and isinstance(row.get("compiled"), float):
            row["speedup"] = row["eager"] / row["compiled"]
        else:
            row.setdefault("speedup", Failure(result.get("error", "n/a")[:120]))
    return rows


def compile_row(key: str, models: Models, plan: Plan, device) -> dict:
    """In a child process: eager and compiled bf16 training steps of one model, timed alike."""
    out = {}
    try:
        model = models.build(key, plan.train_size).to(device)
        torch.manual_seed(1)
        x = torch.randn(plan.train_batch, 3, *plan.train_size, device=device)

        def median_time(m):
            step = benchmark.make_step(m, x, "train", "bf16")
            for _ in range(plan.train_warmup):
                step()
            return statistics.median(benchmark.timed_call(step, device) for _ in range(plan.train_iters))

        out["eager"] = median_time(model)
        compiled = torch.compile(model, backend=plan.compile_backend)
        out["compile_s"] = benchmark.timed_call(benchmark.make_step(compiled, x, "train", "bf16"), device)
        out["compiled"] = median_time(compiled)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        out["trace"] = traceback.format_exc(limit=-4)
    return out


# ---- report ---------------------------------------------------------------------------------------------
def cell(v, fmt="{:.3f}") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, Failure):
        return str(v).replace("|", "/")
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return fmt.format(v)


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        model = ""
    return f"CPU {model or platform.processor()} ({os.cpu_count()} logical cores, {torch.get_num_threads()} threads)"


def render(ctx: dict, sections: dict) -> str:
    plan, device = ctx["plan"], ctx["device"]
    out = [
        "# GPU report: STViT and HAT-Net backbones",
        "",
        f"- date: {ctx['date']}",
        f"- device: {device_name(device)}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda or 'n/a'}, "
        f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'n/a'}; "
        f"Swin-T from {ctx['swin_source']}",
        f"- command: `{ctx['command']}`",
        f"- mode: {'quick (docs/DESIGN.md shrunk archs)' if ctx['quick'] else 'full'}; "
        f"time budget {plan.budget_s:.0f} s; "
        f"timing: {'CUDA events' if device.type == 'cuda' else 'perf_counter'} after warm-up; "
        f"TF32 for the timed rows: {tf32_state()} (torch's defaults; the exactness rows turn both off)",
        "",
    ]
    if "exactness" in sections:
        out += section(
            "Exactness (fp32, TF32 off, batch 1, evaluation mode)",
            "Largest relative difference of the four stage outputs (max |a - b| / max |a| per stage). The same "
            f"computation in another kernel order differs by about 1e-6; over {EXACT_TOLERANCE:.0e} is marked "
            "CHECK. Sizes: the detection size, one that every grid divides, one that no grid divides. The "
            "official and plain HAT-Net run only where every stage map divides by its window grid.",
            [
                "model",
                "input",
                f"{device.type} vs CPU fast paths",
                f"vs plain formulation on {device.type}",
                f"vs official on {device.type}",
                "status",
            ],
            [
                [
                    r["model"],
                    f"{r['size'][0]}x{r['size'][1]}",
                    *(cell(r[k], "{:.1e}") for k in ("cpu", "plain", "official")),
                    _status(r),
                ]
                for r in sections["exactness"]
            ],
        )
    h, w = plan.train_size
    if "training" in sections:
        out += section(
            f"Training step ({h}x{w}, batch {plan.train_batch})",
            f"Forward and backward of the sum of the four stage outputs' means, median of {plan.train_iters} "
            f"iterations after {plan.train_warmup} warm-up (min-max in brackets). bf16 / fp16: autocast; "
            "fp16 scales the loss with a GradScaler and unscales the gradients, as Lightning's `16-mixed`. "
            "Peak: max_memory_allocated of the row (weights and gradients included). finite: every gradient "
            "of the last iteration is finite. vs Swin-T: Swin-T's s/iter / the row's, same precision.",
            ["model", "precision", "s/iter", "peak GiB", "vs Swin-T", "finite grads"],
            [
                [
                    r["model"],
                    r["precision"],
                    _seconds(r),
                    cell(r.get("peak"), "{:.2f}"),
                    cell(r.get("vs_swin"), "{:.2f}x"),
                    cell(r.get("finite")) + (f" (scale {r['scale']:.0f})" if "scale" in r else ""),
                ]
                for r in sections["training"]
            ],
        )
    if "throughput" in sections:
        out += section(
            f"Throughput ({plan.tp_size[0]}x{plan.tp_size[1]}, batch {plan.tp_batch}, inference)",
            f"Images/s as the STViT paper's `throughput()` measures it: eval mode, no_grad, {plan.tp_warmup} "
            f"warm-up then {plan.tp_iters} timed iterations; cuDNN benchmark mode on. Backbones without the "
            "classification head (< 0.1 GMACs of STViT-S's 4.4). The paper's figures are fp32 on its own "
            "GPU, the whole classifier.",
            ["model", "fp32 images/s", "bf16 images/s", "paper images/s (fp32)"],
            [
                [r["model"], cell(r.get("fp32"), "{:.0f}"), cell(r.get("bf16"), "{:.0f}"), cell(r["paper"], "{:.0f}")]
                for r in sections["throughput"]
            ],
        )
    if "compile" in sections:
        out += section(
            f"torch.compile (training step, bf16, {h}x{w}, batch {plan.train_batch})",
            f"`torch.compile(model, backend='{plan.compile_backend}')` in a child process per model (time limit "
            f"{plan.compile_timeout_s:.0f} s or what is left of the budget); compile s = the first compiled step.",
            ["model", "compile s", "eager s/iter", "compiled s/iter", "speed-up"],
            [
                [
                    r["model"],
                    cell(r.get("compile_s"), "{:.1f}"),
                    cell(r.get("eager")),
                    cell(r.get("compiled")),
                    cell(r.get("speedup"), "{:.2f}x"),
                ]
                for r in sections["compile"]
            ],
        )
    if ctx.get("finished"):
        out += [f"Total wall time: {ctx['budget'].elapsed():.0f} s.", ""]
    if ctx["notes"]:
        out += ["## Errors", ""] + [f"- {n}" for n in ctx["notes"]] + [""]
    return "\n".join(out)


def section(title: str, text: str, header: list[str], rows: list[list[str]]) -> list[str]:
    return [f"## {title}", "", text, "", table(header, rows), ""]


def _status(r) -> str:
    values = [r[k] for k in ("cpu", "plain", "official") if isinstance(r.get(k), float)]
    if not values:
        return "n/a"
    return "ok" if max(values) <= EXACT_TOLERANCE else "CHECK"


def _seconds(r) -> str:
    if not isinstance(r["seconds"], float):
        return cell(r["seconds"])
    lo, hi = r["spread"]
    return f"{r['seconds']:.3f} ({lo:.3f}-{hi:.3f})"


def write(path, text: str) -> None:
    """Written whole each time (temporary file, then rename): a run cut short leaves the sections done."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="small sizes, few iterations, small variants (CPU smoke run)")
    p.add_argument("--official-stvit", help="hhb072/STViT's models/stvit.py (optional)")
    p.add_argument("--official-hatnet", help="yun-liu/HAT-Net's HAT_Net.py (optional)")
    p.add_argument("--out", help="write the Markdown report here too (it is always printed)")
    p.add_argument(
        "--budget-s",
        type=float,
        help="skip the rows that would start after this many seconds (default 480; 110 with --quick)",
    )
    p.add_argument(
        "--sections",
        default="exactness,training,throughput,compile",
        help="comma-separated subset of exactness,training,throughput,compile",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: torch's; 1 with --quick on CPU, "
        "where OpenMP barriers on a busy machine cost ~30x the arithmetic)",
    )
    p.add_argument("--_compile-row", dest="compile_row", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(args.sections.split(",")) - {"exactness", "training", "throughput", "compile"}
    if unknown:
        p.error(f"unknown --sections {sorted(unknown)}; choose from exactness,training,throughput,compile")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; use --device cpu (with --quick for a smoke run)")
    for flag in ("official_stvit", "official_hatnet"):
        path = getattr(args, flag)
        if path and not Path(path).is_file():
            p.error(f"--{flag.replace('_', '-')} {path}: no such file (clone {compare_official.REPOS}, pass that file)")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.budget_s is not None:
        plan = plan._replace(budget_s=args.budget_s)
    device = torch.device(args.device)
    threads = args.threads or (1 if args.quick and device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    models = Models(args.official_stvit, args.official_hatnet, plan.shrunk)
    common = (
        ["--device", args.device]
        + (["--quick"] if args.quick else [])
        + (["--threads", str(threads)] if threads else [])
    )
    if args.compile_row:
        print(json.dumps(compile_row(args.compile_row, models, plan, device)))
        return 0
    budget = Budget(plan.budget_s)
    command = "python tools/gpu_report.py " + shlex.join(a for a in argv)
    ctx = dict(
        plan=plan,
        device=device,
        quick=args.quick,
        budget=budget,
        notes=[],
        command=command.strip(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        swin_source=swin_source(),
    )
    sections, runners = {}, dict(exactness=exactness, training=training, throughput=throughput)
    for name in args.sections.split(","):
        if name == "compile":
            sections[name] = compile_section(models, plan, device, budget, ctx["notes"], common)
        else:
            sections[name] = runners[name](models, plan, device, budget, ctx["notes"])
        if args.out:
            write(args.out, render(ctx, sections))
    ctx["finished"] = True
    report = render(ctx, sections)
    if args.out:
        write(args.out, report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
