"""What every picture of tools/visualize_attention.py is drawn with: the prepared image, the mapping from a stage's
map back to original-image pixels, and the grid of labelled panels (each at the image's resolution or larger)
that ``tasks.figures.pictures`` fills, one PNG per image."""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from backbones.checkpoints.atomic import atomic_write  # noqa: E402

MIN_PANEL_SIDE = 320  # display pixels: small images are enlarged so the labels stay readable
TITLE_LINES, TITLE_PT, CHAR_PX = 3, 9, 6.4  # panel titles: wrapped to at most 3 lines of 9 pt text
COLORBAR_PX, GAP_PX, HEADER_PX = 96, 24, 56  # the header: up to 2 lines of 12 pt bold text
HEADER_PT, HEADER_CHAR_PX = 12, 11.0
DPI = 100
TITLE_PX = round(TITLE_LINES * TITLE_PT * 1.25 * DPI / 72) + 10


@dataclass
class PreparedImage:
    """One image as the model sees it, and how its pixels map back to the original image."""

    path: str
    original: np.ndarray  # (H, W, 3) uint8 RGB, as read from the file
    inputs: torch.Tensor  # (1, 3, Hp, Wp): resized, normalised and padded, the backbone's input
    img_shape: tuple[int, int]  # (h, w) of the resized image inside ``inputs`` (the rest is padding)
    scale: tuple[float, float]  # (x, y) factors from original to resized pixels


def stage_stride(stage: int) -> int:
    return 4 * 2**stage


def to_image(stage_map: torch.Tensor, stride: int, image: PreparedImage) -> np.ndarray:
    """(..., h, w) values over a stride-``stride`` map -> (..., H, W) over the original image (nearest: each map
    pixel covers stride x stride input pixels; the padding is cropped and the resize undone)."""
    x = stage_map.float().cpu().repeat_interleave(stride, -2).repeat_interleave(stride, -1)
    x = x[..., : image.img_shape[0], : image.img_shape[1]]
    lead = x.shape[:-2]
    x = F.interpolate(x.reshape(1, -1, *x.shape[-2:]), size=image.original.shape[:2], mode="nearest-exact")
    return x.reshape(*lead, *image.original.shape[:2]).numpy()


def map_pixel(point: tuple[float, float], stride: int, image: PreparedImage) -> tuple[int, int]:
    """(row, col) of the stride-``stride`` map pixel over the original-image point (x, y)."""
    x, y = point
    row = min(int(y * image.scale[1]), image.img_shape[0] - 1) // stride
    col = min(int(x * image.scale[0]), image.img_shape[1] - 1) // stride
    return row, col


def map_box(top: int, left: int, height: int, width: int, stride: int, image: PreparedImage):
    """(x, y, w, h) in original-image pixels of a block of map pixels, clipped to the image."""
    H, W = image.original.shape[:2]
    x0, y0 = left * stride / image.scale[0], top * stride / image.scale[1]
    x1 = min((left + width) * stride / image.scale[0], W)
    y1 = min((top + height) * stride / image.scale[1], H)
    return x0 - 0.5, y0 - 0.5, x1 - x0, y1 - y0


class Grid:
    """A figure of rows x cols image panels, each exactly the image's size times ``zoom`` in pixels, with a
    title band above and a colour bar beside each panel."""

    def __init__(self, image: np.ndarray, rows: int, cols: int, header: str):
        h, w = image.shape[:2]
        self.image = image
        self.zoom = max(1.0, MIN_PANEL_SIDE / min(h, w))
        self.pw, self.ph = round(w * self.zoom), round(h * self.zoom)
        self.cell_w, self.cell_h = GAP_PX + self.pw + COLORBAR_PX, TITLE_PX + self.ph + GAP_PX
        self.fw, self.fh = cols * self.cell_w + GAP_PX, rows * self.cell_h + HEADER_PX
        self.fig = plt.figure(figsize=(self.fw / DPI, self.fh / DPI), dpi=DPI)
        header = "\n".join(textwrap.wrap(header, int(self.fw / HEADER_CHAR_PX))[:2])
        self.fig.text(
            0.5, 1 - HEADER_PX / 2 / self.fh, header, ha="center", va="center", fontsize=HEADER_PT, fontweight="bold"
        )

    def panel(self, row: int, col: int, title: str, dim: float = 1.0):
        left = GAP_PX + col * self.cell_w
        top = HEADER_PX + row * self.cell_h + TITLE_PX
        ax = self.fig.add_axes((left / self.fw, 1 - (top + self.ph) / self.fh, self.pw / self.fw, self.ph / self.fh))
        ax.imshow((self.image * dim).astype(np.uint8), interpolation="antialiased")
        ax.set_xticks([]), ax.set_yticks([])
        lines = textwrap.wrap(title, int((self.pw + COLORBAR_PX - GAP_PX) / CHAR_PX))
        ax.set_title("\n".join(lines[:TITLE_LINES]), fontsize=TITLE_PT, loc="left")
        return ax

    def heat(self, ax, values: np.ndarray, label: str, sparse: bool = False):
        """Overlay ``values`` (H, W); ``sparse``: zero outside a region (left uncoloured, colour scale from 0),
        else a dense distribution (colour scale from its minimum, so that its structure shows)."""
        shown = np.ma.masked_where(values <= 0, values) if sparse else values
        low = 0.0 if sparse else float(values.min())
        im = ax.imshow(
            shown,
            cmap="inferno",
            alpha=0.7,
            vmin=low,
            vmax=max(float(values.max()), low + 1e-12),
            interpolation="nearest",
        )
        box = ax.get_position()
        cax = self.fig.add_axes((box.x1 + 8 / self.fw, box.y0, 14 / self.fw, box.height))
        self.fig.colorbar(im, cax=cax).set_label(label, fontsize=9)

    def save(self, path: str) -> None:
        """Write the PNG atomically: an interrupted run leaves no truncated picture."""
        data = io.BytesIO()
        self.fig.savefig(data, dpi=DPI, format="png")
        plt.close(self.fig)
        atomic_write(path, lambda f: f.write(data.getvalue()))


def mark_point(ax, point) -> None:
    ax.plot(*point, marker="+", color="cyan", markersize=16, markeredgewidth=2.5)


def boundaries(labels: np.ndarray, thickness: int) -> np.ndarray:
    """Pixels within ``thickness`` pixels of a label change (both sides of it)."""
    edge = np.zeros(labels.shape, bool)
    for _ in range(thickness):
        horizontal, vertical = labels[:, 1:] != labels[:, :-1], labels[1:, :] != labels[:-1, :]
        edge[:, 1:] |= horizontal
        edge[:, :-1] |= horizontal
        edge[1:, :] |= vertical
        edge[:-1, :] |= vertical
        labels = np.where(edge, -1, labels)  # grow the edge by one pixel per round
    return edge


def heads_text(n: int) -> str:
    return f"mean of {n} heads" if n > 1 else "1 head"


def outline(ax, box) -> None:
    """A cyan frame around ``box`` ((x, y, w, h) in original-image pixels, ``map_box``)."""
    x, y, w, h = box
    ax.add_patch(Rectangle((x, y), w, h, fill=False, color="cyan", lw=2))
