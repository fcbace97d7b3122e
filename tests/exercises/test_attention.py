"""Scaled dot-product attention and the causal mask: correct variants written in
different styles pass; hand-written learner mistakes are rejected with a hint that
names them; every hint-table entry is reached by at least one mutant."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import attention

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection

NEG = float("-inf")

# ---------------------------------------------------------------------------
# correct variants


def attention_package(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)


def attention_einsum_additive(Q, K, V, attn_mask=None):
    scores = torch.einsum("...ld,...sd->...ls", Q, K) * Q.size(-1) ** -0.5
    if attn_mask is not None:
        scores = scores + torch.zeros(attn_mask.shape).masked_fill(~attn_mask, NEG)
    return torch.einsum("...ls,...sd->...ld", scores.softmax(-1), V)


def attention_torch_sdpa(Q, K, V, attn_mask=None):
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask)


def attention_as_list(Q, K, V, attn_mask=None):
    out, weights = tc.scaled_dot_product_attention(Q, K, V, attn_mask)
    return [out, weights]


def attention_online(Q, K, V, attn_mask=None, block=4):
    """ch04's blockwise recurrence, safe when a whole block is masked."""
    scores = Q @ K.mT / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    m = torch.full(scores.shape[:-1] + (1,), NEG)
    total = torch.zeros_like(m)
    acc = torch.zeros(scores.shape[:-1] + (V.size(-1),))
    for s0 in range(0, scores.size(-1), block):
        s = scores[..., s0 : s0 + block]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p, rescale = torch.exp(s - safe), torch.exp(m - safe)
        total = total * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + p @ V[..., s0 : s0 + block, :]
        m = m_new
    return acc / total


def attention_skeleton(Q, K, V, attn_mask=None):
    pass


def test_self_attention_accepts(capsys):
    for fn in (attention_package, attention_einsum_additive, attention_torch_sdpa, attention_as_list,
               attention_online):  # fmt: skip
        assert_passes(ex.check_self_attention, fn, capsys)
    assert_passes(ex.check_self_attention, attention_package, capsys, solution=True)


def test_self_attention_accepts_a_large_negative_fill(capsys):
    # ch01 asks for -inf; -1e9 gives the same weights unless a whole row is masked
    assert_passes(ex.check_self_attention, attention_fill_large_negative, capsys)


def output_only(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0]


def test_exercise_1_1_requires_the_weights_too(capsys):
    # ch01's 1.1 states the (输出, 权重) return; 5.3 allows the output alone, 1.6 and 2.4 do not say
    with pytest.raises(ex.ExerciseError, match=r"练习 1\.1 要求 output_only 返回 \(输出, 权重\)"):
        ex.check_self_attention(output_only, exercise="1.1")
    assert "✓" not in capsys.readouterr().out
    for number in ("5.3", "1.6", "2.4", None):
        assert_passes(ex.check_self_attention, output_only, capsys, exercise=number)
    assert_passes(ex.check_self_attention, attention_as_list, capsys, exercise="1.1")
    assert_passes(ex.check_self_attention, attention_package, capsys, exercise="1.1")


def test_self_attention_skeleton(capsys):
    assert_skeleton(ex.check_self_attention, attention_skeleton, capsys)


# ---------------------------------------------------------------------------
# learner mistakes, one function each


def no_scale(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    return torch.softmax(scores, -1) @ V


def scale_by_d(Q, K, V, attn_mask=None):
    w = torch.softmax((Q @ K.mT / Q.shape[-1]).masked_fill(~attn_mask, NEG) if attn_mask is not None
                      else Q @ K.mT / Q.shape[-1], dim=-1)  # fmt: skip
    return w @ V, w


def scale_by_query_count(Q, K, V, attn_mask=None):  # learner test 8a, 2.4: √L
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-2])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ V


def scale_by_batch(Q, K, V, attn_mask=None):  # learner test 21a, 2.1: K.shape[0] is the batch size
    scores = Q @ K.transpose(-2, -1) / math.sqrt(K.shape[0])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ V


