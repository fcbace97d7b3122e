import itertools
import pathlib
import warnings

import matplotlib.pyplot as plt
import pytest
import torch

import transformer_course as tc


def test_plot_attention_labels_and_errors():
    ax = tc.viz.plot_attention(torch.rand(3, 4), ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert ax.get_title() == "t"
    with pytest.raises(ValueError, match="3 labels for 4 positions"):
        tc.viz.plot_attention(torch.rand(3, 4), key_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="2-D"):
        tc.viz.plot_attention(torch.rand(2, 3, 4))
    plt.close("all")


def test_plot_attention_heads_grid():
    fig = tc.viz.plot_attention_heads(torch.rand(6, 3, 3), ncols=4)
    heads = [ax for ax in fig.axes if ax.get_title().startswith("头")]
    hidden = [ax for ax in fig.axes if not ax.axison]
    colorbars = [ax for ax in fig.axes if ax.get_ylabel() == "权重"]
    assert len(heads) == 6 and len(hidden) == 2 and len(colorbars) == 1
    with pytest.raises(ValueError, match="key_labels has 2 labels for 3 positions"):
        tc.viz.plot_attention_heads(torch.rand(2, 3, 3), key_labels=["a", "b"])
    plt.close("all")


def _texts(fig):
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def test_book_style_heatmaps_readable():
    """At the book's style: fonts >= MIN_FONT_PT, figures no wider than the text column, one
    colorbar per heatmap figure, tick labels that do not overlap (long label lists are thinned)."""
    labels = [f"tok{i}" for i in range(32)]
    with plt.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on stderr fails the book build
        tc.viz.use_book_style()
        figures = [
            tc.viz.plot_attention(torch.rand(32, 32), labels, labels, title="t").figure,
            tc.viz.plot_attention(torch.rand(4, 4), list("abcd"), ["wo", "ai", "Beijing", "Tiananmen"]).figure,
            tc.viz.plot_attention_heads(torch.rand(4, 32, 32).softmax(-1), labels, labels),
            tc.viz.plot_attention_heads(torch.rand(8, 6, 6).softmax(-1), list("abcdef"), list("abcdef"), ncols=4),
        ]
        for fig in figures:
            fig.tight_layout()  # as chapters do: no "layout has changed" or "not compatible" warning
            fig.canvas.draw()
            assert fig.get_figwidth() <= tc.viz.MAX_WIDTH_IN
            small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < tc.viz.MIN_FONT_PT]
            assert not small, small
            assert sum(ax.get_ylabel() == "权重" for ax in fig.axes) == 1  # the colorbar
            for ax in fig.axes:
                for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
                    boxes = [t.get_window_extent() for t in ticks if t.get_visible() and t.get_text()]
                    overlaps = [(a, b) for a, b in itertools.pairwise(boxes) if a.overlaps(b)]
                    assert not overlaps, [t.get_text() for t in ticks]
        # 32 labels do not fit on a heatmap panel: only every k-th one is shown
        shown = [t.get_text() for t in figures[2].axes[0].get_xticklabels()]
        assert 1 < len(shown) < 32 and shown[0] == "tok0"
    plt.close("all")


def test_plot_positional_encoding_and_loss_curves():
    ax = tc.viz.plot_positional_encoding(tc.sinusoidal_table(20, 8))
    assert ax.images[0].get_array().shape == (20, 8)
    ax = tc.viz.plot_loss_curves({"a": [3, 2, 1], "b": [2, 1, 0.5]}, logy=True)
    assert len(ax.lines) == 2 and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="empty"):
        tc.viz.plot_loss_curves({})
    plt.close("all")


def test_set_seed_reproducible():
    tc.set_seed(5)
    a = torch.randn(3)
    tc.set_seed(5)
    assert torch.equal(a, torch.randn(3))
    with pytest.raises(TypeError, match="seed must be an int"):
        tc.set_seed(1.5)


def test_get_device():
    assert tc.get_device() == torch.device("cpu")
    assert tc.get_device("auto").type in {"cpu", "cuda", "mps"}
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        tc.get_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            tc.get_device("cuda")


def test_the_chinese_font_is_the_one_in_the_package():
    from matplotlib import font_manager

    assert tc.viz.cjk_font() == "Course Sans SC"
    assert tc.viz.CJK_FONT_FILE.is_file() and (tc.viz.CJK_FONT_FILE.parent / "OFL.txt").is_file()
    # a system copy of Noto Sans CJK (or any other font) can never stand in for it
    found = font_manager.findfont(font_manager.FontProperties(family="Course Sans SC"), fallback_to_default=False)
    assert pathlib.Path(found).resolve() == tc.viz.CJK_FONT_FILE.resolve()


def test_the_chinese_font_covers_gb2312_and_the_figure_symbols():
    from matplotlib.ft2font import FT2Font

    font = FT2Font(str(tc.viz.CJK_FONT_FILE))
    hanzi = []
    for row in range(0xB0, 0xF8):
        for cell in range(0xA1, 0xFF):
            try:
                hanzi.append(bytes([row, cell]).decode("gb2312"))
            except UnicodeDecodeError:
                continue
    assert len(hanzi) == 6763
    symbols = "，。、：；！？（）【】《》“”‘’…—×→←↑↓≈≤≥√∑∞★✓·"
    missing = [ch for ch in hanzi + list(symbols) if not font.get_char_index(ord(ch))]
    assert not missing, f"missing from the package's font: {''.join(missing[:20])}"


def test_use_book_style_draws_chinese_with_the_cjk_font():
    with plt.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would fail the book build
        tc.viz.use_book_style()
        assert plt.rcParams["svg.fonttype"] == "path" and plt.rcParams["savefig.dpi"] >= 200
        assert plt.rcParams["font.family"] == ["DejaVu Sans", "Course Sans SC"]
        ax = tc.viz.plot_attention(torch.rand(2, 4), ["<bos>", "I"], ["我", "爱", "北京", "天安门"], title="注意力")
        ax.figure.canvas.draw()
        # three Chinese characters are three em wide (a missing glyph would be a narrower box)
        text = ax.figure.text(0, 0, "天安门", fontsize=10)
        ax.figure.canvas.draw()
        em = 10 * ax.figure.dpi / 72
        assert 2.9 * em < text.get_window_extent().width < 3.1 * em
    plt.close("all")
