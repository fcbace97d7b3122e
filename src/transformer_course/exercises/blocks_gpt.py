"""The Pre-LN GPT block and the GPT model, named as in
:class:`transformer_course.TransformerBlock` and :class:`transformer_course.MiniGPT`."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection

import torch
from torch import Tensor, nn

from ..blocks import TransformerBlock
from ..masks import causal_mask
from ..models import GPTConfig, MiniGPT
from ._protocol import (
    checker,
    construct,
    fail,
    fmt_args,
    name_of,
    randn,
    run_module,
    seeded_generator,
)
from ._report import (
    as_tensor,
    check_finite,
    check_float,
    check_no_dropout,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)
from .heads import MHA_HINTS, _mha_variant
from .norms_ffn import FFN_HINTS, _ffn_variant


def _named_parameters(module: nn.Module) -> list[tuple[str, Tensor]]:
    """``module``'s parameters under the exercises' names: the package's, except that
    MiniGPT's learned position table is wrapped (``pos_emb.embedding.weight``) where
    the learner's ``pos_emb`` is the ``nn.Embedding`` itself. Tied parameters appear
    under each of their names."""
    return [
        (name.replace("pos_emb.embedding.", "pos_emb."), p)
        for name, p in module.named_parameters(remove_duplicate=False)
    ]


def _graded_parameters(module: nn.Module, names: Collection[str]) -> dict[str, Tensor]:
    """``module``'s parameters by name, without the names that only alias a parameter
    also listed under one of ``names``: an FFN that keeps ``self.w1``, ``self.w2`` and
    ``self.net = nn.Sequential(self.w1, nn.GELU(), self.w2)`` lists ``net.0.weight``
    beside ``w1.weight``, one tensor under two names."""
    named = _named_parameters(module)
    known = {id(p) for name, p in named if name in names}
    return {name: p for name, p in named if name in names or id(p) not in known}


def copy_parameters(src: nn.Module, dst: nn.Module) -> None:
    """Copy every parameter of ``dst`` from the parameter of ``src`` with the same
    name (the exercises use the package's names); buffers are left alone, and so is
    a second name of a parameter that ``src`` knows under another one.

    A chapter starts the learner's model from ``tc.MiniGPT``'s weights with
    ``copy_parameters(reference, model)``; :func:`check_gpt` and
    :func:`check_transformer_block` grade by ``copy_parameters(learner, reference)``,
    so whatever they accept, this copies."""
    source = dict(_named_parameters(src))
    with torch.no_grad():
        for name, p in _graded_parameters(dst, source).items():
            if name not in source:
                raise ValueError(
                    f"{type(src).__name__} has no parameter {name!r} to copy into "
                    f"{type(dst).__name__}"
                )
            if source[name].shape != p.shape:
                raise ValueError(
                    f"parameter {name!r}: shape {tuple(source[name].shape)} in "
                    f"{type(src).__name__}, {tuple(p.shape)} in {type(dst).__name__}"
                )
            p.copy_(source[name])


def _check_parameters(learner: nn.Module, ref: nn.Module, what: str) -> None:
    """The learner's parameters are the package module's: same names, same shapes."""
    theirs = dict(_named_parameters(ref))
    mine = _graded_parameters(learner, theirs)
    for name, p in theirs.items():
        owner, _, leaf = name.rpartition(".")
        if name not in mine:
            if leaf == "bias" and f"{owner}.weight" in mine:
                fail(
                    f"{what}.{owner} 缺少偏置（bias）：书里的 tc 模块带偏置，"
                    "nn.Linear 和 nn.LayerNorm 默认就有，不要写 bias=False"
                    "（后面的单元格从 tc.MiniGPT 按名字复制权重）。"
                )
            _missing_parameter(learner, name, what)
        if tuple(mine[name].shape) != tuple(p.shape):
            extra = ""
            if name == "pos_emb.weight" and mine[name].size(0) == p.size(0) + 1:
                extra = (
                    "多出的一行多半是为了让位置从 1 编号（arange(1, L + 1)）：位置从 0 "
                    "开始，pos_emb(torch.arange(L))，表正好 context_length 行，"
                    "nn.Embedding(context_length, d_model)。"
                )
            fail(
                f"{what}.{name} 的形状应为 {tuple(p.shape)}，"
                f"得到 {tuple(mine[name].shape)}。{extra}"
            )
    extra = sorted(mine.keys() - theirs.keys())
    for name in extra:
        owner, _, leaf = name.rpartition(".")
        if leaf == "bias" and f"{owner}.weight" in theirs:
            fail(f"{what}.{owner} 不应带偏置：nn.Linear(…, bias=False)。")
    if extra:
        fail(f"{what} 多了参数 {'、'.join(extra)}：书里的 tc 模块没有它们。")


def _missing_parameter(learner: nn.Module, name: str, what: str) -> None:
    """Fail for the package parameter ``name`` that ``learner`` lacks: a plain list
    that hides its layers, a norm without weights, or another attribute name."""
    obj, path = learner, []
    for part in name.split(".")[:-1]:
        path.append(part)
        if isinstance(obj, (list, tuple)) and not isinstance(obj, nn.Module):
            fail(
                f"{what}.{'.'.join(path[:-1])} 是 Python {type(obj).__name__}，"
                "里面的层没有注册为子模块：它们的参数对 parameters()、state_dict() "
                "和优化器都不可见。改用 nn.ModuleList([...])。"
            )
        if isinstance(obj, nn.Sequential) and not hasattr(obj, part):
            # ffn = nn.Sequential(Linear, GELU, Linear): numbered, not named
            fail(
                f"{what}.{'.'.join(path[:-1])} 是 nn.Sequential：它的参数叫 "
                f"{'.'.join(path[:-1])}.0.weight、….2.weight 这样的编号，检查器和后面"
                f"的单元格按名字 {name} 复制权重。用 (a) 的 MyFeedForward（属性 w1、"
                "w2）：self.ffn = MyFeedForward(d_model, 4 * d_model)。"
            )
        obj = getattr(obj, part, None)
        if obj is None:
            break
    owner = ".".join(path)
    _named_module_hint(learner, path, name, what)
    if getattr(obj, "elementwise_affine", True) is False:
        fail(
            f"{what}.{owner} 是不带参数的 {type(obj).__name__}"
            "（elementwise_affine=False）：书里的 tc 代码用 nn.LayerNorm(d_model)，"
            "带可学习的 weight（γ）和 bias（β），后面的单元格要复制它们。"
        )
    fail(
        f"{what} 缺少参数 {name}：属性名要与书里打印的 tc 代码一致"
        f"（应有 {what}.{owner}），检查器按名字把你的权重复制到参考实现里。"
    )


def _named_module_hint(
    learner: nn.Module, path: list[str], name: str, what: str
) -> None:
    """Learner test 31c: a bare ``nn.Parameter`` where the package has an embedding
    (minGPT's ``pos_emb``), or torch's ``nn.MultiheadAttention`` (its q, k, v weights
    packed in ``in_proj_weight``) where the package's attention has ``q_proj``."""
    obj: object = learner
    for depth, part in enumerate(path):
        obj = getattr(obj, part, None)
        where = f"{what}.{'.'.join(path[: depth + 1])}"
        if isinstance(obj, nn.Parameter):
            fail(
                f"{where} 是一个 nn.Parameter（形状 {tuple(obj.shape)}），"
                f"书里的 tc 代码用的是模块，参数叫 {name}：位置嵌入写 "
                "nn.Embedding(context_length, d_model)，前向里 "
                "pos_emb(torch.arange(L))（不是切片 pos_emb[:, :L]）。"
            )
        if isinstance(obj, nn.MultiheadAttention):
            fail(
                f"{where} 是 torch 的 nn.MultiheadAttention：它把 q、k、v 的权重合在 "
                f"in_proj_weight 里，没有 {name}。本章后面的单元格（带缓存的前向）按"
                "名字用 self_attn.q_proj、k_proj、v_proj、out_proj：用练习 5.4 的"
                "多头注意力，或 tc.MultiHeadAttention(d_model, num_heads)。"
            )


def _check_eps(learner: nn.Module, ref: nn.Module, what: str) -> None:
    """Every norm has the package's eps (``nn.LayerNorm``'s default 1e-5)."""
    for path, norm in ref.named_modules():
        eps = getattr(norm, "eps", None)
        if eps is None or not path:
            continue
        mine = getattr(learner.get_submodule(path), "eps", eps)
        if mine != eps:
            fail(
                f"{what}.{path} 的 eps 是 {mine:g}：应为 {eps:g}"
                "（nn.LayerNorm 的默认值，也是 tc 模块的），不要另设。"
            )


# norm1.., norm_f, and the encoder-decoder's encoder_norm_f / decoder_norm_f
_NORM_PARAMETER = re.compile(r"(^|[._])norm(\d|_f)\.(weight|bias)$")


def _load_into_reference(
    learner: nn.Module, ref: nn.Module, what: str, g: torch.Generator
) -> None:
    """Check the learner's parameters and copy them into ``ref``. The norms get random
    γ/β first (initially all 1/0, they would not tell ``norm1`` from ``norm2``)."""
    _check_parameters(learner, ref, what)
    _check_eps(learner, ref, what)
    check_no_dropout(learner, what)
    with torch.no_grad():
        for name, p in _named_parameters(learner):
            if _NORM_PARAMETER.search(name):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.3 * randn(g, *p.shape))
    copy_parameters(learner, ref)


def _attend(block: nn.Module, h: Tensor, causal: bool = True) -> Tensor:
    return block.self_attn(h, is_causal=causal)


def _attention_takes_masks(mine: nn.Module, ref: nn.Module, x: Tensor) -> bool:
    """Whether the learner's block ``mine`` has a ``self_attn`` that, given the causal
    mask, outputs what the reference block ``ref`` (the same weights) does: then an
    output with the mask transposed comes from the mask the block built."""
    mask = causal_mask(x.size(1))
    try:
        with torch.no_grad():
            out = mine.self_attn(x, x, x, attn_mask=mask)
            want = ref.self_attn(x, x, x, attn_mask=mask)
    except Exception:  # its own signature: the block's code is all there is to go by
        return False
    out = out[0] if isinstance(out, tuple) else out
    return isinstance(out, Tensor) and close(out, want)


def _block_mistake(
    block: nn.Module, x: Tensor, mistake: str, attention_ok: bool = False
) -> Tensor | None:
    """What the package block outputs with one of :data:`BLOCK_HINTS`' mistakes:
    ``attn_<m>`` is the right wiring around a self-attention (the block's four
    projections, causal) with :data:`MHA_HINTS`' mistake ``m`` inside;
    ``mask_inverted`` (the block builds ``.triu()``) only where the learner's own
    attention is known to take a mask right (``attention_ok``), since an attention
    that transposes its mask gives the same output."""
    if mistake == "mask_inverted":
        if not attention_ok:
            return None
        h = block.norm1(x)
        x = x + block.self_attn(h, attn_mask=causal_mask(x.size(1)).T)
        return x + block.ffn(block.norm2(x))
    if not mistake.startswith("attn_"):
        return _block_variant(block, x, mistake)
    a = block.self_attn
    layers = (a.q_proj, a.k_proj, a.v_proj, a.out_proj)
    h = block.norm1(x)
    out = _mha_variant(
        layers, a.num_heads, h, h, h, causal_mask(x.size(1)), mistake[len("attn_") :]
    )
    if out is None:
        return None
    x = x + out
    return x + block.ffn(block.norm2(x))


def _block_variant(block: nn.Module, x: Tensor, mistake: str) -> Tensor:
    """The package block's pieces, wired with one typical mistake."""
    attn = functools.partial(_attend, block, causal=mistake != "no_causal")
    norm1, norm2, ffn = block.norm1, block.norm2, block.ffn
    if mistake in _RESIDUAL_MISTAKES:
        return _residual_variant(x, attn, norm1, norm2, ffn, mistake)
    if mistake == "norm_on_sublayer":  # x + norm(sublayer(x))
        x = x + norm1(attn(x))
        return x + norm2(ffn(x))
    if mistake in ("ffn_first", "ffn_first_norm1"):  # the FFN sublayer before attention
        if mistake == "ffn_first_norm1":  # the norms taken in the order of use
            norm1, norm2 = norm2, norm1
        x = x + ffn(norm2(x))
        return x + attn(norm1(x))
    if mistake in _FFN_ACTIVATIONS:  # the FFN with another activation
        ffn = functools.partial(_ffn_variant, ffn.w1, ffn.w2, mistake=mistake)
    if mistake == "kv_from_x":  # only the query normalised
        x = x + block.self_attn(norm1(x), x, x, is_causal=True)
        return x + ffn(norm2(x))
    norm1, norm2 = _norm_variant(norm1, norm2, mistake)
    x = x + attn(norm1(x))
    return x + ffn(norm2(x))


def _norm_variant(norm1: nn.Module, norm2: nn.Module, mistake: str) -> tuple:
    """The norm mistakes: the right wiring, with the wrong norm (or none)."""
    if mistake == "norm1_twice":
        return norm1, norm1
    if mistake == "no_norm2":
        return norm1, nn.Identity()
    if mistake == "no_norm":
        return nn.Identity(), nn.Identity()
    if mistake == "ln_unbiased":  # both norms with the n − 1 variance
        return _unbiased_norm(norm1), _unbiased_norm(norm2)
    return norm1, norm2


def _unbiased_norm(norm: nn.Module) -> Callable[[Tensor], Tensor]:
    """``norm`` (an ``nn.LayerNorm``) computed with the unbiased variance."""

    def fn(x: Tensor) -> Tensor:
        centred = x - x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=True)
        return centred / torch.sqrt(var + norm.eps) * norm.weight + norm.bias

    return fn


