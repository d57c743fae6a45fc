"""The metrics tables tools/test.py prints: the scalar metrics, and the per-class results (mmdet's ``classwise``
AP columns, mmseg's IoU / Acc table)."""

from __future__ import annotations


def format_table(metrics: dict) -> str:
    flat = {k: v for k, v in metrics.items() if k != "per_class"}
    width = max([len(k) for k in flat] + [6])
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    lines += [f"{k:<{width}}  {v:.4f}" for k, v in flat.items()]
    return "\n".join(lines)


def format_per_class_table(per_class: dict) -> str:
    """One table per metric family (COCO: ``bbox`` and ``segm`` AP columns as mmdet's ``classwise``; ADE20K:
    ``IoU`` and ``Acc`` as mmseg's table), one row per class; ``-`` for a class absent from the ground truth."""
    groups: dict[str, list[str]] = {}
    for name in per_class:  # 'bbox_AP_50' -> family 'bbox', column 'AP_50'; 'IoU' -> family '', column 'IoU'
        family = name.split("_", 1)[0] if name.split("_", 1)[0] in ("bbox", "segm") else ""
        groups.setdefault(family, []).append(name)
    tables = []
    for family, names in groups.items():
        cols = [n.removeprefix(f"{family}_") for n in names]
        classes = list(dict.fromkeys(c for n in names for c in per_class[n]))
        width = max([len(str(c)) for c in classes] + [len(family), 5])
        widths = [max(len(c), 6) for c in cols]
        lines = [
            f"{family or 'class':<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cols, widths)),
            f"{'-' * width}  " + "  ".join("-" * w for w in widths),
        ]
        absent = [c for c in classes if all(per_class[n].get(c) is None for n in names)]
        for c in (c for c in classes if c not in absent):
            cells = [
                "-".rjust(w) if per_class[n].get(c) is None else f"{per_class[n][c]:{w}.4f}"
                for n, w in zip(names, widths)
            ]
            lines.append(f"{c:<{width}}  " + "  ".join(cells))
        if absent:  # e.g. ADE20K's 150 classes on a subset: their rows would be all '-' (the JSON keeps them)
            lines.append(f"({len(absent)} classes without ground truth not shown)")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)
