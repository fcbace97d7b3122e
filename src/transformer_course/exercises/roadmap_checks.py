"""Checkers for chapter 5's own material (the roadmap chapter): the bug hunt graded by
its symptom, and the Witten-Bell smoothed character n-gram that the chapter's GPT is
compared with."""

from __future__ import annotations

import contextlib
import io
import math
from collections import Counter, defaultdict

import torch

from ..data import char_ngram_loss
from ..masks import causal_mask
from ._protocol import checker, fail, name_of, run_learner, seeded_generator
from ._report import (
    TORCH_LETTERS,
    as_tensor,
    filled,
    first_reproduced,
    where_differs,
)
from .attention import (
    ATTENTION_CRASHES,
    INVERTED_MASK_NAN,
    check_self_attention,
    nan_from_inverted_mask,
)

__all__ = ["check_leak_fixed", "check_witten_bell"]


@checker("找 bug：未来不再泄露")
def check_leak_fixed(fn: object) -> str:
    """Grade the fixed attention of the bug hunt by its symptom first: with a causal
    mask, changing only the last token must leave every earlier position's output
    unchanged. The message names the symptom, never the line (save a mask inverted
    by the "fix", named as :func:`check_self_attention` names it); once the symptom
    is gone the full :func:`check_self_attention` grades the function (its ``✓`` line
    is not echoed, its messages are)."""
    name = name_of(fn)
    g = seeded_generator(51)
    L = 6
    x = torch.randn(2, L, 8, generator=g)
    changed = x.clone()
    changed[:, -1] += torch.randn(2, 8, generator=g)
    outs = []
    for i, X in enumerate((x, changed)):
        out = run_learner(
            fn,
            X,
            X,
            X,
            causal_mask(L),
            what=name,
            case="因果掩码",
            first=i == 0,
            causes=filled(ATTENTION_CRASHES, TORCH_LETTERS),
        )
        out = out[0] if isinstance(out, tuple | list) else out
        outs.append(as_tensor(out, f"{name} 的输出", "因果掩码"))
    before, after = outs[0][:, : L - 1], outs[1][:, : L - 1]
    if any(nan_from_inverted_mask(o, causal_mask(L)) for o in outs):
        fail(f"{name} 的输出里有 NaN 或 inf（因果掩码）：{INVERTED_MASK_NAN}")
    if not all(bool(torch.isfinite(o).all()) for o in outs):
        fail(
            f"{name} 的输出里有 NaN 或 inf（因果掩码）：有一组做 softmax 的分数"
            "全是 -inf（全被屏蔽）。每个查询那一行至少能看见它自己，"
            "所以逐步检查 softmax 是沿哪些分数做的。"
        )
    if before.shape != after.shape or not torch.allclose(before, after, atol=1e-6):
        fail(
            f"症状还在：只改最后一个词元，前 {L - 1} 个位置的输出也变了"
            f"（{where_differs(after, before)}）。"
            "位置 i 的输出只能由位置 ≤ i 的词元决定："
            "逐行看第 0 行的权重是怎样算出来的，哪一步用到了后面的位置。"
        )
    with contextlib.redirect_stdout(io.StringIO()):
        check_self_attention(fn)
    return "改最后一个词元不再影响前面的位置，且通过了缩放点积注意力的全部检查"


# what a crash in the learner's interpolation most likely means
WITTEN_BELL_CRASHES = [
    (
        r"ZeroDivisionError",
        "某段历史在训练文本里没出现过时 count(h) + u(h) = 0：遇到没见过的历史就停下，"
        "用已经算到的较短历史的概率（更长的历史也不会见过）。",
    ),
    (
        r"KeyError",
        "counts[k] 里没有这段历史：用 counts[k].get(h) 取，取不到就停下。",
    ),
]


