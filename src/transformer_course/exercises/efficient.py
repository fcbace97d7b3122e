"""Efficient attention (chapter 4): streaming (online-softmax) attention over key
blocks, grouped-query attention without copying the key-value heads, sparsemax, the
size of a KV cache and the prefix-LM mask."""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..masks import causal_mask
from ..models import GPTConfig, MiniGPT
from ..sparse import sparsemax, sparsemax_threshold
from ._protocol import (
    calls_refused,
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
    check_finite,
    check_float,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)

# ---------------------------------------------------------------------------
# streaming attention (ex 4.5)
# ---------------------------------------------------------------------------


class _MemoryWatch(TorchFunctionMode):
    """Records every new tensor the learner's torch calls create (views are not new),
    the largest one, and how many elements of them are alive at the checker's
    ``audit`` calls (one per block request). Paused while the checker makes a block."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.alive: dict[int, tuple[weakref.ref, int]] = {}
        self.largest = (0, "", ())  # (numel, op, shape)
        self.peak_alive = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor) and t._base is None:
                known = self.alive.get(id(t))
                if known is None or known[0]() is not t:
                    self.alive[id(t)] = (weakref.ref(t), t.numel())
                if t.numel() > self.largest[0]:
                    name = getattr(func, "__name__", str(func))
                    self.largest = (t.numel(), name, tuple(t.shape))
        return out

    def audit(self) -> None:
        self.alive = {k: (r, n) for k, (r, n) in self.alive.items() if r() is not None}
        self.peak_alive = max(self.peak_alive, sum(n for _, n in self.alive.values()))


def _stream_blocks(
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    b: int,
    watch: _MemoryWatch,
    held: list[tuple[int, list[int]]],
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """Yield ``(K_j, V_j, mask_j)`` as fresh tensors; before block j is made, the
    learner's new tensors are audited, and the blocks older than j − 1 of which one
    of the three tensors is still alive are recorded in ``held`` as ``(j, [i, …])``
    (learner test 47e: a list of the masks alone)."""
    refs: list[tuple[weakref.ref, ...]] = []
    S = k.size(-2)
    for j, start in enumerate(range(0, S + b, b)):
        watch.audit()
        old = [
            i
            for i, rs in enumerate(refs[: max(j - 1, 0)])
            if any(r() is not None for r in rs)
        ]
        if old:
            held.append((j, old))
        if start >= S:
            return
        watch.paused = True
        block = (
            k[..., start : start + b, :].clone(),
            v[..., start : start + b, :].clone(),
            mask[..., start : start + b].clone(),
        )
        watch.paused = False
        refs.append(tuple(weakref.ref(t) for t in block))
        yield block
        del block


def _mask_scores(s: Tensor, mask: Tensor, mistake: str) -> Tensor:
    """``s`` with the bool ``mask`` applied, as right or as the masking mistakes do."""
    if mistake == "mask_multiplied":  # masked scores 0, still in the softmax
        return s * mask
    if mistake == "mask_added":  # the bool mask added: +1 / +0, nothing masked
        return s + mask
    if mistake == "mask_ignored":
        return s
    return s.masked_fill(~mask, -math.inf)


def _streaming_variant(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, b: int, mistake: str
) -> Tensor:
    """Block-wise attention with one typical mistake (for diagnosis); no NaN from
    fully masked leading blocks, so the mistake is not confused with that one."""
    scales = {"noscale": 1.0, "scale_dv": v.size(-1) ** -0.5, "scale_block": b**-0.5}
    scale = scales.get(mistake, q.size(-1) ** -0.5)
    if mistake == "inverted":
        mask = ~mask
    if mistake == "block_softmax_mean":  # each block's own softmax, averaged
        parts = [
            torch.nan_to_num(
                torch.softmax(
                    (q @ k[..., i : i + b, :].mT * scale).masked_fill(
                        ~mask[..., i : i + b], -math.inf
                    ),
                    -1,
                )
            )
            @ v[..., i : i + b, :]
            for i in range(0, k.size(-2), b)
        ]
        return sum(parts) / len(parts)
    c = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
    ell = torch.zeros_like(c)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
    first = b if mistake == "first_block_dropped" else 0
    for start in range(first, k.size(-2), b):
        raw = (q @ k[..., start : start + b, :].mT) * scale
        s = _mask_scores(raw, mask[..., start : start + b], mistake)
        if mistake == "skipped_block" and torch.isinf(s.amax(-1)).any():
            continue
        block_max = s.amax(-1, keepdim=True)
        own = mistake in ("block_max", "own_block_max")
        c_new = block_max if own else torch.maximum(c, block_max)
        c_safe = torch.where(torch.isinf(c_new), torch.zeros_like(c_new), c_new)
        fix = torch.exp(c - c_safe)
        if mistake == "fix_inverted":  # exp(c_new − c_old), the first block guarded
            fix = torch.exp(c_safe - torch.where(torch.isinf(c), c_safe, c))
        if mistake in ("no_rescale", "own_block_max"):
            fix = torch.ones_like(fix)
        p = torch.exp(s - c_safe)
        ell_fix = torch.ones_like(fix) if mistake == "ell_not_rescaled" else fix
        ell = ell * ell_fix + p.sum(-1, keepdim=True)
        o_fix = torch.ones_like(fix) if mistake == "o_not_rescaled" else fix
        if mistake == "o_unmasked":  # ℓ from the masked scores, o from the raw ones
            p = torch.exp(raw - c_safe)
        o = o * o_fix + p @ v[..., start : start + b, :]
        if mistake == "o_normalized_without_ell":  # o / ℓ, the old ℓ never put back
            o = o / ell
        if mistake != "c_not_updated":
            c = c_new
    return o if mistake in ("not_normalized", "o_normalized_without_ell") else o / ell


_INVERTED = "掩码方向反了：约定 True = 可以关注，屏蔽的是 ~mask_j 的位置。"
_STREAMING_MISTAKES = [
    (_INVERTED, "inverted"),
    ("分数没有除以 √D（D 是 Q 的最后一维）。", "noscale"),
    (
        "分数乘了掩码（s · mask_j）：被屏蔽的分数成了 0，不是 −∞，exp(0 − c) > 0，"
        "这些键仍然分到了权重。屏蔽要用 s.masked_fill(~mask_j, −∞)（或加上 −∞ 的"
        "加性掩码），exp 之后它们才正好是 0。",
        "mask_multiplied",
    ),
    (
        "把布尔掩码直接加到了分数上（s + mask_j）：True 算作 +1、False 算作 +0，"
        "没有屏蔽任何键。要么 s.masked_fill(~mask_j, −∞)，要么先把掩码变成加性的"
        "（可见处 0、屏蔽处 −∞）再加。",
        "mask_added",
    ),
    (
        "mask_j 没有用上：被屏蔽的键也分到了权重。每块的分数先 "
        "s.masked_fill(~mask_j, −∞)，再取最大值和 exp。",
        "mask_ignored",
    ),
    (
        "最大值变大时忘了校正旧的累计量：ℓ 和 o 都要先乘 exp(c_旧 − c_新)，"
        "再加上新块的贡献。",
        "no_rescale",
    ),
    (
        "校正因子写反了：最大值从 c_旧 升到 c_新 时，旧的累计量 ℓ 和 o 要乘 "
        "exp(c_旧 − c_新)（不大于 1，缩小），你乘的是 exp(c_新 − c_旧)（放大）。",
        "fix_inverted",
    ),
    (
        "分母 ℓ 校正了，分子 o 没有：o 也要乘同一个校正因子 exp(c_旧 − c_新)。",
        "o_not_rescaled",
    ),
    (
        "分子 o 校正了，分母 ℓ 没有：ℓ 也要乘同一个校正因子 exp(c_旧 − c_新)，"
        "即 ℓ = ℓ · exp(c_旧 − c_新) + 本块的 Σ p。",
        "ell_not_rescaled",
    ),
    (
        "最后没有除以 ℓ：o 只是按 exp(s − c) 加权的和，输出是 o / ℓ。",
        "not_normalized",
    ),
    (  # learner test 65
        "掩码只用在了分母 ℓ 上：o 的 exp 用的还是没屏蔽的分数，"
        "被屏蔽的键仍把值加进了 o。ℓ 和 o 要用同一个 p = exp(s_屏蔽后 − c_新)。",
        "o_unmasked",
    ),
    (
        "c 没有更新：每块处理完要 c = c_新。c 一直是 −∞ 时，校正因子 exp(c − c_新) "
        "= 0 把前面各块的累计全部清零，结果只剩最后一块。",
        "c_not_updated",
    ),
    (
        "c_新 只取了本块的最大值：c_新 = max(c_旧, 本块最大值)，是到目前为止所有块的"
        "最大值。只用本块的最大值时，某行在一块里整块被屏蔽，c 就成了 −∞，下一块的"
        "校正因子 exp(−∞ − c_新) = 0 把前面的累计清零了。",
        "block_max",
    ),
    (  # learner test 66
        "每块各用自己的最大值取 exp，再直接相加：各块的 exp(s − c) 基准不同，不能直接"
        "相加。c 要取到目前为止所有块的最大值，c_新 = max(c_旧, 本块最大值)，旧的 ℓ 和 "
        "o 先乘 exp(c_旧 − c_新) 换到新的基准，再加上本块的贡献。",
        "own_block_max",
    ),
    (
        "跳过了一整块：只要有一行在这一块里全被屏蔽，你就跳过了这一块，可这一块对"
        "其他行仍有贡献。不要跳过块：全被屏蔽的行在这一块的 p 全是 0，只要 c 为 −∞ "
        "时用 c_safe 代替 c_新 去减，(c, ℓ, o) 自然不变。",
        "skipped_block",
    ),
    (
        "o 每块都除以了新的 ℓ，下一块却直接乘 exp(c_旧 − c_新) 再加 p V_j："
        "归一化过的 o 要先乘回旧的 ℓ，"
        "即 o = (o · ℓ_旧 · exp(c_旧 − c_新) + p V_j) / ℓ_新；"
        "更简单的是 o 不归一化，最后才除以 ℓ。",
        "o_normalized_without_ell",
    ),
    (
        "把每块各自 softmax 的结果取了平均：各块 softmax 的分母不同，不能等权平均，"
        "要按各块的 Σ exp(s − c) 加权，这正是 (c, ℓ, o) 的在线更新做的事。",
        "block_softmax_mean",
    ),
    (
        "缩放因子用的是 √D_v（V 的最后一维）：应除以 √D，D 是 Q 和 K 的最后一维，"
        "这里 D ≠ D_v。",
        "scale_dv",
    ),
    (
        "缩放因子用的是 √b（块的大小）：应除以 √D，D 是 Q 和 K 的最后一维；"
        "缩放只看向量的维度，与怎样分块无关。",
        "scale_block",
    ),
    (
        "第 1 块没有算进结果：先用 next(blocks) 取出的那一块也要参与更新 (c, ℓ, o)，"
        "迭代器交出的块不会再来第二次。",
        "first_block_dropped",
    ),
]

# learner test 45d, 4.5: s + (~m) * -30.0, right everywhere but where the masked keys
# score 100 higher
_WEAK_FILL = (
    "被屏蔽的键仍然拿走了几乎全部权重：屏蔽用的是一个有限的数（如 −30），被屏蔽的键"
    "分数比可见的键高 100 以上时，减去它也还是最大的。屏蔽要用 −∞："
    "s.masked_fill(~mask_j, float('-inf'))（再配合 c_safe 处理整块被屏蔽的行）。"
)
_LEADING_MASKED = (
    "前面的块整块被屏蔽时，这一行的最大值 c 还是 −∞，exp(s − c) 成了 "
    "exp(−∞ − (−∞)) = NaN：用 c_safe = where(c_新 = −∞, 0, c_新) 代替 "
    "c_新 去减（此时 exp(c_旧 − c_safe) = exp(−∞) = 0，正好清零）。"
)
# what a NaN or inf means, by the kind of mask of the case
_NONFINITE_HINTS = {
    "left_pad": _LEADING_MASKED,
    "row_starts": _LEADING_MASKED,
    "none": "输出有 nan 或 inf。若没有减最大值：exp 溢出了，先减去目前为止的"
    "最大分数 c，再取 exp。若减了：减的要是每一行自己的最大值，c 的形状是 "
    "(…, L, 1)，按行 "
    "amax(-1, keepdim=True)；整块共用一个最大值（s.max()）时，分数远低于它的行 "
    "exp(s − c) 全部下溢成 0，ℓ = 0，结果是 0/0 = NaN。",
    "random": "第 1 块里每行都有可见的键，NaN 出在后面某一块里某行全被屏蔽的时候："
    "c_新 = max(c_旧, 本块最大值) 仍是有限的，exp(s − c_新) = 0，这一行在这块没有贡献。"
    "若 c_新 只取了本块的最大值（−∞），exp(−∞ − (−∞)) 就成了 NaN。",
    # learner test 49f: one maximum over every row, exact on paper
    "row_scales": "每一行要减去它自己的最大值：c 的形状是 (…, L, 1)，按行取 "
    "amax(-1, keepdim=True)。用整块（或全部查询）共同的最大值时，分数远低于它的那一行 "
    "exp(s − c) 全部下溢成 0，ℓ = 0，结果是 0/0 = NaN。",
    # learner test 63: c started at 0 rather than −∞ dodges the NaN of masked blocks
    "low_row": "第 1 行的分数全都远低于 0（−100 以下）：c 的初值要是 −∞，不能是 0。"
    "c 从 0 开始时 c_新 = max(0, 本块最大值) = 0，这一行的 exp(s − 0) 全部下溢成 0，"
    "ℓ = 0，最后 0/0 = NaN。整块被屏蔽的行照旧用 c_safe 处理。",
    "loud_masked": "被屏蔽的键分数比可见的键高 100 以上，在 exp 之后才乘掩码就会出 "
    "NaN。若最大值 c 把被屏蔽的键也算进去，可见键的 exp(s − c) 全部下溢成 0，ℓ = 0，"
    "结果是 0/0 = NaN；若 c 只取可见的键，被屏蔽键的 exp(s − c) 上溢成 inf，"
    "inf × 0 = NaN。先屏蔽再取最大值：masked_fill(~mask_j, −∞) 之后再 amax 和 exp。",
}


def _streaming_mask(
    kind: str, batch: tuple[int, ...], L: int, S: int, b: int, g: torch.Generator
) -> Tensor:
    """The case's bool mask, True = may attend; no row is masked everywhere."""
    if kind == "random":
        mask = torch.rand(L, S, generator=g) < 0.7
        mask[:, 0] = True
    elif kind == "left_pad":  # the second sequence's first 40 keys are padding
        mask = torch.ones(batch[0], 1, S, dtype=torch.bool)
        mask[1, :, :40] = False
    elif kind in ("none", "row_scales", "low_row"):
        mask = torch.ones(L, S, dtype=torch.bool)
    elif kind == "loud_masked":  # a third of the keys masked, the same for every row
        mask = torch.rand(1, S, generator=g) < 0.7
        mask[:, 0] = True
    else:  # row r sees keys from a random start on (its first blocks all masked)
        starts = torch.randint(0, 6 * b, (*batch, L, 1), generator=g)
        mask = torch.arange(S) >= starts
        mask &= torch.rand(*batch, L, S, generator=g) < 0.8
        mask[..., -1] = True
    return mask


