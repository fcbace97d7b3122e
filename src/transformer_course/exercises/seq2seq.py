"""The encoder-decoder's own pieces: the decoder layer (named as in
:class:`transformer_course.DecoderLayer`), the shifted decoder input with the masked
(``-100``) loss, greedy decoding, and the rectangular causal mask of cached decoding."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import DecoderLayer
from ..masks import causal_mask
from ..models import Transformer, TransformerConfig
from ._protocol import (
    ExerciseError,
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
    check_finite,
    check_float,
    check_shape,
    close,
    filled,
    first_reproduced,
    shape_letters,
    where_differs,
)
from .attention import ADDITIVE_MASK_NOTE, is_additive_mask
from .blocks_gpt import _load_into_reference
from .translation_bugs import fail_if_tgt_edited

# --- the decoder layer ---------------------------------------------------------------


def _norms(layer: DecoderLayer, mistake: str) -> list[nn.Module]:
    """``norm1``, ``norm2``, ``norm3``, two of them swapped by a norm mistake."""
    norms = [layer.norm1, layer.norm2, layer.norm3]
    swapped = {"norms_swapped": (0, 2), "norms12_swapped": (0, 1)}
    swapped["norms23_swapped"] = (1, 2)
    if mistake in swapped:
        i, j = swapped[mistake]
        norms[i], norms[j] = norms[j], norms[i]
    return norms


def _decoder_mistake(
    layer: DecoderLayer, x: Tensor, memory: Tensor, mask, mistake: str, given: Tensor
) -> Tensor:
    """:func:`_decoder_variant`; for ``diag_hidden`` (a causal mask without its
    diagonal) position 0 sees no key, and is taken from ``given``, the learner's
    output, whatever the code made of it."""
    out = _decoder_variant(layer, x, memory, mask, mistake)
    if mistake == "diag_hidden":
        return torch.cat([given[:, :1], out[:, 1:]], dim=1)
    return out


def _self_mask(mistake: str, L: int) -> dict:
    """The masked self-attention's mask arguments, as wired with ``mistake``."""
    if mistake == "diag_hidden":  # keys j < i only
        return {"attn_mask": torch.ones(L, L, dtype=torch.bool).tril(-1)}
    if mistake == "mask_inverted":  # keys j >= i: the future
        return {"attn_mask": torch.ones(L, L, dtype=torch.bool).triu()}
    return {"is_causal": mistake != "no_causal"}


def _three_steps(
    x: Tensor, sublayers: tuple, norms: Sequence[nn.Module], mistake: str
) -> Tensor | None:
    """The three steps of the decoder layer (masked self-attention, cross-attention,
    FFN) with ``mistake`` in their order or in the form of every step; None: not one
    of these mistakes."""
    s, c, f = sublayers
    n1, n2, n3 = norms
    order = {
        "cross_first": ((c, n1), (s, n2), (f, n3)),
        "ffn_before_cross": ((s, n1), (f, n2), (c, n3)),  # the norms in their places
        "norm2_for_ffn": ((s, n1), (c, n2), (f, n2)),  # norm3 unused
    }
    form = {
        "pre_ln": lambda sub, norm, z: z + sub(norm(z)),
        "norm_on_sublayer": lambda sub, norm, z: z + norm(sub(z)),
    }
    if mistake not in order and mistake not in form:
        return None
    step = form.get(mistake, lambda sub, norm, z: norm(z + sub(z)))
    for sub, norm in order.get(mistake, tuple(zip(sublayers, norms, strict=True))):
        x = step(sub, norm, x)
    return x


def _decoder_variant(
    layer: DecoderLayer, x: Tensor, memory: Tensor, mask, mistake: str
):
    """The package's Post-LN decoder layer, wired with one typical mistake, or two
    (``"no_causal+cross_query_from_input"``: the self-attention's mask, then the
    rest of the wiring)."""
    self_mistake, _, mistake = mistake.rpartition("+")
    n1, n2, n3 = _norms(layer, mistake)

    def self_attn(h):
        return layer.self_attn(h, **_self_mask(self_mistake or mistake, h.size(1)))

    def cross_attn(h):
        if mistake == "cross_is_self":
            return layer.cross_attn(h)
        kwargs = {
            "no_mask": {},
            "cross_causal": {"is_causal": True},  # where memory_mask belongs
            "cross_causal_masked": {"attn_mask": mask, "is_causal": True},
            "cross_query_from_input_causal": {"attn_mask": mask, "is_causal": True},
        }.get(mistake, {"attn_mask": mask})
        return layer.cross_attn(h, memory, **kwargs)

    if mistake in (
        "cross_query_from_input",
        "cross_query_from_input_causal",
        "cross_residual_from_input",
        "res_from_input",
        "ffn_from_b1",
        "ffn_from_input",
    ):
        b1 = n1(x + self_attn(x))  # a sublayer fed from the wrong place
        query, residual = {
            "cross_query_from_input": (x, b1),
            "cross_query_from_input_causal": (x, b1),
            "cross_residual_from_input": (b1, x),
            "res_from_input": (b1, x),  # every residual adds the layer input Y
        }.get(mistake, (b1, b1))
        b2 = n2(residual + cross_attn(query))
        ffn_in = {"ffn_from_b1": b1, "ffn_from_input": x}.get(mistake, b2)
        return n3((x if mistake == "res_from_input" else b2) + layer.ffn(ffn_in))
    steps = _three_steps(x, (self_attn, cross_attn, layer.ffn), (n1, n2, n3), mistake)
    if steps is not None:
        return steps
    if mistake == "norm_before_cross_residual":  # norm2(x) + cross_attn(x)
        x = n1(x + self_attn(x))
        x = n2(x) + cross_attn(x)
        return n3(x + layer.ffn(x))
    if mistake == "norm_before_ffn_residual":  # norm3(x) + ffn(x)
        x = n1(x + self_attn(x))
        x = n2(x + cross_attn(x))
        return n3(x) + layer.ffn(x)
    res = {m: mistake != f"no_res_{m}" for m in ("self", "cross", "ffn")}
    x = n1((x if res["self"] else 0) + self_attn(x))
    x = n2((x if res["cross"] else 0) + cross_attn(x))
    last = {  # the FFN step alone wired wrong, or right
        "pre_ln_ffn": lambda: x + layer.ffn(n3(x)),
        "norm_on_ffn": lambda: x + n3(layer.ffn(x)),
    }
    return last.get(mistake, lambda: n3((x if res["ffn"] else 0) + layer.ffn(x)))()


