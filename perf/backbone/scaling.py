"""Cost against input size: train-step seconds and peak memory of ours (every registered family's measured
variant and named settings, ``perf.lineup``), Swin-T and the reference implementation at several sizes, as tables
and a log-log figure."""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

from ..lineup import entries
from ..memory import peak_memory_gib
from ..models import Setting, model_for
from ..report import save_figure
from ..timing import time_models
from .speed import runnable

SCALING_SIZES = ((224, 224), (448, 448), (448, 672), (640, 960), (800, 1344))


def scaling_models(arch: str | None = None) -> list[tuple[str, str, dict]]:
    """(label, build name, ``Setting`` fields) of every curve: ours (``perf.lineup.entries``), mmdet's Swin-T,
    then each family's reference (ours on its plain path). The reference STViT-S keeps the preset's global
    attention in stage 3 as explicit N x N matrices: the quadratic curve next to ours. ``arch`` (None: each
    family's measured variant) replaces the variant of ours and the references, and is added to their labels."""
    ours = entries()
    models = []
    for impl, rows in (("ours", ours), ("reference", [e for e in ours if not e.setting])):
        for e in rows:
            changes = dict(e.changes(), arch=arch or e.arch)
            label = " ".join(filter(None, ("reference" if impl == "reference" else "", e.label)))
            models.append((label + (f" [{arch}]" if arch not in (None, e.arch) else ""), impl, changes))
        if impl == "ours":
            models.append(("Swin-T (mmdet)", "swin-t", dict(family=ours[0].family)))
    return models


def scaling(s: Setting, sizes, memory: bool = True) -> list[dict]:
    """Train-step seconds and peak memory of ``scaling_models(s.arch)`` at every size of ``sizes`` (batch
    ``s.batch``): the models of one size are timed round-robin in this process; a model that cannot run at a size
    gets a row with its reason instead of numbers."""
    curves = scaling_models(s.arch)
    rows = []
    for size in sizes:
        settings, models, by_label = {}, {}, {}
        torch.manual_seed(1)
        x = torch.randn(s.batch, 3, *size, device=s.device)
        for label, name, changes in curves:
            a = dataclasses.replace(s, **{"size": size, "mode": "train", **changes})
            row = dict(
                model=label,
                impl=name,
                size=f"{size[0]}x{size[1]}",
                pixels=size[0] * size[1],
                seconds=None,
                peak_gib=None,
                note="",
            )
            rows.append(row)
            models[label], settings[label], by_label[label] = model_for(name, a), (name, a), row
        failed = {}
        models = runnable(models, x, failed, size)
        for label, error in failed.items():
            by_label[label]["note"] = f"cannot run: {error[:100]}"
        print(f"note: {size[0]}x{size[1]}: timing {', '.join(models)}", file=sys.stderr, flush=True)
        for label, seconds in time_models(models, x, "train", s.precision, s.warmup, s.repeat).items():
            by_label[label]["seconds"] = seconds
        timed = list(models)
        del models
        for label in timed:
            if memory:
                by_label[label]["peak_gib"] = peak_memory_gib(*settings[label])
        for row in rows[-len(curves) :]:  # a run cut short still leaves the sizes done in its log
            print(f"note: {json.dumps(row)}", file=sys.stderr, flush=True)
    return rows


def scaling_tables(rows) -> str:
    """Two Markdown tables (seconds, peak GiB): one row per model, one column per size; then the notes."""
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    cells = {(r["model"], r["size"]): r for r in rows}
    out = []
    for title, key, fmt in (("s/iter (train step)", "seconds", "{:.3f}"), ("peak GiB", "peak_gib", "{:.2f}")):
        out += [f"| {title} | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for label in dict.fromkeys(r["model"] for r in rows):
            values = [cells[label, s][key] for s in sizes]
            out.append(f"| {label} | " + " | ".join(fmt.format(v) if v is not None else "n/a" for v in values) + " |")
        out.append("")
    notes = sorted({f"{r['model']} {r['size']}: {r['note']}" for r in rows if r["note"]})
    return "\n".join(out + notes)


def scaling_plot(rows, path, title=""):
    """Log-log plot of seconds and peak memory against pixels, one line per model, with dotted slopes 1 and 2
    (cost proportional to the pixels and to their square) through the first model's smallest point, written to
    ``path`` (PNG). Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylabel in ((axes[0], "seconds", "seconds per train step"), (axes[1], "peak_gib", "peak GiB")):
        labels = list(dict.fromkeys(r["model"] for r in rows))
        for i, label in enumerate(labels):
            points = [(r["pixels"], r[key], r["impl"]) for r in rows if r["model"] == label and r[key] is not None]
            if points:
                px, ys, impl = zip(*points)
                ax.plot(px, ys, "--" if impl[0] == "reference" else "-", marker="o", color=f"C{i}", label=label)
        if not ax.get_lines():
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
            continue
        base = [(r["pixels"], r[key]) for r in rows if r["model"] == labels[0] and r[key] is not None]
        if len(base) > 1 and key == "seconds":
            (p0, y0), p1 = base[0], base[-1][0]
            for slope, style in ((1, ":"), (2, "-.")):
                ax.plot(
                    [p0, p1],
                    [y0, y0 * (p1 / p0) ** slope],
                    style,
                    color="grey",
                    linewidth=0.8,
                    label=f"slope {slope} (cost ~ pixels{'' if slope == 1 else '^2'})",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input pixels (H x W)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return fig