# the learner treated the stream of blocks as a list or a tensor
STREAMING_CRASHES = [
    (  # learner test 45d, 4.5: s[~m] = -1e30 with a mask that only broadcasts
        r"shape of the mask",
        "布尔索引 s[~mask_j] = … 要求掩码与 s 的形状完全相同，不会广播（mask_j 可以是 "
        "(1, b) 或 (N, 1, b) 这样只能广播的形状）：用 s.masked_fill(~mask_j, "
        "float('-inf'))，它按广播规则展开掩码。",
    ),
    (
        r"has no len|not subscriptable|no attribute 'size'|no attribute 'shape'",
        "blocks 是一个迭代器，不是列表或张量：只能用 for K_j, V_j, mask_j in blocks: "
        "逐块取，既不能取长度，也不能按下标取。",
    ),
]


def _held_hint(held: list[tuple[int, list[int]]]) -> str:
    """What the old blocks found alive (``(j, [i, …])`` at the request of block j)
    say: one name still bound to one block, every block kept, or the last few."""
    first_j, first_old = held[0]
    said = (
        f"取第 {first_j} 块时，第 {first_old[0]} 块还留在内存里。"
        "练习要求每次只保留当前块。"
    )
    if len({i for _, old in held for i in old}) == 1:
        return said + (
            "留下的只是这一块：还有一个名字指着它，例如先用 first = next(blocks) "
            "取出第一块来定状态的形状，或把上一块存进 prev 留到了下一轮。用完就 del 它"
            "（或让这个名字改指当前块），在 for 循环里处理完一块就丢掉它。"
        )
    last_j, last_old = held[-1]
    if len(last_old) < last_j - 1:  # some old blocks were let go, the last few kept
        most = max(len(old) for _, old in held)
        return said + (
            f"取新的一块时，最多同时还留着 {most} 块比上一块更早的块（例如列表或队列里"
            "留着最近几块）：(c, ℓ, o) 已经记下了旧块的贡献，用不到它们。在 for 循环里"
            "处理完一块就丢掉它。"
        )
    return said + (
        "旧的块一块都没有释放：不要先 list(blocks) 或把块（K_j、V_j 或 mask_j，哪怕"
        "只存其中一样）存进列表，在 for 循环里处理完一块就丢掉它。"
    )