def _interpolate(
    counts: list[dict[str, Counter]],
    history: str,
    c: str,
    vocab_size: int,
    mistake: str,
) -> float:
    """``P(c | history)`` as a learner with ``mistake`` computes it (the right recursion
    is :func:`~transformer_course.char_ngram_loss`'s)."""
    p = 1.0 / vocab_size
    top = min(len(counts), len(history) + 1) - (mistake == "skip_highest")
    for k in range(mistake == "skip_unigram", top):
        h = {"first_k": history[:k], "minus_k": history[-k:]}.get(
            mistake, history[len(history) - k :]
        )
        after = counts[k].get(h)
        if not after:
            break
        seen = sum(after.values())
        u = {"u_total": seen, "u_one": 1, "u_vocab": vocab_size}.get(
            mistake, len(after)
        )
        shorter = 1.0 / vocab_size if mistake == "uniform_escape" else p
        escape = 0.0 if mistake == "no_escape_numerator" else u * shorter
        total = {"u_twice": u + u, "no_u_denominator": seen}.get(mistake, seen + u)
        p = (after[c] + escape) / total
    return p


# (hint, mistake of _interpolate) for probabilities that do not sum to 1
_NOT_A_DISTRIBUTION_HINTS = [
    (
        "分母写成了 u(h) + u(h)：分母是 count(h) + u(h)，count(h) 是 h 出现的总次数 "
        "sum(counts[k][h].values())，u(h) 是 h 之后不同字符的个数 len(counts[k][h])。",
        "u_twice",
    ),
    (
        "分母里少了 u(h)：每一阶是 (count(h c) + u(h)·p_短) / (count(h) + u(h))，"
        "分子多了 u(h)·p_短，分母就要多 u(h)，和才是 1。",
        "no_u_denominator",
    ),
]

# an unseen character got 0 from the formula without u(h)·p_短 in the numerator (at
# order 0 alone the same as starting from p = 0 instead of 1/vocab_size)
_UNSEEN_ZERO_HINT = (
    "没见过的字符的 count(h c) 是 0，它的概率全靠分子里的 u(h)·p_短：分子里少了 "
    "u(h)·p_短（短一阶的概率），或者插值的起点 p 写成了 0，不是词表上的均匀分布 "
    "1/vocab_size。每一阶是 (count(h c) + u(h)·p_短) / (count(h) + u(h))，"
    "k = 0 那一阶的 p_短 = 1/vocab_size。"
)


# (hint, mistake of _interpolate) for a distribution with the wrong held-out loss
_WITTEN_BELL_HINTS = [
    (
        "k 阶的历史 h_k 是紧挨着 c 的最近 k 个字符 history[len(history) - k:]"
        "（k = 0 时是空串），你取的是最前面的 k 个 history[:k]。",
        "first_k",
    ),
    (
        "k = 0 这一阶查的不是空历史：history[-k:] 在 k = 0 时是 history[-0:]"
        " = history[0:]，即整段历史，于是 counts[0] 里找不到它，插值在 k = 0 就停下了。"
        "最近 k 个字符要写成 history[len(history) - k:]，k = 0 时才是空串。",
        "minus_k",
    ),
    (
        "u(h) 是 h 之后出现过的不同字符的个数 len(counts[k][h])，不是次数之和 "
        "sum(counts[k][h].values())。",
        "u_total",
    ),
    (
        "u(h) 写成了 1（加一平滑）：u(h) 是 h 之后出现过的不同字符的个数 "
        "len(counts[k][h])。",
        "u_one",
    ),
    (
        "每一阶都退回到均匀分布 1/vocab_size：p_短 应是上一阶（短一个字符的历史）"
        "算出的概率，插值从 k = 0 一阶一阶往长历史走。",
        "uniform_escape",
    ),
    (
        "u(h) 写成了词表大小 vocab_size：u(h) 是 h 之后出现过的不同字符的个数 "
        "len(counts[k][h])，随历史而变。",
        "u_vocab",
    ),
    (
        "跳过了 k = 0 这一阶（空历史，counts[0][''] 的一元频率）：插值从均匀分布出发，"
        "先到 k = 0，再到 k = 1, 2, …，range 从 0 开始。",
        "skip_unigram",
    ),
    (
        "少了最高的一阶：k 要一直走到 min(n − 1, len(history))（含；n = len(counts)），"
        "range 的上界是 min(len(counts), len(history) + 1)。写成 "
        "range(min(len(counts) − 1, len(history))) 就停在了最长历史的前一阶，"
        "最长的历史没用上。",
        "skip_highest",
    ),
]


