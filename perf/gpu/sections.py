"""The GPU report's sections (tools/gpu_report.py): exactness against our CPU fast paths, the plain formulation
and the official code; the training step in three precisions; inference throughput; torch.compile (one child
process per model: ``python -m perf.gpu.sections``). Each row that fails records its reason and the run goes
on; rows that would start past the budget are skipped."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import traceback
from contextlib import contextmanager

import torch

from .. import timing
from ..backbone.variants import paper_throughput
from ..child import run_module
from ..models import PlainPath
from ..official import max_relative_difference
from ..report import Failure
from ..timing import make_step, timed_call
from .plan import FULL, QUICK, Budget, Models, Plan, attempt

PRECISIONS = ("bf16", "fp16", "fp32")


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
            budget.progress(f"exactness: {row['model']} {size[0]}x{size[1]}")
            label = f"exactness {row['model']} {size[0]}x{size[1]}"
            result = attempt(notes, label, _exactness_row, models, key, size, device, notes, label)
            row.update(dict.fromkeys(("cpu", "plain", "official"), result) if isinstance(result, Failure) else result)
            free(device)
    return rows


def _exactness_row(models, key, size, device, notes, label) -> dict:
    ours, official = models.with_official_weights(key)
    ours.eval()
    if problem := ours.plain_size_problem(*size):
        official = Failure(f"n/a: {problem}")
    torch.manual_seed(1)
    x = torch.randn(1, 3, *size)
    diff = max_relative_difference
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
            return diff(outs, PlainPath(ours)(xd))

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
            budget.progress(f"training step: {row['model']} {precision}")
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
        step = make_step(model, x, "train", precision)
        times = timing.repeated(step, device, plan.train_warmup, plan.train_iters)
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
    entries = [(name, (family, arch)) for name, family, arch in models.variants()]
    entries += [(k, None) for k in models.keys() if k.startswith("official") and not models.entry(k).setting]
    entries += [("swin-t", None)]
    rows = []
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as the paper's training script sets it
    try:
        for key, family_arch in entries:
            row = dict(model=key if family_arch else models.label(key))
            paper = paper_throughput(*family_arch) if plan.tp_size == (224, 224) and family_arch else None
            row["paper"] = float(paper) if paper else Failure("n/a")
            rows.append(row)
            model = None
            for precision in ("fp32", "bf16"):
                if skipped := budget.skip():
                    row[precision] = skipped
                    continue
                budget.progress(f"throughput: {row['model']} {precision}")
                if model is None:
                    model = attempt(notes, f"build {key}", build_on, models, device, key, plan.tp_size, family_arch)
                if isinstance(model, Failure):
                    row[precision] = model
                    continue
                x = torch.randn(plan.tp_batch, 3, *plan.tp_size, device=device)
                row[precision] = attempt(
                    notes,
                    f"throughput {row['model']} {precision}",
                    timing.throughput,
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


def compile_section(models: Models, plan: Plan, device, budget: Budget, notes: list, threads: int = 0) -> list[dict]:
    """One row per ``models.compile_keys`` key: eager and compiled bf16 training steps, measured by a child
    process each (``python -m perf.gpu.sections``), so that a compiler crash or hang costs that row only."""
    rows = []
    for key in models.compile_keys(plan.compile_all):
        row = dict(model=models.label(key))
        rows.append(row)
        timeout = min(plan.compile_timeout_s, budget.left())
        if timeout < 10:
            row["speedup"] = Failure(f"skipped: past the {budget.seconds:.0f} s time budget")
            continue
        budget.progress(f"torch.compile: {row['model']} (timeout {timeout:.0f} s)")
        free(device)
        argv = ["--device", device.type, "--threads", str(threads), key] + (["--quick"] if plan.shrunk else [])
        try:
            done = run_module("perf.gpu.sections", *argv, timeout=timeout)
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
            step = make_step(m, x, "train", "bf16")
            return statistics.median(timing.repeated(step, device, plan.train_warmup, plan.train_iters))

        out["eager"] = median_time(model)
        compiled = torch.compile(model, backend=plan.compile_backend)
        out["compile_s"] = timed_call(make_step(compiled, x, "train", "bf16"), device)
        out["compiled"] = median_time(compiled)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        out["trace"] = traceback.format_exc(limit=-4)
    return out


def _child(argv=None) -> None:
    """``python -m perf.gpu.sections --device D --threads N KEY [--quick]``: ``compile_row`` as one JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("key")
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    plan = QUICK if args.quick else FULL
    print(json.dumps(compile_row(args.key, Models(shrunk=plan.shrunk), plan, torch.device(args.device))))


if __name__ == "__main__":
    _child()
