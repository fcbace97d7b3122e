"""Multi-head attention: correct variants pass, hand-written learner mistakes are
rejected with a hint that names them, every hint-table entry is reached."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import heads

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton

NEG = float("-inf")


class MHA(tc.MultiHeadAttention):
    """A learner's multi-head attention, written the usual way: the package's layers,
    the forward pass by hand."""

    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.h, self.d = num_heads, d_model // num_heads

    def split(self, x):  # (N, T, E) -> (N, H, T, D)
        return x.view(x.size(0), x.size(1), self.h, self.d).transpose(1, 2)

    def merge(self, x):  # (N, H, L, D) -> (N, L, E)
        return x.transpose(1, 2).reshape(x.size(0), x.size(2), self.h * self.d)

    def attend(self, q, k, v, attn_mask):
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, NEG)
        return torch.softmax(scores, dim=-1) @ v

    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))


class MHAEinsumLoop(MHA):
    """Another style: a loop over heads with channel slices and einsum."""

    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.q_proj(Q), self.k_proj(K), self.v_proj(V)
        D = q.size(-1) // self.h
        outs = []
        for i in range(self.h):
            sl = slice(i * D, (i + 1) * D)
            s = torch.einsum("nld,nsd->nls", q[..., sl], k[..., sl]) / D**0.5
            if attn_mask is not None:
                s = s.masked_fill(~attn_mask, NEG)
            outs.append(torch.einsum("nls,nsd->nld", s.softmax(-1), v[..., sl]))
        return self.out_proj(torch.cat(outs, dim=-1))


class MHASdpa(MHA):
    """unflatten/permute and torch's SDPA."""

    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = (p(x).unflatten(-1, (self.h, self.d)).permute(0, 2, 1, 3)
                   for p, x in ((self.q_proj, Q), (self.k_proj, K), (self.v_proj, V)))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out_proj(out.permute(0, 2, 1, 3).flatten(2))


class ReturnsWeights(MHA):
    """Learner test 34a, 1.2: (output, weights) returned like nn.MultiheadAttention;
    a later x + self_attn(x) cannot add a tuple."""

    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        out, w = tc.scaled_dot_product_attention(q, k, v, attn_mask)
        return self.out_proj(self.merge(out)), w


def test_multi_head_attention_accepts(capsys):
    for cls in (tc.MultiHeadAttention, MHA, MHAEinsumLoop, MHASdpa):
        assert_passes(ex.check_multi_head_attention, cls, capsys)


class MHASkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()

    def forward(self, Q, K, V, attn_mask=None):
        pass


class MHAInitNotImplemented(nn.Module):
    def __init__(self, d_model, num_heads):
        raise NotImplementedError


class MHANoSuper(nn.Module):
    def __init__(self, d_model, num_heads):
        pass

    def forward(self, Q, K, V, attn_mask=None):
        pass


@pytest.mark.parametrize("skeleton", [MHASkeleton, MHAInitNotImplemented, MHANoSuper])
def test_multi_head_attention_skeleton(skeleton, capsys):
    assert_skeleton(ex.check_multi_head_attention, skeleton, capsys)


# ---------------------------------------------------------------------------
# learner mistakes


class MergeWithoutTranspose(MHA):
    def merge(self, x):
        return x.reshape(x.size(0), x.size(2), -1)


class SplitWithoutTranspose(MHA):
    def split(self, x):
        return x.reshape(x.size(0), self.h, x.size(1), self.d)


class NeitherTransposed(SplitWithoutTranspose):
    def merge(self, x):
        return x.reshape(x.size(0), x.size(2), -1)


class SplitFeaturesAsDH(MHA):  # learner test 20c, 5.4: E read as (D, H), merged back alike
    def split(self, x):
        return x.view(x.size(0), x.size(1), self.d, self.h).permute(0, 3, 1, 2)

    def merge(self, x):
        return x.permute(0, 2, 3, 1).reshape(x.size(0), x.size(2), self.h * self.d)


class OneHead(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.q_proj(Q), self.k_proj(K), self.v_proj(V)
        s = q @ k.mT / math.sqrt(q.size(-1))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, NEG)
        return self.out_proj(s.softmax(-1) @ v)


