"""The pictures of tools/visualize_attention.py, one per kind of attention record: ``PICTURES`` maps a family's
``picture`` kind (``backbones.families.Family.picture``) to how its records are drawn, so that a new family whose
records are of a kind drawn here gets its picture by naming the kind. A family of another kind, or of none, gets
``MAPS``: every map its records hold over the stage's positions, as heat over the image."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from backbones.models.attention_maps import (
    global_attention_map,
    stoken_assignment,
    stoken_association,
    window_attention_map,
)

from .attention import (
    Grid,
    PreparedImage,
    boundaries,
    heads_text,
    map_box,
    map_pixel,
    mark_point,
    outline,
    stage_stride,
    to_image,
)
from .errors import FigureError


@dataclass(frozen=True)
class Picture:
    """How one kind of attention record is drawn.

    Args:
        suffix: the PNG's name after the image's and the family's (``shapes_stvit_supertokens.png``).
        draw: ``draw(out, image, records, point, title, stoken)`` writes the PNG ``out`` of ``records`` ({stage:
            record of the stage's last block}) over ``image``, for the query ``point`` (x, y) in original-image
            pixels; ``title``: the family's, for the header; ``stoken``: the tool's ``--stoken`` (or None).
        takes_stoken: it shows one super token per stage, chosen by ``--stoken``.
    """

    suffix: str
    draw: Callable[..., None]
    takes_stoken: bool = False


def chosen_stokens(indices, records: dict, point, image: PreparedImage) -> dict[int, int]:
    """{stage: super token to show}: ``--stoken`` (one for all stages or one per stage), else the one under
    the point."""
    chosen = {}
    for n, (stage, rec) in enumerate(sorted(records.items())):
        (hh, ww), (h, w) = rec["grid"], rec["stoken_size"]
        if indices is None:
            row, col = map_pixel(point, stage_stride(stage), image)
            chosen[stage] = row // h * ww + col // w
            continue
        token = indices[n if len(indices) > 1 else 0]
        if not 0 <= token < hh * ww:
            raise FigureError(
                f"--stoken {token}: stage {stage} of {image.path!r} has {hh}x{ww} super tokens "
                f"(flat row-major indices 0..{hh * ww - 1})"
            )
        chosen[stage] = token
    return chosen


def draw_super_tokens(out: str, image: PreparedImage, records: dict, point, title: str, stoken=None) -> None:
    """Super-token association (boundaries) and one super token's soft association, one column per stage.
    ``records``: {stage: 'stoken' record}; the super token shown: ``chosen_stokens``."""
    stokens = chosen_stokens(stoken, records, point, image)
    name = image.path.rsplit("/", 1)[-1]
    header = f"{title} super tokens, last block of each stage (+: the point ({point[0]:g}, {point[1]:g})): {name}"
    grid = Grid(image.original, 2, len(records), header)
    thickness = max(1, round(min(image.original.shape[:2]) / 250))
    rng = np.random.default_rng(0)
    for col, (stage, rec) in enumerate(sorted(records.items())):
        stride, (hh, ww), (h, w) = stage_stride(stage), rec["grid"], rec["stoken_size"]
        labels = to_image(stoken_assignment(rec)[0], stride, image).astype(np.int64)
        token = stokens[stage]
        ti, tj = divmod(token, ww)
        ax = grid.panel(
            0,
            col,
            f"stage {stage} (stride {stride}), {hh}x{ww} super tokens of {h}x{w} map px: each "
            f"pixel's super token (highest affinity of its 9 neighbours); cyan: token {token}",
        )
        tint = rng.random((hh * ww, 3))[labels]
        ax.imshow(np.concatenate([tint, np.full(labels.shape + (1,), 0.25)], -1), interpolation="nearest")
        edges = np.zeros(labels.shape + (4,))
        edges[boundaries(labels, thickness)] = (1.0, 0.9, 0.0, 1.0)
        ax.imshow(edges, interpolation="nearest")
        mine = np.zeros(labels.shape + (4,))
        mine[boundaries(labels == token, thickness + 1) & (labels == token)] = (0.0, 1.0, 1.0, 1.0)
        ax.imshow(mine, interpolation="nearest")
        ax = grid.panel(
            1,
            col,
            f"stage {stage}: soft association of each pixel to super token {token} (row {ti}, "
            f"col {tj}; cyan box: its grid cell), zero outside its 3x3 neighbourhood",
            dim=0.55,
        )
        grid.heat(ax, to_image(stoken_association(rec, token)[0], stride, image), "association weight", sparse=True)
        outline(ax, map_box(ti * h, tj * w, h, w, stride, image))
        mark_point(ax, point)
    grid.save(out)


def draw_window_and_global(out: str, image: PreparedImage, records: dict, point, title: str, stoken=None) -> None:
    """Window attention (top) and global attention (bottom) of the query ``point``, one column per stage.
    ``records``: {stage: 'hat' record}."""
    name = image.path.rsplit("/", 1)[-1]
    header = (
        f"{title} attention of the query at ({point[0]:g}, {point[1]:g}) (+), last block of each stage, "
        f"mean over heads: {name}"
    )
    grid = Grid(image.original, 2, len(records), header)
    for col, (stage, rec) in enumerate(sorted(records.items())):
        stride = stage_stride(stage)
        row, c = map_pixel(point, stride, image)
        heads = rec["global_probs"].shape[1]
        if "window_probs" in rec:
            g = rec["grid_size"]
            ax = grid.panel(
                0,
                col,
                f"stage {stage} (stride {stride}): window attention of the query (+) inside its "
                f"{g}x{g} window (cyan), {heads_text(heads)}",
                dim=0.55,
            )
            window = to_image(window_attention_map(rec, row, c)[0].mean(0), stride, image)
            grid.heat(ax, window, "attention weight", sparse=True)
            outline(ax, map_box(row // g * g, c // g * g, g, g, stride, image))
        else:
            ax = grid.panel(0, col, f"stage {stage} (stride {stride}): no windows (grid size 1)", dim=0.3)
            ax.text(
                0.5,
                0.5,
                "no window attention here:\nplain global attention below",
                color="white",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=11,
            )
        mark_point(ax, point)
        ph, pw = rec["pooled"]
        ds = rec["ds_ratio"]
        over = f"the {ph}x{pw} pooled map ({ds}x{ds} pooling)" if ds > 1 else f"all {ph}x{pw} positions"
        ax = grid.panel(
            1, col, f"stage {stage}: global attention of the query over {over}, {heads_text(heads)}", dim=0.55
        )
        grid.heat(ax, to_image(global_attention_map(rec, row, c)[0].mean(0), stride * ds, image), "attention weight")
        mark_point(ax, point)
    grid.save(out)


def stage_maps(record: Mapping) -> dict[str, torch.Tensor]:
    """The tensors of ``record`` that are maps over the stage's positions: shaped (B, ..., H, W), (H, W) the
    record's ``size`` (what every record of ``backbones.models.attention_maps`` names)."""
    size = tuple(record.get("size", ()))
    return {
        key: value
        for key, value in record.items()
        if isinstance(value, torch.Tensor) and value.dim() >= 3 and len(size) == 2 and tuple(value.shape[-2:]) == size
    }


def draw_maps(out: str, image: PreparedImage, records: dict, point, title: str, stoken=None) -> None:
    """Every map the records hold (``stage_maps``; averaged over the dims between the batch and the map, e.g. the
    heads), one row per name and one column per stage; a family whose records hold none is refused. ``point``:
    unused (such a map is not one query's)."""
    names = sorted({key for rec in records.values() for key in stage_maps(rec)})
    if not names:
        kinds = sorted({str(rec.get("kind")) for rec in records.values()})
        held = sorted({key for rec in records.values() for key in rec})
        raise FigureError(
            f"the {title} backbone's attention records (kind {', '.join(kinds)}: {', '.join(held)}) hold no map over "
            f"a stage's positions, so there is nothing to draw: tools/visualize_attention.py draws the record kinds "
            f"{', '.join(sorted(PICTURES))}, and of any other kind the tensors shaped (batch, ..., H, W) with (H, W) "
            "the record's 'size'"
        )
    name = image.path.rsplit("/", 1)[-1]
    grid = Grid(
        image.original, len(names), len(records), f"{title} attention records, last block of each stage: {name}"
    )
    for col, (stage, rec) in enumerate(sorted(records.items())):
        stride, maps = stage_stride(stage), stage_maps(rec)
        for row, key in enumerate(names):
            if key not in maps:
                grid.panel(row, col, f"stage {stage} (stride {stride}): no {key!r} in this stage's record", dim=0.3)
                continue
            value = maps[key][0].float()
            flat = value.reshape(-1, *value.shape[-2:])
            mean = f", mean of {flat.shape[0]} maps" if flat.shape[0] > 1 else ""
            ax = grid.panel(row, col, f"stage {stage} (stride {stride}): {key!r} {tuple(value.shape)}{mean}", dim=0.55)
            grid.heat(ax, to_image(flat.mean(0), stride, image), key)
    grid.save(out)


# a family's picture kind (``Family.picture``) -> its picture
PICTURES: dict[str, Picture] = {
    "stoken": Picture("supertokens", draw_super_tokens, takes_stoken=True),
    "hat": Picture("attention", draw_window_and_global),
}
MAPS = Picture("maps", draw_maps)


def picture_of(kind: str | None) -> Picture:
    """The picture of records of ``kind`` (a family's ``picture``): its entry of ``PICTURES``, else ``MAPS``."""
    return PICTURES.get(kind, MAPS)
