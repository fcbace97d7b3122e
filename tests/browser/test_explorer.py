"""The attention explorer (tc.explorer) in the browser: a small page with two views (their ids
must not clash) opened in headless Chromium from a local server. Choosing another head, layer or
query token changes what is drawn; nothing is fetched from outside; no script error.

Does not need the built book (run with the other browser tests: ``make browser``).
"""

from __future__ import annotations

import torch
from bookbrowser import SETTLE_JS, open_page, serve

from transformer_course.explorer import attention_explorer

# What the first view draws now: the key cells' colours and values, the framed heatmap row.
DRAWN_JS = """
(id) => {
  const root = document.getElementById(id);
  return {
    keys: [...root.querySelectorAll(".tcx-keys .tcx-key")].map((k) =>
      k.querySelector(".tcx-cell").style.background + " " + k.querySelector(".tcx-val").textContent),
    grid: [...root.querySelectorAll(".tcx-grid div")].map((c) => c.style.background + c.className),
    selected: [...root.querySelectorAll(".tcx-queries button")].findIndex((b) => b.classList.contains("tcx-on")),
    note: root.querySelector(".tcx-note").textContent,
  };
}
"""


def test_choosing_head_layer_or_query_changes_the_view(browser, tmp_path):
    generator = torch.Generator().manual_seed(0)
    weights = torch.softmax(3 * torch.randn(2, 3, 4, 5, generator=generator), dim=-1)
    source, target = ["我", "爱", "北京", "。"], ["I", "love", "Bei", "jing", "."]
    first = attention_explorer(weights, source, target, title="交叉注意力")
    second = attention_explorer(weights[:1], source, target)
    page_html = f"<!doctype html><html><head><meta charset='utf-8'></head><body>{first._repr_html_()}"
    page_html += f"{second._repr_html_()}</body></html>"
    (tmp_path / "explorer.html").write_text(page_html, encoding="utf-8")
    context = browser.new_context(viewport={"width": 900, "height": 700})
    try:
        with serve(tmp_path) as server:
            page, traffic = open_page(context, server)
            page.goto(server + "explorer.html", wait_until="load")
            page.evaluate(SETTLE_JS)
            root = page.locator(f"#{first.id}")
            start = page.evaluate(DRAWN_JS, first.id)
            assert start["selected"] == 0 and len(start["keys"]) == 5 and len(start["grid"]) == 20
            assert "层 1，头 0" in start["note"]

            root.locator("select.tcx-head").select_option("2")
            head = page.evaluate(DRAWN_JS, first.id)
            assert head["keys"] != start["keys"] and head["grid"] != start["grid"]
            assert "头 2" in head["note"]

            root.locator(".tcx-queries button").nth(2).click()
            query = page.evaluate(DRAWN_JS, first.id)
            assert query["selected"] == 2 and query["keys"] != head["keys"]
            assert "北京" in query["note"]

            root.locator("select.tcx-layer").select_option("0")
            layer = page.evaluate(DRAWN_JS, first.id)
            assert layer["keys"] != query["keys"] and "层 0" in layer["note"]

            # a click on a heatmap cell selects that row's query
            root.locator(".tcx-grid div").nth(3 * 5 + 1).click()
            assert page.evaluate(DRAWN_JS, first.id)["selected"] == 3

            # the second view is independent of the first
            assert page.evaluate(DRAWN_JS, second.id)["selected"] == 0
            page.screenshot(path=str(tmp_path / "explorer.png"))
            assert not traffic.problems(), traffic.problems()
    finally:
        context.close()