class NoScale(MHA):
    def attend(self, q, k, v, attn_mask):
        s = q @ k.transpose(-2, -1)
        return (s if attn_mask is None else s.masked_fill(~attn_mask, NEG)).softmax(-1) @ v


class ScaleByModel(MHA):
    def attend(self, q, k, v, attn_mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(self.h * self.d)
        return (s if attn_mask is None else s.masked_fill(~attn_mask, NEG)).softmax(-1) @ v


class SoftmaxOverQueries(MHA):
    def attend(self, q, k, v, attn_mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        return (s if attn_mask is None else s.masked_fill(~attn_mask, NEG)).softmax(-2) @ v


class SoftmaxOverHeads(MHA):
    """Learner test (3.4): softmax(1) on the (N, H, L, S) scores, masked with -1e9."""

    def attend(self, q, k, v, attn_mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        return (s if attn_mask is None else s.masked_fill(~attn_mask, -1e9)).softmax(1) @ v


class NoOutProj(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        return self.merge(self.attend(q, k, v, attn_mask))


class KVFromQuery(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        return super().forward(Q, Q, Q, attn_mask)


class QProjForAll(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.q_proj(K)), self.split(self.q_proj(V))
        return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))


class MaskInverted(MHA):
    def attend(self, q, k, v, attn_mask):
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        return (s if attn_mask is None else s.masked_fill(attn_mask, -1e9)).softmax(-1) @ v


class MaskInvertedPackageAttention(MHA):
    """The inverted mask handed to the package's attention (rows masked whole give 0)."""

    def attend(self, q, k, v, attn_mask):
        return tc.scaled_dot_product_attention(q, k, v, None if attn_mask is None else ~attn_mask)[0]


class KVProjectionsSwapped(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.v_proj(K)), self.split(self.k_proj(V))
        return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))


def copied_projection(role, source):
    """A copy-paste slip: K (or V) projected with another input's layer."""

    class Copied(MHA):
        def forward(self, Q, K, V, attn_mask=None):
            layers = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj}
            k_layer = layers[source] if role == "k" else self.k_proj
            v_layer = layers[source] if role == "v" else self.v_proj
            q, k, v = self.split(self.q_proj(Q)), self.split(k_layer(K)), self.split(v_layer(V))
            return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))

    Copied.__name__ = f"{role.upper()}With{source.upper()}Proj"
    return Copied


class MaskIgnored(MHA):
    def attend(self, q, k, v, attn_mask):
        return super().attend(q, k, v, None)


class SplitWithQueryLength(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        N, L, E = Q.shape

        def split(x):
            return x.view(N, L, self.h, self.d).transpose(1, 2)  # L of Q, also for K and V

        q, k, v = split(self.q_proj(Q)), split(self.k_proj(K)), split(self.v_proj(V))
        return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))


class KeysFromQuery(MHA):  # learner test 7a, 1.8/3.4: k_proj(Q), the package attention
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(Q)), self.split(self.v_proj(V))
        return self.out_proj(self.merge(tc.scaled_dot_product_attention(q, k, v, attn_mask)[0]))


class KeysFromQueryMatmul(MHA):  # the same slip with attention written out
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(Q)), self.split(self.v_proj(V))
        return self.out_proj(self.merge(self.attend(q, k, v, None)))


class ViewAfterTranspose(MHA):
    def merge(self, x):
        return x.transpose(1, 2).view(x.size(0), x.size(2), -1)


class HeadsNotMerged(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        return self.attend(q, k, v, attn_mask)


class NoBias(MHA):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)


class OtherNames(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, Q, K, V, attn_mask=None):
        return Q


class WithDropout(MHA):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.drop = nn.Dropout(0.1)

    def attend(self, q, k, v, attn_mask):
        return self.drop(super().attend(q, k, v, attn_mask))


class MaskTransposedWhenSquare(MHA):  # learner test: attn_mask.T when L == S
    def attend(self, q, k, v, attn_mask):
        if attn_mask is not None and q.size(2) == k.size(2):
            attn_mask = attn_mask.transpose(-2, -1)
        return super().attend(q, k, v, attn_mask)


class ThreeValues(MHA):
    def forward(self, Q, K, V, attn_mask=None):
        return Q, K, V


def check(cls, keyword, id):
    return pytest.param(ex.check_multi_head_attention, cls, keyword, id=id)