def scale_by_length(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(K.shape[-2])
    if attn_mask is not None:
        scores[~attn_mask.expand_as(scores)] = NEG
    return scores.softmax(-1) @ V


def softmax_over_queries(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    w = F.softmax(scores, dim=-2)
    return w @ V


def scale_after_softmax(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    return F.softmax(scores, dim=-1) / math.sqrt(Q.size(-1)) @ V


def scale_after_softmax_with_weights(Q, K, V, attn_mask=None):
    """Learner test 10a (1.1): the weights divided by √D after the softmax, returned."""
    scores = Q @ K.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    w = F.softmax(scores, dim=-1) / math.sqrt(Q.size(-1))
    return w @ V, w


def softmax_over_queries_renormalised(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    w = F.softmax(scores, dim=-2)
    return (w / w.sum(-1, keepdim=True)) @ V


def weights_times_keys(Q, K, V, attn_mask=None):
    out, w = tc.scaled_dot_product_attention(Q, K, V, attn_mask)
    return w @ K


def mask_inverted(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(attn_mask, -1e9)  # -1e9: no NaN, the hint must still say why
    return torch.softmax(scores, -1) @ V


def mask_ignored(Q, K, V, mask=None):  # the argument is there, never used
    return tc.scaled_dot_product_attention(Q, K, V)[0]


def masked_to_zero(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = torch.where(attn_mask, scores, torch.zeros_like(scores))
    return torch.softmax(scores, -1) @ V


def float_mask_added(Q, K, V, attn_mask=None):  # learner test 27c, 5.3: the 0/1 mask as an additive one
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores + attn_mask.float()
    weights = scores.softmax(-1)
    return weights @ V, weights


def float_mask_to_sdpa(Q, K, V, attn_mask=None):  # learner test 38c, 5.3: output only
    mask = None if attn_mask is None else attn_mask.float()
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)


def mask_after_softmax(Q, K, V, attn_mask=None):
    w = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1)), -1)
    if attn_mask is not None:
        w = w * attn_mask
    return w @ V


def mask_zeroed_after_softmax_with_weights(Q, K, V, attn_mask=None):
    """Learner test: the masked weights set to 0 after the softmax, weights returned."""
    w = (Q @ K.mT / math.sqrt(Q.size(-1))).softmax(-1)
    if attn_mask is not None:
        w = w.masked_fill(~attn_mask, 0.0)
    return w @ V, w


def masked_fill_value(value):
    """Learner test (2.4 find-the-bug, weights returned): the masked scores filled
    with ``value`` instead of -inf."""

    def attention(Q, K, V, attn_mask=None):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, value)
        w = torch.softmax(scores, -1)
        return w @ V, w

    return attention


def scale_multiplied(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) * math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    return scores.softmax(-1) @ V


def scores_transposed(Q, K, V, attn_mask=None):
    """Learner test (ch05 find-the-bug): the dim=-2 bug 'fixed' by transposing the
    square score matrix."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    if scores.size(-1) == scores.size(-2):
        scores = scores.transpose(-2, -1)
    return torch.softmax(scores, dim=-1) @ V


def mask_transposed(Q, K, V, attn_mask=None):
    """Learner test 8a, 1.1: a square mask used transposed, filled with -inf."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        mask = attn_mask.mT if attn_mask.size(-1) == attn_mask.size(-2) else attn_mask
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ V, weights


def weights_before_mask(Q, K, V, attn_mask=None):
    """Learner test 8a, 1.1: the output masked, the weights returned unmasked."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    unmasked = scores.softmax(-1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ V, unmasked


def attention_fill_large_negative(Q, K, V, attn_mask=None):
    """-1e9 instead of -inf: the same weights wherever a row keeps a key (no check
    masks a whole row), so it is accepted."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -1e9)
    weights = scores.softmax(-1)
    return weights @ V, weights


def online_without_rescale(Q, K, V, attn_mask=None, block=4):
    scores = Q @ K.mT / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    m = torch.full(scores.shape[:-1] + (1,), NEG)
    total, acc = 0.0, 0.0
    for s0 in range(0, scores.size(-1), block):
        s = scores[..., s0 : s0 + block]
        m = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - torch.nan_to_num(m, neginf=0.0))
        total, acc = total + p.sum(-1, keepdim=True), acc + p @ V[..., s0 : s0 + block, :]
    return acc / total


def online_nan_on_masked_first_block(Q, K, V, attn_mask=None, block=4):
    """Never guards -inf - (-inf): NaN when a row's first block is fully masked."""
    scores = Q @ K.mT / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    m = torch.full(scores.shape[:-1] + (1,), NEG)
    total = torch.zeros_like(m)
    acc = torch.zeros(scores.shape[:-1] + (V.size(-1),))
    for s0 in range(0, scores.size(-1), block):
        s = scores[..., s0 : s0 + block]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, rescale = torch.exp(s - m_new), torch.exp(m - m_new)
        total = total * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + p @ V[..., s0 : s0 + block, :]
        m = m_new
    return acc / total