_DECODER_HINTS = [
    (
        "掩码自注意力没有因果掩码：解码器位置 i 只能看目标的 0..i"
        "（self_attn(x, is_causal=True)，或 attn_mask=tc.causal_mask({L})）。",
        "no_causal",
    ),
    (
        "因果掩码把对角线也遮住了：位置 i 应看得见目标的 0..i，包括它自己；"
        "你的掩码只让它看 0..i−1。",
        "diag_hidden",
    ),
    (
        "因果掩码方向反了：上三角（.triu()）让位置 i 看得见 i 及之后的位置（未来）。"
        "应为下三角 .tril()，或直接 self_attn(x, is_causal=True) / "
        "attn_mask=tc.causal_mask({L})（True = 可以看）。",
        "mask_inverted",
    ),
    (
        "交叉注意力的键和值应来自编码器输出：{cross}"
        "（查询来自解码器，键、值来自 memory），"
        "你的交叉注意力只看了解码器自己。",
        "cross_is_self",
    ),
    (
        "交叉注意力的查询用了层输入 Y（forward 收到的 x）：查询应来自第一个子层的输出 "
        "B1 = norm1(Y + self_attn(Y))，即 cross_attn(B1, memory, memory, "
        "attn_mask=memory_mask)，残差同样加在 B1 上：norm2(B1 + cross_attn(B1, …))。",
        "cross_query_from_input",
    ),
    (
        "交叉注意力加了 is_causal=True，查询却仍是层输入 Y（forward 收到的 x）："
        "查询来错了地方，才是要改的；因果掩码不属于交叉注意力（目标位置 i 会只看得见"
        "源句的前几个位置），去掉 is_causal。查询应来自第一个子层的输出 "
        "B1 = norm1(Y + self_attn(Y))：cross_attn(B1, memory, memory, "
        "attn_mask=memory_mask)。",
        "cross_query_from_input_causal",
    ),
    (
        "交叉注意力的残差加的是层输入 Y（forward 收到的 x）："
        "norm2(Y + cross_attn(B1, …)) 跳过了第一个子层。查询对了，残差也应加在 B1 上："
        "norm2(B1 + cross_attn(B1, memory, memory, attn_mask=memory_mask))。",
        "cross_residual_from_input",
    ),
    (
        "三个子层的残差都加的是层输入 Y（forward 收到的 x）：每个子层的残差应加在"
        "它自己的输入上，norm2(B1 + cross_attn(B1, …))、norm3(B2 + ffn(B2))，"
        "不要先存 x0 = x 再一直加 x0。",
        "res_from_input",
    ),
    (
        "FFN 的输入用了第一个子层的输出 B1（ffn(B1)）：FFN 应作用在交叉注意力之后的 "
        "B2 = norm2(B1 + cross_attn(B1, …)) 上，即 norm3(B2 + ffn(B2))，"
        "否则交叉注意力只经残差进到输出。",
        "ffn_from_b1",
    ),
    (
        "FFN 的输入用了层输入 Y（forward 收到的 x）：FFN 应作用在交叉注意力之后的 "
        "B2 = norm2(B1 + cross_attn(B1, …)) 上，即 norm3(B2 + ffn(B2))。",
        "ffn_from_input",
    ),
    (
        "交叉注意力没有用 memory_mask：源句的填充位置不能被看到（{cross}）。",
        "no_mask",
    ),
    (
        "顺序不对：先掩码自注意力（norm1），再交叉注意力（norm2），最后 FFN（norm3）。",
        "cross_first",
    ),
    (
        "FFN 放在了交叉注意力之前：三个子层的顺序是掩码自注意力 → 交叉注意力 → "
        "FFN，先从源句读进信息，再由 FFN 逐位置加工。第二步是 {cross_step}，"
        "第三步才是 {ffn_step}。",
        "ffn_before_cross",
    ),
    (
        "FFN 这一步用的是 norm2（norm2 用了两次，norm3 没有用上）：每个子层有自己的 "
        "LayerNorm，参数各不相同：{ffn_step}。",
        "norm2_for_ffn",
    ),
    (
        "这是 Pre-LN（x + 子层(norm(x))）；本章的模型是 Post-LN："
        "x = norm1(x + self_attn(x))，依此类推。",
        "pre_ln",
    ),
    (
        "归一化只用在了子层的输出上（x + norm1(self_attn(x))），残差绕过了它。"
        "Post-LN 是先相加、再对和做归一化：x = norm1(x + self_attn(x))，"
        "另两步同样是 norm2(x + …)、norm3(x + …)。",
        "norm_on_sublayer",
    ),
    ("少了掩码自注意力的残差连接：x = norm1(x + self_attn(x))。", "no_res_self"),
    (
        "交叉注意力这一步把 norm2 只用在了残差上：你写的是 norm2({q}) + "
        "cross_attn(…)。Post-LN 是先相加再归一化：{cross_step}。",
        "norm_before_cross_residual",
    ),
    (
        "FFN 这一步把 norm3 只用在了残差上：你写的是 norm3({f}) + ffn({f})，"
        "即 LN(x) + F(x)，FFN 的输出绕过了归一化。Post-LN 是先相加再归一化，"
        "LN(x + F(x))：{ffn_step}。",
        "norm_before_ffn_residual",
    ),
    (
        "少了交叉注意力的残差连接：{cross_step}。",
        "no_res_cross",
    ),
    ("少了 FFN 的残差连接：{ffn_step}。", "no_res_ffn"),
    (
        "FFN 这一步写成了 Pre-LN：x + ffn(norm3(x))，前两个子层却是 Post-LN。"
        "本章的模型三步都是先相加、再归一化：{ffn_step}。",
        "pre_ln_ffn",
    ),
    (
        "FFN 这一步把 norm3 用在了 FFN 的输出上、残差加在归一化之后："
        "x + norm3(ffn(x))，残差绕过了归一化。Post-LN 是先相加再归一化：{ffn_step}。",
        "norm_on_ffn",
    ),
    ("norm1 与 norm3 用反了：子层按顺序用 norm1、norm2、norm3。", "norms_swapped"),
    ("norm1 与 norm2 用反了：子层按顺序用 norm1、norm2、norm3。", "norms12_swapped"),
    ("norm2 与 norm3 用反了：子层按顺序用 norm1、norm2、norm3。", "norms23_swapped"),
    (
        "交叉注意力用了 is_causal=True、没有用 memory_mask：因果掩码只属于掩码自注意力"
        "（解码器看自己的前文）；交叉注意力的每个目标位置都可以看整句源句，"
        "只屏蔽源句的填充：{cross}。",
        "cross_causal",
    ),
    (
        "两处不对。一、掩码自注意力没有因果掩码：位置 i 看得见后面的目标词，"
        "应为 self_attn(Y, is_causal=True)。二、交叉注意力的查询用了层输入 Y"
        "（forward 收到的 x）：查询应来自第一个子层的输出 B1 = norm1(Y + "
        "self_attn(Y))，即 cross_attn(B1, memory, memory, attn_mask=memory_mask)。",
        "no_causal+cross_query_from_input",
    ),
    (
        "交叉注意力不能是因果的：你在 memory_mask 之外又给了 is_causal=True，于是目标"
        "位置 i 只看得见源句的前几个位置。源句在解码之前已经完整读完，解码器的每个位置"
        "都可以看源句的全部位置，只屏蔽填充：去掉 is_causal，{cross}。",
        "cross_causal_masked",
    ),
]