class AttentionOverHeads(MHA):
    """Learner test (5.5): attention on (N, T, H, D), the heads as the key axis."""

    def attend(self, q, k, v, attn_mask):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if attn_mask is not None and attn_mask.shape[-1] == scores.shape[-1]:
            scores = scores.masked_fill(~attn_mask, NEG)
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)


class KVInputsSwapped(MHA):
    """Learner test 9a, 3.4: super().forward(Q, V, K): keys from V, values from K."""

    def forward(self, Q, K, V, attn_mask=None):
        return super().forward(Q, V, K, attn_mask)


class ValuesFromK(MHA):
    """Learner test 5.4: v = v_proj(K), the values projected from the keys' input."""

    def forward(self, Q, K, V, attn_mask=None):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(K))
        return self.out_proj(self.merge(self.attend(q, k, v, attn_mask)))


class KeysAsValues(MHA):
    """Learner test 5.4: the keys used as the values, attend(q, k, k)."""

    def forward(self, Q, K, V, attn_mask=None):
        q, k = self.split(self.q_proj(Q)), self.split(self.k_proj(K))
        return self.out_proj(self.merge(self.attend(q, k, k, attn_mask)))


REJECTS = [
    check(ValuesFromK, "值是从 K 投影的", "values projected from K"),
    check(KeysAsValues, "直接拿键当了值", "keys used as values"),
    check(KVInputsSwapped, "K 和 V 两个输入用反了", "K and V inputs swapped"),
    check(AttentionOverHeads, "注意力算在了头的维度上", "attention over the heads"),
    check(MergeWithoutTranspose, "合并多头时没有先转置", "heads merged without transposing"),
    check(SplitWithoutTranspose, "拆分多头时直接 view", "heads split without transposing"),
    check(NeitherTransposed, "都少了转置", "split and merge without transposing"),
    check(SplitFeaturesAsDH, "把 E 拆成了 (D, H)", "features split as (D, H)"),
    check(OneHead, "没有拆分多头", "a single head"),
    check(NoScale, "没有除以 √d_k", "missing scale"),
    check(ScaleByModel, "√d_model", "scaled by d_model"),
    check(SoftmaxOverQueries, "softmax 的 dim", "softmax over queries"),
    check(SoftmaxOverHeads, "softmax 在头的维度上做了", "softmax over heads"),
    check(NoOutProj, "输出投影", "no output projection"),
    check(KVFromQuery, "K 和 V 都用 Q 算了", "K and V from Q"),
    check(QProjForAll, "也用 q_proj 投影了", "q_proj used for K and V"),
    check(MaskInverted, "掩码方向可能反了", "mask inverted"),
    check(MaskIgnored, "掩码没有起作用", "mask ignored"),
    check(copied_projection("k", "q"), "键用 q_proj 投影了", "K projected with q_proj"),
    check(copied_projection("v", "q"), "值用 q_proj 投影了", "V projected with q_proj"),
    check(copied_projection("v", "k"), "值用 k_proj 投影了", "V projected with k_proj"),
    check(MaskInvertedPackageAttention, "掩码方向反了", "mask inverted, package attention"),
    check(KVProjectionsSwapped, "k_proj 和 v_proj 用反了", "k and v projections swapped"),
    check(SplitWithQueryLength, "K.size(1)", "K split with the query length"),
    check(ViewAfterTranspose, "不再连续", ".view after .transpose"),
    check(KeysFromQuery, "k = k_proj(K)", "keys projected from Q"),
    check(KeysFromQueryMatmul, "k = k_proj(K)", "keys projected from Q, attention written out"),
    check(HeadsNotMerged, "合并多头", "heads not merged"),
    check(NoBias, "应带偏置", "bias-free projection"),
    check(OtherNames, "缺少属性 q_proj", "other names"),
    check(WithDropout, "dropout", "dropout"),
    check(ThreeValues, "返回了 3 个值的 tuple", "three values"),
    check(ReturnsWeights, "加不上一个元组", "(output, weights) returned"),
    check(MaskTransposedWhenSquare, "掩码转置了", "mask transposed"),
]


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    assert_every_hint_reached({"MHA_HINTS": heads.MHA_HINTS, "MHA_CRASHES": heads.MHA_CRASHES}, REJECTS, capsys)


def test_instance_instead_of_class():
    with pytest.raises(ex.ExerciseError, match="类本身"):
        ex.check_multi_head_attention(MHA(12, 3))


