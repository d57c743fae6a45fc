"""Reports: Markdown tables whose cells are numbers or the reason a number is missing, and files written atomically
(``backbones.checkpoints.atomic``: a run cut short leaves the previous file or the new one, never half of one)."""

from __future__ import annotations

import os

from backbones.checkpoints.atomic import atomic_write

__all__ = ["Failure", "cell", "table", "section", "save_figure"]


class Failure(str):
    """A cell that could not be measured: the reason, shown in the report instead of a number."""


def cell(v, fmt: str = "{:.3f}") -> str:
    """A table cell: ``fmt`` of a number, ``n/a`` for None, the reason of a ``Failure``, yes / NO of a bool."""
    if v is None:
        return "n/a"
    if isinstance(v, Failure):
        return str(v).replace("|", "/")
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return fmt.format(v)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of ``rows`` (cells already formatted) under ``header``."""
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def section(title: str, text: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """A report section's lines: ``## title``, the text that says how it was measured, the table."""
    return [f"## {title}", "", text, "", table(header, rows), ""]


def save_figure(fig, path: str | os.PathLike, dpi: int = 90) -> None:
    """A matplotlib figure as a PNG, written atomically."""
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
