"""Matplotlib figures used by the book, in one house style, with the package's own
Chinese font."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "BOOK_STYLE",
    "MAX_WIDTH_IN",
    "MIN_FONT_PT",
    "use_book_style",
    "CJK_FONT_FILE",
    "cjk_font",
    "font_families",
    "plot_attention",
    "plot_attention_heads",
    "plot_positional_encoding",
    "plot_loss_curves",
]

# One house style for every figure of the book. A figure is drawn at most ~7 inches
# wide, the width of the book's text column, so it is shown at its natural size (fonts
# as set here, >= 9 pt) on a laptop; inline figures are SVG (see use_book_style), PNG
# files are saved at 2x density.
BOOK_STYLE: dict[str, object] = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "figure.titlesize": 11,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    # long tick numbers (10000, 20000, ...) get a common "x10^4" factor instead of
    # crowding the axis
    "axes.formatter.limits": (-3, 4),
    "axes.formatter.use_mathtext": True,
    # text as outlines in SVG: the figure looks the same in every browser, with or
    # without its fonts
    "svg.fonttype": "path",
}
# Smallest font size (points) of any text in a book figure, at its natural size.
MIN_FONT_PT = 9.0
# Widest figure (inches) that is shown at its natural size in the book's text column.
MAX_WIDTH_IN = 7.5


# The Chinese font that ships with the package (a subset of Noto Sans CJK SC under the
# SIL Open Font License, built by scripts/make_cjk_font.py): every figure draws Chinese
# with it, so glyphs and metrics are the same on every machine, system fonts or not.
CJK_FONT_FILE = Path(__file__).parent / "fonts" / "CourseSansSC-Regular.ttf"


@functools.cache
def cjk_font() -> str:
    """Register the package's Chinese font with matplotlib (once) and return its family
    name, ``"Course Sans SC"``."""
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(CJK_FONT_FILE))
    return font_manager.FontProperties(fname=str(CJK_FONT_FILE)).get_name()


def font_families(mono: bool = False) -> list[str]:
    """Font families for figure text: Latin from matplotlib's own DejaVu fonts (shipped
    with matplotlib, so the same everywhere), Chinese from :func:`cjk_font`."""
    return ["DejaVu Sans Mono" if mono else "DejaVu Sans", cjk_font()]


def use_book_style() -> None:
    """Apply :data:`BOOK_STYLE`; inside IPython, also show inline figures as SVG (sharp
    at any zoom).

    Text is drawn with :func:`font_families`: Latin from DejaVu Sans, Chinese from the
    package's own font.
    """
    plt.rcParams.update(BOOK_STYLE)
    plt.rcParams["font.family"] = font_families()
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: rcParams are all there is to set
        return
    if get_ipython() is not None:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("svg")


def _as_2d(name: str, x: Tensor) -> Tensor:
    x = torch.as_tensor(x).detach().float().cpu()
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    return x


def _check_labels(name: str, labels: Sequence[str] | None, n: int) -> None:
    if labels is not None and len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels for {n} positions")


def _cell_points(ax: Axes, n: int, axis: str) -> float:
    """Size in points of one of ``n`` heatmap cells along ``axis`` ("x" or "y") of
    ``ax``."""
    fig = ax.figure
    fig.draw_without_rendering()  # settles the layout, so the axes has its final size
    box = ax.get_window_extent()
    length = box.width if axis == "x" else box.height
    return length * 72.0 / fig.dpi / max(n, 1)


def _label_ticks(
    ax: Axes, axis: str, labels: Sequence[str], rotate: bool, thin: bool = True
) -> None:
    """Put ``labels`` on the cells of a heatmap axis; with ``thin``, only every k-th one
    where they would overlap.

    A label needs about 1.3 times its font size across the axis (rotated x labels and y
    labels stack along the axis one text line each); where the cells are smaller, only
    every k-th cell is labelled.
    """
    from matplotlib.font_manager import FontProperties

    n = len(labels)
    size = max(
        FontProperties(size=plt.rcParams[f"{axis}tick.labelsize"]).get_size_in_points(),
        MIN_FONT_PT,
    )
    step = max(1, math.ceil(1.3 * size / _cell_points(ax, n, axis))) if thin else 1
    positions = list(range(0, n, step))
    shown = [labels[i] for i in positions]
    if axis == "x":
        ax.set_xticks(positions, shown, fontsize=size, rotation=90 if rotate else 0)
    else:
        ax.set_yticks(positions, shown, fontsize=size)
    if step > 1:  # a small tick on every cell, so the reader can still count positions
        (ax.set_xticks if axis == "x" else ax.set_yticks)(range(n), minor=True)


def _heatmap_size(
    rows: int, cols: int, cell_in: float, max_width: float
) -> tuple[float, float]:
    """Figure size (inches) of a heatmap: ``cell_in`` per cell, at most ``max_width``
    wide."""
    scale = min(cell_in, (max_width - 1.8) / max(cols, 1))
    return (max(3.0, cols * scale + 1.8), max(2.2, rows * scale + 1.3))


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Heatmap of one attention matrix ``(L, S)``: rows are queries, columns keys, with
    a colorbar.

    Without ``ax``, a new figure is sized for the matrix (at most :data:`MAX_WIDTH_IN`
    wide) and laid out with ``tight_layout`` (calling it again is harmless). Labels that
    would overlap are thinned to every k-th position.
    """
    w = _as_2d("weights", weights)
    _check_labels("query_labels", query_labels, w.size(0))
    _check_labels("key_labels", key_labels, w.size(1))
    own_figure = ax is None
    if ax is None:
        _, ax = plt.subplots(
            figsize=_heatmap_size(w.size(0), w.size(1), 0.45, MAX_WIDTH_IN)
        )
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=max(1e-9, float(w.max())))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="权重")
    _label_heatmap([ax], query_labels, key_labels, ncols=1, tight=own_figure)
    return ax


