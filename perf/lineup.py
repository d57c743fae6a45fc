"""The rows of the measuring reports, from the family registry (``backbones.FAMILIES``): one per registered family
at the variant its record names (``Family.measured_variant``), then one per named setting of its options
(``Family.settings``: STViT's "dense" super-token sizes of the COCO configs). tools/benchmark.py's tables and
tools/gpu_report.py take their rows from here, so that a newly registered family gets its rows with no line here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from backbones import FAMILIES
from backbones.families import get

# Variant names written as the papers write them in model names (STViT-S, HAT-Net-T); others are written whole.
SIZE_LETTERS = {"tiny": "T", "small": "S", "base": "B", "medium": "M", "large": "L"}


def variant_label(family: str, arch: str) -> str:
    """A variant's name in tables: ``'STViT-S'`` for (stvit, small), ``'Toy one'`` for a variant of no size."""
    title = get(family).title
    return f"{title}-{SIZE_LETTERS[arch]}" if arch in SIZE_LETTERS else f"{title} {arch}"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row: a family's variant, in its preset or in one of its named settings.

    Args:
        family: a registered family.
        arch: the variant.
        setting: a name of the family's ``settings`` ('': the preset).
        options: that setting's options ({} for the preset).
    """

    family: str
    arch: str
    setting: str = ""
    options: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        """A name without spaces (``'stvit-s-dense'``): the GPU report's key and its compile child's argument."""
        size = SIZE_LETTERS.get(self.arch, self.arch).lower()
        return "-".join(filter(None, (self.family, size, self.setting)))

    @property
    def label(self) -> str:
        """``'STViT-S'``, ``'STViT-S dense'``."""
        return " ".join(filter(None, (variant_label(self.family, self.arch), self.setting)))

    def values(self) -> str:
        """The setting's option values as a table writes them (``'8,4,2,1'``; '' for the preset)."""
        return " ".join(
            ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v) for v in self.options.values()
        )

    def kwargs(self) -> dict:
        """The setting's options as ``perf.models.build`` takes them (sequences as lists, as the tools parse them)."""
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in self.options.items()}

    def changes(self) -> dict:
        """The ``perf.models.Setting`` fields of this row: family, arch and the setting's options."""
        return dict(family=self.family, arch=self.arch, options=self.kwargs())


def entries(families=None) -> list[Entry]:
    """The rows of every registered family (or of ``families``, names of registered ones), in the registry's order:
    its measured variant, then each named setting."""
    rows = []
    for family in chosen(families):
        arch = family.measured_variant()
        rows.append(Entry(family.name, arch))
        for name, options in family.settings.items():
            unknown = set(options) - set(family.options)
            if unknown:
                raise ValueError(
                    f"family {family.name!r}: setting {name!r} sets {sorted(unknown)}, which are not among the "
                    f"family's own `options` ({sorted(family.options)})"
                )
            rows.append(Entry(family.name, arch, name, dict(options)))
    return rows


def chosen(families=None) -> list:
    """The records of ``families`` (names; None: every registered family) in the registry's order; an unknown name
    is refused with the registered ones."""
    for name in families or ():
        get(name)
    return [f for f in FAMILIES.values() if families is None or f.name in families]


def titles(families=None) -> str:
    """The titles of ``families`` (None: every registered one) as a phrase (``'HAT-Net and STViT'``), for report
    headings."""
    names = [f.title for f in chosen(families)]
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else "no"