# ---------------------------------------------------------------------------
# ch03 3.4: multi-head attention as a sum of per-head contributions


class HeadSum(MHA):
    """The page's solution: split with view/transpose, the package's attention, W^O_h
    the transposed columns of out_proj.weight."""

    def w_o(self, h):  # (D, E)
        return self.out_proj.weight[:, h * self.d : (h + 1) * self.d].T

    def heads(self, Q, K, V, attn_mask):  # (N, H, L, D)
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        return tc.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)[0]

    def head_contributions(self, Q, K, V, attn_mask=None):
        heads = self.heads(Q, K, V, attn_mask)
        return [heads[:, h] @ self.w_o(h) for h in range(self.h)]

    def forward(self, Q, K, V, attn_mask=None):
        return sum(self.head_contributions(Q, K, V, attn_mask)) + self.out_proj.bias


class HeadSumEinsumLoop(MHA):
    """A loop over channel slices with einsum; forward by concatenation (as ch01)."""

    def head_contributions(self, Q, K, V, attn_mask=None):
        q, k, v = self.q_proj(Q), self.k_proj(K), self.v_proj(V)
        parts = []
        for h in range(self.h):
            sl = slice(h * self.d, (h + 1) * self.d)
            s = torch.einsum("nld,nsd->nls", q[..., sl], k[..., sl]) / math.sqrt(self.d)
            if attn_mask is not None:
                s = s.masked_fill(~attn_mask, NEG)
            head = torch.einsum("nls,nsd->nld", s.softmax(-1), v[..., sl])
            parts.append(torch.einsum("nld,ed->nle", head, self.out_proj.weight[:, sl]))
        return parts


class HeadSumBatchedTuple(HeadSum):
    """All heads at once: W viewed as (E, H, D), a tuple returned, forward with F.linear."""

    def head_contributions(self, Q, K, V, attn_mask=None):
        heads = self.heads(Q, K, V, attn_mask)  # (N, H, L, D)
        W = self.out_proj.weight.view(-1, self.h, self.d)  # (E, H, D)
        return tuple(torch.einsum("nhld,ehd->hnle", heads, W))

    def forward(self, Q, K, V, attn_mask=None):
        return F.linear(self.merge(self.heads(Q, K, V, attn_mask)), self.out_proj.weight, self.out_proj.bias)


class HeadSumStacked(HeadSum):
    """The contributions stacked into one (H, N, L, E) tensor: sum() still works."""

    def head_contributions(self, Q, K, V, attn_mask=None):
        return torch.stack(super().head_contributions(Q, K, V, attn_mask))


def test_head_contributions_accepts(capsys):
    for cls in (HeadSum, HeadSumEinsumLoop, HeadSumBatchedTuple, HeadSumStacked):
        assert_passes(ex.check_head_contributions, cls, capsys)
    assert_passes(ex.check_head_contributions, HeadSum, capsys, solution=True)


class HeadSumSkeleton(nn.Module):  # the page's skeleton
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError

    def head_contributions(self, Q, K, V, attn_mask=None):
        raise NotImplementedError

    def forward(self, Q, K, V, attn_mask=None):
        raise NotImplementedError


class ContributionsSkeleton(HeadSum):  # forward written, head_contributions not yet
    def head_contributions(self, Q, K, V, attn_mask=None):
        raise NotImplementedError

    def forward(self, Q, K, V, attn_mask=None):
        return MHA.forward(self, Q, K, V, attn_mask)


@pytest.mark.parametrize("skeleton", [HeadSumSkeleton, ContributionsSkeleton])
def test_head_contributions_skeleton(skeleton, capsys):
    assert_skeleton(ex.check_head_contributions, skeleton, capsys)


def test_head_contributions_progress(capsys):
    ex.check_head_contributions(HeadSumSkeleton, exercise="3.4")
    ex.check_head_contributions(HeadSum, exercise="3.4")
    capsys.readouterr()
    ex.progress(3)
    assert "✓ 练习 3.4  多头注意力写成各头贡献之和（HeadSum）：通过" in capsys.readouterr().out


class Rows(HeadSum):  # learner test: W^O_h as rows, the same (D, E) shape
    def w_o(self, h):
        return self.out_proj.weight[h * self.d : (h + 1) * self.d]