_RESIDUAL_MISTAKES = (
    "post_ln",
    "post_ln_ffn",
    "post_ln_attn",
    "no_res_attn",
    "no_res_ffn",
    "no_res",
    "res_from_norm",
    "res_from_norm1",
    "res_from_norm2",
    "parallel",
    "ffn_from_h",
    "ffn_from_h_no_norm2",
    "ffn_from_attn",
)


def _residual_variant(
    x: Tensor,
    attn: Callable[[Tensor], Tensor],
    norm1: nn.Module,
    norm2: nn.Module,
    ffn: nn.Module,
    mistake: str,
) -> Tensor:
    """The block with one of the :data:`_RESIDUAL_MISTAKES`."""
    if mistake.startswith("post_ln"):  # post_ln_ffn: learner test 44c
        if mistake != "post_ln_ffn":  # the attention sublayer post-LN
            x = norm1(x + attn(x))
        else:
            x = x + attn(norm1(x))
        return norm2(x + ffn(x)) if mistake != "post_ln_attn" else x + ffn(norm2(x))
    if mistake == "no_res_attn":
        x = attn(norm1(x))
        return x + ffn(norm2(x))
    if mistake == "no_res_ffn":
        return ffn(norm2(x + attn(norm1(x))))
    if mistake == "no_res":
        return ffn(norm2(attn(norm1(x))))
    if mistake in ("res_from_norm", "res_from_norm1", "res_from_norm2"):
        h = norm1(x)
        x = x + attn(h) if mistake == "res_from_norm2" else h + attn(h)
        if mistake == "res_from_norm1":  # only the attention sublayer's residual
            return x + ffn(norm2(x))
        h = norm2(x)
        return h + ffn(h)
    if mistake in ("ffn_from_h", "ffn_from_h_no_norm2"):  # FFN fed the old h = norm1(x)
        h = norm1(x)
        x = x + attn(h)
        return x + ffn(h if mistake == "ffn_from_h_no_norm2" else norm2(h))
    if mistake == "ffn_from_attn":  # FFN fed the attention output alone
        a = attn(norm1(x))
        return x + a + ffn(norm2(a))
    return x + attn(norm1(x)) + ffn(norm2(x))  # "parallel"


