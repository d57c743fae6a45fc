"""Ours against the baselines on one input: seconds per iteration (timed round-robin in this process, so that
the ratios are fair on a noisy machine), peak memory (each model alone), parameters and GMACs; and the
speed table of docs/benchmarks/backbone-speed-2026-12-02.md built from such runs."""

from __future__ import annotations

import dataclasses
import sys

import torch

from backbones.families import get

from ..flops import count_gmacs
from ..lineup import entries
from ..memory import peak_memory_gib
from ..models import BASELINES, Setting, model_and_input, model_for
from ..timing import compiled, time_models, time_phases


def runnable(models: dict, x, failed: dict, size) -> dict:
    """The models that run one image of ``x`` (evaluation mode); the others' first error line goes to
    ``failed`` and stderr (a baseline that cannot run at a size is reported and left out)."""
    ok = {}
    for name, model in models.items():
        try:
            with torch.no_grad():
                model.eval()  # mm backbones' train() returns None: not chained
                model(x[:1])
        except RuntimeError as e:
            failed[name] = str(e).splitlines()[0]
            print(f"note: {name} cannot run at {size[0]}x{size[1]}: {failed[name]}", file=sys.stderr)
            continue
        ok[name] = model
    return ok


def run(s: Setting, compare: bool = False, memory: bool = True) -> list[dict]:
    """One row per model (ours, and with ``compare`` every one of ``BASELINES``): params, GMACs, median
    seconds, in train mode also of the forward and the backward timed apart (``forward_seconds``,
    ``backward_seconds``; None in inference), peak GiB (NaN without ``memory``) and the speed-ups against the
    baselines, with Swin-T timed also of the backward alone (``backward_speedup_vs_swin-t``)."""
    h, w = s.size
    ours, x = model_and_input("ours", s)
    models = {"ours": ours, **{name: model_for(name, s) for name in (BASELINES if compare else ())}}
    failed = {}
    models = runnable(models, x, failed, s.size)
    del ours
    if "ours" in failed:
        raise SystemExit(f"benchmark failed at {h}x{w}: {failed['ours']}")
    timed = dict(models)
    if s.compile:  # the eager model is timed too, round-robin with the compiled one
        timed["ours"], timed["eager"] = compiled(models["ours"], x, s.mode, s.precision)[0], models["ours"]
    if s.mode == "train":
        phases = time_phases(timed, x, s.precision, s.warmup, s.repeat)
        times = {k: p["step"] for k, p in phases.items()}
    else:
        phases, times = {}, time_models(timed, x, s.mode, s.precision, s.warmup, s.repeat)
    if s.compile:
        print(
            f"note: compiled {times['ours']:.3f} s/iter, eager {times['eager']:.3f} s/iter: "
            f"{times['eager'] / times['ours']:.2f}x",
            file=sys.stderr,
        )
    rows = [
        dict(
            model=name,
            family=s.family if name in ("ours", "reference") else name,
            arch=s.arch or get(s.family).measured_variant(),
            size=f"{h}x{w}",
            batch=s.batch,
            mode=s.mode,
            precision=s.precision,
            options=s.options,
            params_m=sum(p.numel() for p in model.parameters()) / 1e6,
            gmacs=count_gmacs(model, x[:1]),
            seconds=times[name],
            forward_seconds=phases.get(name, {}).get("forward"),
            backward_seconds=phases.get(name, {}).get("backward"),
        )
        for name, model in models.items()
    ]
    del models, timed
    for row in rows:
        row["peak_gib"] = peak_memory_gib(row["model"], s) if memory else float("nan")
        for base in BASELINES:
            key = "speedup_vs_reference" if base == "reference" else f"speedup_vs_{base}"
            row[key] = (times[base] / times[row["model"]]) if base in times else None
        if "swin-t" in phases:  # the backward alone against Swin-T's, where the steps differ most
            row["backward_speedup_vs_swin-t"] = phases["swin-t"]["backward"] / phases[row["model"]]["backward"]
    return rows


def speed_table(s: Setting, memory: bool = True) -> tuple[str, list[dict]]:
    """(Markdown table, its rows): every row of ``perf.lineup.entries`` (each family's measured variant, and its
    named settings) at 448x672 and 800x1344, train mode, against every baseline, with peak memory."""
    lines = [
        "| backbone | input | s/iter | vs reference | vs Swin-T | vs ResNet-50 | peak GiB (ref / Swin-T / R50) "
        "| GMACs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    all_rows = []
    for size in ((448, 672), (800, 1344)):
        for entry in entries():
            a = dataclasses.replace(s, **{"size": size, "mode": "train", **entry.changes()})
            rows = run(a, compare=True, memory=memory)
            all_rows += rows
            by = {r["model"]: r for r in rows}
            ours = by["ours"]
            name = " ".join(filter(None, (entry.label, entry.values())))
            peaks = " / ".join(f"{by[k]['peak_gib']:.2f}" if k in by else "n/a" for k in BASELINES)
            lines.append(
                f"| {name} | {size[0]}x{size[1]} | {ours['seconds']:.2f} "
                f"| {fmt(ours['speedup_vs_reference'])} "
                f"| {fmt(ours['speedup_vs_swin-t'])} | {fmt(ours['speedup_vs_resnet50'])} "
                f"| {ours['peak_gib']:.2f} ({peaks}) | {ours['gmacs']:.1f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines), all_rows


def rows_text(rows) -> str:
    """The rows of ``run`` as text, one line each: in train mode the step and its forward and backward
    halves (timed apart), and each ratio of ours against the reference and Swin-T (above 1: ours faster)."""
    train = rows[0]["forward_seconds"] is not None
    swin = next((r for r in rows if r["model"] == "swin-t"), None)
    hdr = (
        f"{'model':10} {'arch':>6} {'size':>9} {'mode':>5} {'params(M)':>9} {'GMACs':>7} {'s/iter':>7} "
        + (f"{'fwd s':>6} {'bwd s':>6} " if train else "")
        + f"{'peak GiB':>8} {'vs ref':>6}"
        + (f" {'vs Swin-T':>9}" + (f" {'bwd vs Swin-T':>13}" if train else "") if swin else "")
    )
    lines = [hdr]
    ratio = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731
    for r in rows:
        line = (
            f"{r['model']:10} {r['arch']:>6} {r['size']:>9} {r['mode']:>5} {r['params_m']:9.1f} "
            f"{r['gmacs']:7.1f} {r['seconds']:7.2f} "
            + (f"{r['forward_seconds']:6.2f} {r['backward_seconds']:6.2f} " if train else "")
            + f"{r['peak_gib']:8.2f} {ratio(r['speedup_vs_reference']):>6}"
        )
        if swin:
            line += f" {ratio(r['speedup_vs_swin-t']):>9}"
            if train:
                line += f" {ratio(r['backward_speedup_vs_swin-t']):>13}"
        lines.append(line)
    return "\n".join(lines)
