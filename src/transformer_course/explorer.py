"""An interactive view of attention weights: pick a layer, a head and a query token.

    import transformer_course as tc
    tc.explorer.attention_explorer(weights, query_tokens, key_tokens=None, title=None)

``weights`` has the shape ``(layers, heads, L_q, L_k)`` (a tensor, an array or nested
lists; ``(heads, L_q, L_k)`` and ``(L_q, L_k)`` count as one layer / one head). The
returned :class:`AttentionExplorer` displays itself as

* ``text/html``: a self-contained HTML + JavaScript view: no network, no server, no
  library; the weights are inlined as JSON and every element id is unique to the view,
  so a page may hold several. The reader picks a layer and a head, and a query token by
  clicking it (or a row of the heatmap); the view draws that query's weights over the
  key tokens as shaded tokens with their values, and the head's whole matrix as a
  heatmap with the query's row framed. It works in the HTML book (myst-nb inserts
  ``text/html`` outputs as they are) and in JupyterLab (outputs made in the running
  session are trusted, so their script runs).
* ``image/png``: a static figure of every head of one layer
  (``tc.viz.plot_attention_heads``), for the PDF (``_config.yml`` makes the single-page
  build prefer it) and other places without JavaScript;
* ``text/plain``: a one-line summary.
"""

from __future__ import annotations

import html
import io
import json
import uuid
from collections.abc import Sequence

import torch

__all__ = ["AttentionExplorer", "attention_explorer"]

# Digits kept in the inlined JSON (the view shows two decimals).
DIGITS = 4
# More numbers than this make a page heavy (about 7 bytes each): refuse instead.
MAX_VALUES = 400_000


def _as_tensor(weights) -> torch.Tensor:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach()
    w = torch.as_tensor(weights).to(dtype=torch.float64, device="cpu")
    while w.dim() < 4:
        w = w.unsqueeze(0)
    shape = tuple(w.shape)
    if w.dim() != 4:
        raise ValueError(f"weights must be (layers, heads, L_q, L_k), got {shape}")
    if 0 in shape:
        raise ValueError(f"weights must not be empty, got shape {shape}")
    if not torch.isfinite(w).all():
        raise ValueError("weights must be finite (no NaN or inf)")
    if (w < 0).any():
        raise ValueError("weights must be >= 0: pass softmax outputs, not scores")
    if w.numel() > MAX_VALUES:
        raise ValueError(f"{w.numel():,} weights are too many (at most {MAX_VALUES:,})")
    return w


def _tokens(name: str, tokens: Sequence[str], n: int) -> list[str]:
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} tokens, the weights {n} positions")
    return tokens


class AttentionExplorer:
    """Attention weights and their tokens, shown as an interactive view (see module)."""

    def __init__(
        self,
        weights,
        query_tokens: Sequence[str],
        key_tokens: Sequence[str] | None = None,
        title: str | None = None,
    ):
        self.weights = _as_tensor(weights)
        _, _, lq, lk = self.weights.shape
        self.query_tokens = _tokens("query_tokens", query_tokens, lq)
        keys = query_tokens if key_tokens is None else key_tokens
        self.key_tokens = _tokens("key_tokens", keys, lk)
        self.title = title
        self.id = f"tc-explorer-{uuid.uuid4().hex[:12]}"

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return tuple(self.weights.shape)

    def __repr__(self) -> str:
        layers, heads, lq, lk = self.shape
        title = f" {self.title!r}" if self.title else ""
        return (
            f"AttentionExplorer{title}: {layers} layer(s) x {heads} head(s), "
            f"{lq} query x {lk} key tokens"
        )

    # ------------------------------------------------------------- HTML + JavaScript

    def data(self) -> dict:
        """What the view's script reads (as JSON): the weights to :data:`DIGITS`."""
        weights = [
            [[[round(v, DIGITS) for v in row] for row in head] for head in layer]
            for layer in self.weights.tolist()
        ]
        return {
            "weights": weights,
            "queries": self.query_tokens,
            "keys": self.key_tokens,
        }

    def _repr_html_(self) -> str:
        layers, heads, _, _ = self.shape
        payload = json.dumps(self.data(), ensure_ascii=False, separators=(",", ":"))
        # the JSON sits in a <script> element, which "</" would end early
        payload = payload.replace("</", "<\\/")
        title = ""
        if self.title:
            title = f'<div class="tcx-title">{html.escape(self.title)}</div>'
        controls = _select("layer", "层", layers, layers - 1) + _select(
            "head", "头", heads, 0
        )
        return _TEMPLATE.format(
            id=self.id,
            title=title,
            controls=controls,
            payload=payload,
            css=_CSS.replace("ID", self.id),
            js=_JS.replace("ID", self.id),
        )

    # ------------------------------------------------------------- static figure

    def figure(self, layer: int = -1):
        """A matplotlib figure of every head of ``layer`` (default: the last)."""
        from . import viz

        viz.use_book_style()
        layers, heads, _, _ = self.shape
        index = layer % layers
        fig = viz.plot_attention_heads(
            self.weights[index].float(),
            self.query_tokens,
            self.key_tokens,
            ncols=min(4, heads),
        )
        name = self.title or "注意力"
        fig.suptitle(
            f"{name}：第 {index} 层（共 {layers} 层，从 0 数起）"
            if layers > 1
            else name
        )
        fig.tight_layout()
        return fig

    def _repr_png_(self) -> bytes:
        import matplotlib.pyplot as plt

        fig = self.figure()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=150)
        plt.close(fig)
        return buffer.getvalue()


