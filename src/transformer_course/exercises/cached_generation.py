"""A KV cache wired into the learner's own GPT: the checker for
``forward_with_cache(model, input_ids, caches, num_heads)``, a forward pass that
computes only the new positions and reads every earlier key and value from the caches.

The model has the exercise's layout (``tok_emb``, ``pos_emb`` as ``nn.Embedding``,
``blocks`` with ``norm1``/``self_attn``/``norm2``/``ffn``, ``self_attn`` with
``q_proj``/``k_proj``/``v_proj``/``out_proj``, ``norm_f``,
``lm_head``); the caches have the KV-cache exercise's interface (``update(k, v)``
returning everything cached, ``len``).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from ..masks import causal_mask
from ..models import GPTConfig, MiniGPT
from ._protocol import checker, fail, name_of, run_learner, seeded_generator
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_shape,
    close,
    first_reproduced,
    same_code,
    where_differs,
)

__all__ = ["check_cached_forward"]


class _ConcatCache:
    """The KV-cache exercise's contract, as simply as possible."""

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.keys is None or self.values is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=-2)
            self.values = torch.cat([self.values, v], dim=-2)
        return self.keys, self.values

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]


_QK_GAIN, _EMB_GAIN = 8.0, 15.0


class _ExerciseGPT(nn.Module):
    """A :class:`MiniGPT`'s modules under the exercise's names (``pos_emb`` is the
    bare ``nn.Embedding``); ``forward`` is the MiniGPT's, without a cache. The q and k
    projections and the embeddings are scaled up: a fresh model's attention is nearly
    uniform and its x tiny beside norm1(x), so k or v from x instead of norm1(x)
    changed the logits by ~1e-4 only and looked like another mistake (learner test
    38c)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.gpt = MiniGPT(cfg).eval()
        self.tok_emb, self.blocks = self.gpt.tok_emb, self.gpt.blocks
        self.pos_emb = self.gpt.pos_emb.embedding
        self.norm_f, self.lm_head = self.gpt.norm_f, self.gpt.lm_head
        self.num_heads = cfg.num_heads
        for block in self.blocks:  # the source's skeleton names d_k (the head size)
            block.self_attn.d_k = cfg.d_model // cfg.num_heads
            with torch.no_grad():  # peaky attention: mistakes in it show
                block.self_attn.q_proj.weight.mul_(_QK_GAIN)
                block.self_attn.k_proj.weight.mul_(_QK_GAIN)
        with torch.no_grad():
            self.tok_emb.weight.mul_(_EMB_GAIN)
            self.pos_emb.weight.mul_(_EMB_GAIN)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.gpt(input_ids)[0]


# typical mistakes of a cached forward: (hint, mistake)
_MISTAKES = [
    (
        "位置编号从 0 开始了：新词元的位置是 len(缓存) + 0..T-1，"
        "pos_emb(torch.arange(start, start + T))，start 是已缓存的位置数。",
        "positions_from_zero",
    ),
    (
        "新词元的位置少算了 1：第一次调用之后，位置应是 len(缓存) + 0..T-1"
        "（len(缓存) 正是下一个位置的编号，不用减 1）。",
        "positions_minus_1",
    ),
    (
        "新词元的位置多算了 1：位置应是 len(缓存) + 0..T-1，第一次调用（缓存为空）"
        "从 0 开始（不用加 1）。",
        "positions_plus_1",
    ),
    (
        "缓存不空时新词元的位置多算了 1：已缓存的 len(缓存) 个位置编号是 "
        "0..len(缓存)−1，下一个新词元的位置正是 len(缓存)（不用加 1）："
        "pos_emb(torch.arange(start, start + T))，start = len(缓存)。",
        "positions_plus_1_cached",
    ),
    (
        "新词元的位置多加了 T − 1（T 是这次送进的词元数）：一次送一个词元时恰好对，"
        "送进整段提示或几个词元时，第一个新词元的位置应是 len(缓存)，不是 "
        "len(缓存) + T − 1：pos_emb(torch.arange(start, start + T))，"
        "start = len(缓存)。",
        "positions_plus_T_minus_1",
    ),
    (
        "一次送进多个新词元（例如整段提示）时没有用因果掩码：新的查询也只能看到自己"
        "和之前的位置，attn_mask = tc.causal_mask(T, len(缓存) + T)。",
        "no_mask",
    ),
    (
        "注意力分数没有除以 √D（D 是每个头的维度）。",
        "no_scale",
    ),
    (
        "漏了最后的 norm_f：lm_head(norm_f(x))。",
        "no_norm_f",
    ),
    (
        "FFN 之前漏了 norm2：前归一化的块里两个子层都先归一化，"
        "x = x + block.ffn(block.norm2(x))。",
        "no_norm2",
    ),
    (
        "注意力之前漏了 norm1：q、k、v 都从 h = block.norm1(x) 投影，"
        "残差加回的才是 x。",
        "no_norm1",
    ),
    (
        "k 是从没有归一化的 x 投影的：q、k、v 都要从 h = block.norm1(x) 投影"
        "（block.self_attn.k_proj(h)，不是 k_proj(x)）。",
        "k_from_x",
    ),
    (
        "v 是从没有归一化的 x 投影的：q、k、v 都要从 h = block.norm1(x) 投影"
        "（block.self_attn.v_proj(h)，不是 v_proj(x)）。",
        "v_from_x",
    ),
    (
        "k 和 v 是从没有归一化的 x 投影的（q 是对的）：q、k、v 都要从 "
        "h = block.norm1(x) 投影（k_proj(h)、v_proj(h)）。",
        "k_from_x+v_from_x",
    ),
    (
        "注意力子层少了残差：x = x + out_proj(…)，不是 x = out_proj(…)。",
        "no_res_attn",
    ),
    (
        "FFN 子层少了残差：x = x + block.ffn(block.norm2(x))，不是 x = block.ffn(…)。",
        "no_res_ffn",
    ),
    (
        "q 分头时直接 view 成了 (N, H, T, D)（k、v 是对的）：这样会把不同位置的数"
        "拼进同一个头。应先 view(N, T, H, D)，再 transpose(1, 2)。",
        "q_split_no_transpose",
    ),
    (
        "第一个块的 k、v 是在加位置嵌入之前算的（从 norm1(tok_emb(ids)) 投影）：缓存"
        "里的键和值没有位置信息，只有 q 带着位置。先 x = tok_emb(ids) + "
        "pos_emb(torch.arange(start, start + T))，再进第一个块，q、k、v 都从 "
        "norm1(x) 投影。",
        "kv_before_pos",
    ),
    (
        "所有层共用了一个缓存：各层缓存各自的 k、v，caches[i] 属于 blocks[i]，"
        "for block, cache in zip(model.blocks, caches)。",
        "one_cache",
    ),
    (
        "只让新词元读取了它自己的 k、v：应先 cache.update(k, v)，再用返回的全部"
        " K、V 算注意力。",
        "cache_not_read",
    ),
    (
        "新词元只关注了缓存里过去位置的 k、v，没有关注它自己：这正是“新词元只需计算"
        "自己的 Q”那个常见误解。新词元的 k、v 也要参与注意力（它要关注自己）："
        "K, V = cache.update(k, v) 返回的是过去加上新的全部位置，直接用它们，"
        "掩码 tc.causal_mask(T, len(缓存) + T)。",
        "past_only",
    ),
    (
        "因果掩码对齐到了左上角（新查询 i 只看键 0..i），只在一次送一个词元时不用掩码："
        "这样逐个送词元是对的，可缓存不空时一次送进几个新词元（分块预填充）就错了。"
        "新词元是整段的最后 L 个位置，查询 i 在整段中的位置是 len(缓存) + i，能看键 "
        "0..len(缓存)+i：掩码要对齐到缓存的末尾（右下角），attn_mask = "
        "tc.causal_mask(L, len(缓存) + L)。F.scaled_dot_product_attention 的 "
        "is_causal=True 在 L ≠ S 时对齐的是左上角，不能代替它。",
        "top_left_multi",
    ),
    (
        "tril 的对角线偏移符号反了：查询 i 在整段中的位置是 S − L + i（S 是键的个数），"
        "能看键 0..S−L+i，所以是 ones(L, S).tril(S − L)，即 tc.causal_mask(L, S)；"
        "你写的 tril(L − S) 在缓存不空时把缓存里的键也遮住了，逐个送词元时新词元一个"
        "键也看不见。",
        "mask_sign",
    ),
    (
        "q 是从没有归一化的 x 投影的：q、k、v 都要从 h = block.norm1(x) 投影"
        "（block.self_attn.q_proj(h)，不是 q_proj(x)）。",
        "q_from_x",
    ),
    (
        "因果掩码对齐到了左上角（新查询 i 只看键 0..i）：新词元是整段的最后 T 个位置，"
        "查询 i 在整段中的位置是 len(缓存) + i，能看键 0..len(缓存)+i；逐个送词元时，"
        "新词元看得到缓存里的全部键和它自己。用右下角对齐的 "
        "attn_mask = tc.causal_mask(T, len(缓存) + T)。",
        "top_left",
    ),
    (
        "分头和合并时都少了 transpose：(N, T, E) 直接 reshape 成 (N, H, T, D) 会把"
        "不同位置的数拼进同一个头。分头应 view(N, T, H, D).transpose(1, 2)，"
        "合并应 o.transpose(1, 2).reshape(N, T, E)。",
        "heads_no_transpose",
    ),
    (
        "分头时直接 view 成了 (N, H, T, D)（合并是对的）：这样会把不同位置的数拼进"
        "同一个头。应先 view(N, T, H, D)，再 transpose(1, 2)。",
        "split_no_transpose",
    ),
    (
        "合并多头时少了 transpose（分头是对的）：(N, H, T, D) 要先 transpose(1, 2) "
        "成 (N, T, H, D)，再 reshape(N, T, E)。",
        "merge_no_transpose",
    ),
    (
        "注意力子层的残差加在了 norm1(x) 上（h + 注意力输出；FFN 子层若也写成 "
        "norm2(x) + ffn(…)，同样是这个错）：残差要加在归一化之前的 x 上，"
        "x = x + out_proj(…)，x = x + ffn(norm2(x))；h = norm1(x) 只用来算 q、k、v。",
        "res_from_norm1",
    ),
    (
        "FFN 的输入用了注意力之前的 h = norm1(x)：FFN 要读加过注意力残差之后的 x，"
        "x = x + block.ffn(block.norm2(x))。",
        "ffn_from_h",
    ),
    (
        "缩放用了 √d_model（√E），应除以每个头的维度 √D（D = E // num_heads）。",
        "scale_model",
    ),
    (
        "键和值弄反了：cache.update 的参数顺序是 (k, v)，返回的也是 (K, V)；"
        "分数用 q @ Kᵀ，加权求和用 V。",
        "kv_swapped",
    ),
    (
        "掩码方向反了：上三角 .triu(S − T) 让查询 i 看得见它自己和它之后的键"
        "（未来），逐个送词元时新词元只看得见它自己。True = 可以看的是下三角："
        "tc.causal_mask(T, S)，即 ones(T, S).tril(S − T)。",
        "mask_triu",
    ),
    (
        "掩码把对角线也遮住了：.tril(S − T − 1) 让每个查询看不见它自己的键，"
        "提示的第一个位置什么也看不见（整行 −inf，softmax 得 NaN）。查询 i 对应"
        "第 S − T + i 个键，包括它自己：tc.causal_mask(T, S)，即 tril(S − T)。",
        "mask_no_diagonal",
    ),
    (
        "掩码把对角线也遮住了：.tril(S − T − 1) 让每个查询看不见它自己的键（你又让"
        "每一行都看得见第 0 个键，免得整行 −inf）。查询 i 对应第 S − T + i 个键，"
        "包括它自己：tc.causal_mask(T, S)，即 ones(T, S).tril(S − T)。",
        "mask_no_diagonal_key_0",
    ),
]


def _heads(t: Tensor, H: int, flat: bool = False) -> Tensor:
    """(N, T, E) -> (N, H, T, D); ``flat``: the mistake of reshaping without the
    transpose."""
    N, T, E = t.shape
    if flat:
        return t.reshape(N, H, T, E // H)
    return t.view(N, T, H, E // H).transpose(1, 2)


@torch.no_grad()
def _cached_variant(
    model: _ExerciseGPT, ids: Tensor, caches: list[_ConcatCache], mistake: str | None
) -> Tensor:
    """The cached forward, right (``mistake=None``) or with one typical mistake (two
    joined by ``+``: both)."""
    has = set(mistake.split("+")) if mistake else set()
    N, T = ids.shape
    old = len(caches[0])
    shift = {"positions_minus_1": -1, "positions_plus_1": 1}
    start = max(old + sum(shift.get(m, 0) for m in has), 0)  # max(..., 0): a
    # learner's max keeps it running
    if "positions_from_zero" in has:
        start = 0
    if "positions_plus_1_cached" in has and old:  # right on the first call only
        start = old + 1
    if "positions_plus_T_minus_1" in has:  # right when one token is fed
        start = old + T - 1
    tokens = model.tok_emb(ids)
    x = tokens + model.pos_emb(torch.arange(start, start + T))
    for i, block in enumerate(model.blocks):
        cache = caches[0 if "one_cache" in has else i]
        h = x if "no_norm1" in has else block.norm1(x)
        kv_from = block.norm1(tokens) if "kv_before_pos" in has and i == 0 else h
        q_from = x if "q_from_x" in has else h
        k_from = x if "k_from_x" in has else kv_from
        v_from = x if "v_from_x" in has else kv_from
        o = _cached_attention(
            block.self_attn, model.num_heads, (q_from, k_from, v_from), cache, has
        )
        if "no_res_attn" in has:
            x = o
        else:
            x = (h if "res_from_norm1" in has else x) + o
        h2 = h if "ffn_from_h" in has else block.norm2(x)
        f = block.ffn(x if "no_norm2" in has else h2)
        x = f if "no_res_ffn" in has else x + f
    if "no_norm_f" not in has:
        x = model.norm_f(x)
    return model.lm_head(x)


def _cached_attention(
    attn: nn.Module,
    H: int,
    inputs: tuple[Tensor, Tensor, Tensor],
    cache: _ConcatCache,
    has: set[str],
) -> Tensor:
    """One block's attention output (after ``out_proj``) for the new positions: queries,
    keys and values projected from ``inputs`` (each ``(N, T, E)``), with the mistakes
    ``has``."""
    h, k_from, v_from = inputs
    N, T, E = h.shape
    flat = bool(has & {"heads_no_transpose", "split_no_transpose"})
    q = _heads(attn.q_proj(h), H, flat or "q_split_no_transpose" in has)
    k, v = _heads(attn.k_proj(k_from), H, flat), _heads(attn.v_proj(v_from), H, flat)
    old = len(cache)
    K, V = cache.update(k, v)
    if "past_only" in has and old:  # only the cached positions, not the new ones
        K, V = K[:, :, :old], V[:, :, :old]
    if "cache_not_read" in has:
        K, V = k, v
    if "kv_swapped" in has:
        K, V = V, K
    scale = math.sqrt(q.shape[-1])
    if has & {"no_scale", "scale_model"}:
        scale = 1.0 if "no_scale" in has else math.sqrt(E)
    scores = q @ K.transpose(-2, -1) / scale
    if "no_mask" not in has:
        scores = scores.masked_fill(~_variant_mask(T, K.shape[-2], has), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if "mask_sign" in has:  # tc's attention: a fully masked row gets zero weights
        weights = weights.nan_to_num(0.0)
    o = weights @ V  # (N, H, T, D)
    if not has & {"heads_no_transpose", "merge_no_transpose"}:
        o = o.transpose(1, 2)
    return attn.out_proj(o.reshape(N, T, -1))


def _variant_mask(T: int, S: int, has: set[str]) -> Tensor:
    """The bool ``(T, S)`` mask of the mistakes ``has`` (right: bottom-right
    aligned)."""
    ones = torch.ones(T, S, dtype=torch.bool)
    if "top_left" in has:
        return torch.arange(S) <= torch.arange(T)[:, None]  # query i: keys 0..i
    if "top_left_multi" in has:  # learner test 31c: no mask for one token only
        return ones if T == 1 else torch.arange(S) <= torch.arange(T)[:, None]
    if "mask_sign" in has:  # learner test 31c, a 5.23 "fix": tril(L - S)
        return ones.tril(T - S)
    if "mask_triu" in has:  # learner test 25c, a 5.23 "fix"
        return ones.triu(S - T)
    if has & {"mask_no_diagonal", "mask_no_diagonal_key_0"}:  # a 5.23 "fix"
        mask = ones.tril(S - T - 1)
        if "mask_no_diagonal_key_0" in has:  # every row kept one key: no NaN
            mask[:, 0] = True
        return mask
    return causal_mask(T, S)


def _two_mistakes(hints: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every pair of the ``hints``' mistakes (``"a+b"``), with both hints: a fix of
    the wrong line that leaves the page's bug in, or two slips at once."""
    return [
        (f"有两处错。其一：{hint_a}\n其二：{hint_b}", f"{a}+{b}")
        for i, (hint_a, a) in enumerate(hints)
        for hint_b, b in hints[i + 1 :]
    ]