# the decoder layer's names as each page writes them: chapter 2 (the paper's
# equations) names the sublayers' outputs B1 and B2, so x stays the layer input Y;
# chapter 1 carries x through the three sublayers (the cross-attention's query is
# still named B1, as in the hints shared by both chapters: a bare x reads as the
# layer's input, the bug of exercise 2.6)
_RUNNING_X = {
    "q": "x",
    "f": "x",
    "cross": (
        "cross_attn(B1, memory, memory, attn_mask=memory_mask)，查询 B1 是第一个子层"
        "的输出 norm1(x + self_attn(x))，不是层输入"
    ),
    "cross_step": "x = norm2(x + cross_attn(x, memory, memory, attn_mask=memory_mask))",
    "ffn_step": "x = norm3(x + ffn(x))",
}
_SUBLAYER_OUTPUTS = {
    "q": "b1",
    "f": "b2",
    "cross": "cross_attn(b1, memory, memory, attn_mask=memory_mask)",
    "cross_step": (
        "b2 = norm2(b1 + cross_attn(b1, memory, memory, attn_mask=memory_mask))"
    ),
    "ffn_step": "norm3(b2 + ffn(b2))",
}


def _decoder_names(exercise: str | None) -> dict[str, str]:
    """The shape letters and the decoder's variable names for ``exercise``'s page
    (:data:`_SUBLAYER_OUTPUTS` for chapter 2, else :data:`_RUNNING_X`)."""
    chapter2 = exercise is not None and str(exercise).startswith("2.")
    return shape_letters(exercise) | (_SUBLAYER_OUTPUTS if chapter2 else _RUNNING_X)


# the find-the-bug exercise on this checker (chapter 2): the page's layer feeds the
# cross-attention the layer's input; the hint names the sublayer, not the fix
_BUG_HUNT = {
    "2.6": {
        "cross_query_from_input": (
            "输出和题目给的 BuggyDecoderLayer 完全一样：还没有改到 bug。症状与题目里"
            "的实验相同：换掉前面的目标词，后面位置的交叉注意力权重一点不变，仿佛解码器"
            "读源句时没看自己的前文。看交叉注意力那一行：把它的每个参数与公式逐项对照，"
            "各应来自哪个张量。"
        ),
        "cross_query_from_input_causal": (
            "加上的 is_causal=True 不是改法：交叉注意力不能是因果的（目标位置 i 会只"
            "看得见源句的前几个位置），去掉它。bug 还在：交叉注意力的查询仍是层输入 "
            "Y（forward 收到的 x）。对照公式，查询应来自哪个张量？"
        ),
        "no_causal+cross_query_from_input": (
            "掩码自注意力的因果掩码被去掉了：那不是 bug，去掉后位置 i 看得见后面的"
            "目标词，恢复 is_causal=True。题目里的 bug 还在：交叉注意力的查询仍是"
            "层输入 Y（forward 收到的 x）。对照公式，查询应来自哪个张量？"
        ),
    }
}


DECODER_CRASHES = [
    (
        r"mask of shape \(.*\) does not broadcast to \(\d+, \d+, (\d+), \1\)",
        "memory_mask 传给了掩码自注意力：它的形状 (N, 1, 1, {S}) 对应源句的 "
        "{S} 个位置，只属于交叉注意力（键是 memory）；"
        "自注意力的键是 x 本身（{L} 个位置），只用因果掩码。"
        "self_attn(x, is_causal=True)，{cross}。",
    ),
    (
        r"mask of shape \((\d+), \1\) does not broadcast",
        "因果掩码 ({L}, {L}) 传给了交叉注意力：交叉注意力的键是 memory"
        "（{S} 个位置），用 "
        "memory_mask；因果掩码只给掩码自注意力。",
    ),
    (
        r"size of tensor|shape|mat1 and mat2|must match|expanded size",
        "多半是形状对不上（这里 {L} ≠ {S}）。交叉注意力的查询是解码器的 {q} "
        "(N, {L}, {E})，键和值是 memory (N, {S}, {E})：{cross}。",
    ),
]


@checker("解码器层（Post-LN）", wants_class=True)
def check_decoder_layer(cls: type, exercise: str | None = None) -> str:
    """Grade ``cls(d_model, num_heads, d_ff)``: the Post-LN decoder layer of the
    chapter's model, no dropout.

    Attributes named as in :class:`transformer_course.DecoderLayer`: ``self_attn``
    and ``cross_attn`` (``tc.MultiHeadAttention``), ``ffn`` (``tc.FeedForward``,
    ReLU), ``norm1, norm2, norm3`` (``nn.LayerNorm``). ``forward(x, memory,
    memory_mask=None)``, x ``(N, L, E)``, memory ``(N, S, E)``, memory_mask a bool
    ``(N, 1, 1, S)`` (``True`` = may attend) or ``None``::

        x = norm1(x + self_attn(x) with a causal mask)
        x = norm2(x + cross_attn(x, memory, memory, memory_mask))
        x = norm3(x + ffn(x))

    Compared with :class:`transformer_course.DecoderLayer` holding the same weights
    (the norms get random γ/β first, so that norm1, norm2, norm3 differ).
    """
    name = name_of(cls)
    g = seeded_generator(31)
    hints = bug_hunt_hints(_DECODER_HINTS, exercise, _BUG_HUNT)
    letters = _decoder_names(exercise)  # chapter 2: the paper's n, m, d_model, b1
    causes = filled(DECODER_CRASHES, letters)
    # (d_model, num_heads, d_ff, N, L, S): L != S catches swapped query and memory
    for i, (E, H, d_ff, N, L, S) in enumerate(
        [(16, 4, 32, 2, 5, 7), (8, 2, 16, 1, 6, 3), (12, 3, 24, 3, 1, 4)]
    ):
        case = (
            f"d_model={E}, num_heads={H}, N={N}, {letters['L']}={L}, {letters['S']}={S}"
        )
        layer = construct(cls, E, H, d_ff, what=name)
        layer.eval()
        ref = DecoderLayer(E, H, d_ff).eval()
        _load_into_reference(layer, ref, name, g)
        x, memory = randn(g, N, L, E), randn(g, N, S, E)
        mask = torch.ones(N, 1, 1, S, dtype=torch.bool)
        mask[0, ..., S - 1 :] = False  # the first source ends in padding
        with torch.no_grad():
            out = run_module(
                layer, x, memory, mask, what=name, case=case, first=i == 0,
                causes=causes,
            )  # fmt: skip
            out = as_tensor(out, f"{name}.forward", case)
            check_shape(out, (N, L, E), f"{name}.forward", case)
            check_float(out, f"{name}.forward")
            check_finite(out, f"{name}.forward", case)
            expected = ref(x, memory, memory_mask=mask)
        if close(out, expected):
            continue
        with torch.no_grad():
            hint = first_reproduced(
                out,
                hints,
                functools.partial(_decoder_mistake, ref, x, memory, mask, given=out),
                **letters,
            )
        fail(
            f"{name}.forward 的输出与参考实现不一致（{case}）："
            f"{where_differs(out, expected)}。"
            + (hint or "按顺序检查三个子层：各自的输入、残差与归一化。")
        )
    with torch.no_grad():  # memory_mask=None must also work (a batch without padding)
        out = run_module(layer, x, memory, what=name, case="memory_mask=None")
        if not close(as_tensor(out, f"{name}.forward"), ref(x, memory)):
            fail(
                f"{name}.forward(x, memory) 不传 memory_mask 时结果不对："
                "默认应不屏蔽任何源位置。"
            )
    return (
        f"3 组形状（含 {letters['L']} ≠ {letters['S']}、源句带填充），"
        "逐元素对照 tc.DecoderLayer"
    )