def plot_attention_heads(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ncols: int = 4,
) -> Figure:
    """A grid of heatmaps, one per head, from weights ``(H, L, S)``, with one shared
    colorbar.

    The figure is at most :data:`MAX_WIDTH_IN` wide and laid out with ``tight_layout``
    (calling it again is harmless); labels that would overlap are thinned to every k-th
    position.
    """
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"weights must be (H, L, S), got shape {tuple(w.shape)}")
    _check_labels("query_labels", query_labels, w.size(1))
    _check_labels("key_labels", key_labels, w.size(2))
    H, L, S = w.shape
    if H == 0:
        raise ValueError(
            f"weights must have at least one head, got shape {tuple(w.shape)}"
        )
    ncols = max(1, min(ncols, H))
    nrows = math.ceil(H / ncols)
    # inches per head, the colorbar takes the rest
    panel = min(2.2, (MAX_WIDTH_IN - 1.0) / ncols)
    longest = max(map(len, key_labels), default=0) if key_labels is not None else 0
    # inches under the grid for rotated labels
    label_room = 0.09 * longest if longest > 2 else 0.3
    fig = plt.figure(
        figsize=(
            panel * ncols + 1.0,
            panel * nrows * max(0.5, min(1.5, L / S)) + 0.6 + label_room,
        )
    )
    # the colorbar is a column of the grid, so tight_layout can place it
    grid = fig.add_gridspec(nrows, ncols + 1, width_ratios=[1.0] * ncols + [0.06])
    axes = [fig.add_subplot(grid[h // ncols, h % ncols]) for h in range(nrows * ncols)]
    for h, ax in enumerate(axes):
        if h >= H:
            ax.axis("off")
            continue
        im = ax.imshow(w[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"头 {h}")
    fig.colorbar(im, cax=fig.add_subplot(grid[:, -1]), label="权重")
    _label_heatmap(axes[:H], query_labels, key_labels, ncols=ncols, tight=True)
    return fig


def _label_heatmap(
    axes: Sequence[Axes],
    query_labels: Sequence[str] | None,
    key_labels: Sequence[str] | None,
    ncols: int,
    tight: bool,
) -> None:
    """Tick labels of a grid of heatmaps (``ncols`` per row): key labels under the
    bottom heatmap of each column, query labels left of the first column. Lays the
    figure out first when ``tight``, so that the thinning sees the final cell size."""
    rotate = key_labels is not None and max(map(len, key_labels), default=0) > 2
    fig = axes[0].figure
    # place every label, lay out, then thin the labels to what fits
    for pass_ in range(2):
        if tight:
            fig.tight_layout()
        for i, ax in enumerate(axes):
            # the bottom heatmap of a column
            if key_labels is not None and i + ncols >= len(axes):
                _label_ticks(ax, "x", key_labels, rotate, thin=pass_ == 1)
            elif key_labels is not None:
                ax.set_xticks([])
            if query_labels is not None and i % ncols == 0:
                _label_ticks(ax, "y", query_labels, False, thin=pass_ == 1)
            elif query_labels is not None:
                ax.set_yticks([])
    if tight:
        fig.tight_layout()


def plot_positional_encoding(pe: Tensor, ax: Axes | None = None) -> Axes:
    """Heatmap of a positional table ``(L, E)``: position on the y axis, dimension on
    the x axis."""
    pe = _as_2d("pe", pe)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    im = ax.imshow(pe.numpy(), cmap="RdBu", aspect="auto", vmin=-1.0, vmax=1.0)
    ax.set_xlabel("dimension $j$")
    ax.set_ylabel("position $pos$")
    ax.figure.colorbar(im, ax=ax)
    return ax


def plot_loss_curves(
    curves: Mapping[str, Sequence[float]], ax: Axes | None = None, logy: bool = False
) -> Axes:
    """One line per named loss curve (x axis: step)."""
    if not curves:
        raise ValueError("curves is empty")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in curves.items():
        ax.plot(range(len(values)), list(values), label=name)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("步数")
    ax.set_ylabel("损失")
    ax.legend()
    return ax
