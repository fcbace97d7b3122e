"""Chapter 3's own build exercises on the MiniGPT: the Post-LN wiring bug
(:func:`check_post_ln_block`) and the learner's KV cache plugged into ``tc.MiniGPT``
(:func:`check_kv_cache_in_model`)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..blocks import TransformerBlock
from ..models import GPTConfig, MiniGPT
from ._protocol import (
    checker,
    construct,
    fail,
    name_of,
    randn,
    run_learner,
    run_module,
    seeded_generator,
)
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)
from .blocks_gpt import copy_parameters
from .generation_cache import _check_cache_len, _check_cache_offset

__all__ = ["check_kv_cache_in_model", "check_post_ln_block"]

# the Post-LN block

POST_LN_HINTS = [
    (
        "你的块是 x + LN(F(x))：LayerNorm 放在了子层输出上、残差之内。"
        "后归一化先加残差、再归一化整个和：LN(x + F(x))，"
        "块的输出直接来自 LayerNorm（γ 各分量相同时，每个词元输出的特征之和"
        "与输入无关：第 3.3.1 节的预测题）。",
        "inner_norm",
    ),
    (
        "这是前归一化 x + F(LN(x))。本题要后归一化：h = norm1(x + attn(x))，"
        "输出 norm2(h + ffn(h))。",
        "pre_ln",
    ),
    (
        "只改好了注意力这一层：h = norm1(x + attn(x)) 对了，FFN 这一层还是 "
        "h + norm2(ffn(h))。两个子层都要先加残差再归一化：输出 norm2(h + ffn(h))。",
        "ffn_unfixed",
    ),
    (
        "只改好了 FFN 这一层：输出 norm2(h + ffn(h)) 对了，注意力这一层还是 "
        "x + norm1(attn(x))。两个子层都要先加残差再归一化：h = norm1(x + attn(x))。",
        "attn_unfixed",
    ),
    ("少了残差：应为 LN(x + F(x))，不是 LN(F(x))。", "no_residual"),
    ("注意力这一层少了残差：它的输出是 LN(F(x))，应为 LN(x + F(x))。", "no_res_attn"),
    ("FFN 这一层少了残差：块的输出是 LN(F(h))，应为 LN(h + F(h))。", "no_res_ffn"),
    (
        "FFN 读的是块的输入 x，不是注意力这一层的输出 h：两个子层是串行的，"
        "FFN 的输入和它的残差都应是 h。",
        "ffn_from_input",
    ),
    (
        "子层的输入也先归一化了（子层读 LN(x)）：这混进了前归一化。后归一化的子层"
        "直接读未归一化的输入，LayerNorm 只作用在残差之和上：LN(x + F(x))。",
        "norm_twice",
    ),
    (
        "LayerNorm 只包住了残差一支（LN(x) + F(x)）：后归一化要归一化整个和，"
        "LN(x + F(x))。",
        "norm_on_residual",
    ),
    ("两个子层都用了 norm1：FFN 这一层之后应是 norm2。", "norm1_twice"),
    (
        "FFN 这一层少了 LayerNorm：块的输出是 h + ffn(h)，没有经过 norm2。"
        "后归一化的每个子层都以 LayerNorm 结尾：输出 norm2(h + ffn(h))。",
        "no_norm2",
    ),
    (
        "注意力这一层少了 LayerNorm：h = x + attn(x) 没有经过 norm1。"
        "后归一化的每个子层都以 LayerNorm 结尾：h = norm1(x + attn(x))。",
        "no_norm1",
    ),
    (
        "FFN 这一层的残差加的是块的输入 x：norm2(x + ffn(h)) 跳过了注意力子层。"
        "残差应加 FFN 自己的输入 h：输出 norm2(h + ffn(h))，h = norm1(x + attn(x))。",
        "ffn_residual_from_input",
    ),
    (
        "norm1 挪到了 FFN 的输入上：注意力子层 x + attn(x) 之后没有归一化，"
        "只有块的最后一个 LayerNorm 留在残差之后"
        "（x + ffn(norm1(x)) 是前归一化的写法）。"
        "后归一化的每个子层都以 LayerNorm 结尾：h = norm1(x + attn(x))，"
        "输出 norm2(h + ffn(h))。",
        "norm1_before_ffn",
    ),
    (
        "注意力没有因果掩码，位置看得见未来：调用 self.self_attn(x, is_causal=True)。",
        "no_mask",
    ),
    (
        "接线对了，两个 LayerNorm 却用反了：注意力子层之后是 norm1，"
        "FFN 子层之后是 norm2，h = norm1(x + attn(x))，输出 norm2(h + ffn(h))"
        "（两者的 γ、β 各不相同，后面的单元格要按名字复制参数）。",
        "norms_swapped",
    ),
]


# the find-the-bug exercise on this checker (chapter 3): the page's block is
# x + LN(F(x)); the hint gives the symptom and where to look
_BUG_HUNT = {
    "3.11": {
        "inner_norm": (
            "你的块仍是 x + LN(F(x))：LayerNorm 放在了子层输出上、残差之内，块的输出"
            "不直接来自 LayerNorm。对照第 3.3.1 节后归一化的定义，看两个子层里 "
            "LayerNorm 各该包住哪一部分。"
        )
    }
}


def _post_ln_sublayer_mistake(
    ref: TransformerBlock, x: Tensor, mistake: str
) -> Tensor | None:
    """The Post-LN block with a mistake inside one sublayer (None: not one of them)."""
    n1, n2, ffn = ref.norm1, ref.norm2, ref.ffn
    attend = functools.partial(ref.self_attn, is_causal=True)
    if mistake == "norm_twice":  # the sublayers read normalised inputs as well
        h = n1(x + attend(n1(x)))
        return n2(h + ffn(n2(h)))
    if mistake == "norm_on_residual":  # LN(x) + F(x)
        h = n1(x) + attend(x)
        return n2(h) + ffn(h)
    if mistake in ("no_norm1", "norm1_before_ffn"):  # no LayerNorm after attention
        h = x + attend(x)  # "norm1_before_ffn": norm1 moved onto the FFN's input
        return n2(h + ffn(n1(h) if mistake == "norm1_before_ffn" else h))
    h = n1((0 if mistake == "no_res_attn" else x) + attend(x))
    if mistake == "no_res_ffn":
        return n2(ffn(h))
    if mistake == "ffn_from_input":
        return n2(h + ffn(x))
    if mistake == "norm1_twice":
        return n1(h + ffn(h))
    if mistake == "no_norm2":  # the FFN sublayer's LayerNorm left out
        return h + ffn(h)
    return n2(h + ffn(h)) if mistake == "no_res_attn" else None


def _post_ln_variant(ref: TransformerBlock, x: Tensor, mistake: str) -> Tensor:
    """What the block ``ref`` outputs on ``x`` with one typical wiring mistake."""
    inside = _post_ln_sublayer_mistake(ref, x, mistake)
    if inside is not None:
        return inside

    def attend(z: Tensor) -> Tensor:
        return ref.self_attn(z, is_causal=mistake != "no_mask")

    n1, n2, ffn = ref.norm1, ref.norm2, ref.ffn
    if mistake == "norms_swapped":
        n1, n2 = n2, n1
    if mistake == "inner_norm":
        h = x + n1(attend(x))
        return h + n2(ffn(h))
    if mistake == "pre_ln":
        h = x + attend(n1(x))
        return h + ffn(n2(h))
    if mistake == "no_residual":
        return n2(ffn(n1(attend(x))))
    if mistake == "ffn_unfixed":
        h = n1(x + attend(x))
        return h + n2(ffn(h))
    if mistake == "attn_unfixed":
        h = x + n1(attend(x))
        return n2(h + ffn(h))
    h = n1(x + attend(x))
    if mistake == "ffn_residual_from_input":
        return n2(x + ffn(h))  # "no_mask": the right wiring, attention not causal
    return n2(h + ffn(h))


@checker("后归一化的 GPT 块", wants_class=True)
def check_post_ln_block(cls: type, exercise: str | None = None) -> str:
    """Grade ``cls(d_model, num_heads)``: a Post-LN GPT block with the package's
    names (``norm1``, ``norm2``, ``self_attn``, ``ffn``); ``forward(x)`` is
    ``h = LN1(x + attn(x))`` (causal), ``LN2(h + ffn(h))``. Checked against
    ``TransformerBlock.gpt(..., norm_first=False)`` holding the learner's weights, with
    non-trivial gamma and beta."""
    name = name_of(cls)
    g = seeded_generator(31)
    hints = bug_hunt_hints(POST_LN_HINTS, exercise, _BUG_HUNT)
    first = True
    for E, H, N, T in [(16, 2, 2, 5), (24, 4, 1, 7)]:
        block = construct(cls, E, H, what=name)
        ref = TransformerBlock.gpt(E, H, 4 * E, norm_first=False).eval()
        with torch.no_grad():  # gamma and beta away from 1 and 0
            for norm in (ref.norm1, ref.norm2):
                norm.weight.copy_(1 + 0.3 * randn(g, E))
                norm.bias.copy_(0.3 * randn(g, E))
        try:
            copy_parameters(ref, block)
        except ValueError as err:
            fail(
                f"{name} 的参数名与包里的块不一致（{err}）：用 norm1、norm2、"
                "self_attn（tc.MultiHeadAttention）、"
                "ffn（tc.FeedForward(E, 4 * E, 'gelu')）。"
            )
        block.eval()
        x = randn(g, N, T, E)
        case = f"E={E}，H={H}，x 形状 {(N, T, E)}"
        out = as_tensor(
            run_module(block, x.clone(), what=name, case=case, first=first), name, case
        )
        first = False
        check_shape(out, (N, T, E), f"{name} 的输出", case)
        with torch.no_grad():
            expected = ref(x)
        if close(out, expected):
            continue
        hint = first_reproduced(
            out, hints, lambda m, r=ref, z=x: _post_ln_variant(r, z, m)
        )
        fail(
            f"{name} 的输出不对（{case}）：{where_differs(out, expected)}。"
            + (
                hint
                or "对照第 3.3.1 节：h = norm1(x + attn(x))，输出 norm2(h + ffn(h))。"
            )
        )
    return "两种 (E, H)，γ、β 不是 1 和 0，与包里的后归一化块逐元素一致"


# the learner's KV cache inside tc.MiniGPT


def _cached_logits(
    model: MiniGPT, ids: Tensor, caches: list, chunks: list[int]
) -> Tensor:
    """The model's logits over ``ids``, fed ``chunks`` positions at a time."""
    out, start = [], 0
    for size in chunks:
        logits, _ = run_learner(
            model,
            ids[:, start : start + size],
            what="model(新位置, caches=你的缓存)",
            case=f"位置 {start}..{start + size - 1}",
            caches=caches,
        )
        out.append(logits)
        start += size
    return torch.cat(out, dim=1)