def _heads_last(cache: _ConcatCache, H: int, T: int) -> bool:
    """Whether ``cache`` holds ``T`` positions as ``(N, T, H, D)``: the keys handed
    over before the transpose to ``(N, H, T, D)``."""
    keys = cache.keys
    return keys is not None and keys.dim() == 4 and tuple(keys.shape[1:3]) == (T, H)


def _same_or_both_nan(got: Tensor, ref: Tensor) -> bool:
    """:func:`close`, with NaN where the mistake gives NaN (a fully masked row)."""
    nan = ref.isnan()
    return bool((got.isnan() == nan).all()) and close(got[~nan], ref[~nan])


def _replay(
    model: _ExerciseGPT, chunks: list[Tensor], upto: int, mistake: str
) -> Tensor:
    """What the mistake gives on chunk ``upto`` after the earlier chunks."""
    caches = [_ConcatCache() for _ in model.blocks]
    out = torch.empty(0)
    for chunk in chunks[: upto + 1]:
        out = _cached_variant(model, chunk, caches, mistake)
    return out


_POSITIONS_SYMPTOM = "第一次调用（缓存为空）与整段前向相同，之后逐个送词元就对不上"
# the find-the-bug exercise on this checker: the page's bug (position ids counted from 0
# on every call, as in a forward without a cache) gets a hint that names the symptom and
# where to look
_BUG_HUNT = {
    "5.23": {
        "positions_from_zero": (
            f"{_POSITIONS_SYMPTOM}：错的量在缓存为空时恰好正确。看进第一个块之前的那一步："
            "新词元在整段里排第几？"
        ),
    }
}
# the page's buggy function, by exercise, and what the hunt says while the learner's
# code is still that function (comments aside): the symptom and which call goes wrong;
# the step to look at comes once something was changed
_BUG_UNCHANGED = {
    "5.23": (
        "buggy_forward_with_cache",
        {
            "positions_from_zero": (
                f"{_POSITIONS_SYMPTOM}。你的函数与题目给的 "
                "buggy_forward_with_cache 逐行相同（注释除外）：还没有改到 bug。"
                "想一想：缓存为空和不空时，哪一行算出的东西应当不同？"
            ),
        },
    ),
}