# --- the shifted decoder input and the masked loss -----------------------------------

_PAD, _BOS, _EOS = 0, 1, 2


def _loss_model(
    g: torch.Generator, pad: int = _PAD
) -> tuple[Transformer, Tensor, Tensor]:
    """A small random model and a batch: targets ``BOS … EOS`` right-padded with
    ``pad`` (words are drawn from 4 on, so ``pad`` may also be 3)."""
    cfg = TransformerConfig(9, 11, d_model=16, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=1, d_ff=32, dropout=0.0,
                            context_length=16, pad_id=pad)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 10_000, (1,), generator=g)))
        model = Transformer(cfg).eval()
    src = torch.randint(4, 9, (3, 5), generator=g)
    src[1, 3:] = pad
    lengths = [6, 3, 4]  # words between BOS and EOS
    tgt = torch.full((3, 8), pad, dtype=torch.long)
    for b, n in enumerate(lengths):
        tgt[b, 0], tgt[b, n + 1] = _BOS, _EOS
        tgt[b, 1 : n + 1] = torch.randint(4, 11, (n,), generator=g)
    return model, src, tgt


def _ignored_labels(labels: Tensor, dec_in: Tensor, mistake: str, pad: int) -> Tensor:
    """The labels with the pads replaced by -100, or one mistake in doing so."""
    if mistake == "pad_kept":
        return labels
    if mistake == "mask_from_input":  # the pads of the decoder input, one step early
        return labels.masked_fill(dec_in == pad, -100)
    ignored = 0 if mistake == "pad_zero" else pad
    return labels.masked_fill(labels == ignored, -100)


def _loss_variant(
    model: Transformer, src: Tensor, tgt: Tensor, mistake: str, pad: int = _PAD
) -> Tensor:
    """The loss computed with one typical mistake (``pad`` is the batch's pad id)."""
    head, tail = tgt[:, :-1], tgt[:, 1:]
    dec_in, labels = {
        "no_shift": (tgt, tgt),
        "labels_not_shifted": (head, head),
        "input_shifted_too": (tail, tail),
        "reversed": (tail, head),
    }.get(mistake, (head, tail))
    logits = model(src, dec_in)
    labels = _ignored_labels(labels, dec_in, mistake, pad)
    if mistake == "label_smoothing":
        return F.cross_entropy(logits.transpose(1, 2), labels, label_smoothing=0.1)
    if mistake == "mean_per_sentence":
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
        real = (labels != -100).sum(1)
        return (per_token.sum(1) / real).mean()
    if mistake == "softmax_first":
        logits = logits.softmax(-1)
    flat, target = logits.flatten(0, 1), labels.flatten()
    if mistake == "logits_scrambled":  # (N, V, T) reshaped as if it were (N, T, V)
        flat = logits.transpose(1, 2).reshape(-1, logits.size(-1))
    if mistake == "labels_transposed":  # labels flattened T-major, logits N-major
        target = labels.transpose(0, 1).reshape(-1)
    if mistake == "logits_transposed":  # logits flattened T-major, labels N-major
        flat = logits.transpose(0, 1).reshape(-1, logits.size(-1))
    # the sum over the real labels, divided by something other than their number
    divisor = {"sum": 1, "mean_over_all": target.numel()}
    divisor["mean_over_batch"] = tgt.size(0)
    if mistake in divisor:
        return F.cross_entropy(flat, target, reduction="sum") / divisor[mistake]
    if mistake == "nll_raw":  # F.nll_loss wants log-probabilities
        return F.nll_loss(flat, target)
    if mistake == "nll_probs":
        return F.nll_loss(flat.softmax(-1), target)
    return F.cross_entropy(flat, target)