@checker("把 KV 缓存接进 MiniGPT", wants_class=True)
def check_kv_cache_in_model(cls: type) -> str:
    """Grade ``cls()`` as the cache of every block of a ``tc.MiniGPT``: besides
    ``update``/``len`` (the KV-cache exercise) the model reads ``cache.offset`` (the
    positions seen so far: where the position embedding goes on) and ``cache.window``
    (``None``: the cache never rolls). Decoding with one cache per block, a few
    positions at a time, must give the logits of one full forward pass."""
    name = name_of(cls)
    model = MiniGPT(
        GPTConfig(
            vocab_size=11, context_length=12, d_model=16, num_heads=2, num_layers=2
        )
    ).eval()
    with torch.no_grad():  # logits that differ between positions
        model.lm_head.weight.normal_(0.0, 0.5)
    g = seeded_generator(32)
    ids = torch.randint(0, 11, (2, 9), generator=g)
    caches = [run_learner(cls, what=f"{name}()", first=True) for _ in model.blocks]
    if not hasattr(caches[0], "update"):
        fail(f"{name} 缺少 update(k, v)：收下新位置的键和值，返回全部 (K_all, V_all)。")
    probe = run_learner(cls, what=f"{name}()")  # a skeleton update stops here
    run_learner(
        probe.update,
        randn(g, 1, 2, 1, 8),
        randn(g, 1, 2, 1, 8),
        what=f"{name}.update",
        first=True,
    )
    hints = {
        "offset": "模型从 caches[0].offset 读已经处理过的位置数，位置嵌入从这里接着"
        "编号：加一个 offset 属性（或 property），等于已缓存的位置数。",
        "window": "模型读 cache.window 判断缓存会不会滚动：不滚动的缓存在 __init__ 里"
        "写 self.window = None。",
    }
    for attr, hint in hints.items():
        if attr not in dir(caches[0]):
            fail(f"{name} 缺少 {attr}：{hint}")
    offset = run_learner(
        getattr, caches[0], "offset", what=f"{name}.offset", first=True
    )
    if offset != 0:
        fail(f"新建的 {name}() 的 offset 应为 0，得到 {offset!r}。")
    chunks = [3, 1, 1, 2, 1, 1]
    with torch.no_grad():
        got = _cached_logits(model, ids, caches, chunks)
        full, _ = model(ids)
    for i, cache in enumerate(caches):
        if len(cache) == chunks[-1] != ids.size(1):
            fail(
                f"逐段送完 {ids.size(1)} 个位置后，第 {i} 层缓存的 len = {len(cache)}"
                "，正好是最后一次送进的位置数：update 每次都覆盖了旧的键和值。"
                "应把新位置沿 dim=-2 接在旧位置后面（torch.cat([self.k, k], dim=-2)），"
                "返回的是全部位置的 K、V。"
            )
        case = f"逐段送完 {ids.size(1)} 个位置后，第 {i} 层缓存"
        _check_cache_len(name, cache, ids.size(1), len(chunks), ids.size(0), case)
        _check_cache_offset(name, cache, ids.size(1), case)
    if not close(got, full):
        fail(
            f"用 {name} 逐段解码的 logits 与一次性前向不同："
            f"{where_differs(got, full)}。"
            "先让 tc.exercises.check_kv_cache 通过（旧位置在前、沿 dim=-2 拼接）。"
        )
    return (
        "2 层 MiniGPT，每层一个缓存，按 3、1、1、2、1、1 个位置送入，"
        "logits 与一次性前向一致"
    )