_SQUARE_MASK = (
    "掩码是方的 (T, T)，可缓存不空时键有 len(缓存) + T 个：掩码要是 "
    "(T, len(缓存) + T) 的，右下角对齐：tc.causal_mask(T, len(缓存) + T)。"
)
_CRASHES = [
    # learner test 38c: tc.causal_mask(T), square, on a non-empty cache
    (r"mask of shape \((\d+), \1\) does not broadcast", _SQUARE_MASK),
    # learner test 44c: the same square mask in the learner's own masked_fill
    (r"(?i)size[^\n]*\n.*causal_mask\(\s*(\w+)\s*(?:,\s*\1\s*)?\)", _SQUARE_MASK),
    (
        r"index out of range",
        "嵌入表的下标越界：新词元的位置是 len(缓存) + 0..T-1，第一次调用（缓存为空）"
        "从 0 开始，不会是负数，也不超过 context_length − 1。",
    ),
]


@checker("带缓存的前向（你的 KV 缓存接进你的 GPT）")
def check_cached_forward(fn: object, exercise: str | None = None) -> str:
    """Grade ``fn(model, input_ids, caches, num_heads)``: the logits ``(N, T, V)`` of
    the ``T`` new tokens ``input_ids`` that follow the ``len(caches[0])`` cached
    positions, one cache per block, every cache updated with the new keys and values.
    The first call gets the prompt, later calls one token or (the third model, a
    chunked prefill) several on a non-empty cache, so a mask aligned top-left fails;
    the pieces must give the logits of one full forward."""
    name = name_of(fn)
    g = seeded_generator(31)
    page_bug, unchanged = _BUG_UNCHANGED.get(str(exercise), (None, {}))
    bugs = _BUG_HUNT
    if page_bug is not None and same_code(fn, page_bug):
        bugs = {str(exercise): unchanged}
    hints = bug_hunt_hints(_MISTAKES, exercise, bugs)
    # (V, C, E, H, layers, bias, chunk lengths): a prompt, then one token at a time
    configs = [
        (11, 16, 16, 2, 2, True, (5, 1, 1, 1)),
        (13, 12, 24, 4, 3, False, (3, 1, 1, 1, 1)),
        (12, 16, 16, 2, 2, True, (3, 2, 1, 2)),  # learner test 31c: chunked prefill
    ]
    first = True
    for V, C, E, H, n_layers, bias, lengths in configs:
        cfg = GPTConfig(
            vocab_size=V, context_length=C, d_model=E, num_heads=H,
            num_layers=n_layers, bias=bias,
        )  # fmt: skip
        model = _ExerciseGPT(cfg)
        ids = torch.randint(0, V, (2, sum(lengths)), generator=g)
        full = model(ids)
        chunks = list(ids.split(list(lengths), dim=1))
        caches = [_ConcatCache() for _ in model.blocks]
        done = 0
        for step, chunk in enumerate(chunks):
            T = chunk.shape[1]
            case = (
                f"{n_layers} 层、{H} 个头、E = {E}"
                + ("" if bias else "、线性层不带偏置")
                + f"；已缓存 {done} 个位置，新送进 {T} 个词元"
            )
            with torch.no_grad():
                out = run_learner(
                    fn, model, chunk, caches, H,
                    what=name, case=case, first=first, causes=_CRASHES,
                )  # fmt: skip
            first = False
            got = as_tensor(out, f"{name} 的返回值", case)
            check_shape(got, (2, T, V), f"{name} 返回的 logits", case)
            ref = full[:, done : done + T]
            if not close(got, ref):
                replay = functools.partial(_replay, model, chunks, step)
                hint = first_reproduced(
                    got, hints, replay, same=_same_or_both_nan
                ) or first_reproduced(got, _two_mistakes(hints), replay,
                                      same=_same_or_both_nan)  # fmt: skip
                fail(
                    f"{name} 的 logits 与整段一次前向的不一致（{case}；"
                    f"{where_differs(got, ref)}）。"
                    + (
                        hint
                        or "逐层对照：norm1 → q/k/v 投影并分头 → cache.update → "
                        "注意力 → 合并多头 → out_proj → 残差 → norm2 → ffn → 残差。"
                    )
                )
            done += T
            lengths_now = [len(c) for c in caches]
            if lengths_now != [done] * n_layers:
                if all(_heads_last(c, H, done) for c in caches):
                    fail(
                        f"{name} 运行后各层缓存的位置数是 {lengths_now}，应都是 {done}"
                        f"（{case}）：交给 cache.update 的 k、v 是 (N, T, H, D) 的"
                        f"（缓存里键的形状是 {tuple(caches[0].keys.shape)}），"
                        "len(缓存) 数到的是头数 H。缓存约定的布局是 (N, H, T, D)"
                        "：分头之后 transpose(1, 2)，再 cache.update(k, v)，"
                        "位置在倒数第二维。"
                    )
                fail(
                    f"{name} 运行后各层缓存的位置数是 {lengths_now}，应都是 {done}"
                    f"（{case}）：每一层都要把新词元的 k、v 写进自己的缓存"
                    "（caches[i] 属于 blocks[i]）。"
                )
    return (
        "三种模型（含不带偏置的），先送提示、再逐个或几个一起送词元，"
        "与整段前向逐位置相同"
    )
