"""The Chinese corpus ``tc.load_text_corpus("zh")`` is the book's own prose, derived from book/ by
scripts/make_zh_corpus.py: the committed file must be exactly what the script gives for the current
pages (after editing a page, run ``make zh-corpus``)."""

import sys
from pathlib import Path

import pytest

import transformer_course as tc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zh_corpus  # noqa: E402

PAGE = """---
jupytext:
  text_representation: {extension: .md}
---

# 第 9 章 示例

(ch09-intro)=
## 9.1 导读

本章讲**注意力**，见{ref}`第 1 章 <ch01-intro>`与{numref}`图 %s <fig-x>`和{eq}`eq-1`。
公式 $a^2$ 与代码 `tc.MiniGPT` 都不算正文，链接 [文档](https://example.org) 只留文字。

$$
x = y
$$ (eq-1)

```{code-cell} ipython3
print("代码单元格里的中文不算")
```

| 表头 | 表格 |
|---|---|

- 列表第一项
- 列表第二项

% optional-start

:::{admonition} 选读：缓存
:class: dropdown
框里的中文算。

```{code-cell} ipython3
x = "框里代码的中文不算"
```
:::

```{exercise-start} ★★ 写出掩码
:label: ch09-ex
```

练习的说明。

```{exercise-end}
```

English only paragraph is dropped.
"""


def test_page_paragraphs_keeps_prose_and_drops_code_math_and_markup():
    assert make_zh_corpus.page_paragraphs(PAGE) == [
        "第 9 章示例",
        "9.1 导读",
        "本章讲注意力，见第 1 章与图和。公式与代码都不算正文，链接文档只留文字。",
        "列表第一项",
        "列表第二项",
        "选读：缓存",
        "框里的中文算。",
        "写出掩码",
        "练习的说明。",
    ]


def test_committed_corpus_is_what_the_script_derives_from_book():
    derived = make_zh_corpus.build_corpus(ROOT / "book")
    assert tc.load_text_corpus("zh") == derived, "zh_book.txt is out of date: run `make zh-corpus`"


def test_zh_corpus_splits_into_paragraphs_like_the_english_one():
    text = tc.load_text_corpus("zh")
    assert len(text) > 50_000
    assert "\n\n\n" not in text and text.endswith("\n") and not text.endswith("\n\n")
    train, val = tc.split_paragraphs(text)
    assert train + "\n" + val == text
    paragraphs = text.split("\n\n")
    assert all(make_zh_corpus.HAN.search(p) for p in paragraphs)
    assert not any(mark in text for mark in ("```", "$", "{ref}", "`", "|"))


def test_load_text_corpus_default_is_english_and_names_are_checked():
    assert tc.load_text_corpus() == tc.load_text_corpus("en") == tc.generate_text_corpus()
    with pytest.raises(ValueError, match="'fr'"):
        tc.load_text_corpus("fr")
