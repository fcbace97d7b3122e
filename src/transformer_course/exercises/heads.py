"""Multi-head attention: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` as in
:class:`transformer_course.MultiHeadAttention`; and (ch03) the same attention written as
a sum of per-head contributions ``head_h W^O_h``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, scaled_dot_product_attention
from ..masks import causal_mask
from ._protocol import (
    checker,
    construct,
    fail,
    name_of,
    randn,
    random_mask,
    run_learner,
    run_module,
    seeded_generator,
)
from ._report import (
    apply_linear,
    as_tensor,
    check_finite,
    check_float,
    check_no_dropout,
    check_shape,
    close,
    first_reproduced,
    linear_attr,
    where_differs,
)


def _mha_variant(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    mistake: str,
) -> Tensor | None:
    """What multi-head attention with the learner's four layers outputs with one of
    :data:`MHA_HINTS`' mistakes."""
    # wrong inputs: K and V both from Q, forward(Q, V, K) (keys from V), v_proj(K)
    K, V = {"kv_from_q": (Q, Q), "kv_inputs_swapped": (V, K), "v_from_k": (K, K)}.get(
        mistake, (K, V)
    )
    if mistake != "attend_heads":
        return _mha_wiring_variant(layers, H, Q, K, V, mask, mistake)
    # (N, T, H, D) fed to attention: each token's heads attend to each other
    if mask is not None or K.size(1) != Q.size(1):
        return None
    q_proj, k_proj, v_proj, out_proj = layers
    N, L, E = Q.shape
    q, k, v = (
        apply_linear(proj, x).view(N, L, H, E // H)
        for proj, x in ((q_proj, Q), (k_proj, K), (v_proj, V))
    )
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(E // H), dim=-1)
    return apply_linear(out_proj, (weights @ v).reshape(N, L, E))


def _mha_wiring_variant(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    mistake: str,
) -> Tensor | None:
    """:func:`_mha_variant` for the mistakes in how the heads are wired."""
    square = mask is not None and mask.size(-1) == mask.size(-2)
    if mistake.startswith("mask_") and (
        mask is None or (mistake == "mask_transposed" and not square)
    ):
        return None
    q_proj, k_proj, v_proj, out_proj = layers
    if mistake == "q_proj_for_all":
        k_proj = v_proj = q_proj
    if mistake == "kv_swapped":
        k_proj, v_proj = v_proj, k_proj
    if mistake.startswith("copied_"):  # copied_k_q: K projected with q_proj
        _, role, source = mistake.split("_")
        layer = {"q": q_proj, "k": k_proj}[source]
        k_proj, v_proj = (layer, v_proj) if role == "k" else (k_proj, layer)
    if mistake == "mask_transposed":  # (L, S) read as (S, L): needs L == S
        mask = mask.transpose(-2, -1)
    H = 1 if mistake == "one_head" else H
    N, L, E = Q.shape
    D = E // H
    heads = functools.partial(_split_heads, H=H, mistake=mistake)
    q = heads(apply_linear(q_proj, Q))
    k, v = heads(apply_linear(k_proj, K)), heads(apply_linear(v_proj, V))
    scale = {"no_scale": 1.0, "scale_model": math.sqrt(E)}.get(mistake, math.sqrt(D))
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None and mistake != "mask_ignored":
        inverted = mistake == "mask_inverted"  # -1e9: rows masked whole stay finite
        inverted_zero = mistake == "mask_inverted_zero"  # as tc's SDPA: such rows -> 0
        # over the heads every head of a masked key is filled: -inf would give NaN
        finite = inverted or mistake == "softmax_heads"
        scores = scores.masked_fill(
            mask if inverted or inverted_zero else ~mask,
            -1e9 if finite else -math.inf,
        )
    dim = {"softmax_queries": -2, "softmax_heads": 1}.get(mistake, -1)
    weights = torch.softmax(scores, dim=dim)
    weights = weights.nan_to_num(0.0)  # rows masked whole (only the inverted masks)
    out = weights @ v  # (N, H, L, D)
    out = _merge_heads(out, mistake)
    return out if mistake == "no_out_proj" else apply_linear(out_proj, out)


def _split_heads(x: Tensor, H: int, mistake: str) -> Tensor:
    """``(N, T, E)`` -> ``(N, H, T, D)``, as ``mistake`` splits the heads."""
    N, T, E = x.shape
    if mistake in ("split_view", "split_merge_view"):  # without the transpose
        return x.reshape(N, H, T, E // H)
    if mistake == "split_d_h":  # E read as (D, H): head h takes every H-th feature
        return x.view(N, T, E // H, H).permute(0, 3, 1, 2)
    return x.view(N, T, H, E // H).transpose(1, 2)


def _merge_heads(out: Tensor, mistake: str) -> Tensor:
    """``(N, H, L, D)`` -> ``(N, L, E)``, as ``mistake`` merges the heads."""
    N, H, L, D = out.shape
    if mistake == "split_d_h":  # merged back the same way: (N, L, D, H)
        return out.permute(0, 2, 3, 1).reshape(N, L, H * D)
    if mistake in ("merge_view", "split_merge_view"):
        return out.reshape(N, L, H * D)
    return out.transpose(1, 2).reshape(N, L, H * D)


MHA_HINTS = [
    (
        "合并多头时没有先转置：(N, H, L, D) 要先 transpose(1, 2) 变成 "
        "(N, L, H, D)，再 reshape 成 (N, L, E)。",
        "merge_view",
    ),
    (
        "拆分多头时直接 view 成了 (N, H, L, D)：应先 view 成 (N, L, H, D)，"
        "再 transpose(1, 2)。",
        "split_view",
    ),
    (
        "拆分和合并多头时都少了转置：应 view(N, L, H, D).transpose(1, 2)，"
        "合并时反过来。",
        "split_merge_view",
    ),
    (
        "拆分多头时把 E 拆成了 (D, H)（view(N, T, D, H) 再把 H 换到前面），每个头"
        "拿到的是隔 {H} 个取一个的特征。第 h 个头应是相邻的 {D} 个特征（第 h·{D} 到 "
        "(h+1)·{D}−1 个）：E 拆成 (H, D)，view(N, T, {H}, {D}).transpose(1, 2)；"
        "合并时 transpose(1, 2).reshape(N, L, E)。",
        "split_d_h",
    ),
    (
        "没有拆分多头：应把 (N, T, E) 拆成 {H} 个头 (N, {H}, T, {D})，"
        "每个头各自做注意力（缩放 √d_k 也按每个头的维度）。",
        "one_head",
    ),
    ("输出差了一个缩放：分数没有除以 √d_k（每个头 d_k = {D}）。", "no_scale"),
    ("缩放用了 √d_model = √{E}，应除以每个头的维度 √d_k = √{D}。", "scale_model"),
    (
        "权重在 key 维度上之和不是 1：softmax 的 dim 可能写错了（应为 dim=-1）。",
        "softmax_queries",
    ),
    (
        "softmax 在头的维度上做了（dim=1）：分数是 (N, H, L, S)，应在 key 的维度"
        "上归一化，softmax(dim=-1)。",
        "softmax_heads",
    ),
    ("忘了最后的输出投影：合并多头后还要经过 out_proj。", "no_out_proj"),
    (
        "K 和 V 都用 Q 算了：应为 k_proj(K)、v_proj(V)（交叉注意力里三者不同）。",
        "kv_from_q",
    ),
    (
        "K 和 V 也用 q_proj 投影了：三个输入各用自己的层，"
        "q_proj(Q)、k_proj(K)、v_proj(V)。",
        "q_proj_for_all",
    ),
    ("被屏蔽的位置仍有权重：掩码方向可能反了（True = 可以看）。", "mask_inverted"),
    (
        "被屏蔽的位置仍有权重、能看的位置反而没有：掩码方向反了（True = 可以看；"
        "传给 tc.scaled_dot_product_attention 的也是这种布尔掩码，不要取反）。",
        "mask_inverted_zero",
    ),
    (
        "k_proj 和 v_proj 用反了：键是 k_proj(K)，值是 v_proj(V)。",
        "kv_swapped",
    ),
    (
        "K 和 V 两个输入用反了：键是从 V 投影的、值是从 K 投影的"
        "（例如调用时写成了 (Q, V, K)）。自注意力里 K = V 看不出来，"
        "交叉注意力里就错了：k = k_proj(K)，v = v_proj(V)。",
        "kv_inputs_swapped",
    ),
    (
        "值是从 K 投影的（v = v_proj(K)）：K 和 V 弄混了。键来自 K，"
        "值来自第三个输入 V：k = k_proj(K)，v = v_proj(V)。自注意力里 K = V 看不出来，"
        "交叉注意力里 K ≠ V 就错了。",
        "v_from_k",
    ),
    ("键用 q_proj 投影了（复制粘贴？）：应为 k_proj(K)。", "copied_k_q"),
    ("值用 q_proj 投影了（复制粘贴？）：应为 v_proj(V)。", "copied_v_q"),
    (
        "值用 k_proj 投影了（复制粘贴？或直接拿键当了值，v = k）：值要用自己的投影，"
        "v = v_proj(V)。",
        "copied_v_k",
    ),
    (
        "被屏蔽的位置仍有权重：掩码没有起作用（attn_mask 参数被忽略了？）。",
        "mask_ignored",
    ),
    (
        "掩码转置了：attn_mask[i, j] 说的是查询 i 能否看键 j（形状 (L, S)），"
        "你用的是 attn_mask.T（因果掩码转置后成了只看自己和之后的位置）。"
        "原样传给每个头：(L, S) 会自动广播到 (N, H, L, S)。",
        "mask_transposed",
    ),
    (
        "注意力算在了头的维度上：拆分后的 (N, T, H, D) 要先 .transpose(1, 2) 成 "
        "(N, H, T, D)，再在最后两维上算 q @ kᵀ（每个头里词元看词元）；"
        "直接送进注意力，成了每个词元的各个头互相看。",
        "attend_heads",
    ),
]

MHA_CRASHES = [
    (
        r"is invalid for input of size",
        "拆分多头时 view 的形状与元素个数不符：交叉注意力里 K、V 的长度 S 可以与 Q 的"
        "长度 L 不同，拆分 K、V 时用它们自己的长度（K.size(1)），不要用 Q 的 L。",
    ),
    (
        r"key and value must share the length S|first two dimensions of batch2 tensor",
        "键和值的长度对不上（交叉注意力里 L ≠ S）：只有查询来自 Q（q = q_proj(Q)），"
        "键和值来自另外两个输入：k = k_proj(K)，v = v_proj(V)。"
        "k_proj 或 v_proj 是不是用在了 Q 上？",
    ),
]


def _mha_reference(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
) -> Tensor:
    """The package's :class:`MultiHeadAttention` with the learner's weights."""
    ref = MultiHeadAttention(Q.size(-1), H)
    with torch.no_grad():
        for mine, theirs in zip(
            layers, (ref.q_proj, ref.k_proj, ref.v_proj, ref.out_proj), strict=True
        ):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
        return ref(Q, K, V, attn_mask=mask)


_MHA_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


@checker("多头注意力", wants_class=True)
def check_multi_head_attention(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: multi-head attention.

    The module has four ``nn.Linear(d_model, d_model)`` layers named as in
    :class:`~transformer_course.MultiHeadAttention`: ``q_proj, k_proj, v_proj,
    out_proj`` (with bias, as ``nn.Linear``'s default);
    ``forward(Q, K, V, attn_mask=None)`` takes Q ``(N, L, E)``, K/V ``(N, S, E)`` and
    a bool mask ``(L, S)`` (``True`` = may attend) and returns ``(N, L, E)`` (or
    ``(output, weights)``). Compared with the package's
    :class:`~transformer_course.MultiHeadAttention` holding the same weights.
    """
    return _grade_multi_head_attention(cls)


def _mha_cases(g: torch.Generator, specs: Sequence[tuple]) -> list[tuple]:
    """``(description, d_model, heads, Q, K, V, mask)`` for each spec ``(d_model,
    heads, N, L, S, mask)``: ``S`` None is self-attention (K = V = Q); ``mask`` is
    None, ``"causal"`` or ``"random"`` (L, S)."""
    cases = []
    for E, H, N, L, S, mask_kind in specs:
        if S is None:
            Q = K = V = randn(g, N, L, E)
            kind, S = f"自注意力 N={N}, L={L}", L
        else:
            Q, K, V = randn(g, N, L, E), randn(g, N, S, E), randn(g, N, S, E)
            size = f"L=S={L}" if S == L else f"L={L}, S={S}"
            kind = f"交叉注意力 N={N}, {size}"
        mask = {None: None, "causal": causal_mask(L, S)}.get(mask_kind)
        if mask_kind == "random":
            mask = random_mask(g, L, S)
        about = {None: "无掩码", "causal": "因果掩码", "random": "随机掩码"}[mask_kind]
        about += "" if mask is None else f" ({L}, {S})"
        cases.append((f"d_model={E}, {H} 个头，{kind}，{about}", E, H, Q, K, V, mask))
    return cases


def _constructed(cls: type, cases: list[tuple]) -> Iterator[tuple]:
    """For each case of :func:`_mha_cases`: ``(i, case, E, H, (Q, K, V, mask), what,
    module, args)``, the learner's module built for it and the arguments to call it
    with."""
    name = name_of(cls)
    for i, (case, E, H, Q, K, V, mask) in enumerate(cases):
        module = construct(cls, E, H, what=name)
        args = (Q, K, V) if mask is None else (Q, K, V, mask)
        yield i, case, E, H, (Q, K, V, mask), f"{name}({E}, {H})", module, args


def _projections(module: nn.Module, E: int, what: str) -> list[nn.Linear]:
    """The module's four projections (checked), after checking it has no dropout."""
    layers = [linear_attr(module, a, E, E, what, bias=True) for a in _MHA_NAMES]
    check_no_dropout(module, what)
    return layers


def _output(out: object, what: str, case: str) -> Tensor:
    """The output tensor of ``forward``; an ``(output, weights)`` pair is refused: the
    later cells add the output to a residual."""
    if isinstance(out, (tuple, list)):
        fail(
            f"{what}.forward 返回了 {len(out)} 个值的 {type(out).__name__}（{case}）："
            "练习要的是一个形状 (N, L, E) 的 torch.Tensor。"
            + (
                "nn.MultiheadAttention 返回（输出, 注意力权重），这里只返回输出 "
                "return self.out_proj(...)："
                if len(out) == 2
                else "只返回输出投影的结果 return self.out_proj(...)："
            )
            + "后面的块要做 x + self_attn(...)，加不上一个元组。"
        )
    return as_tensor(out, f"{what} 的输出", case)


def _grade_multi_head_attention(cls: type) -> str:
    """The body of :func:`check_multi_head_attention` (also run by
    :func:`check_head_contributions`)."""
    cases = _mha_cases(
        seeded_generator(3),
        [
            (12, 3, 3, 5, None, None),
            (12, 3, 2, 4, 7, None),
            (8, 2, 2, 6, None, "causal"),
            (12, 4, 2, 3, 5, "random"),
            (8, 2, 2, 4, 4, None),  # cross-attention of equal lengths: K ≠ Q
        ],
    )
    for i, case, E, H, (Q, K, V, mask), what, module, args in _constructed(cls, cases):
        with torch.no_grad():
            out = run_module(
                module, *args, what=what, case=case, first=i == 0, causes=MHA_CRASHES
            )
        out = _output(out, what, case)
        layers = _projections(module, E, what)
        with torch.no_grad():
            ref = _mha_reference(layers, H, Q, K, V, mask)
        if tuple(out.shape) == (Q.size(0), H, Q.size(1), E // H):
            fail(
                f"{what} 的输出形状是 {tuple(out.shape)}（{case}）：这是各个头的输出 "
                "(N, H, L, D)，还要合并多头 transpose(1, 2).reshape(N, L, E) 再经过 "
                "out_proj。"
            )
        check_shape(
            out,
            ref.shape,
            f"{what} 的输出",
            case,
            " 多头注意力的输出应与 Q 同形 (N, L, E)。",
        )
        check_float(out, f"{what} 的输出")
        nan_hint = "检查 softmax 之前的分数，是否某一行全被填成了 -inf？"
        if mask is not None and bool(mask.all(-1).any()):
            nan_hint = (
                "NaN 出现在有掩码的情形：掩码整行为 True 的 query 得到了 NaN，"
                "说明被填成 -inf 的恰是「可以看」的位置：掩码方向可能反了"
                "（True = 可以看）：应写 masked_fill(~attn_mask, -inf)。"
            )
        check_finite(out, f"{what} 的输出", case, nan_hint)
        if close(out, ref):
            continue
        variant = functools.partial(_mha_variant, layers, H, Q, K, V, mask)
        hint = first_reproduced(out, MHA_HINTS, variant, H=H, D=E // H, E=E) or (
            "逐步对照：投影 → view(N, T, H, D).transpose(1, 2) → 缩放点积注意力"
            "（除以 √d_k，掩码，softmax(dim=-1)）"
            "→ transpose(1, 2).reshape(N, L, E) → out_proj。"
        )
        fail(
            f"{what} 的输出与参考实现（同样权重的 tc.MultiHeadAttention）不一致"
            f"（{case}；{where_differs(out, ref)}）。\n可能的原因：{hint}"
        )
    return (
        "2 到 4 个头，自注意力与交叉注意力（S ≠ L 与 S = L），"
        "因果掩码与随机掩码，共 5 组"
    )


# multi-head attention as a sum of per-head contributions (ch03): head_h W^O_h


def _head_outputs(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    heads: Callable[[int, int], slice],
) -> list[Tensor]:
    """``head_h`` ``(N, L, D)`` for each head, attending with the features
    ``heads(h, D)`` of the three projections."""
    q_proj, k_proj, v_proj, _ = layers
    q, k, v = apply_linear(q_proj, Q), apply_linear(k_proj, K), apply_linear(v_proj, V)
    D = Q.size(-1) // H
    return [
        scaled_dot_product_attention(
            q[..., heads(h, D)], k[..., heads(h, D)], v[..., heads(h, D)], mask
        )[0]
        for h in range(H)
    ]


def _segment(h: int, D: int) -> slice:  # head h: features hD .. (h+1)D - 1
    return slice(h * D, (h + 1) * D)


def _contributions(
    layers: Sequence[nn.Linear],
    H: int,
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    mask: Tensor | None,
    mistake: str = "",
) -> list[Tensor]:
    """``[head_h W^O_h for h]``, each ``(N, L, E)``: ``W^O_h`` is the transpose of
    columns ``hD .. (h+1)D - 1`` of ``out_proj.weight`` (``nn.Linear`` stores
    ``W^T``); or what :data:`HEAD_HINTS`' ``mistake`` gives instead."""
    E = Q.size(-1)
    heads = {  # which features head h reads (and which columns of W it uses)
        "segment_from_h": lambda h, D: slice(h, h + D),
        "strided": lambda h, D: slice(h, E, H),
    }.get(mistake, _segment)
    outputs = _head_outputs(layers, H, Q, K, V, mask, heads)
    W, bias = layers[3].weight, layers[3].bias  # (E, E): W^T
    D = E // H
    if mistake == "rows":  # W^O_h taken as rows hD .. (h+1)D - 1
        return [out @ W[heads(h, D)] for h, out in enumerate(outputs)]
    if mistake == "cols_reshaped":  # the (E, D) column slice reshaped to (D, E)
        return [out @ W[:, heads(h, D)].reshape(D, E) for h, out in enumerate(outputs)]
    if mistake == "w_o_next_head":  # head h times the columns of head h + 1
        return [out @ W[:, heads((h + 1) % H, D)].T for h, out in enumerate(outputs)]
    parts = [out @ W[:, heads(h, D)].T for h, out in enumerate(outputs)]
    if mistake == "shared_equally":  # every head given 1/H of the whole output
        return [sum(parts) / H] * H
    if mistake == "bias_split":  # the bias shared out, 1/H of it on each head
        return [p + bias / H for p in parts]
    return [p + bias for p in parts] if mistake == "bias_per_head" else parts


HEAD_HINTS = [
    (
        "W^O_h 取成了 out_proj.weight 的行：nn.Linear 存的是 Wᵀ（形状 "
        "(out, in)），W^O_h 是第 hD 到 (h+1)D−1 列的转置："
        "out_proj.weight[:, h * D : (h + 1) * D].T，形状 (D, E)。",
        "rows",
    ),
    (
        "列切片 out_proj.weight[:, h * D : (h + 1) * D] 是 (E, D)，你用 reshape（或 "
        "view）把它变成了 (D, E)：reshape 只按内存顺序重排，不是转置，元素放错了"
        "位置。要转置：out_proj.weight[:, h * D : (h + 1) * D].T。",
        "cols_reshaped",
    ),
    (
        "各头的贡献里加了 out_proj.bias：偏置不属于任何一个头，"
        "只在 forward 里对各头之和加一次。",
        "bias_per_head",
    ),
    (
        "各头的贡献里加了 out_proj.bias / H（把偏置平分给了各头）：各头之和因此"
        "仍然对，但一个头的贡献就不再只是 head_h W^O_h。偏置不属于任何一个头："
        "head_contributions 只返回 head_h W^O_h，forward 里对各头之和加一次偏置。",
        "bias_split",
    ),
    (
        "第 h 个头取的是第 h 到 h+D−1 个特征（像是 [h : h + D]）：第 h 段是第 hD "
        "到 (h+1)D−1 个特征，切片 [h * D : (h + 1) * D]"
        "（投影结果和 out_proj.weight 的列都这样切）。",
        "segment_from_h",
    ),
    (
        "第 h 个头取的是每隔 H 个的特征 h, h+H, h+2H, …（像是 [h::H] 或 "
        "view(N, T, D, H)）：一个头是连续的一段，第 hD 到 (h+1)D−1 个特征，"
        "即 view(N, T, H, D) 的第 h 个，或切片 [h * D : (h + 1) * D]。",
        "strided",
    ),
    (
        "head_h 乘的是下一个头的 W^O（out_proj.weight 的第 (h+1)D 到 (h+2)D−1 列）："
        "head_h 与 W^O_h 要用同一个 h，out_proj.weight[:, h * D : (h + 1) * D].T。",
        "w_o_next_head",
    ),
    (
        "每个头的贡献都一样，都是整个多头输出的 1/H：和是对的，但那不是第 h 个头"
        "自己的贡献。第 h 个头只用自己那一段特征算注意力 head_h，再乘自己的 "
        "W^O_h = out_proj.weight[:, h * D : (h + 1) * D].T，各头的贡献一般各不相同。",
        "shared_equally",
    ),
]


def _forward_variant(
    contributions: Callable[[Tensor | None], list[Tensor]],
    bias: Tensor,
    mask: Tensor | None,
    mistake: str,
) -> Tensor | None:
    """What ``forward`` outputs with one of :data:`SUM_HINTS`' mistakes."""
    if mistake == "mask_dropped":
        return None if mask is None else sum(contributions(None)) + bias
    parts = contributions(mask)
    return sum(parts) + {"no_bias": 0, "bias_per_head": len(parts)}[mistake] * bias


SUM_HINTS = [
    ("forward 少加了 out_proj.bias：输出是各头贡献之和再加一次偏置。", "no_bias"),
    (
        "forward 把 out_proj.bias 加了 {H} 次（每个头一次）：偏置只加一次，"
        "sum(各头贡献) + out_proj.bias。",
        "bias_per_head",
    ),
    (
        "forward 没有把 attn_mask 传给 head_contributions：输出像是没有掩码时的"
        "各头之和；写 self.head_contributions(Q, K, V, attn_mask)。",
        "mask_dropped",
    ),
]

_NO_TRANSPOSE_W_O = (
    "W^O_h 的形状应为 (D, E)：out_proj.weight 是 (E, E)，取第 hD 到 (h+1)D−1 "
    "列得到 (E, D)，还要转置：out_proj.weight[:, h * D : (h + 1) * D].T。"
)

HEAD_CRASHES = [
    (r"cannot be multiplied[^\n]*\n.*\.weight\b", _NO_TRANSPOSE_W_O),
    # (…×D) @ (E×D) where the line is unknown (code run by exec): the same slip
    (r"cannot be multiplied \(\d+x(\d+) and \d+x\1\)", _NO_TRANSPOSE_W_O),
]


def _contributions_of(
    module: nn.Module, args: tuple, H: int, what: str, case: str, first: bool
) -> list[Tensor]:
    """The learner's ``head_contributions(*args)`` as a list of ``H`` tensors (a
    tuple, or a tensor stacked on a first axis of ``H``, works as well)."""
    method = getattr(module, "head_contributions", None)
    if method is None:
        fail(
            f"{what} 缺少方法 head_contributions(Q, K, V, attn_mask=None)："
            "它返回 H 个张量的列表，第 h 个是 head_h W^O_h。"
        )
    parts = run_learner(
        method,
        *args,
        what=f"{what}.head_contributions",
        case=case,
        first=first,
        causes=HEAD_CRASHES,
    )
    if isinstance(parts, Tensor) and parts.dim() == 4 and parts.size(0) == H:
        parts = list(parts.unbind(0))
    if isinstance(parts, Tensor):
        fail(
            f"{what}.head_contributions 返回了一个形状为 {tuple(parts.shape)} 的张量"
            f"（{case}）：应返回 H = {H} 个张量的列表，每个头一个"
            "（各头之和留给 forward）。"
        )
    if not isinstance(parts, (list, tuple)) or len(parts) != H:
        kind = type(parts).__name__
        got = f"{len(parts)} 个（{kind}）" if isinstance(parts, (list, tuple)) else kind
        fail(
            f"{what}.head_contributions 应返回 H = {H} 个张量的列表（每个头一个），"
            f"得到 {got}（{case}）。"
        )
    return [
        as_tensor(p, f"{what}.head_contributions 的第 {h} 个元素", case)
        for h, p in enumerate(parts)
    ]


def _grade_contributions(
    parts: list[Tensor],
    layers: Sequence[nn.Linear],
    H: int,
    qkv_mask: tuple,
    what: str,
    case: str,
) -> list[Tensor]:
    """Compare the learner's ``parts`` with ``head_h W^O_h``; returns the
    reference."""
    Q, K, V, mask = qkv_mask
    N, L, E = Q.shape
    with torch.no_grad():
        ref = _contributions(layers, H, Q, K, V, mask)
    for h, part in enumerate(parts):
        if tuple(part.shape) == (N, L, E // H):
            fail(
                f"{what}.head_contributions 的第 {h} 个元素形状是 {tuple(part.shape)}"
                f"（{case}）：这是 head_h 本身 (N, L, D)，还要乘 W^O_h（形状 (D, E)）"
                "得到这个头对输出的贡献 (N, L, E)。"
            )
        check_shape(
            part,
            ref[h].shape,
            f"{what}.head_contributions 的第 {h} 个元素",
            case,
            " 每个头的贡献 head_h W^O_h 与输出同形 (N, L, E)。",
        )
    wrong = [h for h in range(H) if not close(parts[h], ref[h])]
    if not wrong:
        return ref
    got = torch.stack(parts)
    hint = first_reproduced(
        got,
        HEAD_HINTS,
        lambda m: torch.stack(_contributions(layers, H, Q, K, V, mask, m)),
    ) or first_reproduced(
        got.sum(0) + layers[3].bias,
        MHA_HINTS,
        functools.partial(_mha_variant, layers, H, Q, K, V, mask),
        H=H,
        D=E // H,
        E=E,
    )
    h = wrong[0]
    fail(
        f"{what}.head_contributions 的第 {h} 个头的贡献不等于 head_h W^O_h"
        f"（{case}；{where_differs(parts[h], ref[h])}）。\n可能的原因："
        + (
            hint
            or f"逐步对照：第 {h} 个头用 q、k、v 的第 hD 到 (h+1)D−1 个特征做缩放点积"
            "注意力（除以 √D，掩码），再乘 out_proj.weight[:, h * D : (h + 1) * D].T。"
        )
    )
    return ref


@checker("多头注意力写成各头贡献之和", wants_class=True)
def check_head_contributions(cls: type) -> str:
    """Grade ``cls(d_model, num_heads)``: multi-head attention written as a sum over
    heads (ch03).

    Besides the contract of :func:`check_multi_head_attention` (which it also runs),
    ``head_contributions(Q, K, V, attn_mask=None)`` returns a list of ``H`` tensors
    ``(N, L, E)``, the ``h``-th being ``head_h W^O_h``: attention over features
    ``hD .. (h+1)D - 1`` of the three projections times the transpose of columns
    ``hD .. (h+1)D - 1`` of ``out_proj.weight``; ``forward`` returns their sum plus
    ``out_proj.bias``.
    """
    cases = _mha_cases(
        seeded_generator(34),
        [(12, 3, 2, 5, 7, "random"), (8, 2, 2, 6, None, None)],
    )
    for i, case, E, H, (Q, K, V, mask), what, module, args in _constructed(cls, cases):
        with torch.no_grad():
            parts = _contributions_of(module, args, H, what, case, first=i == 0)
        layers = _projections(module, E, what)
        ref = _grade_contributions(parts, layers, H, (Q, K, V, mask), what, case)
        with torch.no_grad():
            out = run_module(module, *args, what=what, case=case, causes=MHA_CRASHES)
        out = _output(out, what, case)
        bias = layers[3].bias
        if close(out, sum(ref) + bias):
            continue
        with torch.no_grad():
            hint = first_reproduced(
                out,
                SUM_HINTS,
                functools.partial(
                    _forward_variant,
                    functools.partial(_contributions, layers, H, Q, K, V),
                    bias,
                    mask,
                ),
                H=H,
            )
        fail(
            f"{what}.forward 应返回各头贡献之和加上 out_proj.bias（{case}）"
            + (
                f"：{hint}"
                if hint
                else "：sum(self.head_contributions(Q, K, V, attn_mask)) "
                "+ self.out_proj.bias。"
            )
        )
    detail = _grade_multi_head_attention(cls)
    return f"各头贡献 head_h W^O_h 与它们之和加偏置，2 组；{detail}"
