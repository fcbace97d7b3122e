import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle

from transformer_course.diagrams import HIGHLIGHT, KINDS, Diagram


def _layer() -> Diagram:
    d = Diagram()
    d.box("x", (0, 0), "输入 x", kind="input")
    d.box("attn", (0, 1.4), "多头自注意力", kind="attention")
    d.op("add", (0, 2.5), "+")
    d.arrow("x", "attn", label="(N, L, E)")
    d.arrow("attn", "add", highlight=True)
    d.arrow("x", "add", route="left")
    d.group(["attn", "add"], label="× N 层")
    return d


def test_draws_boxes_circles_arrows_and_group():
    fig = _layer().draw(width=4)
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 2
    assert sorted(p.get_facecolor()[:3] for p in boxes) == sorted(
        tuple(int(KINDS[k][i : i + 2], 16) / 255 for i in (1, 3, 5)) for k in ("input", "attention")
    )
    assert sum(isinstance(p, Circle) for p in ax.patches) == 1
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 3
    assert sum(p.get_linewidth() > 2 for p in arrows) == 1
    assert any(
        tuple(round(c, 3) for c in p.get_edgecolor()[:3])
        == tuple(round(int(HIGHLIGHT[i : i + 2], 16) / 255, 3) for i in (1, 3, 5))
        for p in arrows
    )
    frames = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_ls() == "--"]
    assert len(frames) == 1
    texts = {t.get_text() for t in ax.texts}
    assert {"输入 x", "多头自注意力", "+", "(N, L, E)", "× N 层"} <= texts
    # the skip connection runs left of every node between its ends
    leftmost_edge = min(p.get_x() for p in boxes)
    assert min(ax.lines[0].get_xdata()) < leftmost_edge
    w, h = fig.get_size_inches()
    assert w == pytest.approx(4)
    plt.close(fig)


def test_straight_arrow_ends_on_the_outlines():
    d = Diagram()
    d.box("a", (0, 0), "a", w=2, h=1)
    d.box("b", (0, 3), "b", w=2, h=1)
    d.arrow("a", "b")
    fig = d.draw(width=3)
    (arrow,) = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
    (x0, y0), (x1, y1) = arrow._posA_posB
    assert (x0, y0, x1, y1) == pytest.approx((0, 0.5, 0, 2.5))
    plt.close(fig)


def test_a_label_that_does_not_fit_is_refused():
    d = Diagram()
    d.box("a", (0, 0), "一个放不进这个小框的很长很长的标签", w=1.0)
    d.box("b", (12, 0), "b", w=1.0)
    with pytest.raises(ValueError, match="does not fit its box"):
        d.draw(width=6)
    plt.close("all")


def test_default_width_fits_chinese_and_multiline_labels():
    d = Diagram()
    d.box("a", (0, 0), "交叉注意力\n(Q 来自解码器，K/V 来自 memory)", kind="cross", h=1.0)
    d.box("b", (0, 2), "LayerNorm", kind="norm")
    d.arrow("a", "b")
    plt.close(d.draw(width=5))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda d: d.box("a", (0, 0), "dup"), ValueError, "exists already"),
        (lambda d: d.box("c", (0, 0), "x", kind="nope"), ValueError, "kind must be"),
        (lambda d: d.box("c", (0, 0), "x", w=0), ValueError, "w must be positive"),
        (lambda d: d.box("c", "here", "x"), TypeError, "xy must be a pair"),
        (lambda d: d.box("", (0, 0), "x"), TypeError, "non-empty str"),
        (lambda d: d.arrow("a", "zz"), ValueError, "unknown node 'zz'"),
        (lambda d: d.arrow("a", "a", route="up"), ValueError, "route must be"),
        (lambda d: d.group(["zz"]), ValueError, "unknown: \\['zz'\\]"),
        (lambda d: d.text((0, 0), "x", size=6), ValueError, "at least 9"),
        (lambda d: d.draw(width=9), ValueError, "at most 7.5"),
    ],
)
def test_bad_input_is_refused(call, error, match):
    d = Diagram()
    d.box("a", (0, 0), "a")
    with pytest.raises(error, match=match):
        call(d)


def test_empty_diagram_is_refused():
    with pytest.raises(ValueError, match="empty"):
        Diagram().draw()