def attention_explorer(
    weights,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
) -> AttentionExplorer:
    """An interactive view of ``weights`` ``(layers, heads, L_q, L_k)`` (see module).

    ``key_tokens`` defaults to ``query_tokens`` (self-attention); for cross-attention
    pass the source tokens. The weights must be finite and >= 0 (softmax outputs).
    """
    return AttentionExplorer(weights, query_tokens, key_tokens, title)


def _select(kind: str, label: str, n: int, selected: int) -> str:
    options = "".join(
        f'<option value="{i}"{" selected" if i == selected else ""}>{i}</option>'
        for i in range(n)
    )
    return (
        f'<label>{label} <select class="tcx-{kind}" aria-label="{label}">'
        f"{options}</select></label>"
    )


# "ID" below is replaced by the view's own id.
_CSS = """
#ID { margin: 0.6em 0; max-width: 100%; overflow-x: auto; }
#ID .tcx-title { font-weight: 600; margin-bottom: 0.3em; }
#ID .tcx-controls { display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center;
  margin-bottom: 0.5em; font-size: 0.92em; }
#ID .tcx-controls select { margin-left: 0.3em; }
#ID .tcx-row { display: flex; flex-wrap: wrap; gap: 3px; margin: 0.2em 0;
  align-items: flex-end; }
#ID .tcx-row .tcx-row { margin: 0; }
#ID .tcx-label { width: 3.2em; font-size: 0.8em; color: #666; align-self: center; }
#ID .tcx-tok, #ID .tcx-cell { border: 1px solid #bbb; border-radius: 3px;
  padding: 0.1em 0.35em; font: inherit; font-size: 0.9em; line-height: 1.4;
  background: #fff; color: #222; }
#ID .tcx-tok { cursor: pointer; }
#ID .tcx-tok.tcx-on { border-color: #c0392b; box-shadow: 0 0 0 2px #c0392b inset; }
#ID .tcx-key { display: flex; flex-direction: column; align-items: center;
  min-width: 2.2em; }
#ID .tcx-val { font-size: 0.72em; color: #555; font-variant-numeric: tabular-nums; }
#ID .tcx-grid { display: grid; gap: 1px; margin-top: 0.6em; width: max-content; }
#ID .tcx-grid div { width: 14px; height: 14px; cursor: pointer; }
#ID .tcx-grid div.tcx-on { outline: 2px solid #c0392b; outline-offset: -1px; }
#ID .tcx-note { font-size: 0.78em; color: #666; margin-top: 0.3em; }
"""

_JS = """
(() => {
  const root = document.getElementById("ID");
  if (!root || root.dataset.ready) return;
  root.dataset.ready = "1";
  const data = JSON.parse(root.querySelector("script.tcx-data").textContent);
  const W = data.weights;
  const $ = (cls) => root.querySelector("." + cls);
  const layerSel = $("tcx-layer"), headSel = $("tcx-head"), grid = $("tcx-grid");
  const queryRow = $("tcx-queries"), keyRow = $("tcx-keys"), note = $("tcx-note");
  let query = 0;
  // white -> dark blue
  const shade = (v) => "rgb(" + [222, 160, 75].map((d) => Math.round(255 - d * v)) +
    ")";
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  data.queries.forEach((tok, i) => {
    const b = el("button", "tcx-tok", tok);
    b.type = "button";
    b.title = "query " + i;
    b.addEventListener("click", () => { query = i; draw(); });
    queryRow.appendChild(b);
  });
  function draw() {
    const m = W[+layerSel.value][+headSel.value];
    const row = m[query];
    const top = Math.max(...row, 1e-9);
    [...queryRow.children].forEach((b, i) => b.classList.toggle("tcx-on", i === query));
    keyRow.replaceChildren(...data.keys.map((tok, j) => {
      const box = el("div", "tcx-key");
      const cell = el("span", "tcx-cell", tok);
      const v = row[j] / top;
      cell.style.background = shade(v);
      cell.style.color = v > 0.55 ? "#fff" : "#222";
      box.title = data.queries[query] + " -> " + tok + ": " + row[j].toFixed(4);
      box.append(cell, el("span", "tcx-val", row[j].toFixed(2)));
      return box;
    }));
    grid.style.gridTemplateColumns = "repeat(" + data.keys.length + ", 14px)";
    const gmax = Math.max(...m.flat(), 1e-9);
    grid.replaceChildren(...m.flatMap((r, i) => r.map((v, j) => {
      const c = el("div", i === query ? "tcx-on" : "");
      c.style.background = shade(v / gmax);
      c.title = data.queries[i] + " -> " + data.keys[j] + ": " + v.toFixed(4);
      c.addEventListener("click", () => { query = i; draw(); });
      return c;
    })));
    const best = row.indexOf(Math.max(...row));
    const sum = row.reduce((a, b) => a + b, 0);
    note.textContent = "层 " + layerSel.value + "，头 " + headSel.value +
      "，查询“" + data.queries[query] + "”：权重之和 " + sum.toFixed(3) +
      "，最大 " + row[best].toFixed(3) + "（“" + data.keys[best] + "”）。" +
      "下方热图是这个头的整个权重矩阵（行 = 查询，列 = 键）。";
  }
  layerSel.addEventListener("change", draw);
  headSel.addEventListener("change", draw);
  draw();
})();
"""

_TEMPLATE = """<div id="{id}" class="tc-explorer">
<style>{css}</style>
{title}<div class="tcx-controls">{controls}<span>点击一个查询词元</span></div>
<div class="tcx-row"><span class="tcx-label">查询</span>
<span class="tcx-row tcx-queries"></span></div>
<div class="tcx-row"><span class="tcx-label">键</span>
<span class="tcx-row tcx-keys"></span></div>
<div class="tcx-grid" role="img" aria-label="attention heatmap"></div>
<div class="tcx-note"></div>
<script type="application/json" class="tcx-data">{payload}</script>
<script>{js}</script>
</div>"""
