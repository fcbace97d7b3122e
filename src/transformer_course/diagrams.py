"""Block and flow diagrams for the book, drawn with matplotlib: boxes, arrows with
tensor shapes, residual skips, dashed groups and a highlighted path.

A diagram is code, so it is tested and every chapter draws its architecture pictures in
the same style::

    d = Diagram()
    d.box("emb", (0, 0), "词嵌入 + 位置编码", kind="embed")
    d.box("attn", (0, 1.4), "多头自注意力", kind="attention")
    d.op("add", (0, 2.4), "+")
    d.arrow("emb", "attn", label="(N, L, E)")
    d.arrow("emb", "add", route="left")
    d.arrow("attn", "add")
    d.group(["attn", "add"], label="× N 层")
    fig = d.draw()

Coordinates are free units (x to the right, y upwards) drawn with equal aspect, so a
unit is as long on both axes. :meth:`Diagram.draw` scales the picture to the requested
width and raises ``ValueError`` when a label does not fit inside its box.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from .viz import font_families

__all__ = ["KINDS", "HIGHLIGHT", "Diagram"]

# Fill colour of each kind of box: the same meaning has the same colour in every
# chapter.
KINDS: dict[str, str] = {
    "input": "#eeeeee",
    "embed": "#d9ead3",
    "attention": "#fce5cd",
    "cross": "#f4cccc",
    "norm": "#fff2cc",
    "ffn": "#cfe2f3",
    "output": "#d9d2e9",
    "op": "#ffffff",
    "tensor": "#ffffff",
    "cache": "#d0e0e3",
    "plain": "#ffffff",
}
HIGHLIGHT = "#c0392b"
_EDGE = "0.25"
_FONT_PT = 10.0
_SMALL_PT = 9.0
_CJK = re.compile(r"[\u3400-\u9fff\uff00-\uffef]")


@dataclass
class _Node:
    x: float
    y: float
    w: float
    h: float
    text: str
    kind: str
    circle: bool
    highlight: bool

    def boundary(self, dx: float, dy: float) -> tuple[float, float]:
        """The point where a ray from the centre in direction (dx, dy) leaves the
        node."""
        norm = math.hypot(dx, dy)
        if norm == 0:
            return self.x, self.y
        if self.circle:
            r = self.w / 2
            return self.x + r * dx / norm, self.y + r * dy / norm
        tx = (self.w / 2) / abs(dx) if dx else math.inf
        ty = (self.h / 2) / abs(dy) if dy else math.inf
        t = min(tx, ty)
        return self.x + t * dx, self.y + t * dy

    def side(self, which: str) -> tuple[float, float]:
        sign = -1 if which == "left" else 1
        return self.x + sign * self.w / 2, self.y


@dataclass
class _Arrow:
    src: str
    dst: str
    label: str | None
    highlight: bool
    route: str
    offset: float
    dashed: bool


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a positive number; otherwise raise naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return float(value)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a node name must be a non-empty str, got {name!r}")
    return name


def _check_point(name: str, xy: object) -> tuple[float, float]:
    try:
        x, y = (float(v) for v in xy)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a pair of numbers (x, y), got {xy!r}"
        ) from None
    return x, y


class Diagram:
    """A block diagram: add boxes, circles, arrows, groups and notes, then
    :meth:`draw`."""

    def __init__(self, title: str | None = None) -> None:
        self.title = title
        self._nodes: dict[str, _Node] = {}
        self._arrows: list[_Arrow] = []
        self._groups: list[tuple[list[str], str | None, float]] = []
        self._texts: list[tuple[float, float, str, float, str]] = []

    def _add(self, name: str, node: _Node) -> Diagram:
        if name in self._nodes:
            raise ValueError(f"a node named {name!r} exists already")
        if node.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {node.kind!r}")
        self._nodes[name] = node
        return self

    def box(
        self,
        name: str,
        xy: tuple[float, float],
        text: str,
        *,
        kind: str = "plain",
        w: float | None = None,
        h: float = 0.6,
        highlight: bool = False,
    ) -> Diagram:
        """A rounded box centred at ``xy``; ``w`` defaults to a width that fits
        ``text``."""
        x, y = _check_point("xy", xy)
        if w is None:
            longest = max(_text_units(line) for line in str(text).split("\n"))
            w = max(1.2, 0.16 * longest + 0.5)
        check_positive("w", w)
        check_positive("h", h)
        node = _Node(x, y, float(w), float(h), str(text), kind, False, highlight)
        return self._add(_check_name(name), node)

    def op(
        self,
        name: str,
        xy: tuple[float, float],
        text: str = "+",
        *,
        r: float = 0.22,
        highlight: bool = False,
    ) -> Diagram:
        """A small circle (a residual addition, a product, …) of radius ``r``."""
        x, y = _check_point("xy", xy)
        check_positive("r", r)
        node = _Node(x, y, 2 * r, 2 * r, str(text), "op", True, highlight)
        return self._add(_check_name(name), node)

    def arrow(
        self,
        src: str,
        dst: str,
        *,
        label: str | None = None,
        highlight: bool = False,
        route: str = "straight",
        offset: float = 0.8,
        dashed: bool = False,
    ) -> Diagram:
        """An arrow from node ``src`` to node ``dst``.

        ``route="straight"`` joins the two outlines along the line between the centres;
        ``"left"``/``"right"`` leaves ``src`` sideways, runs ``offset`` units beside it
        and enters ``dst`` from the same side (a residual skip). ``label`` (a tensor
        shape, say) is written beside the arrow.
        """
        for end in (src, dst):
            if end not in self._nodes:
                raise ValueError(f"unknown node {end!r}; add it before the arrow")
        if route not in ("straight", "left", "right"):
            raise ValueError(f"route must be straight, left or right, got {route!r}")
        check_positive("offset", offset)
        self._arrows.append(
            _Arrow(src, dst, label, highlight, route, float(offset), dashed)
        )
        return self

    def group(
        self, names: list[str], *, label: str | None = None, pad: float = 0.25
    ) -> Diagram:
        """A dashed frame around the nodes ``names`` (a repeated layer, say), with
        ``label`` at its top right."""
        missing = [n for n in names if n not in self._nodes]
        if not names or missing:
            raise ValueError(f"group needs known node names, unknown: {missing}")
        check_positive("pad", pad)
        self._groups.append((list(names), label, float(pad)))
        return self

    def text(
        self,
        xy: tuple[float, float],
        text: str,
        *,
        size: float = _SMALL_PT,
        ha: str = "center",
    ) -> Diagram:
        """A free note at ``xy``."""
        x, y = _check_point("xy", xy)
        if size < _SMALL_PT:
            raise ValueError(f"size must be at least {_SMALL_PT} pt, got {size}")
        self._texts.append((x, y, str(text), float(size), ha))
        return self

    # -- drawing ---------------------------------------------------------------------

    def _group_frames(self) -> list[tuple[float, float, float, float, str | None]]:
        frames = []
        for names, label, pad in self._groups:
            nodes = [self._nodes[n] for n in names]
            x0 = min(n.x - n.w / 2 for n in nodes) - pad
            x1 = max(n.x + n.w / 2 for n in nodes) + pad
            y0 = min(n.y - n.h / 2 for n in nodes) - pad
            y1 = max(n.y + n.h / 2 for n in nodes) + pad
            frames.append((x0, y0, x1, y1, label))
        return frames

    def _extent(self) -> tuple[float, float, float, float]:
        xs, ys = [], []
        for n in self._nodes.values():
            xs += [n.x - n.w / 2, n.x + n.w / 2]
            ys += [n.y - n.h / 2, n.y + n.h / 2]
        for a in self._arrows:
            if a.route != "straight":
                xs.append(self._route_x(a))
        for x0, y0, x1, y1, _ in self._group_frames():
            xs += [x0, x1]
            ys += [y0, y1 + 0.35]
        for x, y, _, _, _ in self._texts:
            xs.append(x)
            ys.append(y)
        if not xs:
            raise ValueError("the diagram is empty: add a box first")
        m = 0.3
        return min(xs) - m, max(xs) + m, min(ys) - m, max(ys) + m

    def draw(self, width: float = 6.5) -> Figure:
        """Draw the diagram on a new figure ``width`` inches wide (≤ 7.5, the book's
        text column) and return it."""
        check_positive("width", width)
        if width > 7.5:
            raise ValueError(f"width must be at most 7.5 inches, got {width}")
        x0, x1, y0, y1 = self._extent()
        height = width * (y1 - y0) / (x1 - x0)
        fig, ax = plt.subplots(figsize=(width, max(height, 0.8)))
        ax.set(xlim=(x0, x1), ylim=(y0, y1), aspect="equal")
        ax.axis("off")
        fig.subplots_adjust(0, 0, 1, 1)
        for gx0, gy0, gx1, gy1, label in self._group_frames():
            ax.add_patch(
                Rectangle(
                    (gx0, gy0),
                    gx1 - gx0,
                    gy1 - gy0,
                    fill=False,
                    ls="--",
                    lw=1,
                    ec="0.45",
                )
            )
            if label:
                ax.text(
                    gx1,
                    gy1 + 0.08,
                    label,
                    ha="right",
                    va="bottom",
                    fontsize=_SMALL_PT,
                    color="0.3",
                    family=font_families(),
                )
        for arrow in self._arrows:
            self._draw_arrow(ax, arrow)
        labels = [self._draw_node(ax, name, n) for name, n in self._nodes.items()]
        for x, y, s, size, ha in self._texts:
            ax.text(
                x,
                y,
                s,
                ha=ha,
                va="center",
                fontsize=size,
                color="0.3",
                family=font_families(),
            )
        if self.title:
            ax.set_title(self.title, fontsize=11, family=font_families())
        _check_labels_fit(fig, labels)
        return fig

    def _draw_node(self, ax, name: str, n: _Node):
        edge = HIGHLIGHT if n.highlight else _EDGE
        lw = 2.2 if n.highlight else 1.0
        if n.circle:
            patch = Circle(
                (n.x, n.y), n.w / 2, fc=KINDS[n.kind], ec=edge, lw=lw, zorder=3
            )
        else:
            patch = FancyBboxPatch(
                (n.x - n.w / 2, n.y - n.h / 2),
                n.w,
                n.h,
                boxstyle="round,pad=0,rounding_size=0.1",
                fc=KINDS[n.kind],
                ec=edge,
                lw=lw,
                zorder=3,
            )
        ax.add_patch(patch)
        family = font_families(mono=n.kind == "tensor")
        label = ax.text(
            n.x,
            n.y,
            n.text,
            ha="center",
            va="center",
            fontsize=_FONT_PT,
            linespacing=1.15,
            family=family,
            zorder=4,
        )
        return name, label, patch

    def _route_x(self, a: _Arrow) -> float:
        """x of the vertical run of a bent arrow: ``offset`` beyond the outer side of
        every node that lies between its two ends in height."""
        s, d = self._nodes[a.src], self._nodes[a.dst]
        lo, hi = min(s.y, d.y), max(s.y, d.y)
        sign = -1 if a.route == "left" else 1
        between = [n for n in self._nodes.values() if lo <= n.y <= hi]
        edge = max(sign * n.x + n.w / 2 for n in between)
        return sign * (edge + a.offset)

    def _draw_arrow(self, ax, a: _Arrow) -> None:
        s, d = self._nodes[a.src], self._nodes[a.dst]
        color = HIGHLIGHT if a.highlight else "0.2"
        lw = 2.2 if a.highlight else 1.1
        style = dict(color=color, lw=lw, ls="--" if a.dashed else "-")
        if a.route == "straight":
            start = s.boundary(d.x - s.x, d.y - s.y)
            end = d.boundary(s.x - d.x, s.y - d.y)
            path = [start, end]
        else:
            start, end = s.side(a.route), d.side(a.route)
            x = self._route_x(a)
            path = [start, (x, start[1]), (x, end[1]), end]
        if len(path) > 2:
            xs, ys = zip(*path[:-1], strict=True)
            ax.plot(xs, ys, solid_capstyle="butt", zorder=2, **style)
        ax.add_patch(
            FancyArrowPatch(
                path[-2],
                path[-1],
                arrowstyle="-|>",
                mutation_scale=12,
                zorder=2,
                shrinkA=0,
                shrinkB=0,
                **style,
            )
        )
        if a.label:
            (ax_, ay), (bx, by) = path[-2], path[-1]
            mx, my = (ax_ + bx) / 2, (ay + by) / 2
            vertical = abs(bx - ax_) < abs(by - ay)
            ax.text(
                mx + (0.1 if vertical else 0),
                my + (0 if vertical else 0.1),
                a.label,
                ha="left" if vertical else "center",
                va="center" if vertical else "bottom",
                fontsize=_SMALL_PT,
                family=font_families(mono=True),
                color=color,
                zorder=4,
            )


def _text_units(line: str) -> float:
    """Width of ``line`` in units of a Latin character (a Chinese one counts two)."""
    return sum(2.0 if _CJK.match(ch) else 1.0 for ch in line)


def _check_labels_fit(fig: Figure, labels: list) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for name, text, patch in labels:
        tb = text.get_window_extent(renderer)
        pb = patch.get_window_extent(renderer)
        if tb.width > pb.width + 1 or tb.height > pb.height + 1:
            plt.close(fig)
            raise ValueError(
                f"the label {text.get_text()!r} of node {name!r} does not fit its box "
                f"({tb.width:.0f}x{tb.height:.0f} px text in a {pb.width:.0f}x"
                f"{pb.height:.0f} px box): make the box larger (w=, h=) or the "
                "figure wider"
            )
