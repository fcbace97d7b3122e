/* Search result snippets of the course book (listed in _config.yml: html_js_files).
 *
 * Sphinx's search page fetches every result page and shows 240 characters of its text. By
 * default that text is everything in the theme's [role="main"] element, which starts with the
 * page's table of contents (so the snippet is usually the TOC), and it contains the TeX source
 * of every formula ("\(\frac{QK^\top}{\sqrt{d_k}}\)"), because the fetched page has not been
 * typeset. Here the text is the article only (or the section of the result's anchor), formulas
 * become short plain text ("QK⊤/√d_k") and display formulas are left out, and the snippet is the
 * sentence that contains the search term.
 */
(() => {
  "use strict";

  const SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", zeta: "ζ",
    eta: "η", theta: "θ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π", rho: "ρ", sigma: "σ",
    tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω", Gamma: "Γ", Delta: "Δ",
    Theta: "Θ", Lambda: "Λ", Pi: "Π", Sigma: "Σ", Phi: "Φ", Omega: "Ω",
    top: "⊤", cdot: "·", times: "×", le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠",
    approx: "≈", sim: "~", to: "→", rightarrow: "→", leftarrow: "←", in: "∈", sum: "Σ",
    prod: "Π", infty: "∞", partial: "∂", nabla: "∇", sqrt: "√", log: "log", exp: "exp",
    max: "max", min: "min", softmax: "softmax", ldots: "…", cdots: "⋯", dots: "…",
    odot: "⊙", otimes: "⊗", oplus: "⊕", mid: "|", propto: "∝", circ: "∘", ell: "ℓ",
  };

  /* TeX source -> short readable text (not typesetting: enough for a one-line snippet). */
  const texToText = (tex) => {
    let s = tex.replace(/^\s*(\\\(|\\\[|\$\$?)/, "").replace(/(\\\)|\\\]|\$\$?)\s*$/, "");
    for (let i = 0; i < 5; i++) {
      s = s.replace(/\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)");
      s = s.replace(/\\sqrt\s*\{([^{}]*)\}/g, "√($1)");
      s = s.replace(/\\(?:text|mathrm|mathbf|mathit|mathsf|mathtt|mathcal|mathbb|operatorname|boldsymbol)\s*\{([^{}]*)\}/g, "$1");
    }
    s = s.replace(/\\([A-Za-z]+)/g, (m, name) => (name in SYMBOLS ? SYMBOLS[name] : ""));
    s = s.replace(/\\[,;:!> ]/g, " ").replace(/\\([{}%$&#_])/g, "$1");
    s = s.replace(/\((\w)\)/g, "$1").replace(/[{}]/g, "").replace(/&/g, " ");
    return s.replace(/\s+/g, " ").trim();
  };

  const htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    const article = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (!article) return "";
    const drop = [".headerlink", "script", "style", "div.math", ".page-runtime", ".toggle-hidden",
                  "nav", ".cell_input", "button"];
    article.querySelectorAll(drop.join(",")).forEach((el) => el.remove());
    article.querySelectorAll(".math").forEach((el) => el.replaceWith(texToText(el.textContent)));
    let root = article;
    if (anchor) {
      try {
        root = article.querySelector(anchor) || article;
      } catch (e) {  // an anchor that is not a valid selector
        root = article;
      }
    }
    // block elements end a sentence even without punctuation
    root.querySelectorAll("p, li, h1, h2, h3, h4, h5, h6, td, th, dt, dd, pre").forEach(
      (el) => el.append("\n"));
    return root.textContent;
  };

  /* The sentence that holds the first search term, at most about 200 characters. */
  const makeSearchSummary = (htmlText, keywords, anchor) => {
    const text = htmlToText(htmlText, anchor).replace(/[ \t\r]+/g, " ").replace(/\n\s*/g, "\n").trim();
    if (!text) return null;
    const lower = text.toLowerCase();
    const hits = [...keywords].map((k) => lower.indexOf(k.toLowerCase())).filter((i) => i > -1);
    const at = hits.length ? Math.min(...hits) : 0;
    const ends = /[。！？!?\n]|\.\s/g;
    let start = 0;
    for (let m; (m = ends.exec(text)) !== null && m.index < at; ) start = m.index + m[0].length;
    ends.lastIndex = at;
    const next = ends.exec(text);
    let end = next ? next.index + next[0].length : text.length;
    if (at - start > 120) start = at - 60;
    if (end - start > 200) end = start + 200;
    const sentence = text.slice(start, end).replace(/\n/g, " ").trim();
    const summary = document.createElement("p");
    summary.classList.add("context");
    summary.textContent = (start > 0 && !/[。！？!?\n]/.test(text[start - 1]) ? "…" : "") + sentence +
      (end < text.length && !/[。！？!?\n]\s*$/.test(text.slice(start, end)) ? "…" : "");
    return summary;
  };

  const install = () => {
    if (typeof Search === "undefined") return;  // not the search page
    Search.htmlToText = htmlToText;
    Search.makeSearchSummary = makeSearchSummary;
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", install);
  else install();
})();