class ColumnsReshaped(HeadSum):  # learner test 25a, 3.4: (E, D) columns reshaped to (D, E)
    def w_o(self, h):
        return self.out_proj.weight[:, h * self.d : (h + 1) * self.d].reshape(self.d, -1)


class BiasPerHead(HeadSum):
    def head_contributions(self, Q, K, V, attn_mask=None):
        return [p + self.out_proj.bias for p in super().head_contributions(Q, K, V, attn_mask)]

    def forward(self, Q, K, V, attn_mask=None):
        return sum(self.head_contributions(Q, K, V, attn_mask))


class BiasSharedOut(HeadSum):  # learner test 27a, 3.4: bias / H on each head, the sum right
    def head_contributions(self, Q, K, V, attn_mask=None):
        return [p + self.out_proj.bias / self.h for p in super().head_contributions(Q, K, V, attn_mask)]

    def forward(self, Q, K, V, attn_mask=None):
        return sum(self.head_contributions(Q, K, V, attn_mask))


class SegmentFromH(HeadSum):  # slice(h, h + D): forgot to multiply by D
    def head_contributions(self, Q, K, V, attn_mask=None):
        q, k, v = self.q_proj(Q), self.k_proj(K), self.v_proj(V)
        parts = []
        for h in range(self.h):
            sl = slice(h, h + self.d)
            head = tc.scaled_dot_product_attention(q[..., sl], k[..., sl], v[..., sl], attn_mask)[0]
            parts.append(head @ self.out_proj.weight[:, sl].T)
        return parts


class Strided(HeadSum):  # heads split as view(N, T, D, H), W viewed the same way
    def split(self, x):
        return x.view(x.size(0), x.size(1), self.d, self.h).permute(0, 3, 1, 2)

    def w_o(self, h):
        return self.out_proj.weight.view(-1, self.d, self.h)[:, :, h].T


class NoScaleHeads(HeadSum):
    def heads(self, Q, K, V, attn_mask):
        q, k, v = self.split(self.q_proj(Q)), self.split(self.k_proj(K)), self.split(self.v_proj(V))
        return NoScale.attend(self, q, k, v, attn_mask)


class HeadsWithoutWO(HeadSum):
    def head_contributions(self, Q, K, V, attn_mask=None):
        return list(self.heads(Q, K, V, attn_mask).unbind(1))


class WOWithoutTranspose(HeadSum):
    def head_contributions(self, Q, K, V, attn_mask=None):
        heads, D = self.heads(Q, K, V, attn_mask), self.d
        return [heads[:, h] @ self.out_proj.weight[:, h * D : (h + 1) * D] for h in range(self.h)]


class WONextHead(HeadSum):  # learner test 24a, 3.4: the slice of the next head
    def w_o(self, h):
        return super().w_o((h + 1) % self.h)


class ReturnsTheSum(HeadSum):
    def head_contributions(self, Q, K, V, attn_mask=None):
        return sum(super().head_contributions(Q, K, V, attn_mask))


class OneTooFew(HeadSum):
    def head_contributions(self, Q, K, V, attn_mask=None):
        return super().head_contributions(Q, K, V, attn_mask)[1:]


class SharedEqually(HeadSum):
    """Learner test 34a, 3.4: every head given 1/H of the whole output."""

    def head_contributions(self, Q, K, V, attn_mask=None):
        whole = sum(super().head_contributions(Q, K, V, attn_mask))
        return [whole / self.h for _ in range(self.h)]


class NoMethod(MHA):
    pass


class ForwardWithoutBias(HeadSum):
    def forward(self, Q, K, V, attn_mask=None):
        return sum(self.head_contributions(Q, K, V, attn_mask))


class ForwardBiasPerHead(HeadSum):
    def forward(self, Q, K, V, attn_mask=None):
        return sum(p + self.out_proj.bias for p in self.head_contributions(Q, K, V, attn_mask))


class ForwardDropsMask(HeadSum):
    def forward(self, Q, K, V, attn_mask=None):
        return sum(self.head_contributions(Q, K, V)) + self.out_proj.bias


class ForwardWrong(HeadSum):
    def forward(self, Q, K, V, attn_mask=None):
        return 2 * super().forward(Q, K, V, attn_mask)


def contributions(cls, keyword, id):
    return pytest.param(ex.check_head_contributions, cls, keyword, id=id)


