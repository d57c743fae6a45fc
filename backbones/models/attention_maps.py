"""Opt-in recording of the attention maps that the backbones compute in their own forward pass (for pictures).

    with record_attention(model) as maps:   # every attention module of the model, or a chosen subset
        model(images)
    maps[(stage, block)]  # dict of tensors, see below

The attention modules pass the paper's quantities through named probe points (``base.Probe``, identities):
STViT's ``StokenAttention.association`` (the association map Q), HAT-Net's ``Attention.window_weights`` and
``Attention.global_weights`` (the attention weights). Inside a ``record_attention`` block, forward hooks on the
watched modules' probes store (detached) what passed through them, and the backbones compute their plain
formulation (``backbones.fast_paths(False)``), the one that forms the attention weights (fused kernels never
do): the records are exactly what that forward computed. Outside a block nothing is recorded and the forward
is the normal one. The records:

- STViT super-token attention (stages whose super tokens are larger than one pixel), kind ``'stoken'``:
  ``affinity`` (B, hh*ww, h*w, 9): for each super token's grid cell, each of its h*w pixels' softmax
  association to the 9 super tokens of the cell's 3x3 neighbourhood (neighbour k = (k // 3 - 1, k % 3 - 1)
  cells away; neighbours outside the grid are the official code's zero padding), from the final
  iteration (the one that upsamples the refined super tokens back to pixels); ``grid`` (hh, ww);
  ``stoken_size`` (h, w); ``size`` (H, W) of the stage's map before the padding to whole super tokens.
- HAT-Net attention, kind ``'hat'``: ``global_probs`` (B, heads, H*W, Nk): every position's attention
  over the ds_ratio-pooled map (``pooled`` (ph, pw), pooled cell (i, j) averaging map pixels
  [i*ds_ratio, (i+1)*ds_ratio) x [j*ds_ratio, (j+1)*ds_ratio)), or over all H*W positions where the stage has
  no windows (grid_size 1: ``pooled`` = ``size``, ``ds_ratio`` 1); with windows also ``window_probs``
  (B, heads, gh*gw, g*g, g*g): attention inside each g x g window, windows in row-major order, the
  windows' positions row-major (``windows`` (gh, gw), ``grid_size`` g, border windows zero-padded and
  their padding masked, as the forward does). ``size`` (H, W).

Recording works in any mode (eval or training, with or without grad); a block run twice (activation
checkpointing recomputes it in backward) keeps its last record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import ExitStack, contextmanager

import torch
import torch.nn as nn

from ..families import FAMILIES, family_of
from ..ops.switch import fast_paths


def attention_modules(model: nn.Module) -> dict[tuple[int, int], nn.Module]:
    """{(stage, block): attention module} of a backbone of a registered family, stages and blocks 0-based."""
    family = family_of(model)
    if family is None:
        raise TypeError(
            f"record_attention expects a backbone of a registered family ({sorted(FAMILIES)}), "
            f"got {type(model).__name__}"
        )
    return family.attention_modules(model)


def last_blocks(model: nn.Module) -> list[tuple[int, int]]:
    """The (stage, block) key of each stage's last block: the block whose output is the stage's output."""
    keys = attention_modules(model)
    return [max(k for k in keys if k[0] == stage) for stage in sorted({s for s, _ in keys})]


def _cells(size: tuple[int, int], cell: int | tuple[int, int]) -> tuple[int, int]:
    """How many cells of ``cell`` pixels cover ``size`` (H, W), partial border cells included."""
    h, w = (cell, cell) if isinstance(cell, int) else cell
    return -(-size[0] // h), -(-size[1] // w)


def stoken_record(m: nn.Module, shape: torch.Size, affinity: torch.Tensor) -> dict:
    """The ``'stoken'`` record of a super-token attention module ``m`` (input ``shape``) from its association."""
    size = tuple(shape[-2:])
    return dict(
        kind="stoken", affinity=affinity, grid=_cells(size, m.stoken_size), stoken_size=m.stoken_size, size=size
    )


def window_record(m: nn.Module, shape: torch.Size, probs: torch.Tensor) -> dict:
    """The window part of a ``'hat'`` record of a HAT-Net attention module ``m`` (input ``shape``)."""
    size, g = tuple(shape[-2:]), m.grid_size
    windows = _cells(size, g)
    probs = probs.reshape(shape[0], m.num_heads, windows[0] * windows[1], g * g, g * g)
    return dict(kind="hat", window_probs=probs, windows=windows, grid_size=g, size=size)


def global_record(m: nn.Module, shape: torch.Size, probs: torch.Tensor) -> dict:
    """The global part of a ``'hat'`` record of a HAT-Net attention module ``m`` (input ``shape``)."""
    size, ds = tuple(shape[-2:]), m.ds_ratio if m.grid_size > 1 else 1
    probs = probs.reshape(shape[0], m.num_heads, size[0] * size[1], -1)
    return dict(kind="hat", global_probs=probs, size=size, pooled=_cells(size, ds), ds_ratio=ds)


@contextmanager
def record_attention(model: nn.Module, blocks: Iterable[tuple[int, int]] | None = None):
    """Record the attention maps of ``blocks`` ((stage, block) keys; default all) during the forward passes
    run inside the block (on the plain formulation). Yields the dict {(stage, block): record} that the forward
    fills (module doc)."""
    modules: Mapping[tuple[int, int], nn.Module] = attention_modules(model)
    keys = list(modules) if blocks is None else [tuple(b) for b in blocks]
    unknown = [k for k in keys if k not in modules]
    if unknown:
        raise KeyError(
            f"record_attention: no attention block {unknown} in this {type(model).__name__}; "
            f"its (stage, block) keys are {sorted(modules)}"
        )
    records: dict[tuple[int, int], dict] = {}
    with ExitStack() as hooks:
        for key in keys:
            hooks.enter_context(_watch(modules[key], family_of(model).probes, key, records))
        with fast_paths(False):
            yield records


@contextmanager
def _watch(module: nn.Module, probes: dict, key: tuple[int, int], records: dict):
    """Forward hooks on ``module`` (its input's shape) and on its probes (the records)."""
    shape = []

    def remember_shape(_, args):
        shape[:] = [args[0].shape]

    def saver(make_record):
        def save(_, args, out):
            records.setdefault(key, {}).update(make_record(module, shape[0], out.detach().float()))

        return save

    handles = [module.register_forward_pre_hook(remember_shape)]
    handles += [
        getattr(module, name).register_forward_hook(saver(make))
        for name, make in probes.items()
        if hasattr(module, name)
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# --- reading the records: maps over a stage's feature map (pixels of the map, not of the image) -----------
def _to_pixels(cells: torch.Tensor, record: dict) -> torch.Tensor:
    """(B, hh*ww, h*w, ...) per-cell pixel values -> (B, H, W, ...) on the stage's map (padding cropped)."""
    (hh, ww), (h, w), (H, W) = record["grid"], record["stoken_size"], record["size"]
    rest = cells.shape[3:]
    pixels = cells.reshape(cells.shape[0], hh, ww, h, w, *rest).transpose(2, 3)
    return pixels.reshape(cells.shape[0], hh * h, ww * w, *rest)[:, :H, :W]


def _neighbours(record: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, valid), both (hh*ww, 9): the flat index of each cell's k-th neighbouring super token, and
    whether that neighbour lies inside the grid (outside ones are the forward's zero padding)."""
    hh, ww = record["grid"]
    offsets = torch.arange(9, device=device)
    rows = torch.arange(hh, device=device).view(hh, 1, 1) + offsets // 3 - 1
    cols = torch.arange(ww, device=device).view(1, ww, 1) + offsets % 3 - 1
    valid = (rows >= 0) & (rows < hh) & (cols >= 0) & (cols < ww)
    return (rows * ww + cols).reshape(hh * ww, 9), valid.reshape(hh * ww, 9)


def stoken_assignment(record: dict) -> torch.Tensor:
    """(B, H, W) int64: each map pixel's super token (flat row-major index into the hh x ww grid), the one
    of its cell's 9 neighbours inside the grid with the highest affinity (a ``'stoken'`` record)."""
    affinity = record["affinity"]
    token, valid = _neighbours(record, affinity.device)
    best = affinity.masked_fill(~valid[None, :, None], float("-inf")).argmax(-1)  # (B, hh*ww, h*w)
    chosen = torch.gather(token.expand(affinity.shape[0], -1, -1), 2, best)
    return _to_pixels(chosen, record)


def stoken_association(record: dict, stoken: int) -> torch.Tensor:
    """(B, H, W): every map pixel's soft association (affinity) to super token ``stoken`` (flat index);
    zero for pixels whose cell is not one of the token's 9 neighbours (a ``'stoken'`` record)."""
    hh, ww = record["grid"]
    if not 0 <= stoken < hh * ww:
        raise IndexError(
            f"super token {stoken} does not exist: the grid has {hh}x{ww} = {hh * ww} super tokens "
            f"(indices 0..{hh * ww - 1}, row-major)"
        )
    affinity = record["affinity"]
    token, valid = _neighbours(record, affinity.device)
    hit = ((token == stoken) & valid).to(affinity.dtype)  # (hh*ww, 9): which neighbour slot is this token
    return _to_pixels((affinity * hit[None, :, None]).sum(-1), record)


def window_attention_map(record: dict, y: int, x: int) -> torch.Tensor:
    """(B, heads, H, W): the window attention of the query at map pixel (y, x) over the stage's map, zero
    outside the query's grid_size x grid_size window (a ``'hat'`` record of a stage with windows)."""
    if "window_probs" not in record:
        raise KeyError("this HAT-Net stage has no windows (grid_size 1): it has global attention only")
    _check_point(record, y, x)
    probs, g, (gh, gw), (H, W) = record["window_probs"], record["grid_size"], record["windows"], record["size"]
    row = probs[:, :, (y // g) * gw + x // g, (y % g) * g + x % g]  # (B, heads, g*g)
    full = probs.new_zeros(probs.shape[0], probs.shape[1], gh * g, gw * g)
    top, left = (y // g) * g, (x // g) * g
    full[:, :, top : top + g, left : left + g] = row.reshape(*row.shape[:2], g, g)
    return full[:, :, :H, :W]


def global_attention_map(record: dict, y: int, x: int) -> torch.Tensor:
    """(B, heads, ph, pw): the global attention of the query at map pixel (y, x) over the pooled map (over
    the whole map where the stage has no windows) (a ``'hat'`` record)."""
    _check_point(record, y, x)
    probs, width = record["global_probs"], record["size"][1]
    return probs[:, :, y * width + x].reshape(*probs.shape[:2], *record["pooled"])


def _check_point(record: dict, y: int, x: int) -> None:
    H, W = record["size"]
    if not (0 <= y < H and 0 <= x < W):
        raise IndexError(f"query ({y}, {x}) lies outside the stage's {H}x{W} map")