_LOSS_HINTS = [
    (
        "解码器输入和标签用的是同一个序列：位置 t 的标签就是它自己的输入，"
        "模型只要照抄。"
        "输入 tgt[:, :-1]，标签 tgt[:, 1:]（右移一位）。",
        "no_shift",
    ),
    (
        "标签没有右移：输入 tgt[:, :-1] 时，标签应是 tgt[:, 1:]"
        "（位置 t 预测第 t+1 个词），"
        "不是 tgt[:, :-1]。",
        "labels_not_shifted",
    ),
    (
        "解码器输入也右移了：输入应以 BOS 开头（tgt[:, :-1]），标签才是 tgt[:, 1:]。",
        "input_shifted_too",
    ),
    (
        "右移的方向反了（输入与标签对调）：解码器输入要以 BOS 开头（tgt[:, :-1]），"
        "标签要以第一个词开头、以 EOS 结尾（tgt[:, 1:]）。",
        "reversed",
    ),
    (
        "填充的编号写死成了 0（ignore_index=0 或 labels == 0）：这一批的 pad_id 是 "
        "{pad}，填充位置于是都算进了损失。用传进来的参数 pad_id，不要写常数。",
        "pad_zero",
    ),
    (
        "填充位置也算进了损失：把标签里的 pad_id 换成 -100"
        "（labels.masked_fill(labels == pad_id, -100)），F.cross_entropy 会忽略它们。",
        "pad_kept",
    ),
    (
        "F.cross_entropy 要的是 logits（未归一化的分数），它自己做 log_softmax；"
        "你先做了 softmax。",
        "softmax_first",
    ),
    (
        "F.nll_loss 直接用了 logits：它只把标签处的数取负再平均，不做 softmax，"
        "要的是对数概率。先 logits.log_softmax(-1) 再传给 F.nll_loss，"
        "或者直接用 F.cross_entropy(logits, …)（它自己做 log_softmax）。",
        "nll_raw",
    ),
    (
        "F.nll_loss 拿到的是 softmax 的概率：它要的是对数概率，"
        "把 softmax 换成 log_softmax（或直接用 F.cross_entropy 处理 logits）。",
        "nll_probs",
    ),
    (
        "损失应是非填充位置上的平均（F.cross_entropy 的默认 reduction='mean'），"
        "不是总和。",
        "sum",
    ),
    (
        "平均时把填充位置也算进了分母：-100 的位置既不计损失、也不计个数"
        "（用默认的 reduction='mean'，不要自己除以 N·L）。",
        "mean_over_all",
    ),
    (
        "总和除以了批大小 N（每句的损失之和）：分母应是非填充标签的个数，"
        "用 F.cross_entropy 默认的 reduction='mean'，不要自己除以 tgt.size(0)。",
        "mean_over_batch",
    ),
    (
        "先对每句求平均、再对各句求平均：短句的每个词元因此权重更大。"
        "应对整批所有非填充标签一起求一个平均（F.cross_entropy 的默认 "
        "reduction='mean'），不要按句子分组。",
        "mean_per_sentence",
    ),
    (
        "标签展平的顺序与 logits 不同：logits.reshape(-1, V) 按 (N, T) 逐句展平，"
        "标签也要 labels.reshape(-1)，不要先 transpose(0, 1)。",
        "labels_transposed",
    ),
    (
        "logits 展平的顺序与标签不同：logits.transpose(0, 1).reshape(-1, V) 按 "
        "(T, N) 逐位置展平，标签 labels.reshape(-1) 却按 (N, T) 逐句展平，"
        "每个位置的分数于是配上了别的句子、别的位置的标签。两者都不转置："
        "logits.reshape(-1, V) 与 labels.reshape(-1)。",
        "logits_transposed",
    ),
    (
        "-100 放错了位置：你按解码器输入里的填充去换标签，两者错开一位，"
        "输入是 <eos> 的那个位置的标签是填充，却没有被换掉、算进了损失。要看标签自己："
        "labels.masked_fill(labels == pad_id, -100)。",
        "mask_from_input",
    ),
    (
        "logits 展平时行被打乱了：logits.transpose(1, 2).reshape(N·(T-1), V) 把形状 "
        "(N, V, T-1) 的张量按 (N, T-1, V) 读，每一行不再是一个位置的 V 个分数。"
        "直接 logits.reshape(-1, V)（或 flatten(0, 1)）；若要类别在第 1 维，就传 "
        "logits.transpose(1, 2) 本身（形状 (N, V, T-1)）和 (N, T-1) 的标签，"
        "不要再 reshape。",
        "logits_scrambled",
    ),
    (
        "加了标签平滑（label_smoothing）：本练习是普通的交叉熵，"
        "去掉 label_smoothing 参数（标签平滑是训练时另加的，见 1.12 节）。",
        "label_smoothing",
    ),
]


@checker("右移的解码器输入与屏蔽填充的损失")
def check_seq2seq_loss(fn: Callable) -> str:
    """Grade ``fn(model, src, tgt, pad_id)`` -> a scalar loss with a gradient.

    ``tgt`` ``(N, T)`` is ``BOS w1 … wn EOS`` right-padded with ``pad_id``. The
    decoder input is ``tgt[:, :-1]``, the labels ``tgt[:, 1:]`` with ``pad_id``
    replaced by ``-100``, and the loss is ``F.cross_entropy`` (mean over the non-pad
    labels) of ``model(src, dec_in)``. Compared with that computation on a small
    random :class:`transformer_course.Transformer`.
    """
    name = name_of(fn)
    g = seeded_generator(32)
    # the last batch pads with 3: code with the pad id 0 as a constant fails there
    for i, pad in enumerate((_PAD, _PAD, 3)):
        case = f"第 {i + 1} 个随机模型与批次（pad_id = {pad}）"
        model, src, tgt = _loss_model(g, pad)
        given, crash = tgt.clone(), None
        try:
            loss = run_learner(
                fn, model, src, given, pad, what=name, case=case, first=i == 0,
                copy_inputs=False,
            )  # fmt: skip
        except ExerciseError as err:
            crash = str(err)
        fail_if_tgt_edited(given, tgt, name, case, crash or "")
        if crash:
            fail(crash)
        loss = as_tensor(loss, name, case)
        if loss.dim() != 0:
            fail(
                f"{name} 应返回一个标量损失（形状 ()），得到形状 {tuple(loss.shape)}"
                f"（{case}）：F.cross_entropy 默认就对所有非 -100 的位置取平均。"
            )
        check_float(loss, name)
        if not loss.requires_grad:
            fail(
                f"{name} 返回的损失没有梯度（{case}）：不要在 torch.no_grad() 里计算，"
                "也不要 .item()/.detach()——训练要对它调用 backward()。"
            )
        with torch.no_grad():
            expected = _loss_variant(model, src, tgt, "right", pad)
        if close(loss, expected):
            continue
        with torch.no_grad():
            hint = first_reproduced(
                loss,
                _LOSS_HINTS,
                lambda m, model=model, src=src, tgt=tgt, pad=pad: _loss_variant(
                    model, src, tgt, m, pad
                ),
                pad=pad,
            )
        fail(
            f"{name} 的损失不对（{case}）：应为 {expected.item():.6f}，得到 "
            f"{loss.item():.6f}。"
            + (hint or "解码器输入 tgt[:, :-1]，标签 tgt[:, 1:]，填充换成 -100。")
        )
    return (
        "3 个随机模型（pad_id 为 0 和 3）；右移、-100 屏蔽填充、"
        "对非填充位置取平均、可反向传播"
    )


# --- greedy decoding -----------------------------------------------------------------


def _greedy_reference(
    model: Transformer, src: Tensor, bos: int, eos: int, max_len: int
):
    return model.greedy_decode(src, bos, eos, max_len=max_len)


