import itertools
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
    heads = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    hidden = [ax for ax in fig.axes if not ax.axison]
    colorbars = [ax for ax in fig.axes if ax.get_ylabel() == "weight"]
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
            assert sum(ax.get_ylabel() == "weight" for ax in fig.axes) == 1  # the colorbar
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


def test_cjk_font_agrees_with_the_glyph_tables():
    import matplotlib
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    bundled = matplotlib.get_data_path()
    fonts = font_manager.fontManager.ttflist
    with_glyph = {f.name for f in fonts if FT2Font(f.fname).get_char_index(ord("爱")) and bundled not in f.fname}
    name = tc.viz.cjk_font()
    assert (name in with_glyph) if with_glyph else name is None
    # matplotlib's "Last Resort" font maps every character to a placeholder box: never chosen
    assert tc.viz.find_cjk_font([f for f in fonts if bundled in f.fname]) is None


def test_use_book_style_draws_chinese_with_the_cjk_font():
    with plt.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would fail the book build
        tc.viz.use_book_style()
        assert plt.rcParams["svg.fonttype"] == "path" and plt.rcParams["savefig.dpi"] >= 200
        if tc.viz.cjk_font() is None:
            assert plt.rcParams["font.family"] == ["sans-serif"]
            return
        assert plt.rcParams["font.family"] == ["sans-serif", tc.viz.cjk_font()]
        ax = tc.viz.plot_attention(torch.rand(2, 4), ["<bos>", "I"], ["我", "爱", "北京", "天安门"], title="x")
        ax.figure.canvas.draw()
    plt.close("all")
