"""tc.explorer: the attention explorer's Python side (the browser test of its view is
tests/browser/test_explorer.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import transformer_course as tc
from transformer_course.explorer import DIGITS, AttentionExplorer, attention_explorer


def _weights(*shape):
    return torch.softmax(torch.randn(*shape), dim=-1)


def _payload(html: str) -> dict:
    match = re.search(r'<script type="application/json" class="tcx-data">(.*?)</script>', html, re.S)
    assert match, "no inlined data"
    return json.loads(match.group(1).replace("<\\/", "</"))


def test_reachable_as_tc_explorer():
    assert tc.explorer.attention_explorer is attention_explorer


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((2, 3, 4, 5), (2, 3, 4, 5)), ((3, 4, 5), (1, 3, 4, 5)), ((4, 5), (1, 1, 4, 5))],
)
def test_shapes(shape, expected):
    view = attention_explorer(_weights(*shape), list("abcd"), list("vwxyz"))
    assert view.shape == expected


def test_nested_lists_and_self_attention_default():
    weights = [[[[0.25, 0.75], [1.0, 0.0]]]]
    view = attention_explorer(weights, ["我", "爱"])
    assert view.key_tokens == ["我", "爱"]
    assert view.data()["weights"] == weights


@pytest.mark.parametrize(
    ("weights", "queries", "keys", "message"),
    [
        (_weights(1, 1, 1, 2, 3), list("ab"), list("xyz"), "layers, heads"),
        (_weights(1, 1, 2, 3), list("abc"), list("xyz"), "query_tokens"),
        (_weights(1, 1, 2, 3), list("ab"), list("xy"), "key_tokens"),
        (torch.full((1, 1, 2, 2), -0.5), list("ab"), None, ">= 0"),
        (torch.full((1, 1, 2, 2), float("nan")), list("ab"), None, "finite"),
        (torch.zeros(1, 0, 2, 2), list("ab"), None, "empty"),
    ],
)
def test_rejects_bad_input(weights, queries, keys, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_explorer(weights, queries, keys)


def test_html_is_self_contained_and_unique():
    weights = _weights(2, 3, 4, 5)
    first = attention_explorer(weights, list("abcd"), list("vwxyz"), title="<b>标题</b>")
    second = attention_explorer(weights, list("abcd"), list("vwxyz"))
    html = first._repr_html_()
    assert first.id != second.id and first.id not in second._repr_html_()
    # every id and style of the view is scoped to its own id
    assert html.count(f'id="{first.id}"') == 1
    assert f'document.getElementById("{first.id}")' in html
    assert "#ID" not in html and f"#{first.id} " in html
    # nothing is fetched: no URL, no external script or stylesheet
    assert not re.search(r"https?://|src=|<link", html)
    # the title is text, not markup
    assert "&lt;b&gt;标题&lt;/b&gt;" in html
    data = _payload(html)
    assert data["queries"] == list("abcd") and data["keys"] == list("vwxyz")
    expected = torch.round(weights.double(), decimals=DIGITS)
    assert torch.allclose(torch.tensor(data["weights"], dtype=torch.float64), expected, atol=1e-12)
    # the last layer and the first head are selected at first
    assert '<option value="1" selected>' in html and '<option value="0" selected>' in html


def test_tokens_cannot_end_the_script():
    view = attention_explorer(_weights(1, 1, 2, 2), ["</script><script>alert(1)", "x"])
    html = view._repr_html_()
    assert "</script><script>alert(1)" not in html
    assert _payload(html)["queries"][0] == "</script><script>alert(1)"


def test_png_and_text():
    view = attention_explorer(_weights(2, 2, 3, 3), ["我", "爱", "你"], title="注意力")
    png = view._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert repr(view) == "AttentionExplorer '注意力': 2 layer(s) x 2 head(s), 3 query x 3 key tokens"
    fig = view.figure(layer=0)
    assert len([ax for ax in fig.axes if ax.images]) == 2  # one heatmap per head


def test_mime_bundle_has_html_png_and_text():
    from IPython.core.formatters import DisplayFormatter

    bundle, _ = DisplayFormatter().format(AttentionExplorer(_weights(1, 2, 2, 2), list("ab")))
    assert {"text/html", "image/png", "text/plain"} <= set(bundle)