def _decode_model(
    g: torch.Generator, padded: bool = False
) -> tuple[Transformer, Tensor]:
    """A small random model and a source ``(1, 5)``, ending in two pads if
    ``padded`` (then the source mask changes what is decoded)."""
    cfg = TransformerConfig(9, 12, d_model=16, num_heads=2, num_encoder_layers=1,
                            num_decoder_layers=2, d_ff=32, dropout=0.0,
                            context_length=32, pad_id=_PAD)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 10_000, (1,), generator=g)))
        model = Transformer(cfg).eval()
    with torch.no_grad():  # larger logits: the argmax is not a near tie
        model.lm_head.weight.mul_(4.0)
    src = torch.randint(3, 9, (1, 5), generator=g)
    if padded:
        src[0, 3:] = _PAD
    return model, src


def _decode_unmasked(
    model: Transformer, src: Tensor, bos: int, eos: int, max_len: int
) -> list[int]:
    """Greedy decoding that ignores the source padding (no source mask anywhere)."""
    memory, ys = model.encode(src, None), torch.tensor([[bos]])
    while ys.size(1) < max_len and (ys.size(1) == 1 or int(ys[0, -1]) != eos):
        nxt = model.lm_head(model.decode(ys, memory, None)[:, -1]).argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
    return ys[0].tolist()


def _decode_first_position(
    model: Transformer, src: Tensor, bos: int, eos: int, max_len: int
) -> list[int]:
    """Greedy decoding that reads the FIRST position's logits at each step."""
    ys = torch.tensor([[bos]])
    while ys.size(1) < max_len and (ys.size(1) == 1 or int(ys[0, -1]) != eos):
        nxt = model(src, ys)[:, 0].argmax(-1)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
    return ys[0].tolist()


def _decode_argmax_over_positions(
    model: Transformer, src: Tensor, bos: int, eos: int, max_len: int
) -> list[int]:
    """Greedy decoding whose argmax runs over the positions (``logits[0].argmax(0)``),
    the last vocabulary entry's best position taken as the next token."""
    ys = torch.tensor([[bos]])
    while ys.size(1) < max_len and (ys.size(1) == 1 or int(ys[0, -1]) != eos):
        nxt = model(src, ys)[0].argmax(0)[-1].view(1, 1)
        ys = torch.cat([ys, nxt], dim=1)
    return ys[0].tolist()


def _stop_id(ids: list[int]) -> int | None:
    """A token first emitted at step >= 2 of a no-stop decode: used as EOS, it makes
    the reference stop early."""
    for t in range(3, len(ids)):
        if ids[t] not in ids[:t]:
            return ids[t]
    return None


def _decode_hint(
    got: list[int], ref: list[int], eos: int, max_len: int, run: tuple
) -> str:
    model, src = run
    if bool((src == _PAD).any()):
        with torch.no_grad():
            if got == _decode_unmasked(model, src, ref[0], eos, max_len):
                return (
                    "源句的填充没有屏蔽：编码和每一步解码都要传源句掩码 "
                    "src_mask = model.src_mask(src)（encode(src, src_mask)、"
                    "decode(ys, memory, src_mask)），否则填充位置也被注意到。"
                )
    if got[:1] != ref[:1]:
        return "输出应以 BOS 开头：ys = torch.tensor([[bos_id]])，再逐个接上新词元。"
    if len(got) > max_len:
        return f"输出最长 max_len = {max_len} 个词元（含 BOS）：循环 max_len - 1 次。"
    if got[: len(ref)] == ref and len(got) > len(ref):
        return "生成 EOS 之后应立即停止（if next_id == eos_id: break）。"
    if ref[-1] == eos and got == ref[:-1]:
        return "EOS 本身也要接到输出里，再停止（先 cat，再 break）。"
    early = _stopped_early_or_first_position(got, ref, eos, max_len, run)
    if early:
        return early
    not_argmax = _not_argmax_hint(got, ref, eos, max_len, run)
    if not_argmax:
        return not_argmax
    if got[: len(ref)] != ref and len(got) > 1 and len(got) == len(ref):
        return (
            "下一个词元取错了：用最后一个位置的 logits（logits[:, -1]）的 argmax，"
            "不是第一个位置。"
        )
    return (
        "每一步：把目前的 ys 送进解码器，取最后一个位置 logits 的 argmax，"
        "接到 ys 后面。"
    )


def _not_argmax_hint(
    got: list[int], ref: list[int], eos: int, max_len: int, run: tuple
) -> str:
    """The hint for a decode whose new tokens are not the last position's argmax: an
    argmax over the positions, or some other choice (sampling)."""
    model, src = run
    with torch.no_grad():
        over_positions = _decode_argmax_over_positions(model, src, ref[0], eos, max_len)
    if got == over_positions:
        return (
            "新词元是一个位置的编号：argmax 沿位置那一维取了（logits[0].argmax(0) "
            "或 argmax(dim=1)），得到的是「哪个位置分数最大」。先取最后一个位置的 "
            "logits[:, -1]（形状 (1, V)），再沿词表那一维 argmax(-1)。"
        )
    sampled = _not_argmax(model, src, got)
    if sampled is None:
        return ""
    step, rank = sampled
    return (
        f"第 {step} 个新词元不是（前面的词元送进模型后）最后一个位置 logits 的"
        f"最大者，它排第 {rank}：贪心解码每步取 argmax，不抽样，结果是确定的。"
    )


def _stopped_early_or_first_position(
    got: list[int], ref: list[int], eos: int, max_len: int, run: tuple
) -> str:
    """The hint for a decode that stops on a token other than EOS, or that reads the
    first position's logits; "" for neither."""
    if 1 < len(got) < len(ref) and got == ref[: len(got)]:
        stop = "BOS（bos_id）" if got[-1] == ref[0] else f"词元 {got[-1]} "
        return (
            f"停得太早：生成 {stop}后就停了，它不是 eos_id = {eos}。"
            "只在新词元等于 eos_id 时停止；BOS 等其他词元也可能出现在输出中间，"
            "照常接上、继续解码。"
        )
    with torch.no_grad():
        if got == _decode_first_position(*run, ref[0], eos, max_len):
            return (
                "每一步取的是第一个位置的 logits（logits[:, 0]）：下一个词元由最后一个"
                "位置预测，用 logits[:, -1] 的 argmax。"
            )
    return ""


