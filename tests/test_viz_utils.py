import matplotlib.pyplot as plt
import pytest
import torch

import transformer_course as tc


def test_plot_attention_labels_and_errors():
    ax = tc.plot_attention(torch.rand(3, 4), ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert ax.get_title() == "t"
    with pytest.raises(ValueError, match="3 labels for 4 positions"):
        tc.plot_attention(torch.rand(3, 4), key_labels=["a", "b", "c"])
    with pytest.raises(ValueError, match="2-D"):
        tc.plot_attention(torch.rand(2, 3, 4))
    plt.close("all")


def test_plot_attention_heads_grid():
    fig = tc.plot_attention_heads(torch.rand(6, 3, 3), ncols=4)
    visible = [ax for ax in fig.axes if ax.axison]
    assert len(fig.axes) == 8 and len(visible) == 6
    plt.close("all")


def test_plot_positional_encoding_and_loss_curves():
    ax = tc.plot_positional_encoding(tc.sinusoidal_table(20, 8))
    assert ax.images[0].get_array().shape == (20, 8)
    ax = tc.plot_loss_curves({"a": [3, 2, 1], "b": [2, 1, 0.5]}, logy=True)
    assert len(ax.lines) == 2 and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="empty"):
        tc.plot_loss_curves({})
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
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    with_glyph = {f.name for f in font_manager.fontManager.ttflist if FT2Font(f.fname).get_char_index(ord("爱"))}
    name = tc.viz.cjk_font()
    assert (name in with_glyph) if with_glyph else name is None