def weights_transposed_when_square(Q, K, V, attn_mask=None):
    """Learner test: weights.mT @ V, which only runs when L == S."""
    scores = Q @ K.mT / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = scores.softmax(-1)
    return (weights.mT if Q.size(-2) == K.size(-2) else weights) @ V


def no_transpose(Q, K, V, attn_mask=None):
    scores = Q @ K / math.sqrt(Q.size(-1))  # forgot the transpose
    return torch.softmax(scores, -1) @ V


def k_dot_t(Q, K, V, attn_mask=None):
    with warnings.catch_warnings():  # torch deprecates .T on 3-D tensors
        warnings.simplefilter("ignore")
        scores = Q @ K.T / math.sqrt(Q.size(-1))
    return torch.softmax(scores, -1) @ V


def raw_scores_as_weights(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    out = tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0]
    return out, scores


def returns_weights(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[1]


def swapped_pair(Q, K, V, attn_mask=None):
    out, w = tc.scaled_dot_product_attention(Q, K, V, attn_mask)
    return w, out


def three_values(Q, K, V, attn_mask=None):
    out, w = tc.scaled_dot_product_attention(Q, K, V, attn_mask)
    return out, w, None


def nested_list(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0].tolist()


def nan_output(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0] * math.nan


def view_after_transpose(Q, K, V, attn_mask=None):
    N, L = Q.shape[0], Q.shape[-2]
    out = tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0]
    return out.transpose(-2, -1).view(N, -1, L).transpose(-2, -1).view(out.shape)


def transposed_output_tuple(Q, K, V, attn_mask=None):
    q = (Q, K)  # a tuple where a tensor is meant
    return q.transpose(-2, -1)


def bad_signature(Q, K, V):  # no attn_mask argument
    return tc.scaled_dot_product_attention(Q, K, V)[0]


def float_and_long(Q, K, V, attn_mask=None):
    return torch.softmax(Q @ K.mT, -1) @ V.long()


def wrong_shape(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0][..., :1]


def integer_output(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0].long()


def scales_q_in_place(Q, K, V, attn_mask=None):
    # learner test 6a, 1.1: f(x, x, x) then scales K and V too
    Q.div_(math.sqrt(Q.size(-1)))
    scores = Q @ K.transpose(-2, -1)
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, NEG)
    weights = scores.softmax(-1)
    return weights @ V, weights