def _not_argmax(model: nn.Module, src: Tensor, got: list[int]) -> tuple | None:
    """The first new token of ``got`` that is the argmax of neither the last nor the
    first position's logits for the prefix before it, as (step, its rank); None:
    none."""
    if not all(0 <= i < model.cfg.tgt_vocab_size for i in got):
        return None
    with torch.no_grad():
        for k in range(1, len(got)):
            logits = model(src, torch.tensor([got[:k]]))[0]
            if got[k] not in (int(logits[-1].argmax()), int(logits[0].argmax())):
                return k, int((logits[-1] > logits[-1, got[k]]).sum()) + 1
    return None


@contextmanager
def _modes_seen(model: nn.Module) -> Iterator[list[bool]]:
    """The ``training`` flag of each of ``model``'s modules as it runs inside."""
    modes: list[bool] = []
    hooks = [
        m.register_forward_pre_hook(lambda m, args: modes.append(m.training))
        for m in model.modules()
    ]
    try:
        yield modes
    finally:
        for h in hooks:
            h.remove()


@checker("贪心解码")
def check_greedy_decode(fn: Callable) -> str:
    """Grade ``fn(model, src, bos_id, eos_id, max_len)`` -> ids ``(1, T)``.

    ``src`` is ``(1, S)``; the result starts with ``bos_id``, appends the argmax of
    the last position's logits one token at a time, stops right after appending
    ``eos_id`` or when it holds ``max_len`` tokens. Compared with
    :meth:`transformer_course.Transformer.greedy_decode` on small random models, with
    an EOS that the model emits early and with one it never emits.
    """
    name = name_of(fn)
    g = seeded_generator(33)
    runs = 0
    for i in range(3):
        model, src = _decode_model(g, padded=i == 2)
        free = _greedy_reference(model, src, _BOS, -1, 12)[0].tolist()
        eos = _stop_id(free)
        # an EOS the model never emits within 7 tokens (still a valid id)
        never = next(t for t in range(3, 12) if t not in free[:7])
        for eos_arg, max_len in ((eos, 12), (never, 7)):
            if eos_arg is None:
                continue
            what = "EOS 会提前出现" if eos_arg == eos else "EOS 从不出现"
            what += "，源句末尾有填充" if i == 2 else ""
            case = f"随机模型 {i + 1}，{what}，max_len={max_len}"
            with _modes_seen(model) as modes:
                out = run_learner(
                    fn, model, src, _BOS, eos_arg, max_len, what=name, case=case,
                    first=runs == 0,
                )  # fmt: skip
            runs += 1
            if any(modes) or model.training:
                fail(
                    f"{name} 把模型切到了训练模式（调用了 model.train()？{case}）："
                    "训练模式下 dropout 是开着的，解码结果每次不同，也改变了调用者"
                    "模型的状态。解码时模型应处于评估模式：不要调用 model.train()，"
                    "需要时在开头调用 model.eval()。"
                )
            out = as_tensor(out, name, case)
            if out.dim() != 2 or out.size(0) != 1:
                fail(
                    f"{name} 应返回形状 (1, T) 的词元编号，得到形状 {tuple(out.shape)}"
                    f"（{case}）：ys 从 torch.tensor([[bos_id]]) 开始，"
                    "用 torch.cat(…, dim=1) 接长。"
                )
            # any integer dtype is a row of token ids ("词元编号"): the page only
            # decodes it with tgt_tok.decode, which reads each id as an int
            if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
                fail(f"{name} 应返回整数的词元编号，得到 dtype {out.dtype}。")
            out = out.long()
            ref = _greedy_reference(model, src, _BOS, eos_arg, max_len)[0].tolist()
            got = out[0].tolist()
            if got == ref:
                continue
            again = run_learner(fn, model, src, _BOS, eos_arg, max_len, what=name)
            if isinstance(again, Tensor) and again.tolist() != out.tolist():
                fail(
                    f"{name} 两次调用结果不同（{case}）：贪心解码每步取 argmax，"
                    "结果是确定的，同样的输入每次得到同样的输出；结果会变，说明在抽样。"
                )
            fail(
                f"{name} 的输出不对（{case}）：应为 {ref}，得到 {got}。"
                + _decode_hint(got, ref, eos_arg, max_len, (model, src))
            )
    if runs < 4:  # the seeded models always give both cases; guard the guarantee
        fail(f"检查器内部错误：只检查了 {runs} 种情形。")
    return f"{runs} 种情形：EOS 提前出现时停止、不出现时到 max_len 为止"


# --- the rectangular causal mask -----------------------------------------------------


@checker("矩形因果掩码（L 个新查询、S 个键）")
def check_rectangular_causal_mask(fn: Callable) -> str:
    """Grade ``fn(L, S)``: a bool ``(L, S)`` mask for the last ``L`` of ``S``
    positions: query ``i`` may see key ``j`` iff ``j <= i + S - L``. Compared with
    :func:`transformer_course.causal_mask`."""
    name = name_of(fn)
    for i, (L, S) in enumerate([(2, 5), (4, 4), (1, 6), (3, 7), (5, 6)]):
        case = f"L = {L}, S = {S}"
        out = as_tensor(
            run_learner(fn, L, S, what=name, case=case, first=i == 0), name, case
        )
        check_shape(out, (L, S), name, case)
        ref = causal_mask(L, S)
        if out.dtype != torch.bool:
            fail(
                f"{name}({L}, {S}) 应返回 torch.bool 张量，得到 dtype {out.dtype}"
                + (
                    ADDITIVE_MASK_NOTE
                    if is_additive_mask(out, ref)
                    else "：0/1 的浮点掩码会被当作加到分数上的加性掩码；"
                )
                + "比较运算（<=）本身就得到 bool。"
            )
        if bool((out == ref).all()):
            continue
        top_left = torch.ones(L, S, dtype=torch.bool).tril()
        variants = [
            (
                top_left,
                "对齐到了左上角（query i 只看 key 0..i）：新查询是整段的最后 L 个位置，"
                "第 i 个查询在整段中的位置是 i + S - L，它能看 key 0..i+S-L。",
            ),
            (~ref, "得到的是「不能看」的掩码：本课程约定 True = 可以看。"),
            (
                torch.arange(S)[None, :] < torch.arange(L)[:, None] + (S - L),
                "每个查询也要能看它自己：用 <=，不是 <。",
            ),
            (
                torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L) + 1,
                "多看了一个未来位置：条件是 j <= i + S - L。",
            ),
            (
                torch.arange(S)[None, :] >= torch.arange(L)[:, None] + (S - L),
                "方向反了：True 应在 i + S - L 及其左边（j <= i + S - L）。",
            ),
            (
                torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (L - S),
                "偏移的符号反了：你写的是 i + L - S（S > L 时为负，向左上移）；"
                "新查询在整段的最后，偏移是 S - L ≥ 0：j <= i + S - L。",
            ),
        ]
        hint = next((h for v, h in variants if torch.equal(out, v)), "")
        diff = (out != ref).nonzero()[0].tolist()
        fail(
            f"{name}({L}, {S}) 不对：例如第 {diff[0]} 个查询、第 {diff[1]} 个键应为 "
            f"{bool(ref[diff[0], diff[1]])}。"
            + (hint or "第 i 个查询能看 j <= i + S - L 的键。")
        )
    return "5 组 (L, S)，含 L = S 与 L = 1"