# the FFN's activation mistakes, named with check_feed_forward's hints
_FFN_ACTIVATIONS = ("tanh", "relu")

# the multi-head attention's mistakes a causal self-attention shows (K = V = Q makes
# the others look right; an ignored mask is "no_causal", an inverted one gives NaN)
_BLOCK_ATTENTION_MISTAKES = (
    "no_scale",
    "scale_model",
    "split_view",
    "merge_view",
    "split_merge_view",
    "one_head",
    "softmax_queries",
    "softmax_heads",
    "no_out_proj",
    "mask_transposed",
    "q_proj_for_all",
    "kv_swapped",
    "copied_k_q",
    "copied_v_q",
    "copied_v_k",
)

BLOCK_HINTS = [
    (
        "块里的 LayerNorm 用了无偏方差（除以 n − 1）：torch.var / x.std 默认 "
        "unbiased=True，LayerNorm 要有偏方差，x.var(-1, keepdim=True, unbiased=False)"
        "（或直接用 nn.LayerNorm）。",
        "ln_unbiased",
    ),
    ("少了注意力子层的残差连接：x = x + self_attn(norm1(x))。", "no_res_attn"),
    ("少了 FFN 子层的残差连接：x = x + ffn(norm2(x))。", "no_res_ffn"),
    (
        "两个子层都少了残差连接：x = x + self_attn(norm1(x))，"
        "然后 x = x + ffn(norm2(x))。",
        "no_res",
    ),
    (
        "这是 Post-LN（先加残差再归一化：norm(x + self_attn(x))）；本练习要 Pre-LN："
        "x + self_attn(norm1(x))。",
        "post_ln",
    ),
    (
        "FFN 子层写成了 Post-LN：norm2(x + ffn(x))，先加残差再归一化（注意力子层你"
        "写对了）。Pre-LN 的 FFN 子层是 x = x + ffn(norm2(x))，输出不再经过 norm2。",
        "post_ln_ffn",
    ),
    (
        "注意力子层写成了 Post-LN：norm1(x + self_attn(x))，先加残差再归一化（FFN "
        "子层你写对了）。Pre-LN 是 x = x + self_attn(norm1(x))。",
        "post_ln_attn",
    ),
    (
        "注意力没有因果掩码：GPT 块里位置 i 只能看 0..i"
        "（attn_mask = causal_mask(L)）。",
        "no_causal",
    ),
    (
        "残差要加在归一化之前的 x 上：x + self_attn(norm1(x))，"
        "不是 norm1(x) + self_attn(norm1(x))。",
        "res_from_norm",
    ),
    (
        "注意力子层的残差加在了 norm1(x) 上：你写的是 h = norm1(x)，x = h + "
        "self_attn(h)。残差要加在归一化之前的 x 上：x = x + self_attn(norm1(x))"
        "（FFN 子层你写对了）。",
        "res_from_norm1",
    ),
    (
        "FFN 子层的残差加在了 norm2(x) 上：你写的是 h = norm2(x)，x = h + ffn(h)。"
        "残差要加在归一化之前的 x 上：x = x + ffn(norm2(x))（注意力子层你写对了）。",
        "res_from_norm2",
    ),
    (
        "两个子层是串行的：FFN 的输入是加过注意力残差之后的 x，"
        "不是原来的 x（x + self_attn(…) + ffn(…) 是并行块）。",
        "parallel",
    ),
    *(
        (
            "FFN 的输入用了注意力之前的 h = norm1(x)：FFN 要读加过注意力残差之后"
            "的 x，x = x + self_attn(h)，再 x + ffn(norm2(x))，不是 ffn(norm2(h))"
            "或 ffn(h)。",
            mistake,
        )
        for mistake in ("ffn_from_h", "ffn_from_h_no_norm2")
    ),
    (
        "FFN 的输入只有注意力的输出 a = self_attn(h)，没有残差：ffn(norm2(a))。"
        "FFN 要读加过残差的 x：先 x = x + self_attn(h)，再 x = x + ffn(norm2(x))。",
        "ffn_from_attn",
    ),
    (
        "只有查询用了归一化后的 h：键和值用的是原来的 x（self_attn(norm1(x), x, x)）。"
        "自注意力的 Q、K、V 都来自同一个 h = norm1(x)：self_attn(h)"
        "（或 self_attn(h, h, h)）。",
        "kv_from_x",
    ),
    (
        "归一化用在了子层的输出上（x + norm(子层(x))）：Pre-LN 先归一化、再进子层，"
        "子层读归一化后的 x，残差加的是原来的 x。",
        "norm_on_sublayer",
    ),
    *(
        ("两个子层的顺序反了：GPT 块先注意力，后 FFN。", mistake)
        for mistake in ("ffn_first", "ffn_first_norm1")
    ),
    ("第二个子层应该用 norm2，你用了两次 norm1。", "norm1_twice"),
    ("FFN 之前忘了 norm2：x + ffn(norm2(x))。", "no_norm2"),
    (
        "没有用 norm1 和 norm2：Pre-LN 先归一化再进子层，x + self_attn(norm1(x))。",
        "no_norm",
    ),
    *(
        (f"FFN 里{hint}", mistake)
        for hint, mistake in FFN_HINTS
        if mistake in _FFN_ACTIVATIONS
    ),
    (
        "因果掩码方向反了：块里建的掩码是上三角（.triu()），位置 i 看得见 i 及之后的"
        "位置（未来）。应为下三角 .tril()，或直接用 tc.causal_mask(L)"
        "（True = 可以看）；你的多头注意力本身没问题。",
        "mask_inverted",
    ),
    # the block's wiring is right, its attention has one of the multi-head mistakes
    *(
        (f"块的连线对，错在块里的多头注意力：{hint}", f"attn_{mistake}")
        for hint, mistake in MHA_HINTS
        if mistake in _BLOCK_ATTENTION_MISTAKES
    ),
]


