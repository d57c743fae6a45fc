"""The GPU report's Markdown (tools/gpu_report.py): the header (device, versions, TF32 state) and a table per
section measured so far (``perf/gpu/sections.py``), then the errors. Needs only torch."""

from __future__ import annotations

import os
import platform

import torch

from ..report import cell, section

EXACT_TOLERANCE = 1e-4  # max relative difference of fp32 outputs that counts as the same computation


def tf32_state() -> str:
    try:  # torch refuses to read the legacy flags after a mix of its legacy and new TF32 APIs
        return f"matmul {torch.backends.cuda.matmul.allow_tf32}, cuDNN {torch.backends.cudnn.allow_tf32}"
    except RuntimeError as e:
        return f"unknown ({str(e)[:80]})"


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
    """The Markdown report of the sections measured so far (``ctx``: plan, device, quick, budget, notes, command,
    date, swin_source, families (their titles, for the heading), finished)."""
    plan, device = ctx["plan"], ctx["device"]
    out = [
        f"# GPU report: {ctx['families']} backbones",
        "",
        f"- date: {ctx['date']}",
        f"- device: {device_name(device)}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda or 'n/a'}, "
        f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'n/a'}; "
        f"Swin-T from {ctx['swin_source']}",
        f"- command: `{ctx['command']}`",
        f"- mode: {'quick (shrunk archs)' if ctx['quick'] else 'full'}; "
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
