"""``tools/benchmark.py --config``'s table: ``perf.whole_model.bench.benchmark``'s rows, ours against the baseline."""

from __future__ import annotations

from ..report import table as md_table
from .subject import TRAIN_BATCH


def _cell(v, fmt: str, column: str, notes: list[str]) -> str:
    """A table cell: a median with its (min-max) spread, a number, or why there is none. A reason's details
    ("no test data (the path ... does not exist ...)") go to ``notes`` under the ``column``'s name, each once
    (both models usually share one), so that the cell stays short."""
    if isinstance(v, dict):
        return f"{fmt.format(v['median'])} ({fmt.format(v['min'])}-{fmt.format(v['max'])})"
    if isinstance(v, str):
        short, _, details = v.partition(" (")
        note = f"{column}: {short}: {details[:-1]}"
        if details and note not in notes:
            notes.append(note)
        return short
    return "n/a" if v is None else fmt.format(v)


def _ratio(a, b) -> str:
    a, b = (v["median"] if isinstance(v, dict) else v for v in (a, b))
    return f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "n/a"


def table(rows: list[dict]) -> str:
    """``benchmark``'s rows as a Markdown table, medians with the (min-max) spread, and with a baseline the ratio
    row: ours / baseline of images/s (above 1: ours faster), of train-step seconds and of peak memory (below 1:
    ours faster / smaller)."""
    header = ["model", "params (M)", "infer img/s", "infer + loading img/s", "train step s", "peak GiB"]
    fmts = dict(infer="{:.2f}", infer_loaded="{:.2f}", train="{:.3f}", peak_gib="{:.2f}")
    notes: list[str] = []
    lines = [
        [r["model"], f"{r['params_m']:.1f}", *(_cell(r[k], f, c, notes) for (k, f), c in zip(fmts.items(), header[2:]))]
        for r in rows
    ]
    if len(rows) == 2:
        ours, base = rows
        lines.append([f"ours / {base['model']}", *(_ratio(ours[k], base[k]) for k in ("params_m", *fmts))])
    r = rows[0]
    title = f"{r['size']} input, batch 1 (train step: {TRAIN_BATCH}), {r['device']}"
    kept = {row["model"]: row.get("detections") for row in rows if row.get("detections") is not None}
    if len(set(kept.values())) == 1:
        title += f", {next(iter(kept.values()))} detections per image"
    elif kept:  # fewer boxes than max_per_img survived NMS in some model: the work differs, so say so
        title += ", detections per image: " + ", ".join(f"{name} {n}" for name, n in kept.items())
    title += f", median (min-max) of {r['rounds']} rounds"
    return title + "\n\n" + md_table(header, lines) + "".join(f"\n\n{note}" for note in notes)