CONTRIBUTION_REJECTS = [
    contributions(Rows, "W^O_h 取成了 out_proj.weight 的行", "rows of W"),
    contributions(ColumnsReshaped, "reshape 只按内存顺序重排，不是转置", "W^O_h columns reshaped"),
    contributions(BiasPerHead, "各头的贡献里加了 out_proj.bias", "bias in every contribution"),
    contributions(BiasSharedOut, "把偏置平分给了各头", "bias / H in every contribution"),
    contributions(SegmentFromH, "第 h 到 h+D−1 个特征", "segment starting at h"),
    contributions(Strided, "每隔 H 个的特征", "strided heads"),
    contributions(NoScaleHeads, "没有除以 √d_k", "no scale, through the MHA hints"),
    contributions(HeadsWithoutWO, "还要乘 W^O_h", "head_h without W^O_h"),
    contributions(WOWithoutTranspose, "还要转置", "W^O_h columns not transposed"),
    contributions(WONextHead, "head_h 乘的是下一个头的 W^O", "W^O of the next head"),
    contributions(SharedEqually, "每个头的贡献都一样", "the whole output shared out equally"),
    contributions(ReturnsTheSum, "应返回 H = 3 个张量的列表", "the sum returned"),
    contributions(OneTooFew, "得到 2 个（list）", "H - 1 contributions"),
    contributions(NoMethod, "缺少方法 head_contributions", "no head_contributions"),
    contributions(ForwardWithoutBias, "forward 少加了 out_proj.bias", "forward without the bias"),
    contributions(ForwardBiasPerHead, "加了 3 次", "forward adds the bias per head"),
    contributions(ForwardDropsMask, "没有把 attn_mask 传给 head_contributions", "forward drops the mask"),
    contributions(ForwardWrong, "sum(self.head_contributions(Q, K, V, attn_mask))", "forward otherwise wrong"),
    contributions(MaskIgnored, "缺少方法 head_contributions", "plain MHA"),
]


@pytest.mark.parametrize("checker, candidate, keyword", CONTRIBUTION_REJECTS)
def test_head_contributions_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_head_contributions_runs_the_multi_head_checks(capsys):
    class MaskOnlyInForward(HeadSum):  # contributions right; forward's own attention ignores the mask
        def forward(self, Q, K, V, attn_mask=None):
            if attn_mask is not None and attn_mask.size(-1) != attn_mask.size(-2):
                return super().forward(Q, K, V, attn_mask)
            return super().forward(Q, K, V, None)

    assert_rejects(ex.check_head_contributions, MaskOnlyInForward, "掩码没有起作用", capsys)


def test_every_contribution_hint_is_reached(capsys):
    tables = {"HEAD_HINTS": heads.HEAD_HINTS, "SUM_HINTS": heads.SUM_HINTS, "HEAD_CRASHES": heads.HEAD_CRASHES}
    assert_every_hint_reached(tables, CONTRIBUTION_REJECTS, capsys)


class KeysFromQueryWhenLengthsMatch(MHA):
    """Cross-attention that silently uses the queries for K and V whenever S == L."""

    def forward(self, Q, K, V, attn_mask=None):
        if K.shape[1] == Q.shape[1]:
            K = V = Q
        return super().forward(Q, K, V, attn_mask)


def test_cross_attention_of_equal_lengths_is_checked(capsys):
    # every other cross-attention case has S != L; this one has S == L and K != Q
    assert_rejects(ex.check_multi_head_attention, KeysFromQueryWhenLengthsMatch, "K 和 V 都用 Q 算了", capsys)


def test_w_o_without_transpose_is_named_when_the_line_is_unknown(capsys):
    """Learner test 24a ran its code by exec: without the line (``.weight``) the crash
    "(10x4 and 12x4)" got the generic shape hint; (…×D) @ (E×D) names the transpose."""
    ns = {"HeadSum": HeadSum}
    exec(  # noqa: S102
        compile(
            "class ExecWO(HeadSum):\n"
            "    def w_o(self, h):\n"
            "        return self.out_proj.weight[:, h * self.d : (h + 1) * self.d]\n",
            "<string>",
            "exec",
        ),
        ns,
    )
    assert_rejects(ex.check_head_contributions, ns["ExecWO"], "还要转置", capsys)
