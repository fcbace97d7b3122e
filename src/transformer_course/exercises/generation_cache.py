"""Autoregressive generation and the KV cache."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..models import GPTConfig, MiniGPT
from ._protocol import (
    checker,
    fail,
    name_of,
    randn,
    run_learner,
    seeded_generator,
)
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_shape,
    first_reproduced,
    same_code,
)

# generation


class _ToyLM(nn.Module):
    """A small random GPT that returns logits ``(N, L, V)`` and refuses inputs longer
    than its context; it records what it was given. ``row_shift``: row ``r`` of a batch
    gets ``r * row_shift`` added to all its logits (the softmax of each row, hence the
    right draws, do not change; the rows' k-th largest logits then differ)."""

    def __init__(self, vocab_size: int, context_length: int) -> None:
        super().__init__()
        cfg = GPTConfig(
            vocab_size=vocab_size,
            context_length=context_length,
            d_model=16,
            num_heads=2,
            num_layers=1,
            dropout=0.0,
        )
        self.gpt = MiniGPT(cfg).eval()
        # logits of std ~1: no near-ties for argmax, yet sampling is far from greedy
        with torch.no_grad():
            self.gpt.lm_head.weight.normal_(0.0, 0.12)
        self.context_length = context_length
        self.row_shift = 0.0
        self.calls: list[Tensor] = []

    def logits(self, idx: Tensor) -> Tensor:
        with torch.no_grad():
            logits = self.gpt(idx)[0]
        return logits + self.row_shift * torch.arange(len(logits))[:, None, None]

    def forward(self, idx: Tensor) -> Tensor:
        if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point():
            fail(
                f"传给 model 的应是整数 id 张量 (N, L)，得到 "
                f"{tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__}"
                + (f" {idx.dtype}" if isinstance(idx, Tensor) else "")
                + "。"
            )
        if idx.size(1) > self.context_length:
            fail(
                "模型一次最多看 context_length = "
                f"{self.context_length} 个词元，却收到了 "
                f"{idx.size(1)} 个：每一步先裁剪"
                " input_ids[:, -context_length:]，再送进模型。"
            )
        self.calls.append(idx.detach().clone())
        return self.logits(idx)


def _generate_reference(
    model: _ToyLM,
    idx: Tensor,
    steps: int,
    C: int,
    top_k: int | None,
    seed: int | None,
    among_top_k: bool = False,
) -> Tensor:
    """The contract's generation loop; ``seed`` seeds a fresh generator (``None``:
    greedy). ``among_top_k``: sample among ``torch.topk``'s values and map back (the
    accepted other way to write top-k)."""
    generator = None if seed is None else seeded_generator(seed)
    for _ in range(steps):
        logits = model.logits(idx[:, -C:])[:, -1]
        if generator is None:
            nxt = logits.argmax(-1, keepdim=True)
        elif top_k is not None and among_top_k:
            vals, inds = torch.topk(logits, min(top_k, logits.size(-1)))
            probs = torch.softmax(vals, -1)
            nxt = inds.gather(-1, torch.multinomial(probs, 1, generator=generator))
        else:
            if top_k is not None:
                vals, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits = logits.masked_fill(logits < vals[:, -1:], -math.inf)
            probs = torch.softmax(logits, -1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


# mistakes in a top-k draw: a rank among the top k not mapped back (right), or the
# probabilities outside the top k zeroed and put through softmax again
_TOP_K_DRAW_MISTAKES = (
    "topk_positions",
    "row0_indices",
    "sorted_ranks",
    "rank_offset",
    "zeroed_probs_softmax",
)


def _draw_top_k(
    logits: Tensor, top_k: int, generator: torch.Generator, mistake: str
) -> Tensor:
    """One draw ``(N, 1)`` with one of :data:`_TOP_K_DRAW_MISTAKES`."""
    if mistake == "zeroed_probs_softmax":
        probs = torch.softmax(logits, -1)
        kth = torch.topk(probs, min(top_k, probs.size(-1))).values[:, -1:]
        probs = torch.softmax(probs.masked_fill(probs < kth, 0.0), -1)
        return torch.multinomial(probs, 1, generator=generator)
    if mistake == "sorted_ranks":
        # sorted values masked by rank: the rank drawn is kept as the token
        ranked = torch.sort(logits, dim=-1, descending=True).values
        ranked = ranked.masked_fill(torch.arange(ranked.size(-1)) >= top_k, -math.inf)
        return torch.multinomial(torch.softmax(ranked, -1), 1, generator=generator)
    vals, inds = torch.topk(logits, min(top_k, logits.size(-1)))
    pos = torch.multinomial(torch.softmax(vals, -1), 1, generator=generator)
    if mistake == "row0_indices":  # every row mapped back with row 0's indices
        return inds[0, pos[:, 0]][:, None]
    if mistake == "rank_offset":  # the rank added to the best token's id
        return inds[:, :1] + pos
    return pos  # topk_positions: the place in the top-k list kept as the token


def _generate_mistake(
    model: _ToyLM,
    idx: Tensor,
    steps: int,
    C: int,
    top_k: int | None,
    seed: int | None,
    mistake: str,
) -> Tensor:
    """The generation loop with one of :data:`GENERATE_HINTS`' mistakes (kept apart
    from the oracle above)."""
    generator = None if seed is None else seeded_generator(seed)
    crop = {"first": lambda i: i[:, :C], "short": lambda i: i[:, -(C - 1) :]}
    for _ in range(steps):
        ctx = crop.get(mistake, lambda i: i[:, -C:])(idx)
        logits = model.logits(ctx)[:, 0 if mistake == "pos0" else -1]
        if generator is None or mistake == "greedy":
            nxt = logits.argmax(-1, keepdim=True)
        elif mistake in _TOP_K_DRAW_MISTAKES and top_k is not None:
            nxt = _draw_top_k(logits, top_k, generator, mistake)
        else:
            off = {"k_minus_1": -1, "k_plus_1": 1}.get(mistake, 0)
            k = None if top_k is None else top_k + off
            if k is not None and mistake not in ("no_top_k", "logits_no_top_k"):
                k = max(1, min(k, logits.size(-1)))
                if mistake == "k_smallest":  # torch.topk(..., largest=False)
                    vals, _ = torch.topk(logits, k, largest=False)
                    logits = logits.masked_fill(logits > vals[:, -1:], -math.inf)
                else:
                    threshold = torch.topk(logits, k).values[:, -1:]
                    if mistake == "batch_min_threshold":  # one threshold for all rows
                        threshold = threshold.min()
                    logits = logits.masked_fill(logits < threshold, -math.inf)
            if mistake == "fill_zero" and top_k is not None:  # 0 instead of -inf
                logits = logits.nan_to_num(neginf=0.0)
            # softmax_dim0 (learner test 31c): over the batch, the NaN columns zeroed
            probs = torch.softmax(logits, 0 if mistake == "softmax_dim0" else -1)
            probs = probs.nan_to_num(0.0)
            if mistake in ("logits_as_probs", "logits_no_top_k"):  # no softmax,
                probs = logits.clamp(min=0)  # negative logits cut to 0
            if mistake == "double_softmax":
                probs = torch.softmax(probs, -1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


GENERATE_HINTS = [
    ("取了第一个位置的 logits：应取最后一个位置 logits[:, -1, :]。", "pos0"),
    (
        "裁剪保留的是最前面的 context_length 个词元：应保留最后的 "
        "input_ids[:, -context_length:]。",
        "first",
    ),
    (
        "裁剪多了一个：应保留最后 context_length 个词元"
        "（input_ids[:, -context_length:]）。",
        "short",
    ),
    ("给了 generator 时应按概率抽样（torch.multinomial），不是取 argmax。", "greedy"),
    (
        "top-k 只保留了 k − 1 个词元：阈值应是第 k 大的值 v[:, [-1]]，"
        "把小于它的（logits < 阈值）设为 -inf。",
        "k_minus_1",
    ),
    (
        "top-k 多保留了一个（k + 1 个）：阈值应是第 k 大的值，torch.topk(logits, k)。",
        "k_plus_1",
    ),
    (
        "从 torch.topk 的 k 个值里抽样后，直接把抽到的序号（0..k−1）当成了词元编号："
        "要用 topk 返回的下标映射回词表，next_id = idx.gather(-1, pos)；"
        "或把小于第 k 大的值的 logits 设为 -inf，再在整个词表上抽样。",
        "topk_positions",
    ),
    (
        "在排好序的 logits 上抽样：torch.sort(logits, descending=True).values 的第 j 个"
        "是排第 j 的词元的 logit，在它上面抽到的 j 是名次，不是词元编号，与丢掉 topk "
        "的下标是同一个错误。用 sort 返回的下标映射回词表（indices.gather(-1, pos)），"
        "或在原来顺序的 logits 上把小于第 k 大的值的设为 -inf。",
        "sorted_ranks",
    ),
    (
        "抽到的名次用第 0 行的下标映射回了词表（idx[0, pos]）：每一行有自己的 top-k "
        "下标，要逐行映射：next_id = idx.gather(-1, pos)，形状 (N, 1)。",
        "row0_indices",
    ),
    (
        "抽到的名次 pos（0..k−1）映射回词表时写成了 idx[:, :1] + pos（最好的词元的"
        "编号加上名次）：词元编号并不按 logit 大小排列，排第 2 的词元不是编号大 1 的"
        "那个。topk 已经不是问题了：按名次取 topk 返回的下标，"
        "next_id = idx.gather(-1, pos)。",
        "rank_offset",
    ),
    (
        "top-k 的阈值要逐行取：每一行自己的第 k 大（torch.topk(logits, k).values"
        "[:, [-1]]，形状 (N, 1)）。你的各行共用了一个阈值（看起来是各行第 k 大中最小"
        "的那个），第 k 大较高的行就多留了词元。",
        "batch_min_threshold",
    ),
    (
        "top_k 没有起作用：每一行应只保留词表维上最大的 top_k 个 logits"
        "（torch.topk(logits, k, dim=-1)），其余设为 -inf。若写了 "
        "torch.topk(…, dim=0)：那是沿批的维度取，批大小不超过 k 时什么也去不掉。",
        "no_top_k",
    ),
    (
        "top-k 保留的是最小的 k 个：应保留最大的 k 个（torch.topk 默认 largest=True），"
        "把小于第 k 大的值的 logits 设为 -inf。",
        "k_smallest",
    ),
    (
        "softmax 做了两次：对已经是概率的 probs 再做 softmax 会把分布压平；"
        "只对 logits 做一次 softmax。",
        "double_softmax",
    ),
    (
        "softmax 沿了批的维度（dim=0）：logits 的形状是 (N, V)，dim=0 让同一列（同一个"
        "词元）在各行之间归一化，每一行的概率不再是它自己的分布。应沿词表维："
        "torch.softmax(logits, dim=-1)。",
        "softmax_dim0",
    ),
    (
        "把 top-k 以外的概率设成 0 之后又做了一次 softmax：softmax 的输入应是 logits，"
        "概率 0 经过 softmax 得到 exp(0) = 1 的权重，top-k 以外的词元还会被抽到，留下的"
        "也被压平了。要么在 logits 上把其余的设为 -inf 再 softmax，要么把概率置 0 后"
        "除以行和重新归一化（probs / probs.sum(-1, keepdim=True)）。",
        "zeroed_probs_softmax",
    ),
    (
        "top-k 把其余的 logits 设成了 0，不是 -inf：softmax 之后 exp(0) 仍有权重，"
        "最大的 k 个以外的词元还会被抽到。用 logits.masked_fill(logits < v[:, [-1]], "
        "float('-inf'))。",
        "fill_zero",
    ),
    (
        "把 logits 直接当成了抽样权重（负数截成 0 后交给 torch.multinomial）："
        "logits 不是概率，先 probs = torch.softmax(logits, dim=-1)，"
        "再 torch.multinomial(probs, 1, generator=generator)。",
        "logits_as_probs",
    ),
    (
        "把 logits 直接当成了抽样权重（负数截成 0 后交给 torch.multinomial），"
        "top_k 也没有用上：先把最大的 top_k 个以外的 logits 设为 -inf，再 "
        "probs = torch.softmax(logits, dim=-1)，最后 torch.multinomial(probs, 1, "
        "generator=generator)。",
        "logits_no_top_k",
    ),
]

_TOPK_SYMPTOM = "抽到的词元总是编号最小的 top_k 个之一（0..k−1），与 logits 大小无关"
# the find-the-bug exercise on this checker: the page's bug (the place among the top k
# kept as the token) gets a hint that names the symptom and where to look
_BUG_HUNT = {
    "5.14": {
        "topk_positions": (
            f"{_TOPK_SYMPTOM}：看 torch.topk 返回的两样东西各是什么，"
            "你的代码用了哪一样，抽样得到的又是什么。"
        ),
    }
}
# the page's buggy function, by exercise, and what the hunt says while the learner's
# code is still that function (comments aside): the symptom only; where to look comes
# once something was changed
_BUG_UNCHANGED = {
    "5.14": (
        "buggy_generate",
        {
            "topk_positions": (
                f"{_TOPK_SYMPTOM}。你的函数与题目给的 buggy_generate 逐行相同"
                "（注释除外）：还没有改到 bug。对照这个症状想一想："
                "是哪一步让抽到的编号只能落在 0..k−1？"
            ),
        },
    ),
}

GENERATE_CRASHES = [
    (
        r"selected index k out of range",
        "torch.topk 的 k 超过了词表大小：top_k 可以等于词表大小 V（这时一个也不去掉）。"
        "阈值取第 top_k 大的值 torch.topk(logits, top_k).values[:, -1:]，把小于它的"
        "设为 -inf；不要取第 top_k + 1 大再用 <=。",
    ),
    (
        r"tuple indices must be integers|return_types\.topk",
        "torch.topk 返回两样东西 (values, indices)：阈值要从 values 里取，"
        "torch.topk(logits, k).values[:, -1:]（或 v, _ = torch.topk(logits, k)）。",
    ),
    (
        r"must be int, not NoneType",
        "top_k 可以是 None（这时不做 top-k 过滤，在整个词表上抽样）："
        "只在 top_k is not None 时才调用 torch.topk。",
    ),
    (
        r"same number of dimensions: got 2 and 1",
        "新词元的形状是 (N,)，少了一维：argmax 加 keepdim=True"
        "（或写 next_id[:, None]），得到 (N, 1)，"
        "才能 torch.cat([input_ids, next_id], dim=1)。",
    ),
    (
        r"same number of dimensions: got 2 and 3",
        "新词元是三维的：model(...) 返回每个位置的 logits (N, L, V)，"
        "只取最后一个位置 logits[:, -1, :]（形状 (N, V)），再 argmax 或抽样。",
    ),
    (
        r"must match except in dimension 0",
        "新词元拼在了批的维度上：序列是 dim=1，"
        "torch.cat([input_ids, next_id], dim=1)。",
    ),
    (
        r"required positional arguments?: \"num_samples\""
        r"|multinomial\(\): argument 'replacement'|multinomial\(\) takes",
        "torch.multinomial 的第二个参数是抽几个，generator 要按关键字传："
        "torch.multinomial(probs, 1, generator=generator)。",
    ),
    (
        r"must match the size[\s\S]*<",
        "top-k 的阈值要保留维度才能与 (N, V) 的 logits 比较：写 v[:, [-1]] 或 "
        "v[:, -1:]（形状 (N, 1)），不是 v[:, -1]（形状 (N,)）。",
    ),
    (
        r"too many values to unpack|not enough values to unpack|'tuple' object",
        "model(input_ids) 直接返回 logits (N, L, V)，不是 (logits, loss) 元组。",
    ),
    (
        r"softmax\((?:[^()]|\([^()]*\))*,\s*(?:dim\s*=\s*)?0\s*\)"
        r"|softmax\(\s*(?:dim\s*=\s*)?0\s*\)",
        "softmax 沿错了维度：logits 的形状是 (N, V)，dim=0 是沿批的维度，各行不再"
        "各自和为 1，某一列在所有行都是 -inf 时还得到 NaN。应沿词表维："
        "torch.softmax(logits, dim=-1)。",
    ),
    (
        r"multinomial|probability tensor",
        "torch.multinomial 需要非负、有限、和为正的概率：先对（屏蔽后的）logits 沿"
        "词表维做 softmax（dim=-1；dim=0 沿的是批，整列 -inf 时给出 NaN），再抽样。"
        "若某一行的 logits 全被设成了 -inf，softmax 也给出 NaN：top-k "
        "的阈值要逐行取：每一行自己的第 k 大（v[:, [-1]]），不能整批共用一个阈值"
        "（如展平后的第 k 大）。",
    ),
]


@checker("自回归生成")
def check_generate(fn: Callable, exercise: str | None = None) -> str:
    """Grade ``fn(model, input_ids, max_new_tokens, context_length, top_k=None,
    generator=None)`` -> ``(N, L + max_new_tokens)``.

    ``model(idx)`` returns logits ``(N, L, V)`` and accepts at most ``context_length``
    tokens. Each step: crop to the last ``context_length`` tokens, take the last
    position's logits; ``generator is None``: greedy argmax (``top_k`` given or
    not, graded both ways); otherwise keep the
    ``top_k`` largest logits (if given; the rest -inf), softmax, and
    ``torch.multinomial(probs, 1, generator=generator)`` (sampling among
    ``torch.topk``'s values and mapping back is accepted too); append. Compared with
    that loop run on the same model with a generator of the same seed. In the top-k
    case the rows' logits are shifted apart, so a threshold shared by the batch
    (flattened, or the smallest row's) changes the draws. A wrong output gets the
    typical mistake it reproduces, rows of the batch mixed, or (greedy) what its first
    wrong token is, with "it sampled" only when a second run gave other tokens.
    """
    name = name_of(fn)
    page_bug, unchanged = _BUG_UNCHANGED.get(str(exercise), (None, {}))
    bugs = _BUG_HUNT
    if page_bug is not None and same_code(fn, page_bug):
        bugs = {str(exercise): unchanged}
    hints = bug_hunt_hints(GENERATE_HINTS, exercise, bugs)
    g = seeded_generator(13)
    V, C = 17, 5
    # (description, idx shape, new tokens, top_k, sample, row_shift)
    cases = [
        (
            "贪心，input_ids (3, 3)，生成 6 个（超过 context_length = 5）",
            (3, 3),
            6,
            None,
            False,
            0.0,
        ),
        (
            "贪心，input_ids (1, 7) 比 context_length = 5 长，生成 3 个",
            (1, 7),
            3,
            None,
            False,
            0.0,
        ),
        # the rows' k-th largest logits 3 apart: a threshold shared by the batch shows
        (
            "top_k = 3 抽样，input_ids (3, 2)，各行 logits 高低不同，生成 8 个",
            (3, 2),
            8,
            3,
            True,
            3.0,
        ),
        ("不限 top_k 抽样，input_ids (1, 1)，生成 6 个", (1, 1), 6, None, True, 0.0),
        # generator None means greedy, whatever top_k says (last: the inputs drawn
        # for the cases above stay as they were)
        (
            "贪心：给了 top_k = 3 但 generator 为 None，input_ids (2, 3)，生成 5 个",
            (2, 3),
            5,
            3,
            False,
            0.0,
        ),
        # top_k = V keeps every token (a threshold from topk(top_k + 1) cannot exist)
        (
            f"top_k = {V}（词表大小）抽样，input_ids (2, 2)，生成 4 个",
            (2, 2),
            4,
            V,
            True,
            0.0,
        ),
    ]
    model = _ToyLM(V, C)
    for i, (case, shape, steps, top_k, sample, row_shift) in enumerate(cases):
        idx = torch.randint(V, shape, generator=g)
        model.row_shift = row_shift
        seed = 200 + i if sample else None
        # run_learner hands the learner a copy of idx
        run = functools.partial(
            run_learner, fn, model, idx, steps, C, what=name, case=case
        )
        model.calls.clear()
        out = run(
            first=i == 0, causes=GENERATE_CRASHES, **_generate_kwargs(top_k, seed)
        )
        out = _generated_tokens(name, out, idx, steps, case)
        gen = functools.partial(_generate_reference, model, idx, steps, C, top_k, seed)
        if torch.equal(out, gen()) or (
            top_k is not None and torch.equal(out, gen(among_top_k=True))
        ):
            continue
        model.calls.clear()
        drawn: list[str] = []
        with _watching_multinomial(drawn):
            again = run(**_generate_kwargs(top_k, seed))
        random = not (isinstance(again, Tensor) and torch.equal(again, out))
        if sample and random:
            fail(
                f"{name} 用同一个种子的 generator 运行两次，结果却不同（{case}）："
                "没有把 generator 传给 torch.multinomial（generator=generator）。"
            )
        mistake = functools.partial(
            _generate_mistake, model, idx, steps, C, top_k, seed
        )
        expected = gen()
        hint = _generate_hint(
            out,
            expected,
            hints,
            mistake,
            (sample, random, bool(drawn)),
            model,
            C,
            top_k,
            idx.size(1),
        )
        bad = tuple((out != expected).nonzero()[0].tolist())
        fail(
            f"{name} 生成的词元与参考不一致（{case}）：位置 {bad} 应为 "
            f"{int(expected[bad])}，得到 {int(out[bad])}。{hint}"
        )
    return (
        "贪心（含给了 top_k、没给 generator）与抽样（top-k，含 top_k 等于词表大小；"
        "带种子的 generator），prompt 长于上下文，批量 1 到 3"
    )


def _generate_kwargs(top_k: int | None, seed: int | None) -> dict:
    """The optional arguments of one generation call: ``top_k`` and a fresh
    ``generator`` seeded with ``seed`` (``None``: greedy)."""
    kwargs = {}
    if top_k is not None:
        kwargs["top_k"] = top_k
    if seed is not None:
        kwargs["generator"] = seeded_generator(seed)
    return kwargs


def _generated_tokens(
    name: str, out: object, idx: Tensor, steps: int, case: str
) -> Tensor:
    """``out`` must be int64 ``(N, L + steps)`` and start with the prompt
    ``input_ids``."""
    out = as_tensor(out, f"{name} 的输出", case)
    N, L = idx.shape
    if tuple(out.shape) == (N, steps):
        fail(
            f"{name} 只返回了新生成的词元 {tuple(out.shape)}（{case}）："
            f"应返回 prompt 加新词元，形状 (N, L + max_new_tokens) = "
            f"{(N, L + steps)}。"
        )
    check_shape(
        out,
        (N, L + steps),
        f"{name} 的输出",
        case,
        " 每一步在 dim=1 上拼接一个新词元：torch.cat([input_ids, next_id], dim=1)。",
    )
    if out.dtype != torch.int64:
        fail(
            f"{name} 的输出应是 torch.long（int64）的词元 id，得到 {out.dtype}："
            "argmax 和 torch.multinomial 的结果本来就是 long，不要转成浮点。"
        )
    if not torch.equal(out[:, :L], idx):
        fail(f"{name} 的输出前 {L} 列应原样是输入 input_ids（{case}）。")
    return out


def _agreement(out: Tensor, other: Tensor) -> int:
    """How many leading columns (in every row) ``other`` shares with ``out``."""
    if other.shape != out.shape:
        return -1
    return int((other == out).all(0).int().cumprod(0).sum())


def _same_draws(out: Tensor, other: Tensor, first_wrong: int, prompt: int) -> bool:
    """Whether ``other`` reproduces the generated ``out``: its first wrong token, and
    at least nine in ten of the new tokens (drawing from the same distribution written
    another way, e.g. zeroed probabilities instead of -inf logits, may flip a rare
    draw)."""
    if _agreement(out, other) <= first_wrong:
        return False
    return float((other == out)[:, prompt:].float().mean()) >= 0.9


def _generate_hint(
    out: Tensor,
    expected: Tensor,
    hints: list[tuple[str, str]],
    mistake: Callable[[str], Tensor],
    sample_random: tuple[bool, bool, bool],
    model: _ToyLM,
    C: int,
    top_k: int | None,
    prompt: int,
) -> str:
    """The typical mistake (``mistake(m)`` generates with it) that ``out``
    reproduces, rows of the batch mixed, or what the first wrong token says.
    ``sample_random``: whether the case samples, whether a second run with the
    same inputs gave other tokens, and whether that run called ``multinomial``."""
    sample, random, multinomial = sample_random
    first_wrong = _agreement(out, expected)
    same = functools.partial(_same_draws, first_wrong=first_wrong, prompt=prompt)
    hint = first_reproduced(out, hints, mistake, same=same)
    if hint is None and sample and not multinomial:
        hint = NO_MULTINOMIAL_HINT
    if hint is None:
        hint = _mixed_rows(out, expected, first_wrong, model, C, prompt, sample)
    if hint is None and not sample:
        hint = _greedy_miss(out, expected, first_wrong, model, C, top_k, random)
    return "\n可能的原因：" + (
        hint or _first_wrong_draw(out, expected, first_wrong, model, C, top_k)
    )


NO_MULTINOMIAL_HINT = (
    "用 torch.multinomial(probs, 1, generator=generator) 抽样，用同一个 generator："
    "你的函数没有调用 torch.multinomial。自己用 torch.rand 做逆 CDF（累计概率与"
    "均匀随机数比较）、Gumbel 之类的写法，分布也许没错，但用掉的随机数不同，抽到的"
    "词元就与参考对不上；练习按 torch.multinomial 逐个核对抽到的词元。"
)


@contextmanager
def _watching_multinomial(drawn: list[str]) -> Iterator[None]:
    """Note in ``drawn`` every call to ``torch.multinomial`` (or
    ``Tensor.multinomial``) made inside."""

    def watch(frame, event: str, arg: object) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "multinomial":
            drawn.append("multinomial")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)


def _mixed_rows(
    out: Tensor,
    expected: Tensor,
    col: int,
    model: _ToyLM,
    C: int,
    prompt: int,
    sample: bool,
) -> str | None:
    """Rows of the batch mixed: every row got the same new tokens where the
    reference's rows differ, or (greedy) the first wrong token is another row's
    argmax."""
    if out.size(0) < 2:
        return None
    new, ref = out[:, prompt:], expected[:, prompt:]
    if bool((new == new[:1]).all()) and not bool((ref == ref[:1]).all()):
        if sample:
            return (
                "批里每一行抽到的新词元完全相同：只按一行的概率抽了一次，再复制给了"
                "所有行。每一行按自己的概率抽：probs 形状 (N, V)，"
                "torch.multinomial(probs, 1, generator=generator) 给出 (N, 1)。"
            )
        return (
            "批里每一行生成的新词元完全相同：看来只算了一个 argmax（如 logits[0]"
            ".argmax()，或不带 dim 的 argmax），再复制给了所有行。每一行各取自己的："
            "logits[:, -1, :].argmax(dim=-1, keepdim=True)，形状 (N, 1)。"
        )
    if sample:
        return None
    own = model.logits(out[:, :col][:, -C:])[:, -1].argmax(-1)
    for row in (out[:, col] != own).nonzero().flatten().tolist():
        token = int(out[row, col])
        other = (own == token).nonzero().flatten().tolist()
        if other:
            return (
                f"批里的行混在了一起：第 {row} 行第 {col} 列取到的词元 {token} 是"
                f"第 {other[0]} 行这一步的 argmax，不是它自己的（{int(own[row])}）。"
                "每一行各取自己的：logits[:, -1, :].argmax(dim=-1, keepdim=True)；"
                "不带 dim 的 argmax（在整批展平后取）或只算一行再复制，"
                "都会把行混在一起。"
            )
    return None


def _greedy_miss(
    out: Tensor,
    expected: Tensor,
    col: int,
    model: _ToyLM,
    C: int,
    top_k: int | None,
    random: bool,
) -> str:
    """What the first wrong greedy token says: drawn at random (a second run
    differed), or which token the argmax of the learner's own context gives."""
    with_top_k = "（给了 top_k 也一样：top_k 只在抽样时起作用）" if top_k else ""
    if random:
        return (
            f"generator 为 None 时应贪心地取 argmax{with_top_k}，你的函数却在抽样："
            "同样的输入运行两次，结果不同（不带 generator 的 torch.multinomial "
            "用的是全局随机数）。写 logits[:, -1, :].argmax(dim=-1, keepdim=True)。"
        )
    row = int((out[:, col] != expected[:, col]).nonzero()[0])
    logits = model.logits(out[row : row + 1, :col][:, -C:])[0, -1]
    token = int(out[row, col])
    if not 0 <= token < logits.numel():
        return (
            f"第 {row} 行第 {col} 列的词元 {token} 不在词表 0..{logits.numel() - 1} "
            "之内：argmax 要沿词表维取（dim=-1），结果是词元编号。"
        )
    rank = int((logits > logits[token]).sum()) + 1
    return (
        f"第 {row} 行第 {col} 列：以你生成的前文为上下文，最后一个位置的 logits "
        f"最大的是词元 {int(logits.argmax())}，你取了 {token}（它的 logit 排第 "
        f"{rank}）。generator 为 None 时贪心{with_top_k}：逐项核对：裁剪 "
        "input_ids[:, -context_length:]、取最后一个位置 logits[:, -1, :]、沿词表维"
        "取 argmax(dim=-1, keepdim=True)，每一行各取各的。"
    )


def _first_wrong_draw(
    out: Tensor, expected: Tensor, col: int, model: _ToyLM, C: int, top_k: int | None
) -> str:
    """What the first sampled token that differs from the reference's says: outside
    the top k, or drawn with other probabilities."""
    row = int((out[:, col] != expected[:, col]).nonzero()[0])
    logits = model.logits(out[row : row + 1, :col][:, -C:])[0, -1]
    token = int(out[row, col])
    rank = int((logits > logits[token]).sum()) + 1
    if top_k is not None and rank > top_k:
        return (
            f"第 {row} 行第 {col} 列抽到的词元 {token} 的 logit 排第 {rank}，"
            f"不在 top-{top_k} 之内：top-k 没有起作用或保留多了，只保留最大的 top_k "
            "个 logits，其余设为 -inf；或者在 topk 的 k 个值里抽到名次 pos 后，映射回"
            "词表时取错了下标（应为 indices.gather(-1, pos)）。"
        )
    return (
        f"第 {row} 行第 {col} 列抽到的词元 {token}"
        + (" 在 top-k 之内" if top_k is not None else "")
        + "，但与同一个 "
        "generator 按参考的概率抽到的不同：抽样用的分布不对。常见的原因："
        "对 logits 做了缩放（如除以温度；本练习不用温度）、softmax 做了两次、"
        "top-k 的阈值不是每一行各自的第 k 大值（v[:, [-1]]），"
        "或抽样前又用这个 generator 抽了别的随机数。每步 probs = "
        "torch.softmax(logits, dim=-1)，再 torch.multinomial(probs, 1, "
        "generator=generator)。"
    )


# KV cache


def _call_len(cache: object, what: str, first: bool = False) -> int:
    n = run_learner(type(cache).__len__, cache, what=f"{what}.__len__", first=first)
    if not isinstance(n, int) or isinstance(n, bool):
        fail(
            f"len({what}) 应返回 int，得到 {type(n).__name__}：用 Python 整数"
            "（如 self.k.size(2)，或累加的计数）。"
        )
    return n


@checker("KV 缓存", wants_class=True)
def check_kv_cache(cls: type) -> str:
    """Grade ``cls()``: a KV cache.

    ``update(k, v)`` takes the new keys and values ``(N, H, T, D)`` (``T`` new
    positions) and returns ``(K_all, V_all)``: everything cached so far, old positions
    first, concatenated along dim -2 (``torch.cat([old, new], dim=-2)``);
    ``len(cache)`` is the number of cached positions (0 when empty). Two caches do not
    share state. A cache with an ``offset`` (chapter 3: where the position embedding
    goes on) must keep it equal to ``len(cache)``.
    """
    name = name_of(cls)
    g = seeded_generator(14)
    # (N, H, D, chunk lengths)
    configs = [(2, 3, 4, (1, 1, 3, 2)), (1, 2, 6, (2, 2, 1))]
    first = True
    for N, H, D, chunks in configs:
        cache = run_learner(cls, what=f"{name}()", first=first)
        other = run_learner(cls, what=f"{name}()")
        if not hasattr(cache, "update"):
            fail(f"{name} 缺少方法 update(k, v)。")
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for step, T in enumerate(chunks):
            k, v = randn(g, N, H, T, D), randn(g, N, H, T, D)
            keys.append(k)
            values.append(v)
            case = f"(N, H, D) = {(N, H, D)}，第 {step + 1} 次 update，新增 {T} 个位置"
            out = run_learner(
                cache.update,
                k.clone(),
                v.clone(),
                what=f"{name}.update",
                case=case,
                first=first,
                causes=CACHE_CRASHES,
            )
            if first:
                _call_len(cache, name, first=True)
            first = False
            K_all, V_all = _cache_outputs(name, out, case)
            total = sum(chunks[: step + 1])
            for got, n in ((K_all, "K_all"), (V_all, "V_all")):
                _check_cache_shape(name, got, n, (N, H, T, D), total, step + 1, case)
            _check_cache_contents(name, K_all, V_all, keys, values, case)
            _check_cache_len(name, cache, total, step + 1, N, case)
            _check_cache_offset(name, cache, total, case, first=step == 0)
        if _call_len(other, name) != 0:
            fail(
                f"另一个新建的 {name}() 的 len 不是 0：两个缓存共享了数据。把 "
                "self.k = None 之类写在 __init__ 里，不要用类属性（class 级别的列表）。"
            )
    return "两种 (N, H, D)，每次新增 1 到 3 个位置，len 与两个缓存互不影响"


def _cache_outputs(name: str, out: object, case: str) -> tuple[Tensor, Tensor]:
    """``update``'s result must be two tensors ``(K_all, V_all)``."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        fail(
            f"{name}.update 应返回 (K_all, V_all) 两个张量，得到 {type(out).__name__}。"
        )
    K_all, V_all = (
        as_tensor(t, f"{name}.update 返回的 {n}", case)
        for t, n in zip(out, ("K_all", "V_all"), strict=True)
    )
    return K_all, V_all


def _check_cache_shape(
    name: str,
    got: Tensor,
    what: str,
    chunk: tuple[int, int, int, int],
    total: int,
    updates: int,
    case: str,
) -> None:
    """After ``updates`` calls, ``got`` holds all ``total`` positions:
    ``(N, H, total, D)``."""
    N, H, _, D = chunk
    expected = (N, H, total, D)
    if tuple(got.shape) != expected:
        hint = _cache_shape_hint(tuple(got.shape), chunk, expected, updates)
        fail(
            f"{name}.update 返回的 {what} 形状不对（{case}）：应为 "
            f"{expected}，得到 {tuple(got.shape)}。{hint}"
        )


def _check_cache_contents(
    name: str,
    K_all: Tensor,
    V_all: Tensor,
    keys: list[Tensor],
    values: list[Tensor],
    case: str,
) -> None:
    """``(K_all, V_all)`` must be all keys and values so far, oldest first."""
    exp_k, exp_v = torch.cat(keys, dim=-2), torch.cat(values, dim=-2)
    if torch.equal(K_all, exp_k) and torch.equal(V_all, exp_v):
        return
    if torch.equal(K_all, exp_v) and torch.equal(V_all, exp_k):
        fail(f"{name}.update 返回的 K 和 V 顺序反了（{case}）：应为 (K_all, V_all)。")
    if torch.equal(K_all, exp_k) and torch.equal(V_all, exp_k):
        fail(
            f"{name}.update 返回的 V_all 就是 K_all（{case}）：两个返回值都是键，"
            "值 V 没有返回。值要像键一样存下、沿 dim=-2 拼接，返回 (K_all, V_all)。"
        )
    if torch.equal(K_all, exp_v) and torch.equal(V_all, exp_v):
        fail(
            f"{name}.update 返回的 K_all 就是 V_all（{case}）：两个返回值都是值，"
            "键存成了 v（像是 update(v, v) 或 self.k = v）。键 k 要单独存下、"
            "沿 dim=-2 拼接，返回 (K_all, V_all)。"
        )
    if torch.equal(K_all, exp_k):
        fail(
            f"{name}.update 返回的 K_all 对了，V_all 不对（{case}）：值 v 要像键 k "
            "一样存下、沿 dim=-2 拼接并返回。"
        )
    if len(keys) > 1 and torch.equal(K_all, torch.cat(keys[::-1], dim=-2)):
        fail(
            f"{name}.update 拼接的顺序反了（{case}）：旧的位置在前、新的在后，"
            "torch.cat([self.k, k], dim=-2)。"
        )
    fail(
        f"{name}.update 返回的 K_all/V_all 与逐次拼接的结果不一致（{case}）："
        "应为到目前为止所有 k（v）沿 dim=-2 拼接。"
    )


def _check_cache_len(
    name: str, cache: object, total: int, updates: int, batch: int, case: str
) -> None:
    """``len(cache)`` is the number of cached positions, not of ``update`` calls nor
    the batch size."""
    n_len = _call_len(cache, name)
    if n_len != total:
        if n_len == updates:
            extra = (
                "：len 应是缓存的位置数（每次新增 T 个的总和），"
                "不是 update 的调用次数。"
            )
        elif n_len == batch:
            extra = (
                f"：这是批大小 N = {batch}（dim=0）。__len__ 应返回缓存的位置数，"
                "即时间维 dim=-2 的长度：self.k.size(-2)。"
            )
        elif n_len == 0:  # learner test 38c: update concatenated, never stored
            extra = (
                "：缓存里一个位置也没存下。多半 update 只把拼接的结果返回了，没有存回"
                "去：self.k = torch.cat([self.k, k], dim=-2)（v 也一样），再返回"
                " self.k, self.v；或者 __len__ 读的不是 update 存下的那个属性。"
            )
        else:
            extra = "：len 应是缓存的位置数（dim=-2 的长度）。"
        fail(f"len({name}) 应为 {total}，得到 {n_len}（{case}）{extra}")


def _check_cache_offset(
    name: str, cache: object, total: int, case: str, first: bool = False
) -> None:
    """A cache that has an ``offset`` (the position the next token gets) keeps it
    equal to the number of cached positions."""
    if "offset" not in dir(cache):
        return
    offset = run_learner(
        getattr, cache, "offset", what=f"{name}.offset", case=case, first=first
    )
    if offset != total:
        fail(
            f"{name}.offset 应为 {total}，得到 {offset!r}（{case}）：offset 是已经送入"
            "的位置数，下一个位置的位置嵌入从这里接着编号，要随每次 update 增加新"
            "位置的个数（例如写成 property：return len(self)）。"
        )


CACHE_CRASHES = [
    (
        r"Sizes of tensors must match|torch\.cat",
        "torch.cat 报形状不匹配，多半是拼接的维度不对：应沿时间维 dim=-2"
        "（(N, H, T, D) 的 T）拼接，torch.cat([self.k, k], dim=-2)。",
    ),
]


def _cache_shape_hint(got: tuple, chunk: tuple, expected: tuple, updates: int) -> str:
    if got == chunk:  # learner test 44a: also a cat on the last dim, cut back to D
        return (
            "返回的 k/v 只有这一步的长度：应返回缓存里全部的位置（旧的在前，"
            "新的在后），沿时间维 dim=-2 拼接。若是拼在了别的维上、再切回原来的形状，"
            "留下的也只有一步（例如拼在最后一维再切回前 D 个，留下的是最早的一步）。"
        )
    N, H, T_all, D = expected
    for dim, shape in ((0, (N * updates, H)), (1, (N, H * updates))):
        if got[:2] == shape and updates > 1:
            return (
                f"拼接的维度不对：你沿 dim={dim} 拼接了；应沿时间维 dim=-2"
                "（(N, H, T, D) 的 T）拼接。"
            )
    if len(got) == 4 and got[:2] == (N, H) and got[-1] == D and got[2] > T_all:
        # learner test 38c: a preallocated buffer returned whole
        return (
            f"返回的像是整块预分配的缓冲区（{got[2]} 个位置），只有前 {T_all} 个"
            "填过：返回到目前为止的部分，self.k[:, :, :n]、self.v[:, :, :n]"
            "（n 是已存的位置数），或者用 torch.cat 拼接。"
        )
    if got[:2] == (N, H) and got[-1] != D:
        return (
            "拼接的维度不对：你沿最后一维拼接了；应沿时间维 dim=-2"
            "（(N, H, T, D) 的 T）拼接。"
        )
    return "应沿时间维 dim=-2 拼接：torch.cat([self.k, k], dim=-2)。"