def scale_by_value_dim(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(V.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, NEG)
    return scores.softmax(-1) @ V


def always_causal(Q, K, V, attn_mask=None):
    """Learner test 34a, 1.1: a lower triangle built in, whatever mask is passed."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    if attn_mask is not None:
        allowed = allowed & attn_mask
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return weights @ V, weights


def check(fn, keyword, id):
    return pytest.param(ex.check_self_attention, fn, keyword, id=id)


def mask_check(fn, keyword, id):
    return pytest.param(ex.check_causal_mask, fn, keyword, id=id)


ones = torch.ones

REJECTS = [
    check(no_scale, "没有除以 √d_k", "missing scale"),
    check(scale_by_d, "除以了 d_k", "divided by d, not its root"),
    check(scales_q_in_place, "原地修改了输入 Q", "Q scaled in place"),
    check(scale_by_value_dim, "除以了 √d_v", "divided by the root of d_v"),
    check(scale_by_length, "键的个数", "divided by the root of the key count"),
    check(scale_by_query_count, "查询的个数", "divided by the root of the query count"),
    check(scale_by_batch, "第一维是批大小 N，不是向量维度 d_k", "divided by the root of the batch size"),
    check(softmax_over_queries, "softmax 的 dim 可能写错了", "softmax over queries"),
    check(weights_times_keys, "应是 V，不是 K", "weights times K"),
    check(weights_transposed_when_square, "乘 V 之前把权重转置了", "weights transposed"),
    check(scale_after_softmax, "缩放放错了位置", "scaled after the softmax"),
    check(scale_after_softmax_with_weights, "权重在 softmax 之后又除以了 √d_k", "weights / sqrt(d), returned"),
    check(softmax_over_queries_renormalised, "再把每行除以行和", "softmax over queries, rows renormalised"),
    check(mask_inverted, "掩码方向可能反了", "mask inverted (-1e9)"),
    check(mask_ignored, "掩码没有起作用", "mask argument ignored"),
    check(masked_to_zero, "填成了 0", "masked scores set to 0"),
    check(masked_fill_value(0.0), "填 0 不行", "masked scores set to 0, weights returned"),
    check(float_mask_added, "0/1 的浮点数加到了分数上", "0/1 mask added to the scores"),
    check(float_mask_to_sdpa, "0/1 的浮点掩码被当成了加性掩码", "0/1 mask to F.sdpa"),
    check(masked_fill_value(-10.0), "有限值（约 -10）", "masked scores filled with -10"),
    check(mask_transposed, "掩码用转置了", "square mask transposed"),
    check(weights_before_mask, "返回的权重是没有屏蔽的 softmax", "weights from before the mask"),
    check(mask_after_softmax, "softmax 之后才乘掩码", "mask applied after softmax"),
    check(mask_zeroed_after_softmax_with_weights, "softmax 之后才把被屏蔽的权重置 0", "weights zeroed after softmax"),
    check(scores_transposed, "把分数矩阵转置了", "score matrix transposed"),
    check(scale_multiplied, "分数乘了 √d_k", "multiplied by sqrt(d)"),
    check(online_without_rescale, "重新缩放", "online softmax without rescaling"),
    check(online_nan_on_masked_first_block, "NaN", "online softmax: NaN on a masked first block"),
    check(k_dot_t, "K.transpose(-2, -1)", "K.T"),
    check(always_causal, "自己加了一个因果", "causal mask built in"),
    check(no_transpose, "形状对不上", "Q @ K without the transpose"),
    check(raw_scores_as_weights, "softmax 之前的分数", "raw scores returned as weights"),
    check(returns_weights, "weights @ V", "returns the weights"),
    check(swapped_pair, "顺序反了", "(weights, output)"),
    check(three_values, "3 个值", "three values"),
    check(nested_list, "应是 torch.Tensor", "returns a list"),
    check(nan_output, "含 NaN 或 inf", "NaN without a mask"),
    check(view_after_transpose, "不再连续", ".view after .transpose"),
    check(transposed_output_tuple, "先解包", "a tuple used as a tensor"),
    check(bad_signature, "签名", "no attn_mask argument"),
    check(float_and_long, "dtype 不一致", "float times long"),
    check(wrong_shape, "形状不对", "wrong output shape"),
    check(integer_output, "浮点", "integer output"),
    mask_check(lambda L: ones(L, L, dtype=torch.bool).triu(1), "True = 可以看", "blocked convention"),
    mask_check(lambda L: ones(L, L, dtype=torch.bool).triu(), "方向反了", "upper triangle"),
    mask_check(lambda L: ones(L, L, dtype=torch.bool).tril(-1), "对角线上应为 True", "diagonal missing"),
    mask_check(lambda L: ones(L, L).tril(), "浮点掩码会被当作加到分数上的加性掩码", "float mask"),
    mask_check(
        lambda L: torch.zeros(L, L).masked_fill(~tc.causal_mask(L), float("-inf")), "这是加性掩码", "additive mask"
    ),  # learner test 7a, 1.3/3.8: the hint called it a 0/1 mask
    mask_check(lambda L: ones(L, L, dtype=torch.long).tril(), "整数的 0/1 不是布尔掩码", "int64 mask"),
    mask_check(lambda L: ones(L, L, dtype=torch.bool), "没有屏蔽", "all True"),
    mask_check(lambda L: ones(L, L, dtype=torch.bool).tril(1), "i + 1", "one step ahead"),
    mask_check(lambda L: ones(L, L + 1, dtype=torch.bool).tril(), "形状", "wrong shape"),
    mask_check(lambda L: ones(L, L).tril().tolist(), "torch.Tensor", "returns a list"),
]


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {
        "ATTENTION_HINTS": attention.ATTENTION_HINTS,
        "ATTENTION_CRASHES": attention.ATTENTION_CRASHES,
        "CAUSAL_MASK_HINTS": attention.CAUSAL_MASK_HINTS,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)


# ---------------------------------------------------------------------------
# causal mask: correct variants


def test_causal_mask_accepts(capsys):
    assert_passes(ex.check_causal_mask, tc.causal_mask, capsys)
    assert_passes(ex.check_causal_mask, lambda L: torch.tril(torch.ones(L, L)).bool(), capsys)
    assert_passes(ex.check_causal_mask, lambda L: torch.arange(L)[:, None] >= torch.arange(L), capsys)
    assert_passes(ex.check_causal_mask, lambda L: ~torch.ones(L, L, dtype=torch.bool).triu(1), capsys)


def test_causal_mask_skeleton(capsys):
    def my_causal_mask(L):
        pass

    assert_skeleton(ex.check_causal_mask, my_causal_mask, capsys)


def test_chapter_2_messages_use_the_papers_letters(capsys):
    # ch02 writes n, m, d_k, h (the paper's notation); the other chapters L, S, D, H
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_self_attention(scale_by_length, exercise="2.4")
    message = str(info.value)
    assert "n=5, m=7, d_k=8" in message and "键的个数 m = 7" in message, message
    assert "S = 7" not in message and "L=5" not in message, message
    for number in ("1.6", "5.3", None):
        with pytest.raises(ex.ExerciseError) as info:
            ex.check_self_attention(scale_by_length, exercise=number)
        message = str(info.value)
        assert "L=5, S=7, D=8" in message and "键的个数 S = 7" in message, message
    ex.check_self_attention(attention_package, solution=True, exercise="2.4")
    assert "n ≠ m" in capsys.readouterr().out
    ex.check_self_attention(attention_package, solution=True)
    assert "L ≠ S" in capsys.readouterr().out


def test_chapter_2_crash_and_shape_hints_use_the_papers_letters(capsys):
    with pytest.raises(ex.ExerciseError, match=r"\(N, n, d_k\) 或 4 维 \(N, h, n, d_k\)"):
        ex.check_self_attention(k_dot_t, exercise="2.4")
    with pytest.raises(ex.ExerciseError, match=r"\(N, L, D\) 或 4 维 \(N, H, L, D\)"):
        ex.check_self_attention(k_dot_t, exercise="1.6")
    with pytest.raises(ex.ExerciseError, match=r"权重 \(…, n, m\)"):
        ex.check_self_attention(returns_weights, exercise="2.4")
    with pytest.raises(ex.ExerciseError, match=r"权重 \(…, L, S\)"):
        ex.check_self_attention(returns_weights)


# Learner test 24a ran its code by exec, so the crashing line was unknown and 1.1's
# K.transpose(1, 2) (4-D) and 1.7's transposed weights got the generic shape hint; the
# hints now come from the crash's sizes.
EXEC_SOURCE = """
def k_transposed_1_2(Q, K, V, attn_mask=None):
    s = Q @ K.transpose(1, 2) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    w = torch.softmax(s, -1)
    return w @ V, w


def weights_transposed(Q, K, V, attn_mask=None):
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    w = torch.softmax(s.transpose(-2, -1), dim=-2)
    return w @ V, w
"""


def exec_defined(source, name):
    ns = {"math": math, "torch": torch}
    exec(compile(source, "<string>", "exec"), ns)  # noqa: S102
    return ns[name]


SIZE_CRASH_REJECTS = [
    pytest.param(
        lambda f: ex.check_self_attention(f, exercise="1.1"),
        exec_defined(EXEC_SOURCE, "k_transposed_1_2"),
        "K.transpose(1, 2) 在 4 维时交换的是头和位置",
        id="K.transpose(1, 2), line unknown",
    ),
    pytest.param(
        lambda f: ex.check_self_attention(f, exercise="1.7"),
        exec_defined(EXEC_SOURCE, "weights_transposed"),
        "你的权重是 (…, S, L)，被转置了",
        id="weights transposed, line unknown",
    ),
]


@pytest.mark.parametrize("checker, candidate, keyword", SIZE_CRASH_REJECTS)
def test_a_crash_with_an_unknown_line_is_named_from_its_sizes(checker, candidate, keyword, capsys):
    message = rejection(checker, candidate)
    assert keyword in message and "打印各个张量的 .shape" not in message, message


def test_every_size_crash_hint_is_reached(capsys):
    tables = {"ATTENTION_SIZE_CRASHES": attention.ATTENTION_SIZE_CRASHES}
    letters = {"L": "L", "S": "S", "D": "D", "H": "H"}
    tables = {k: [(p, h.format(**letters)) for p, h in t] for k, t in tables.items()}
    assert_every_hint_reached(tables, SIZE_CRASH_REJECTS, capsys)