# --- the alignment read from the cross-attention -------------------------------------


def _alignment_model(g: torch.Generator) -> tuple[Transformer, Tensor, Tensor]:
    """A small random model with sharp attention, a source ``(1, 5)`` and its greedy
    output ``ys`` ``(1, 7)``: 6 decoder inputs, so no axis has the length of another."""
    model, src = _decode_model(g)
    with torch.no_grad():  # sharper weights: the argmax of each row is not a near tie
        for name, mod in model.named_modules():
            if name.endswith("attn"):
                mod.q_proj.weight.mul_(4.0)
    ys = _greedy_reference(model, src, _BOS, -1, 7)
    return model, src, ys


def _alignment_variant(model: Transformer, src: Tensor, ys: Tensor, mistake: str):
    """The head-averaged argmax of one attention map, read the right or a wrong way."""
    from ..notebook import record_attention

    attn = {
        kind: [m for name, m in model.named_modules() if name.endswith(kind)]
        for kind in ("cross_attn", "self_attn")
    }
    decoder_in = ys if mistake in ("full_ys", "full_ys_drop_first") else ys[:, :-1]
    with torch.no_grad(), record_attention(model) as maps:
        model(src, decoder_in)
    module = {
        "first_layer": attn["cross_attn"][0],
        "self_attn": attn["self_attn"][-1],  # the last decoder layer's self-attention
    }.get(mistake, attn["cross_attn"][-1])
    weights = maps[module][0]  # (H, L, S)
    if mistake == "mean_layers":  # every layer's cross-attention, averaged
        weights = torch.stack([maps[m][0] for m in attn["cross_attn"]]).mean(0)
    if mistake == "head0":
        weights = weights[0]
    else:
        weights = weights.amax(0) if mistake == "max_heads" else weights.mean(0)
    positions = weights.argmax(0 if mistake == "argmax_queries" else -1)
    return positions[1:] if mistake == "full_ys_drop_first" else positions


_ALIGNMENT_HINTS = [
    (
        "读的是第一层的交叉注意力：要最后一层，cross_attention_modules(model)[-1]。",
        "first_layer",
    ),
    (
        "读的是解码器的自注意力（看目标自己的词）：对齐要看交叉注意力 cross_attn，"
        "它的键是源句。",
        "self_attn",
    ),
    (
        "对所有层的交叉注意力取了平均：本题只读最后一层，"
        "cross_attention_modules(model)[-1]，对它的头取平均，再对每行取 argmax。",
        "mean_layers",
    ),
    ("只取了一个头：先对头取平均（.mean(0)），再取 argmax。", "head0"),
    (
        "对头取的是最大值（amax / max）：一个头的尖峰就会盖过其余头。"
        "应对头取平均（.mean(0)），再对每行取 argmax。",
        "max_heads",
    ),
    (
        "行与解码器输入错开了一位：解码器输入用了完整的 ys，又丢掉了第 0 行。"
        "输入应是 ys[:, :-1]（以 BOS 开头），第 t 行就对应输入 ys[0, t]，"
        "一行也不要丢。",
        "full_ys_drop_first",
    ),
]


@checker("从交叉注意力读出对齐")
def check_cross_attention_alignment(fn: Callable) -> str:
    """Grade ``fn(model, src, ys)`` -> source positions ``(T - 1,)``.

    ``src`` is ``(1, S)``, ``ys`` ``(1, T)`` a decoded output (BOS first). Run the
    decoder on ``ys[:, :-1]``; for each decoder input ``t`` the answer is the source
    position with the largest weight in the LAST decoder layer's cross-attention,
    averaged over heads. A list of ints is accepted as well as a tensor. Compared on
    three small random models.
    """
    name = name_of(fn)
    g = seeded_generator(34)
    for i in range(3):
        case = f"随机模型 {i + 1}"
        model, src, ys = _alignment_model(g)
        out = run_learner(fn, model, src, ys, what=name, case=case, first=i == 0)
        if isinstance(out, (list, tuple)):
            try:
                out = torch.tensor(out)
            except (TypeError, ValueError):
                fail(f"{name} 应返回源词位置的列表或张量，得到 {out!r}（{case}）。")
        out = as_tensor(out, name, case)
        T, S = ys.size(1), src.size(1)
        if out.numel() == T:
            fail(
                f"{name} 返回了 {T} 个位置，应为 {T - 1} 个（{case}）：解码器的输入是 "
                "ys[:, :-1]，最后一个词元（它之后不再预测）不送进去。"
            )
        if out.numel() == S:
            fail(
                f"{name} 返回了 {S} 个位置（源句的长度），应为 {T - 1} 个（{case}）："
                "argmax 要在每一行（每个解码器输入）上对源词取，dim=-1。"
            )
        if out.dim() > 1 and out.numel() == T - 1:
            fail(
                f"{name} 返回的形状是 {tuple(out.shape)}，应为 ({T - 1},)（{case}）："
                "多了长度为 1 的维（批维？）。页面接着用 my_alignment(...)[pos] "
                "按位置取一个源词，要一维的结果：对注意力图先取批中唯一的样本 [0]"
                "（或在结尾取 [0]），argmax 也不要 keepdim=True。"
            )
        check_shape(out, (T - 1,), name, case)
        if out.dtype.is_floating_point:
            fail(f"{name} 应返回整数位置（argmax 的结果），得到 dtype {out.dtype}。")
        expected = _alignment_variant(model, src, ys, "right")
        if torch.equal(out.long(), expected):
            continue
        hint = next(
            (
                h
                for h, m in _ALIGNMENT_HINTS
                if torch.equal(out.long(), _alignment_variant(model, src, ys, m))
            ),
            "",
        )
        fail(
            f"{name} 的对齐不对（{case}）：应为 {expected.tolist()}，得到 "
            f"{out.tolist()}。"
            + (hint or "最后一层交叉注意力，对头取平均，每行对源词取 argmax。")
        )
    return "3 个随机模型；最后一层交叉注意力、对头平均、每个解码器输入一个源词"


__all__ = [
    "check_decoder_layer",
    "check_seq2seq_loss",
    "check_greedy_decode",
    "check_rectangular_causal_mask",
    "check_cross_attention_alignment",
]