@checker("流式（在线 softmax）注意力")
def check_streaming_attention(fn) -> str:
    """Grade ``fn(Q, blocks)``: Q ``(…, L, D)``; ``blocks`` an iterator of
    ``(K_j, V_j, mask_j)``, K_j ``(…, b_j, D)``, V_j ``(…, b_j, D_v)``, mask_j bool,
    broadcastable to ``(…, L, b_j)``, True = may attend; returns the exact masked
    softmax attention ``(…, L, D_v)``. Streaming is graded too: when block j is
    requested, no block older than j − 1 may still be alive, and no new tensor, nor
    all the learner's live tensors together, may grow with the number of keys S
    (S is much larger than L, D and the block size)."""
    name = name_of(fn)
    g = seeded_generator(47)
    # (description, batch shape, L, D, D_v, S, b, mask kind, score scale)
    cases = [
        ("Q (2, 3, 8)，S=256 个键，每块 4 个；随机掩码 (L, S)",
         (2,), 3, 8, 8, 256, 4, "random", 1.0),
        ("左侧填充：第 2 个序列的前 40 个键（前 10 块）全被屏蔽，掩码 (N, 1, S)",
         (2,), 3, 4, 4, 256, 4, "left_pad", 1.0),
        ("分数很大（q、k 放大 10 倍）：不减去最大值，exp 会溢出",
         (2,), 3, 4, 4, 256, 4, "none", 10.0),
        ("Q (2, 2, 5, 6)，D_v=3，S=300，每块 8 个（最后一块 4 个）；"
         "每行前面若干块全被屏蔽，掩码 (N, H, L, S)",
         (2, 2), 5, 6, 3, 300, 8, "row_starts", 1.0),
        ("被屏蔽的键分数比可见的键高 100 以上，掩码 (1, S)",
         (2,), 3, 4, 4, 256, 4, "loud_masked", 1.0),
        ("各行分数的尺度相差悬殊（第 1 行的查询放大 60 倍，第 2 行缩小到 0.1）",
         (2,), 2, 8, 4, 64, 8, "row_scales", 1.0),
        ("第 1 行的分数全都远低于 0（−100 以下），其余行正常",
         (2,), 3, 4, 4, 64, 8, "low_row", 1.0),
    ]  # fmt: skip
    peak = 0
    for i, (case, batch, L, D, Dv, S, b, kind, scale) in enumerate(cases):
        q = randn(g, *batch, L, D, scale=scale)
        k = randn(g, *batch, S, D, scale=scale)
        v = randn(g, *batch, S, Dv)
        mask = _streaming_mask(kind, batch, L, S, b, g)
        if (
            kind == "loud_masked"
        ):  # q > 1 and masked keys 100·(1, …, 1): scores ≥ 100·D/√D
            q = q.abs() + 1
            k[..., ~mask[0], :] = 100.0
        if kind == "row_scales":  # one row's scores hundreds above the other's
            q, k = q * torch.tensor([[60.0], [0.1]]), k * 10
        if kind == "low_row":  # k > 1 and row 0 of q < −60: its scores ≤ −60·D/√D
            k = k.abs() + 1
            q[..., 0, :] = -60 * (q[..., 0, :].abs() + 1)
        lead = math.prod(batch)
        # one block plus O(L·D) state, with room to spare; anything that grows with S
        # (a concatenation, the full score matrix, a list of all the blocks) is larger
        cap = 4 * lead * (L * D + L * Dv + L * b + b * D + b * Dv)
        cap += mask[..., :b].numel()
        watch, held = _MemoryWatch(), []
        stream = _stream_blocks(k, v, mask, b, watch, held)
        with watch:
            out = run_learner(fn, q, stream, what=name, case=case, first=i == 0,
                              causes=STREAMING_CRASHES)  # fmt: skip
        out = as_tensor(out, f"{name} 的输出", case)
        check_shape(
            out,
            (*batch, L, Dv),
            f"{name} 的输出",
            case,
            " 输出与 Q 的前几维相同，最后一维是 V 的维度 D_v。",
        )
        check_float(out, f"{name} 的输出")
        hint = _NONFINITE_HINTS.get(kind)
        check_finite(out, f"{name} 的输出", case, f"\n提示：{hint}" if hint else "")
        s = (q.double() @ k.double().mT) / math.sqrt(D)
        ref = torch.softmax(s.masked_fill(~mask, -math.inf), dim=-1) @ v.double()
        if not close(out, ref):
            hint = first_reproduced(
                out,
                _STREAMING_MISTAKES,
                functools.partial(_streaming_variant, q, k, v, mask, b),
            )
            if kind == "loud_masked" and hint in (None, _INVERTED):
                # an inverted mask fails the first case already: here, a finite fill
                hint = _WEAK_FILL
            fail(
                f"{name} 的输出不对（{case}）：{where_differs(out, ref)}。"
                + (f"\n提示：{hint}" if hint else "")
            )
        if held:
            fail(f"{name} 的结果正确，但不是流式的（{case}）：{_held_hint(held)}")
        numel, op, shape = watch.largest
        if numel > cap or watch.peak_alive > cap:
            what = (
                f"{op} 得到了形状 {shape} 的张量（{numel} 个元素）"
                if numel > cap
                else f"你的张量同时占了 {watch.peak_alive} 个元素"
            )
            fail(
                f"{name} 的结果正确，但不是流式的（{case}）：{what}，随键数 S={S} "
                f"增长；一块加上 (c, ℓ, o) 状态最多约 {cap} 个。不要拼接各块"
                "（torch.cat）或存下每块的分数/部分结果：每来一块就用校正因子"
                " exp(c_旧 − c_新) 更新 (c, ℓ, o)。"
            )
        peak = max(peak, watch.peak_alive)
    return (
        f"{len(cases)} 种情形，含前几块整块被屏蔽与大分数；流式，同时最多 {peak} 个元素"
    )


# ---------------------------------------------------------------------------
# grouped-query attention
# ---------------------------------------------------------------------------

_COPYING = {"repeat_interleave", "repeat", "tile"}
_MATMULS = {"matmul", "__matmul__", "bmm"}
_AXIS_SWAPS = {"transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims"}


class _CopyWatch(TorchFunctionMode):
    """What the learner's torch calls do with the key-value heads: a ``repeat``-like
    call, the reference itself (``F.scaled_dot_product_attention(enable_gqa=True)``),
    and, with :class:`_CopyFinder`, every tensor that torch materialises holding more
    than the ``H_kv`` given copies of the (S, D) rows, inside torch's own functions too
    (a broadcasting ``matmul`` expands and clones its operand)."""

    def __init__(self, kv_numel: int, S: int, D: int) -> None:
        super().__init__()
        self.kv_numel, self.S, self.D = kv_numel, S, D
        self.calls: list[str] = []
        self.reference = False
        self.current = ""  # the learner's torch call now running
        self.ops: list[str] = []  # the learner's torch calls, in order

    def is_kv(self, t: object) -> bool:
        """Whether ``t`` holds key or value rows (a mask, also repeated, does not):
        its last two dims of size > 1 are (S, D) or (D, S); einsum's internal copies
        end in a dim of size 1 (learner test 64)."""
        if not isinstance(t, Tensor):
            return False
        dims = tuple(n for n in t.shape if n != 1)[-2:]
        return dims in ((self.S, self.D), (self.D, self.S))

    def merged_by_transpose(self) -> bool | None:
        """Whether an axis swap follows the last softmax (the merge step swapped
        axes); ``None`` without a softmax call (nothing to tell the steps apart)."""
        if "softmax" not in self.ops:
            return None
        last = len(self.ops) - self.ops[::-1].index("softmax")
        return any(op in _AXIS_SWAPS for op in self.ops[last:])

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in _COPYING and self.is_kv(args[0] if args else None):
            self.calls.append(name)
        if name == "scaled_dot_product_attention" and (kwargs or {}).get("enable_gqa"):
            self.reference = True
        self.current = name
        self.ops.append(name)
        return func(*args, **(kwargs or {}))