def _backoff(
    counts: list[dict[str, Counter]],
    history: str,
    c: str,
    vocab_size: int,
    relative: bool = False,
) -> float:
    """Back-off instead of interpolation: the longest history after which ``c`` was
    seen alone decides, ``count(h c) / (count(h) + u(h))`` (``relative``: the relative
    frequency ``count(h c) / count(h)``); else ``1/vocab_size``."""
    for k in range(min(len(counts), len(history) + 1) - 1, -1, -1):
        after = counts[k].get(history[len(history) - k :])
        if after and after[c] > 0:
            return after[c] / (sum(after.values()) + (0 if relative else len(after)))
    return 1.0 / vocab_size


_BACKOFF_HINT = (
    "这是回退（back-off），不是插值：只用见过 c 的最长那一阶的 "
    "count(h c) / (count(h) + u(h))，留给没见过的字符的 u(h)/(count(h) + u(h)) "
    "就丢掉了。插值要从 k = 0 一阶一阶往长历史走，每一阶都用上一阶的结果："
    "p = (count(h c) + u(h)·p_短) / (count(h) + u(h))。"
)


def _text(g: torch.Generator, alphabet: str, length: int) -> str:
    """A text with local structure: each character mostly follows its predecessor's
    favourite, sometimes a random one."""
    favourite = torch.randperm(len(alphabet), generator=g)
    ids = [0]
    for r, u in zip(
        torch.rand(length - 1, generator=g).tolist(),
        torch.randint(0, len(alphabet), (length - 1,), generator=g).tolist(),
        strict=True,
    ):
        ids.append(int(favourite[ids[-1]]) if r < 0.7 else u)
    return "".join(alphabet[i] for i in ids)


def _counts(text: str, n: int) -> list[dict[str, Counter]]:
    """``counts[k][h][c]``: how often ``c`` follows the length-``k`` history ``h``."""
    counts: list[dict[str, Counter]] = [defaultdict(Counter) for _ in range(n)]
    for i, c in enumerate(text):
        for k in range(min(n, i + 1)):
            counts[k][text[i - k : i]][c] += 1
    return [dict(level) for level in counts]  # a history not seen is not a key


def _not_a_distribution_hint(
    probs: list[float], counts: list[dict[str, Counter]], h: str, vocab: str
) -> str:
    """Why the probabilities ``probs`` of every character of ``vocab`` after ``h`` do
    not sum to 1: back-off, a typical mistake in one order's formula, or the
    formula."""
    got = torch.tensor(probs, dtype=torch.float64)
    for relative in (False, True):
        backoff = [_backoff(counts, h, c, len(vocab), relative) for c in vocab]
        if torch.allclose(got, torch.tensor(backoff, dtype=torch.float64), 1e-9, 0.0):
            return _BACKOFF_HINT
    return first_reproduced(
        got,
        _NOT_A_DISTRIBUTION_HINTS,
        lambda m: torch.tensor(
            [_interpolate(counts, h, c, len(vocab), m) for c in vocab],
            dtype=torch.float64,
        ),
        rtol=1e-9,
        atol=0.0,
    ) or (
        "每一阶都是 (count(h c) + u(h)·p_短) / (count(h) + u(h))："
        "分子里要加 u(h)·p_短（短一阶的概率），分母里要有 u(h)，"
        "这样每一阶都仍是分布。"
    )


