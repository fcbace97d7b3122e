"""Matplotlib figures used by the book. Figure text is English/LaTeX so that it renders
without CJK fonts."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "BOOK_STYLE",
    "use_book_style",
    "cjk_font",
    "plot_attention",
    "plot_attention_heads",
    "plot_positional_encoding",
    "plot_loss_curves",
]

# One house style for every figure of the book: readable fonts at the page's width, light grid.
BOOK_STYLE: dict[str, object] = {
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "axes.grid": False,
}


@functools.cache
def cjk_font() -> str | None:
    """The name of an installed font that has Chinese glyphs, or ``None`` when there is none.

    Figures may show Chinese tokens only when this is not ``None``; otherwise a chapter falls back
    to pinyin or English labels, so that the figure renders on any machine.
    """
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    for font in sorted(font_manager.fontManager.ttflist, key=lambda f: f.name):
        try:
            if FT2Font(font.fname).get_char_index(ord("爱")):
                return font.name
        except (OSError, RuntimeError):  # unreadable font file: skip it
            continue
    return None


def use_book_style() -> None:
    """Apply :data:`BOOK_STYLE`; inside IPython, also show inline figures as SVG (sharp at any zoom)."""
    plt.rcParams.update(BOOK_STYLE)
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


def plot_attention(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Heatmap of one attention matrix ``(L, S)``: rows are queries, columns keys."""
    w = _as_2d("weights", weights)
    _check_labels("query_labels", query_labels, w.size(0))
    _check_labels("key_labels", key_labels, w.size(1))
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * w.size(1) + 1.5, 0.45 * w.size(0) + 1))
    im = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=max(1e-9, float(w.max())))
    if key_labels is not None:
        ax.set_xticks(range(w.size(1)), key_labels, rotation=45, ha="right")
    if query_labels is not None:
        ax.set_yticks(range(w.size(0)), query_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def plot_attention_heads(
    weights: Tensor,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    ncols: int = 4,
) -> Figure:
    """A grid of heatmaps, one per head, from weights ``(H, L, S)``."""
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"weights must be (H, L, S), got shape {tuple(w.shape)}")
    H = w.size(0)
    ncols = max(1, min(ncols, H))
    nrows = math.ceil(H / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 3.0 * nrows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(w[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
        ax.set_title(f"head {h}")
        if key_labels is not None:
            ax.set_xticks(range(w.size(2)), key_labels, rotation=90, fontsize=7)
        if query_labels is not None:
            ax.set_yticks(range(w.size(1)), query_labels, fontsize=7)
    fig.tight_layout()
    return fig


def plot_positional_encoding(pe: Tensor, ax: Axes | None = None) -> Axes:
    """Heatmap of a positional table ``(L, E)``: position on the y axis, dimension on the x axis."""
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
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    return ax