class _CopyFinder(TorchDispatchMode):
    """Records, for :class:`_CopyWatch`, each new tensor (not a view of an input) whose
    last two dims are (S, D) or (D, S) and that has more elements than k itself."""

    def __init__(self, watch: _CopyWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        w = self.watch
        if w.is_kv(out) and out.numel() > w.kv_numel:
            inputs = {
                t.untyped_storage().data_ptr()
                for t in tree_leaves((args, kwargs))
                if isinstance(t, Tensor)
            }
            if out.untyped_storage().data_ptr() not in inputs:
                op = func.overloadpacket.__name__
                w.calls.append(
                    f"{w.current}（其中 {op} 得到形状 {tuple(out.shape)} 的新张量）"
                )
        return out


def _gqa_masked(s: Tensor, mask: Tensor, G: int, mistake: str) -> Tensor:
    """Scores ``s`` (N, H, L, S) with the (L, S) ``mask``, as right or as a masking
    mistake applies it. ``mask_interleaved``: the mask made (G·L, S) for the grouped
    rows with ``repeat_interleave`` (row r of a group gets mask row r // G);
    ``mask_tiled_lg``: the rows made in (L, G) order (row l·G + g is query position l of
    group member g) but the mask tiled with ``repeat(G, 1)`` (row r gets mask row
    r % L)."""
    if mistake in ("mask_ignored", "weights_zeroed"):  # the latter masks after softmax
        return s
    if mistake == "mask_own_tril":  # the passed mask ignored, tril() built instead
        mask = torch.ones_like(mask).tril()
    if mistake == "mask_first_group":  # the mask on the first L grouped rows only
        rows = torch.ones(G * mask.size(0), mask.size(1), dtype=torch.bool)
        rows[: mask.size(0)] = mask
        mask = rows.view(G, mask.size(0), -1).repeat(s.size(1) // G, 1, 1)
    if mistake == "mask_multiplied":
        return s * mask
    if mistake == "mask_interleaved":
        L = mask.size(0)
        rows = mask.repeat_interleave(G, 0).view(G, L, -1)  # (G, L, S): row g·L + l
        mask = rows.repeat(s.size(1) // G, 1, 1)  # query head h = kv·G + g
    if mistake == "mask_tiled_lg":
        L = mask.size(0)
        g, pos = torch.arange(G)[:, None], torch.arange(L)
        rows = mask[(pos * G + g) % L]  # (G, L, S): query (g, l) sits at row l·G + g
        mask = rows.repeat(s.size(1) // G, 1, 1)
    return s.masked_fill(~mask, -math.inf)


def _gqa_variant(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, mistake: str) -> Tensor:
    """Grouped attention with one typical mistake (for diagnosis); the layout mistakes
    (rows regrouped) are told apart on the cases without masked keys, where the mask
    changes nothing, so they leave it out."""
    N, H, L, D = q.shape
    Hkv = k.size(1)
    G = H // Hkv
    if mistake == "dim_grouped_rows":  # softmax over the G·L rows of a group
        rows = q.reshape(N, Hkv, G * L, D)
        w = torch.softmax(rows @ k.mT / math.sqrt(D), dim=-2)
        return (w @ v).reshape(N, H, L, D)
    if mistake in ("q_transposed", "q_transposed_back"):  # (N, L, H, D) rows regrouped
        rows = q.transpose(1, 2).reshape(N, Hkv, G * L, D)
        out = torch.softmax(rows @ k.mT / math.sqrt(D), dim=-1) @ v
        if mistake == "q_transposed":
            return out.reshape(N, H, L, D)
        return out.reshape(N, L, H, D).transpose(1, 2)
    if mistake == "modulo":  # query head h uses key-value head h % H_kv
        kv_of = torch.arange(H) % Hkv
    else:
        kv_of = torch.arange(H) // G
    k, v = k[:, kv_of], v[:, kv_of]
    s = q @ k.mT
    s = {
        "noscale": s,
        "groupscale": s / math.sqrt(D * G),
        "scale_s": s / math.sqrt(k.size(2)),
    }.get(mistake, s / math.sqrt(D))
    s = _gqa_masked(s, mask, G, mistake)
    w = torch.softmax(s, dim=-2 if mistake == "dim" else -1)
    if mistake == "weights_zeroed":  # masked weights 0, the rows not renormalised
        w = w * mask
    out = w @ v
    if (
        mistake == "groups_transposed"
    ):  # (N, H_kv, G, L, D) -> transpose(2, 3) -> reshape
        return out.view(N, Hkv, G, L, D).transpose(2, 3).reshape(N, H, L, D)
    if mistake == "groups_as_l_g":  # (N, H_kv, G·L, D) read as (N, H_kv, L, G, D)
        return out.reshape(N, Hkv, L, G, D).transpose(2, 3).reshape(N, H, L, D)
    return out


_GQA_MISTAKES = [
    (
        "查询头与键值头的对应关系错了：你的结果是查询头 h 用了键值头 h % H_kv。"
        "约定是相邻的 G = H/H_kv 个查询头共享一组，即查询头 h 用键值头 h // G："
        "把 q 直接 reshape 为 (N, H_kv, G·L, D)（先是组、再是组内的头），"
        "不是 (N, G, H_kv, L, D) 那样先排组内序号。",
        "modulo",
    ),
    *(
        (
            "变形 q 之前先交换了 H 和 L（q.transpose(1, 2) 再 reshape）：这样 "
            "(N, H_kv, G·L, D) 的一组行里混进了别的组的查询头，它们用错了键值头。"
            "q 本来就是 (N, H, L, D)，相邻 G 个头连在一起：直接 "
            "q.reshape(N, H_kv, G·L, D)，不要先 transpose。",
            mistake,
        )
        for mistake in ("q_transposed_back", "q_transposed")
    ),
    ("分数没有除以 √D（D 是每个头的维度）。", "noscale"),
    ("缩放多乘了组大小：分数应除以 √D，不是 √(D·G)。", "groupscale"),
    *(
        (
            "softmax 的 dim 写错了：你沿查询（行）的维度归一化了，"
            "应在键的维度（最后一维，dim=-1）上归一化。",
            mistake,
        )
        for mistake in ("dim", "dim_grouped_rows")
    ),
    ("分数除以的是 √S（键的个数）：应除以 √D，D 是每个头的维度。", "scale_s"),
    (
        "mask 没有用上：被屏蔽的键也分到了权重。softmax 之前把 mask 为 False 的分数"
        "填成 −∞。",
        "mask_ignored",
    ),
    (
        "没有用传进来的 mask，自己用 tril() 造了一个因果掩码：缓存之后预填充时，查询 i "
        "在全部 S 个键里的位置是 S − L + i，应看键 j ≤ S − L + i，tril() 却只让它看 "
        "j ≤ i（有填充时它也不知道哪些键是填充）。直接用参数 mask。",
        "mask_own_tril",
    ),
    (
        "mask 只加在了每组的前 L 行（第一个查询头）上：分组后的 G·L 行里，每个查询头"
        "都要用同一个 (L, S) 的 mask。把分数 view 成 (N, H_kv, G, L, S)，mask 直接"
        "广播；或用 mask.repeat(G, 1)。",
        "mask_first_group",
    ),
    (
        "分数乘了掩码：被屏蔽的分数成了 0，不是 −∞，exp 之后仍有权重。"
        "用 masked_fill(~mask, −∞)。",
        "mask_multiplied",
    ),
    (
        "softmax 之后才把被屏蔽的权重置 0：剩下的权重没有重新归一化，每行的和小于 1。"
        "屏蔽要放在 softmax 之前：把 mask 为 False 的分数填成 −∞，softmax 之后"
        "它们正好是 0，其余的权重和为 1。",
        "weights_zeroed",
    ),
    (
        "掩码的行排错了：(N, H_kv, G·L, S) 的一组行是组内序号在前、位置在后 (G, L)，"
        "第 g·L + l 行要用 mask[l]；mask.repeat_interleave(G, 0) 给的是 "
        "mask[(g·L + l) // G]。"
        "把分数 view 成 (N, H_kv, G, L, S)，(L, S) 的 mask 直接广播；或用 "
        "mask.repeat(G, 1)。",
        "mask_interleaved",
    ),
    (
        "掩码的行序与查询的行序不一致：你把查询排成了位置在前、组内序号在后 (L, G)"
        "（第 l·G + g 行是位置 l），掩码却用 mask.repeat(G, 1) 按 (G, L) 铺开"
        "（第 r 行用 mask[r % L]）。(L, G) 的行要配 mask.repeat_interleave(G, 0)；"
        "更简单的是按 (G, L) 排：q.reshape(N, H_kv, G·L, D) 直接变形，配 "
        "mask.repeat(G, 1)。",
        "mask_tiled_lg",
    ),
    # the G·L rows made in (L, G) order and merged as (G, L), or the other way round:
    # the same output, so the learner's calls tell which step swapped the axes
    ("{regroup}", "groups_transposed"),
    (
        "合并各组时把 (N, H_kv, G·L, D) 当成了 (N, H_kv, L, G, D)：q 变形时 G·L 这一维"
        "是组内序号在前、位置在后（(N, H_kv, G, L, D) 合并而来），所以输出直接 "
        "reshape(N, H, L, D) 就对，不要 view 成 (…, L, G, D) 再 transpose(2, 3)。",
        "groups_as_l_g",
    ),
]


_REPEAT_NOTE = (
    "你调用了 repeat：k.repeat(1, G, 1, 1) 把整组键值头重复 G 遍"
    "（头序 0, 1, 0, 1, …），正是 h % H_kv；"
    "repeat_interleave 才是每个头连着重复（0, 0, 1, 1, …）。"
    "不过练习要求根本不复制键值头。"
)
_REGROUP_HINTS = {
    True: "合并各组时先交换了 G 和 L：(N, H_kv, G, L, D) 直接 reshape(N, H, L, D) "
    "就对（H_kv 与 G 相邻，合起来正是 H，头 h = 组·G + 组内序号），"
    "不要先 transpose(2, 3)。",
    False: "拆分 q 时 G·L 这一维的顺序错了：你把查询排成了位置在前、组内序号在后 "
    "(L, G)（例如先 transpose 成 (N, L, H, D) 再分组），合并时却按 (G, L) 读回，"
    "各行错了位。q 本来就是 (N, H, L, D)，相邻 G 个头连在一起：直接 "
    "q.reshape(N, H_kv, G·L, D)（组内序号在前），输出直接 reshape(N, H, L, D)，"
    "都不用 transpose/permute。",
    None: "拆分 q 与合并输出时 G·L 这一维的顺序不一致：一处是组内序号在前 (G, L)，"
    "另一处是位置在前 (L, G)。两处都用 (G, L)：q.reshape(N, H_kv, G·L, D)，"
    "输出直接 reshape(N, H, L, D)，都不用 transpose/permute。",
}


GQA_CRASHES = [
    (  # learner test: mask.T on the scores (crashes where L ≠ S)
        r"(?s)(must match the size of tensor b|shape mismatch|cannot be broadcast)"
        r".*\bmask\w*\s*\.\s*(m?T\b|t\(\)|transpose\b)",
        "mask 被转置了：mask[i, j] 说的是查询 i 能否看键 j，形状 (L, S)，与每个查询头"
        "的分数矩阵 (L, S) 同向，直接用它，不要转置。",
    ),
    # the (L, S) mask put on the (N, H_kv, G·L, S) scores as it is
    (
        r"must match the size of tensor b|shape mismatch|cannot be broadcast",
        "mask 是 (L, S)，分组后的分数是 (N, H_kv, G·L, S)，G > 1 时两者对不上："
        "把分数 view 成 (N, H_kv, G, L, S)，mask 就能直接广播"
        "（每个查询头用同一个 mask）。",
    ),
]


def _gqa_mask(kind: str, L: int, S: int) -> Tensor:
    """The case's bool (L, S) mask, True = may attend; no row fully masked."""
    mask = torch.ones(L, S, dtype=torch.bool)
    if kind == "prefill":  # the last L of S positions: query i sees j ≤ S − L + i
        mask = mask.tril(S - L)
    elif kind == "padding":  # the first 3 keys are padding
        mask[:, :3] = False
    return mask


@checker("分组查询注意力")
def check_grouped_attention(fn) -> str:
    """Grade ``fn(q, k, v, mask)``: q ``(N, H, L, D)``, k and v ``(N, H_kv, S, D)``
    with ``H`` a multiple of ``H_kv``, mask bool ``(L, S)`` (True = may attend, the
    same for every head); returns ``(N, H, L, D)``, query head ``h`` attending with
    key-value head ``h // (H // H_kv)``, scaled by ``1/√D``. The first cases mask no
    key (the grouping is graded there), the later ones are a causal prefill after a
    cache (the mask on the grouped rows). Compared with
    ``F.scaled_dot_product_attention(..., enable_gqa=True)``; calling that reference, a
    ``repeat_interleave``/``repeat``/``tile`` of the keys or values, or any new tensor
    holding more than ``H_kv`` copies of them (also one made inside a broadcasting
    ``matmul``) fails."""
    name = name_of(fn)
    g = seeded_generator(41)
    # (description, N, H, H_kv, L, S, D, mask): L, S, D distinct so a copy is
    # recognisable
    cases = [
        ("N=2, H=6, H_kv=2（每组 3 个查询头），L=5, S=7, D=4，mask 全 True",
         2, 6, 2, 5, 7, 4, "none"),
        ("N=1, H=8, H_kv=1（MQA），L=3, S=9, D=6，mask 全 True",
         1, 8, 1, 3, 9, 6, "none"),
        ("N=2, H=4, H_kv=4（普通多头，G=1），L=6, S=6, D=5，因果 mask",
         2, 4, 4, 6, 6, 5, "prefill"),
        ("N=3, H=4, H_kv=2，解码一步 L=1, S=11, D=8，前 3 个键是填充",
         3, 4, 2, 1, 11, 8, "padding"),
        ("N=2, H=6, H_kv=2，缓存 6 个位置后预填充 L=4 个（S=10），D=5，"
         "因果 mask：查询 i 看键 j ≤ 6 + i", 2, 6, 2, 4, 10, 5, "prefill"),
        ("N=1, H=8, H_kv=1（MQA），缓存 3 个位置后预填充 L=4 个（S=7），D=3，因果 mask",
         1, 8, 1, 4, 7, 3, "prefill"),
    ]  # fmt: skip
    for i, (case, N, H, Hkv, L, S, D, kind) in enumerate(cases):
        q, k, v = randn(g, N, H, L, D), randn(g, N, Hkv, S, D), randn(g, N, Hkv, S, D)
        mask = _gqa_mask(kind, L, S)
        watch = _CopyWatch(k.numel(), S, D) if Hkv < H else None
        run = functools.partial(run_learner, fn, q, k, v, mask, what=name, case=case,
                                first=i == 0, causes=GQA_CRASHES)  # fmt: skip
        if watch is None:
            out = run()
        else:
            with watch, _CopyFinder(watch):
                out = run()
            if watch.reference:
                fail(
                    f"{name} 调用了 F.scaled_dot_product_attention(..., "
                    f"enable_gqa=True)（{case}）：那正是检查器用来比较的参考实现，分组由它替你做了。"
                    "练习要你自己写出分组：把 q 变形为 (N, H_kv, G·L, D)，与 k、v 做"
                    "矩阵乘法。"
                )
        out = as_tensor(out, f"{name} 的输出", case)
        check_shape(
            out,
            (N, H, L, D),
            f"{name} 的输出",
            case,
            " 输出应与 q 同形 (N, H, L, D)：每个查询头一份输出；若你把 q 变形成了"
            " (N, H_kv, G, L, D)，最后要 reshape 回 (N, H, L, D)。",
        )
        check_float(out, f"{name} 的输出")
        inverted = kind == "none" and not bool(out.isfinite().any())
        check_finite(
            out,
            f"{name} 的输出",
            case,
            "\n提示：mask 全 True 时输出全是 NaN：掩码方向反了。True = 可以关注，"
            "要屏蔽的是 ~mask：masked_fill(~mask, −∞)。"
            if inverted
            else "",
        )
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        if not close(out, ref):
            hint = first_reproduced(
                out,
                _GQA_MISTAKES,
                functools.partial(_gqa_variant, q, k, v, mask),
                regroup=_REGROUP_HINTS[watch.merged_by_transpose() if watch else None],
            )
            if hint == _GQA_MISTAKES[0][0] and watch and "repeat" in watch.calls:
                hint += _REPEAT_NOTE  # h % H_kv made by k.repeat
            fail(
                f"{name} 的输出不对（{case}）：{where_differs(out, ref)}。"
                + (f"\n提示：{hint}" if hint else "")
            )
        if watch is not None and watch.calls:
            broadcast = any(c.split("（")[0] in _MATMULS for c in watch.calls)
            fail(
                f"{name} 的结果正确，但把键值头复制成了 H 份（{case}：调用了 "
                f"{', '.join(dict.fromkeys(watch.calls))}）。"
                + (
                    "矩阵乘法沿组的维度广播 k、v 时（k.unsqueeze(2) 或 expand），"
                    "PyTorch 先把它们展开再复制成 G 份，才能交给批量矩阵乘法：这就是 "
                    "H 份键值。"
                    if broadcast
                    else ""
                )
                + "练习要求不复制：把 G 并进查询的行，q.reshape(N, H_kv, G·L, D) "
                "@ k.mT，再乘 v，最后 reshape 回 (N, H, L, D)；k、v 不加维度，也就"
                "不用广播。"
            )
    return f"{len(cases)} 种形状，含 MQA、G=1 与缓存之后的因果预填充，未复制键值头"


# ---------------------------------------------------------------------------
# sparsemax
# ---------------------------------------------------------------------------


# the support test 1 + k·z_(k) > cs, and as typical mistakes write it
_SUPPORT_TESTS = {
    "": lambda ks, zs, cs: 1 + ks * zs > cs,
    "no_one": lambda ks, zs, cs: ks * zs > cs,  # the page's bug
    "no_one_plus_one": lambda ks, zs, cs: ks * zs > cs,  # and k + 1 in the τ line
    "no_one_at_least": lambda ks, zs, cs: ks * zs >= cs,  # true for top ties only
    "no_k": lambda ks, zs, cs: 1 + zs > cs,  # the rank k left out
}


def _sparsemax_tau(cs: Tensor, k: Tensor, mistake: str) -> Tensor:
    """τ from the sorted cumulative sums ``cs`` and the support size ``k``, with the
    τ-line mistake ``mistake`` (any other: the right τ)."""
    n = cs.size(-1)
    if mistake == "k_zero_based":
        return (cs.gather(-1, k - 1) - 1) / (k - 1).clamp(min=1)
    if mistake == "mean_threshold":  # tau = mean of all entries - 1/n
        # also what sorting ascending gives: 1 + k·z_(k) > cs holds at every k then
        return (cs[..., -1:] - 1) / n
    if mistake == "sum_shifted":  # cs[k] where cs[k - 1] is the sum of the top k
        return (cs.gather(-1, k.clamp(max=n - 1)) - 1) / k
    if mistake == "no_minus_one":
        return cs.gather(-1, k - 1) / k
    if mistake == "plus_one":  # learner test 65: + 1 where − 1 belongs
        return (cs.gather(-1, k - 1) + 1) / k
    if mistake == "no_parentheses":  # cs[k - 1] / k - 1: divided first, then 1 taken
        return cs.gather(-1, k - 1) / k - 1
    if mistake == "tau_over_n":  # the right sum, divided by the length n
        return (cs.gather(-1, k - 1) - 1) / n
    return (cs.gather(-1, k - 1) - 1) / k


def _sparsemax_variant(z: Tensor, mistake: str) -> Tensor:
    """sparsemax along the last dim with one typical mistake (for diagnosis)."""
    if mistake == "softmax":
        return torch.softmax(z, dim=-1)
    if mistake == "sorted_order":  # right values, in the sorted order of zs
        return _sparsemax_variant(z, "").sort(dim=-1, descending=True).values
    if mistake == "renormalised":  # the bug left in, the output divided by its sum
        wrong = _sparsemax_variant(z, "no_one")
        return wrong / wrong.sum(-1, keepdim=True)
    if mistake == "argmax":  # one-hot of the (first) largest entry
        return torch.zeros_like(z).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    n = z.size(-1)
    zs = z if mistake == "unsorted" else z.sort(dim=-1, descending=True).values
    ks = torch.arange(0 if mistake == "ranks_from_zero" else 1, n + 1, dtype=z.dtype)[
        :n
    ]
    cs = (z if mistake == "cs_unsorted" else zs).cumsum(-1)
    support = _SUPPORT_TESTS.get(mistake, _SUPPORT_TESTS[""])(ks, zs, cs)
    k = support.sum(-1, keepdim=True).clamp(min=1)
    if mistake == "no_one_plus_one":  # the bug left in, its k raised by one
        k = (k + 1).clamp(max=n)
    out = z - _sparsemax_tau(cs, k, mistake)
    return out if mistake == "no_clamp" else out.clamp(min=0)


_SPARSEMAX_MISTAKES = [
    ("这是 softmax 的结果：sparsemax 是向单纯形的欧氏投影，max(z − τ, 0)。", "softmax"),
    (
        "输出有负数：最后一步要截断 max(z − τ, 0)（torch.clamp(z - tau, min=0)）。",
        "no_clamp",
    ),
    (
        "阈值用错了 k：支撑集大小 k 从 1 数起，τ = (前 k 大之和 − 1) / k。",
        "k_zero_based",
    ),
    (
        "支撑集的判据不对：应为 1 + k·z_(k) > 前 k 大之和，名次 k = 1, 2, …, n；"
        "你的名次 k 从 0 数起了。",
        "ranks_from_zero",
    ),
    (
        "支撑集的判据少了 1，> 又换成了 ≥：k·z_(k) ≥ 前 k 大之和只在前 k 个并列"
        "最大时成立，支撑集就只剩并列最大的那几个。判据是 1 + k·z_(k) > 前 k 大之和。",
        "no_one_at_least",
    ),
    (
        "支撑集的判据少了 1：应为 1 + k·z_(k) > 前 k 大之和。",
        "no_one",
    ),
    (
        "支撑集的判据少了名次 k：应为 1 + k·z_(k) > 前 k 大之和，不是 1 + z_(k) > "
        "前 k 大之和（k = torch.arange(1, n + 1)）。",
        "no_k",
    ),
    (
        "τ 用错了前 k 大之和：cs = zs.cumsum(-1) 的下标从 0 开始，前 k 个之和是 "
        "cs[k − 1]（cs.gather(-1, k - 1)），不是 cs[k]。",
        "sum_shifted",
    ),
    ("τ 少了 −1：τ = (前 k 大之和 − 1) / k。", "no_minus_one"),
    (
        "τ 里写成了 + 1：τ = (前 k 大之和 − 1) / k。+ 1 让 τ 大了 2/k，"
        "支撑集上 z − τ 的和成了 −1，截断之后输出多半是 0，和不再是 1。",
        "plus_one",
    ),
    (
        "τ 那一行少了括号：cs.gather(-1, k - 1) / k - 1 是先除以 k 再减 1，"
        "应是 (前 k 大之和 − 1) / k，即 (cs.gather(-1, k - 1) - 1) / k。",
        "no_parentheses",
    ),
    (
        "τ 除以了 z 的全部元素个数 n（z.size(-1)），应除以支撑集的大小 k(z)："
        "τ = (前 k 大之和 − 1) / k(z)。支撑集和前 k 大之和你都算对了。",
        "tau_over_n",
    ),
    (
        "没有先排序：判据 1 + k·z_(k) > 前 k 大之和里的 z_(k) 和前 k 大之和都来自从大到"
        "小排好的 z：zs = z.sort(dim=-1, descending=True).values，cs = zs.cumsum(-1)"
        "，不是原顺序的 z.cumsum(-1)。",
        "unsorted",
    ),
    (
        "τ 用了全部元素，(所有元素之和 − 1)/n：τ 只由支撑集（前 k 个最大值）决定，"
        "(前 k 大之和 − 1)/k。若是排了序：排序方向反了，z 要从大到小排序"
        "（descending=True）；从小到大排时判据 1 + k·z_(k) > 前 k 大之和处处成立，"
        "k 就成了 n。",
        "mean_threshold",
    ),
    (
        "前 k 大之和是从原顺序的 z 累加的（z.cumsum(-1)）：判据和 τ 里的“前 k 大之和”"
        "要从排好序的 zs 累加，cs = zs.cumsum(-1)。",
        "cs_unsorted",
    ),
    (
        "输出是按从大到小排好的顺序：最后一步应对原始的 z 截断，"
        "torch.clamp(z - tau, min=0)，不是对排序后的 zs（排序只用来求 τ）。",
        "sorted_order",
    ),
    (
        "输出除以了自己的和：这样每行和虽为 1，错误的 τ 却被掩盖了。"
        "正确的 τ 下 max(z − τ, 0) 的和本来就是 1，不需要再归一化；"
        "要改的是支撑集的判据：1 + k·z_(k) > 前 k 大之和。",
        "renormalised",
    ),
    (
        "支撑集大小多加了 1：k(z) 应由判据 1 + k·z_(k) > 前 k 大之和直接数出来；"
        "判据少了 1 时再把 k 加 1，只在真正的支撑集恰好比它多一个时碰巧对"
        "（z 全部相等时就不对）。",
        "no_one_plus_one",
    ),
    (
        "输出是 argmax 的 one-hot（只有最大的一个为 1）：sparsemax 可以保留好几个"
        "非零，值是 max(z − τ, 0)，τ = (前 k 大之和 − 1)/k，k 是支撑集的大小。",
        "argmax",
    ),
]


# the find-the-bug exercise on this checker (chapter 4): the page's support test
# lacks the 1; the hints give the symptom and where to look
_BUG_HUNT = {
    "4.7": {
        "no_one": (
            "支撑集大小 k(z) 算错了，τ 跟着错（τ 那一行本身没有错）。排第 k 的元素"
            "留在支撑集里，当且仅当它大于只由前 k 个算出的阈值 (前 k 大之和 − 1)/k："
            "把这个条件乘开写成不等式，再与支撑集那一行对照。"
        ),
        "renormalised": (
            "输出除以了自己的和：每行和虽为 1，错误的 τ 却被掩盖了。正确的 τ 下 "
            "max(z − τ, 0) 的和本来就是 1，不需要再归一化；问题在更前面的支撑集判据。"
        ),
        "no_one_plus_one": (
            "τ 那一行里把支撑集大小加了 1：z = (1.0, 0.8, 0.1) 碰巧对了，z 全部相等时"
            "就不对。τ 那一行本身没有错，错的是算支撑集大小的那一行。"
        ),
    }
}


def _sparsemax_hint(
    fn, inputs: list[Tensor], hints: list[tuple[str, str]]
) -> str | None:
    """The mistake of ``hints`` (:data:`_SPARSEMAX_MISTAKES` as the exercise shows
    them) that reproduces the learner's output on every input it answers (one
    input can match two mistakes: on [1.0, 0.8, 0.1] a criterion without the 1,
    without k, or with k from 0 all keep a single element)."""
    answers = []
    for z in inputs:
        try:  # diagnosis only: an input the learner's code cannot answer is skipped
            out = fn(z.clone())
        except Exception:
            continue
        if isinstance(out, Tensor) and out.shape == z.shape:
            answers.append((z, out.detach()))
    return next(
        (
            hint
            for hint, mistake in hints
            if answers
            and all(close(out, _sparsemax_variant(z, mistake)) for z, out in answers)
        ),
        None,
    )


def _each_row_right(fn, z: Tensor) -> bool:
    """Whether ``fn`` is right on each row of ``z`` given alone (a 1-D input)."""
    for row in z.reshape(-1, z.size(-1)):
        try:  # diagnosis only
            out = fn(row.clone())
        except Exception:
            return False
        if not (isinstance(out, Tensor) and close(out, sparsemax(row))):
            return False
    return True


# a crash on (or a wrong answer to) the first input with rows, after the 1-D inputs
# passed
_BATCHED_CRASHES = [
    (
        r"size|shape|dimension|Scalar|only one element|broadcast",
        "一维输入通过了，有多行的输入出错：每一步都要沿最后一维、对每一行分别做"
        "（sort(dim=-1)、cumsum(-1)、sum(-1, keepdim=True)、gather(-1, …)），不要用"
        " int(...)、.item() 或不带 dim 的 sum 把支撑集大小归成一个数。",
    ),
]


def _check_z_unchanged(name: str, given: Tensor, z: Tensor, case: str) -> None:
    """The learner's sparsemax must leave its input as it was."""
    if not torch.equal(given, z):
        fail(
            f"{name} 的输出对，却原地修改了传进来的 z（{case}）：z -= tau、"
            "z.clamp_(...) 这类带下划线或 -= 的运算改的是调用者的张量。在注意力里 z "
            "就是调用者的分数（logits），改了它，后面再用这些分数（另一次前向、"
            "求梯度、画图）都会出错。用不改输入的写法：torch.clamp(z - tau, min=0)。"
        )


# more inputs for the diagnosis only: [0.9, 0.8, 0.1] tells a rank k from 0
# (support 2) from k·z_(k) >= the sum (support 1), alike on the graded inputs
_TELL = [torch.tensor([0.9, 0.8, 0.1], dtype=torch.float64)]


@checker("sparsemax")
def check_sparsemax(fn, exercise: str | None = None) -> str:
    """Grade ``fn(z)``: sparsemax along the last dim of ``z`` (any leading shape),
    compared with :func:`transformer_course.sparsemax`; calling that reference (or
    ``sparsemax_threshold``) fails."""
    name = name_of(fn)
    g = seeded_generator(43)
    hints = bug_hunt_hints(_SPARSEMAX_MISTAKES, exercise, _BUG_HUNT)
    cases = [
        ("一维 z = [1.0, 0.8, 0.1]（支撑集 2 个）", torch.tensor([1.0, 0.8, 0.1])),
        ("一维 z = [0.5, 0.5, 0.5, 0.5]（全部相等）", torch.full((4,), 0.5)),
        ("形状 (3, 6)，每行在最后一维上", randn(g, 3, 6, scale=2.0)),
        (
            "形状 (2, 3, 8)，分数很分散（常常只剩一个非零）",
            randn(g, 2, 3, 8, scale=8.0),
        ),
        ("形状 (4, 5)，整体加了 1000（结果应不变）", randn(g, 4, 5) + 1000.0),
        ("一维 z = [3.0, 0.0, -2.0]（只剩一个非零）", torch.tensor([3.0, 0.0, -2.0])),
    ]
    refused = (
        f"{name} 调用了 tc.sparsemax（或 tc.sparsemax_threshold）：那正是检查器用来"
        "比较的参考实现。"
        + (
            "练习要你把上面有 bug 的函数抄过来，自己改掉错的那一行。"
            if exercise
            else "练习要你自己写出排序、支撑集和阈值 τ。"
        )
    )
    for i, (case, z) in enumerate(cases):
        z = z.double()
        given = z.clone()  # the learner's own copy: an in-place edit shows
        with calls_refused((sparsemax, sparsemax_threshold), refused):
            out = run_learner(
                fn, given, what=name, case=case, first=i == 0,
                causes=_BATCHED_CRASHES if z.dim() > 1 else (), copy_inputs=False,
            )  # fmt: skip
        out = as_tensor(out, f"{name} 的输出", case)
        check_shape(
            out, z.shape, f"{name} 的输出", case, " sparsemax 逐元素输出，与 z 同形。"
        )
        check_float(out, f"{name} 的输出")
        check_finite(out, f"{name} 的输出", case)
        ref = sparsemax(z)
        if close(out, ref):
            _check_z_unchanged(name, given, z, case)
            continue
        hint = _sparsemax_hint(fn, [z.double() for _, z in cases] + _TELL, hints)
        if hint is None and z.dim() > 1 and _each_row_right(fn, z):
            hint = _BATCHED_CRASHES[0][1]
        if hint is None and torch.equal(out > 0, ref > 0):
            hint = (
                "非零的位置（支撑集）对了，值不对：τ 算错了。τ = (前 k 大之和 − 1)/k，"
                "k 是支撑集的大小（非零的个数）：看 k 是否多数或少数了一个（支撑集"
                "那一行），前 k 大之和是否取自从大到小排好的 z。"
            )
        if hint is None and not torch.allclose(
            out.double().sum(-1), torch.ones(()).double()
        ):
            hint = (
                "每一行的和应为 1（输出在单纯形上）。τ = (前 k 大之和 − 1)/k 只在支撑集"
                "大小 k 对的时候才让和为 1：先检查支撑集的判据，再看 τ。"
            )
        fail(
            f"{name} 的输出不对（{case}）：{where_differs(out, ref)}。"
            + (f"\n提示：{hint}" if hint else "")
        )
    return f"{len(cases)} 组输入，含并列、平移与高维"


# ---------------------------------------------------------------------------
# KV cache bytes (ex 5.22)
# ---------------------------------------------------------------------------


def _kv_bytes(
    cfg: GPTConfig, batch: int, seq_len: int, nbytes: int, mistake: str = ""
) -> int:
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    width = {
        "d_model": cfg.d_model,
        "head_dim_d_model": kv_heads * cfg.d_model,
        "no_kv_heads": cfg.head_dim,
    }.get(mistake, kv_heads * cfg.head_dim)
    copies = 1 if mistake == "one_copy" else 2
    layers = 1 if mistake == "one_layer" else cfg.num_layers
    batch = 1 if mistake == "no_batch" else batch
    per_element = {"no_bytes": 1, "bits": 8 * nbytes, "fixed_4": 4}.get(mistake, nbytes)
    return copies * layers * batch * seq_len * width * per_element


_KV_MISTAKES = [
    ("只算了一份：每层要缓存键和值两份（因子 2）。", "one_copy"),
    (
        # H × head_dim, d_model and H_kv × (d_model // H_kv) are the same number
        "每个位置每层缓存的宽度算成了 d_model：可能用了查询头数 num_heads，"
        "或把 head_dim 算成了 d_model // num_kv_heads。缓存的是 num_kv_heads 个"
        "键值头（None 时才等于 num_heads），每个头宽 head_dim = d_model // "
        "num_heads，共 H_kv × head_dim 个数（GQA 时小于 d_model）。",
        "d_model",
    ),
    ("只算了一层：每一层都有自己的缓存，要乘 num_layers。", "one_layer"),
    (
        "漏了批大小：批里每条序列都有自己的缓存，要乘 batch"
        "（只有一条序列时才碰巧不影响）。",
        "no_batch",
    ),
    ("返回的是元素个数：还要乘每个元素的字节数 bytes_per_element。", "no_bytes"),
    (
        "每个头的宽度用了 d_model：一个键值头的宽度是 head_dim = d_model // "
        "num_heads，每个位置缓存 H_kv × head_dim 个数。",
        "head_dim_d_model",
    ),
    (
        "漏了键值头数：每个位置每层缓存 H_kv 个头，每个头 head_dim 个数，"
        "要乘 num_kv_heads（None 时用 num_heads）。",
        "no_kv_heads",
    ),
    (
        "多乘了 8：这是比特数；本题要字节数，bytes_per_element 已经是每个数的字节数。",
        "bits",
    ),
    (
        "每个元素总按 4 字节算了：要乘的是参数 bytes_per_element"
        "（默认 4，bf16 时是 2），"
        "不要写死 4。",
        "fixed_4",
    ),
]


def _kv_bytes_hint(fn, cases: list) -> str | None:
    """The mistake that reproduces the learner's answer in every case it answers (a
    single case can match two mistakes, e.g. H_kv = 2 and the factor 2)."""
    answers = []
    for _case, cfg, batch, seq_len, nbytes in cases:
        try:  # diagnosis only: a case the learner's code cannot answer is skipped
            got = fn(cfg, batch, seq_len, nbytes)
            got = got.item() if isinstance(got, Tensor) else got
            answers.append(((cfg, batch, seq_len, nbytes), int(got)))
        except Exception:
            continue
    return next(
        (
            h
            for h, m in _KV_MISTAKES
            if answers and all(_kv_bytes(*a, m) == got for a, got in answers)
        ),
        None,
    )


# a crash where num_kv_heads is None (MHA, Llama): the learner used it as a number
KV_BYTES_CRASHES = [
    (
        r"NoneType|None",
        "num_kv_heads 为 None 时键值头数等于查询头数："
        "cfg.num_kv_heads or cfg.num_heads。",
    ),
]


@checker("KV 缓存的字节数")
def check_kv_cache_bytes(fn) -> str:
    """Grade ``fn(cfg, batch, seq_len, bytes_per_element=4)``: bytes of the KV cache
    of a ``GPTConfig`` model; the first case is checked against a real
    :class:`~transformer_course.MiniGPT` cache."""
    name = name_of(fn)
    small = GPTConfig(
        vocab_size=20,
        context_length=16,
        d_model=24,
        num_heads=6,
        num_layers=2,
        num_kv_heads=2,
    )
    mha = GPTConfig(
        vocab_size=20, context_length=16, d_model=32, num_heads=4, num_layers=3
    )
    mqa = GPTConfig(
        vocab_size=20,
        context_length=16,
        d_model=64,
        num_heads=8,
        num_layers=4,
        num_kv_heads=1,
    )
    llama70b = GPTConfig(
        vocab_size=32000,
        context_length=4096,
        d_model=8192,
        num_heads=64,
        num_layers=80,
        num_kv_heads=8,
    )
    cases = [
        ("GQA：d_model=24，6 个查询头、2 个键值头，2 层；batch=3，seq_len=10，fp32",
         small, 3, 10, 4),
        ("MHA（num_kv_heads=None）：d_model=32，4 头，3 层；batch=2，seq_len=5，fp16",
         mha, 2, 5, 2),
        ("MQA：d_model=64，8 头、1 个键值头，4 层；batch=1，seq_len=7，fp32",
         mqa, 1, 7, 4),
        ("Llama-2-70B 的形状：64 头、8 个键值头，80 层；batch=1，seq_len=4096，fp16",
         llama70b, 1, 4096, 2),
    ]  # fmt: skip
    model = MiniGPT(small)
    caches = model.new_caches()
    with torch.no_grad():
        model(torch.zeros(3, 10, dtype=torch.long), caches=caches)
    real = sum(c.nbytes() for c in caches)
    for i, (case, cfg, batch, seq_len, nbytes) in enumerate(cases):
        causes = KV_BYTES_CRASHES if cfg.num_kv_heads is None else ()
        got = run_learner(fn, cfg, batch, seq_len, nbytes, what=name, case=case,
                          first=i == 0, causes=causes)  # fmt: skip
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if not isinstance(got, int) or isinstance(got, bool):
            fail(
                f"{name} 应返回一个整数（字节数），得到 {type(got).__name__}："
                f"{got!r:.60}（{case}）。"
            )
        want = _kv_bytes(cfg, batch, seq_len, nbytes)
        if i == 0 and want != real:  # the formula itself is checked against the model
            fail(f"内部错误：公式 {want} 与 MiniGPT 的实际缓存 {real} 字节不符。")
        if got == want:
            continue
        hint = _kv_bytes_hint(fn, cases)
        fail(
            f"{name} 返回 {got:,} 字节，应为 {want:,}（{case}）。"
            + (f"\n提示：{hint}" if hint else "")
        )
    return f"{len(cases)} 种配置，含 MHA、MQA 与真实 MiniGPT 缓存 {real:,} 字节"


# ---------------------------------------------------------------------------
# prefix-LM mask (ex 4.21)
# ---------------------------------------------------------------------------


def _prefix_variant(L: int, prefix: int, mistake: str) -> Tensor:
    mask = causal_mask(L).clone()
    if mistake == "rows":  # prefix positions see everything, future included
        mask[:prefix, :] = True
    elif mistake == "plus_one":
        mask[:, : prefix + 1] = True
    elif mistake == "minus_one":
        mask[:, : max(prefix - 1, 0)] = True
    elif mistake == "causal":  # the prefix part left out: the plain causal mask
        return mask
    elif mistake == "strict":  # diagonal forgotten
        mask = torch.ones(L, L, dtype=torch.bool).tril(-1)
        mask[:, :prefix] = True
    elif mistake == "zero_means_all" and prefix == 0:  # e.g. mask[:prefix or L, ...]
        mask[:] = True
    elif mistake.startswith("suffix_"):
        return _suffix_variant(L, prefix, mistake)
    else:
        mask[:, :prefix] = True
    if mistake == "inverted":
        mask = ~mask
    if mistake == "transposed":  # row = key, column = query
        mask = mask.T
    return mask


def _suffix_variant(L: int, prefix: int, mistake: str) -> Tensor:
    """The prefix block right, the positions after it seeing too little: not the prefix
    (``suffix_blind``), or no earlier suffix position (``suffix_prefix_self``: the
    prefix and itself; ``suffix_self``: only itself), or no causal part at all
    (``suffix_prefix_only``: the prefix alone; ``suffix_none``: nothing;
    ``suffix_all``: everything, the future included)."""
    if mistake == "suffix_all":
        return torch.ones(L, L, dtype=torch.bool)
    if mistake == "suffix_blind":  # the prefix block, then causal among the rest only
        mask = causal_mask(L).clone()
        mask[prefix:, :prefix] = False
    else:
        mask = torch.zeros(L, L, dtype=torch.bool)
        if mistake in ("suffix_prefix_self", "suffix_self"):  # each sees itself
            mask.fill_diagonal_(True)
        if mistake in ("suffix_prefix_self", "suffix_prefix_only"):
            mask[:, :prefix] = True
    mask[:prefix, :prefix] = True
    return mask


_PREFIX_MISTAKES = [
    ("掩码方向反了：约定 True = 可以关注。", "inverted"),
    (
        "把前缀的行整行打开了：前缀里的位置不能看前缀之后的词元（那是要生成的部分）；"
        "应打开的是前 prefix 列：mask[:, :prefix] = True。",
        "rows",
    ),
    ("前缀多开了一列：只打开前 prefix 列（下标 0 … prefix−1）。", "plus_one"),
    ("前缀少开了一列：要打开前 prefix 列（下标 0 … prefix−1）。", "minus_one"),
    ("对角线被屏蔽了：每个位置都可以关注自己（用 tril() 而不是 tril(-1)）。", "strict"),
    (
        "这是普通的因果掩码，前缀部分没有处理：前 prefix 个位置要互相都能看到"
        "（双向），在因果掩码上再打开前 prefix 列：mask[:, :prefix] = True。",
        "causal",
    ),
    (
        "掩码转置了：行 i 是查询、列 j 是键，mask[i, j] = True 表示位置 i 可以看 j；"
        "前缀之后应是下三角（j ≤ i，tril），你的是上三角（triu）。",
        "transposed",
    ),
    (
        "prefix = 0 时没有前缀，掩码就是普通的因果掩码；你的代码在 prefix = 0 时把整个"
        "序列都打开了（例如 prefix or L 这样的写法）。",
        "zero_means_all",
    ),
    (
        "前缀之后的位置看不到前缀了：它们仍是因果的，j ≤ i 包括前缀里的全部位置；"
        "只在因果掩码上再打开前缀块（或前 prefix 列），不要关掉别的。",
        "suffix_blind",
    ),
    (
        "前缀之后的位置只看得到前缀和自己，看不到它前面的后缀词元：前缀之后仍是"
        "因果的，位置 i 要看所有 j ≤ i（在因果掩码 tril() 上再打开前 prefix 列）。",
        "suffix_prefix_self",
    ),
    (
        "前缀之后的位置只看得到自己（只有对角线）：前缀之后仍是因果的，位置 i 要看"
        "所有 j ≤ i，包括前缀和它前面的后缀词元；从因果掩码 tril() 起步，再打开"
        "前 prefix 列。",
        "suffix_self",
    ),
    (
        "掩码全是 True：这是双向（编码器）的掩码，没有因果的部分，每个位置都看得见"
        "它后面的词元。只有前 prefix 个位置彼此双向，前缀之后仍是因果的：位置 i "
        "只看 j ≤ i。",
        "suffix_all",
    ),
    (
        "掩码里没有因果的部分：前缀之后的位置只看得到前缀，连自己和前面的后缀词元"
        "都看不到。前缀之后仍是因果的：位置 i 要看所有 j ≤ i。",
        "suffix_prefix_only",
    ),
    (
        "掩码里只有前缀块，没有因果的部分：前缀之后的位置什么都看不到（这些行全是 "
        "False，softmax 会得 NaN）。前缀之后仍是因果的：位置 i 要看所有 j ≤ i。",
        "suffix_none",
    ),
]


@checker("前缀语言模型的掩码")
def check_prefix_lm_mask(fn) -> str:
    """Grade ``fn(L, prefix)``: a bool ``(L, L)`` mask, True = may attend; the first
    ``prefix`` positions see each other, the rest is causal."""
    name = name_of(fn)
    cases = [(8, 3), (5, 0), (6, 6), (1, 1), (7, 1), (9, 4)]
    for i, (L, prefix) in enumerate(cases):
        case = f"L={L}, prefix={prefix}"
        out = run_learner(fn, L, prefix, what=name, case=case, first=i == 0)
        out = as_tensor(out, f"{name} 的输出", case)
        check_shape(out, (L, L), f"{name} 的输出", case)
        if out.dtype != torch.bool:
            additive = out.is_floating_point() and bool(torch.isinf(out).any())
            fail(
                f"{name} 的输出应是布尔张量，得到 dtype {out.dtype}（{case}）："
                + (
                    "你返回的是加性掩码（可见处 0、屏蔽处 −∞），这里要布尔掩码。"
                    if additive
                    else ""
                )
                + "本书的掩码约定 True = 可以关注，可用 tc.causal_mask(L) 起步。"
            )
        want = _prefix_variant(L, prefix, "ok")
        if torch.equal(out, want):
            continue
        hint = next(
            (
                h
                for h, m in _PREFIX_MISTAKES
                if torch.equal(out, _prefix_variant(L, prefix, m))
            ),
            None,
        )
        if hint is None and prefix > 0 and not bool(out[:prefix, :prefix].any()):
            hint = (
                f"前缀块 mask[:{prefix}, :{prefix}] 全是 False：前缀里的位置互相都"
                "看不见，连自己也看不见。约定是 True = 可以关注：前缀块应全是 True。"
            )
        if hint is None and bool((out & ~want)[:, prefix:].any()):
            hint = (
                "前缀之后的键 j 被更早的位置 i < j 看到了（看见了未来）："
                "前缀之后仍是因果的，mask[i, j] 只在 j ≤ i 或 j < prefix 时为 True。"
            )
        bad = (out != want).nonzero()[0].tolist()
        fail(
            f"{name}({L}, {prefix}) 不对：例如 (i, j) = ({bad[0]}, {bad[1]}) 应为 "
            f"{bool(want[bad[0], bad[1]])}，得到 {bool(out[bad[0], bad[1]])}。"
            + (f"\n提示：{hint}" if hint else "")
        )
    return f"{len(cases)} 组 (L, prefix)，含 prefix=0 与 prefix=L"