@checker("Witten–Bell 插值")
def check_witten_bell(fn: object) -> str:
    """Grade ``fn(counts, history, c, vocab_size) -> float``: ``P(c | history)`` with
    Witten-Bell interpolation from the uniform distribution over ``vocab_size``
    characters up to the longest history of ``counts`` (``counts[k]`` maps each seen
    length-``k`` history to a ``Counter`` of the characters after it). It must be a
    distribution after every history (seen, partly seen or unseen) and reproduce
    :func:`~transformer_course.char_ngram_loss` on a held-out text."""
    name = name_of(fn)
    g = seeded_generator(50)
    alphabet, unseen = "abcdef ", "z"  # "z" is in the vocabulary, never in the text
    vocab = alphabet + unseen
    text = _text(g, alphabet, 800)  # one source: the held-out part follows the same
    train, held_out = text[:600], text[600:]  # favourites as the training part
    first = True
    for n in (1, 3):
        counts = _counts(train, n)
        # empty, seen, unseen, and seen at order 1 but not at order 2
        histories = [""] if n == 1 else ["", held_out[:2], unseen * 2, unseen + "a"]
        for h in histories:
            case = f"{n} 元，历史 {h!r}"
            probs = []
            for c in vocab:
                p = run_learner(
                    fn,
                    counts,
                    h,
                    c,
                    len(vocab),
                    what=name,
                    case=f"{case}，字符 {c!r}",
                    first=first,
                    causes=WITTEN_BELL_CRASHES,
                )
                first = False
                try:
                    p = float(p)
                except (TypeError, ValueError):
                    fail(f"{name} 应返回一个概率（float），得到 {type(p).__name__}。")
                probs.append(p)
            if probs[-1] <= 0:
                no_escape = [
                    _interpolate(counts, h, c, len(vocab), "no_escape_numerator")
                    for c in vocab
                ]
                fail(
                    f"{name} 给从没出现过的字符 {unseen!r} 的概率是 {probs[-1]:.3g}"
                    f"（{case}）："
                    + (
                        _UNSEEN_ZERO_HINT
                        if probs == no_escape
                        else "插值要从词表上的均匀分布 1/vocab_size 开始，"
                        "再一阶一阶往长历史走，没见过的字符才不会是 0。"
                    )
                )
            total = math.fsum(probs)
            if abs(total - 1) > 1e-9:
                fail(
                    f"{name} 在历史 {h!r} 之后给出的概率之和是 {total:.6f}，不是 1"
                    f"（{case}）：" + _not_a_distribution_hint(probs, counts, h, vocab)
                )
    n = 3
    counts = _counts(train, n)
    steps = [
        (counts, held_out[max(0, i - n + 1) : i], held_out[i], len(vocab))
        for i in range(1, len(held_out))
    ]
    mine = [
        float(
            run_learner(
                fn, *step, what=name, case="留出文本", causes=WITTEN_BELL_CRASHES
            )
        )
        for step in steps
    ]
    loss = -math.fsum(map(math.log, mine)) / len(steps)
    ref = char_ngram_loss(train, held_out, n, len(vocab))
    if abs(loss - ref) > 1e-9 * max(1.0, ref):
        hint = first_reproduced(
            torch.tensor(mine, dtype=torch.float64),
            _WITTEN_BELL_HINTS,
            lambda m: torch.tensor(
                [_interpolate(*step, m) for step in steps], dtype=torch.float64
            ),
            rtol=1e-9,
            atol=0.0,
        ) or (
            "逐阶对照 (count(h c) + u(h)·p_短) / (count(h) + u(h))：u(h) 是 h 之后"
            "出现过的不同字符的个数，h_k 是最近的 k 个字符，插值从 k = 0 往长历史走，"
            "每一阶的 p_短 是上一阶的结果。"
        )
        fail(
            f"{name} 给出的是一个分布，但留出文本上的交叉熵是 {loss:.6f} nats/字符，"
            f"应为 {ref:.6f}。{hint}"
        )
    return "四种历史之后都是分布，留出文本上的交叉熵与 tc.char_ngram_loss 相同"