def _causality_hint(
    run: Callable[[Tensor], Tensor], x: Tensor, t: int, noise: Tensor
) -> str | None:
    """Change the inputs from position ``t`` on; earlier outputs must not move."""
    with torch.no_grad():
        before = run(x)
        x2 = x.clone()
        x2[:, t:] = noise
        after = run(x2)
    if (
        isinstance(before, Tensor)
        and isinstance(after, Tensor)
        and not close(before[:, :t], after[:, :t])
    ):
        return (
            f"改动第 {t} 个位置及以后的输入，前 {t} 个位置的输出也变了："
            "缺少因果掩码（或方向反了），位置 i 只能看 0..i。"
        )
    return None


@checker("Transformer 块（Pre-LN，GPT）", wants_class=True)
def check_transformer_block(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: a Pre-LN GPT block, d_ff = 4·d_model, no
    dropout.

    Attributes named as in :class:`transformer_course.TransformerBlock`: ``norm1`` and
    ``norm2`` (``nn.LayerNorm(d_model)``), ``self_attn`` (the multi-head attention of
    :func:`check_multi_head_attention`: ``q_proj, k_proj, v_proj, out_proj``), ``ffn``
    (the FFN of :func:`check_feed_forward`: ``w1``, GELU, ``w2``).
    ``forward(x)`` with x ``(N, L, E)``, causal: ``x = x + self_attn(norm1(x))`` then
    ``x = x + ffn(norm2(x))``. Compared with
    :class:`transformer_course.TransformerBlock`
    (``.gpt``) holding the same weights (the norms get random γ/β first).
    """
    name = name_of(cls)
    g = seeded_generator(9)
    cases = [
        ("d_model=16, 4 个头, x (2, 7, 16)", 16, 4, randn(g, 2, 7, 16)),
        ("d_model=12, 3 个头, x (3, 5, 12)", 12, 3, randn(g, 3, 5, 12, scale=2.0)),
        ("d_model=8, 2 个头, x (1, 1, 8)", 8, 2, randn(g, 1, 1, 8)),
    ]
    for i, (case, E, H, x) in enumerate(cases):
        what = f"{name}({E}, {H})"
        module = construct(cls, E, H, what=name)
        with torch.no_grad():
            run_module(module, x, what=what, case=case, first=i == 0)
        ref_mod = TransformerBlock.gpt(E, H, 4 * E)
        ref_mod.eval()
        _load_into_reference(module, ref_mod, what, g)
        with torch.no_grad():
            out = run_module(module, x, what=what, case=case)
            ref = ref_mod(x)
        out = as_tensor(out, f"{what} 的输出", case)
        check_shape(out, x.shape, f"{what} 的输出", case, " 块的输出与输入同形。")
        check_float(out, f"{what} 的输出")
        check_finite(
            out,
            f"{what} 的输出",
            case,
            "因果掩码的方向可能反了（True = 可以看）：最后一行全被屏蔽时会得到 NaN。",
        )
        if close(out, ref):
            continue
        hint = first_reproduced(
            out,
            BLOCK_HINTS,
            functools.partial(
                _block_mistake,
                ref_mod,
                x,
                attention_ok=_attention_takes_masks(module, ref_mod, x),
            ),
            H=H,
            D=E // H,
            E=E,
        )
        if hint is None and x.size(1) > 2:
            hint = _causality_hint(
                functools.partial(run_module, module, what=what, case=case),
                x,
                2,
                randn(g, x.size(0), x.size(1) - 2, E),
            )
        hint = hint or (
            "逐项对照：norm1/norm2 是 nn.LayerNorm(d_model)，注意力带因果掩码，"
            "FFN 的 d_ff = 4·d_model、激活是精确 GELU；x = x + self_attn(norm1(x))，"
            "x = x + ffn(norm2(x))。先分别用 check_multi_head_attention、"
            "check_feed_forward 检查子模块。"
        )
        fail(
            f"{what} 的输出与参考（同样权重的 tc.TransformerBlock.gpt）不一致"
            f"（{case}；{where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    _check_backward(module, x.detach().clone().requires_grad_(True) * 1.0, what)
    return "3 组 (d_model, 头数, 形状)，含 L = 1，因果性与 Pre-LN 连线，再反向传播一次"


def _gpt_reference(V: int, C: int, E: int, H: int, n_layers: int) -> MiniGPT:
    """``tc.MiniGPT`` as the chapters build it: learned positions, GELU, Pre-LN,
    biases, ``lm_head`` tied to ``tok_emb``, no dropout."""
    cfg = GPTConfig(V, context_length=C, d_model=E, num_heads=H, num_layers=n_layers)
    return MiniGPT(cfg).eval()


def _gpt_embeddings(ref: nn.Module, idx: Tensor, mistake: str) -> Tensor | None:
    """The first block's input with one embedding mistake (None: not possible here)."""
    L = idx.size(1)
    tok = ref.tok_emb(idx)
    if mistake == "tok_scaled":  # as in the original Transformer's embeddings
        tok = tok * math.sqrt(tok.size(-1))
    pos = ref.pos_emb.embedding.weight
    if mistake in ("no_pos", "pos_after_blocks"):
        return tok
    if mistake == "pos_from_1":
        return tok + pos[1 : L + 1] if L < pos.size(0) else None
    if mistake == "pos_by_id":  # clamped into the table, as a learner makes it run
        return tok + pos[idx.clamp(max=pos.size(0) - 1)]
    if mistake == "sum_scaled":  # tokens and positions together times sqrt(E)
        return (tok + pos[:L]) * math.sqrt(tok.size(-1))
    if mistake == "pos_reversed":
        return tok + pos[:L].flip(0)
    if mistake == "pos_by_batch":  # pos_emb(arange(N)): one row per sequence
        N = idx.size(0)
        return tok + pos[:N, None] if N <= pos.size(0) else None
    return tok + (pos[-L:] if mistake == "pos_last" else pos[:L])


def _gpt_variant(ref: nn.Module, idx: Tensor, mistake: str) -> Tensor | None:
    """The package model's pieces, wired with one typical mistake."""
    x = _gpt_embeddings(ref, idx, mistake)
    if x is None:
        return None
    h = ref.norm_f(x) if mistake == "norm_f_first" else x
    blocks = {
        "blocks_reversed": lambda: reversed(ref.blocks),
        "first_block_only": lambda: ref.blocks[:1],
    }.get(mistake, lambda: ref.blocks)()
    for block in blocks:
        if mistake == "no_causal":
            h = _block_variant(block, h, "no_causal")
        else:
            h = block(x if mistake == "same_input" else h)
        if mistake == "norm_f_per_block":  # norm_f after every block
            h = ref.norm_f(h)
    if mistake == "norm_f_per_block":
        return ref.lm_head(h)
    if mistake == "pos_after_blocks":
        h = h + ref.pos_emb.embedding.weight[: idx.size(1)]
    if mistake not in ("no_norm_f", "norm_f_first"):
        h = ref.norm_f(h)
    logits = ref.lm_head(h)
    return torch.softmax(logits, -1) if mistake == "softmax" else logits


GPT_HINTS = [
    ("忘了加位置嵌入：x = tok_emb(input_ids) + pos_emb(torch.arange(L))。", "no_pos"),
    (
        "位置应从 0 开始：pos_emb(torch.arange(L))，不是 arange(1, L + 1)。",
        "pos_from_1",
    ),
    (
        "位置嵌入取的是表的最后 L 行：应取前 L 行，pos_emb(torch.arange(L))"
        "（或 pos_emb.weight[:L]）。",
        "pos_last",
    ),
    (
        "位置嵌入是按 token id 查的（pos_emb(input_ids)）：位置嵌入按位置查表，"
        "pos_emb(torch.arange(L))，第 t 个词元加第 t 行。",
        "pos_by_id",
    ),
    (
        "位置嵌入的顺序反了：第 t 个词元加第 t 行，pos_emb(torch.arange(L))，"
        "不要翻转（flip）或倒着数。",
        "pos_reversed",
    ),
    (
        "位置嵌入按批里的序号查了（pos_emb(torch.arange(N))，N = input_ids.size(0)）："
        "同一句的所有词元加的是同一行。位置是第 1 维（列）：L = input_ids.size(1)，"
        "pos_emb(torch.arange(L))，第 t 个词元加第 t 行。",
        "pos_by_batch",
    ),
    ("lm_head 之前忘了最后的 norm_f。", "no_norm_f"),
    (
        "词元嵌入乘了 √d_model（原始 Transformer 的做法）：本书的 GPT 不缩放，"
        "x = tok_emb(input_ids) + pos_emb(torch.arange(L))。",
        "tok_scaled",
    ),
    (
        "进入第一个块的 x（词元嵌入与位置嵌入之和）乘了 √d_model：本书的 GPT 不缩放"
        "嵌入，x = tok_emb(input_ids) + pos_emb(torch.arange(L))，直接进入各块。",
        "sum_scaled",
    ),
    (
        "forward 应返回 logits（未经 softmax）：交叉熵和采样都从 logits 出发。",
        "softmax",
    ),
    (
        "每个块的输入应是上一个块的输出：for block in self.blocks: x = block(x)。",
        "same_input",
    ),
    ("注意力没有因果掩码：位置 i 只能看 0..i。", "no_causal"),
    (
        "位置嵌入加晚了（在所有块之后）：位置信息要在进入第一个块之前加上，"
        "x = tok_emb(input_ids) + pos_emb(torch.arange(L))。",
        "pos_after_blocks",
    ),
    (
        "norm_f 用在了进入块之前：最后的归一化在所有块之后、lm_head 之前，"
        "lm_head(norm_f(x))。",
        "norm_f_first",
    ),
    (
        "norm_f 用在了每个块之后（循环里 x = norm_f(block(x))）：块与块之间不再"
        "归一化（各块自己的 norm1、norm2 已经做了），norm_f 只在所有块之后用一次，"
        "for block in self.blocks: x = block(x)，然后 lm_head(norm_f(x))。",
        "norm_f_per_block",
    ),
    (
        "块的顺序反了：按 self.blocks 的顺序逐个过，for block in self.blocks。",
        "blocks_reversed",
    ),
    (
        "只用了第一个块（self.blocks[0]）：num_layers 个块都要按顺序过一遍，"
        "for block in self.blocks: x = block(x)。",
        "first_block_only",
    ),
]


@checker("GPT 模型", wants_class=True)
def check_gpt(cls: type) -> str:
    """Grade ``cls(vocab_size, context_length, d_model, num_heads, num_layers)``.

    Attributes: ``tok_emb`` (``nn.Embedding(vocab_size, d_model)``), ``pos_emb``
    (learned, ``nn.Embedding(context_length, d_model)``), ``blocks``
    (``nn.ModuleList`` of blocks of the :func:`check_transformer_block` contract),
    ``norm_f`` (``nn.LayerNorm``), ``lm_head`` (``nn.Linear(d_model, vocab_size,
    bias=False)``, its weight tied to ``tok_emb``'s). ``forward(input_ids)`` with
    ``input_ids (N, L)``, ``L <= context_length``, returns logits
    ``(N, L, vocab_size)`` only (the chapters use ``model(x)`` as logits). No dropout;
    biases and eps as ``nn.Linear``'s and ``nn.LayerNorm``'s defaults. Graded by
    :func:`copy_parameters` into :class:`transformer_course.MiniGPT` (learned
    positions, GELU, Pre-LN, tied head).
    """
    name = name_of(cls)
    g = seeded_generator(10)
    # (vocab, context, d_model, heads, layers, idx shapes)
    configs = [(23, 8, 16, 2, 2, ((3, 5), (2, 8))), (11, 6, 12, 3, 1, ((1, 1), (2, 6)))]
    first = True
    for V, C, E, H, n_layers, shapes in configs:
        args = (V, C, E, H, n_layers)
        what = f"{name}{fmt_args(args, {})}"
        module = construct(cls, *args, what=name)
        probe = torch.randint(V, shapes[0], generator=g)
        with torch.no_grad():
            run_module(
                module,
                probe,
                what=what,
                case=f"input_ids {shapes[0]}",
                first=first,
                causes=GPT_CRASHES,
            )
        first = False
        _check_structure(module, what)
        ref = _gpt_reference(*args)
        _load_into_reference(module, ref, what, g)
        for shape in shapes:
            case = f"vocab={V}, context={C}, input_ids {shape}"
            idx = torch.randint(V, shape, generator=g)
            with torch.no_grad():
                out = run_module(module, idx, what=what, case=case, causes=GPT_CRASHES)
                expected, _ = ref(idx)
            if isinstance(out, (tuple, list)):
                fail(
                    f"{what} 返回了 {type(out).__name__}（{case}）：forward(input_ids) "
                    "应只返回 logits (N, L, V)——本章后面的训练和生成单元格直接把 "
                    "model(x) 当 logits 用；损失在 forward 外面算。"
                )
            out = as_tensor(out, f"{what} 的输出", case)
            N, L = shape
            if tuple(out.shape) == (N, V) and L > 1:
                fail(
                    f"{what} 只返回了最后一个位置的 logits {tuple(out.shape)}（{case}）"
                    f"：forward 应返回每个位置的 (N, L, V) = {(N, L, V)}。"
                )
            if tuple(out.shape) == (N * L, V) and N > 1:
                fail(
                    f"{what} 的输出被展平成了 {tuple(out.shape)}（{case}）：forward "
                    f"应返回 (N, L, V) = {(N, L, V)}，展平留给算损失的地方。"
                )
            check_shape(out, (N, L, V), f"{what} 的输出", case)
            check_float(out, f"{what} 的输出")
            check_finite(out, f"{what} 的输出", case)
            if close(out, expected):
                continue
            hint = first_reproduced(
                out, GPT_HINTS, functools.partial(_gpt_variant, ref, idx)
            )
            if hint is None:
                hint = _gpt_block_hint(module, ref, idx, what)
            fail(
                f"{what} 的 logits 与参考（同样权重的 tc.MiniGPT）不一致（{case}；"
                f"{where_differs(out, expected)}）。\n可能的原因：{hint}"
            )
        _check_backward(module, idx, what)
    return "2 组配置、1 到 2 层、L = 1 到 context_length、批量 1 到 3，再反向传播一次"


def _check_backward(module: nn.Module, inputs: Tensor, what: str) -> None:
    """One backward pass, as the chapter's training cell runs it: an activation that
    a sublayer saved and the learner then changed in place (``x += ...``) fails here."""
    module.zero_grad(set_to_none=True)
    with torch.enable_grad():
        out = run_module(module, inputs, what=what, case="反向传播", causes=GPT_CRASHES)
        try:
            as_tensor(out, f"{what} 的输出", "反向传播").float().sum().backward()
        except RuntimeError as err:
            if "inplace" not in str(err):
                raise
            fail(
                f"{what} 的前向结果对，反向传播却报错：某个激活被原地改动了"
                "（例如块里写成 x += self.attn(...)；LayerNorm 等已经为反向传播存下了"
                "原来的 x）。改成 x = x + …，本章的训练单元格才能运行。"
            )
    module.zero_grad(set_to_none=True)


GPT_CRASHES = [
    (
        r"index out of range|IndexError",
        "nn.Embedding 的下标越界：token 嵌入用 input_ids 查表，位置嵌入按位置 "
        "torch.arange(L) 查表（不是按 token id，也不从 1 开始）；"
        "检查 vocab_size 和 context_length 有没有用反。",
    ),
]


def _check_structure(module: nn.Module, what: str) -> None:
    """Distinct blocks, and ``lm_head`` sharing ``tok_emb``'s weight."""
    blocks = getattr(module, "blocks", None)
    if isinstance(blocks, nn.ModuleList) and len({id(b) for b in blocks}) < len(blocks):
        fail(
            f"{what}.blocks 里是同一个块对象重复了多次（[block] * n）：它们共用一份"
            "权重。每层新建一个块：nn.ModuleList(MyBlock(...) for _ in range(n))。"
        )
    head, emb = getattr(module, "lm_head", None), getattr(module, "tok_emb", None)
    if isinstance(head, nn.Module) and isinstance(emb, nn.Module):
        if getattr(head, "weight", None) is not getattr(emb, "weight", None):
            fail(
                f"{what}.lm_head 的权重没有与 tok_emb 共享：在 __init__ 里写 "
                "self.lm_head.weight = self.tok_emb.weight（书里的 tc.MiniGPT 这样做；"
                "后面从它复制权重、逐步比较训练时依赖这一点）。"
            )


def _gpt_block_hint(module: nn.Module, ref: nn.Module, idx: Tensor, what: str) -> str:
    """Locate the first block whose output differs, given the reference's input."""
    with torch.no_grad():
        h = ref.tok_emb(idx) + ref.pos_emb.embedding.weight[: idx.size(1)]
        for i, block in enumerate(ref.blocks):
            mine = module.blocks[i]
            try:
                got = mine(h)
            except Exception:
                return (
                    f"{what}.blocks[{i}] 单独运行时出错："
                    "先用 check_transformer_block 检查块。"
                )
            expected = block(h)
            if not (isinstance(got, Tensor) and close(got, expected)):
                H, E = block.self_attn.num_heads, h.size(-1)
                named = isinstance(got, Tensor) and first_reproduced(
                    got,
                    BLOCK_HINTS,
                    functools.partial(
                        _block_mistake,
                        block,
                        h,
                        attention_ok=_attention_takes_masks(mine, block, h),
                    ),
                    H=H,
                    D=E // H,
                    E=E,
                )
                if named:
                    return (
                        f"{what}.blocks[{i}] 的输出与参考块不一致：{named}"
                        "（改好后可以先用 check_transformer_block 单独检查块类。）"
                    )
                return (
                    f"{what}.blocks[{i}] 的输出与参考块不一致："
                    "先用 check_transformer_block 检查你的块类。"
                )
            h = expected
    return (
        "各个块都对，问题在嵌入或最后几步："
        "x = tok_emb(input_ids) + pos_emb(arange(L))，"
        "逐个过 blocks，再 norm_f，最后 lm_head。"
    )
