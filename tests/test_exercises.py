"""The exercise checkers: each accepts a correct implementation (the package's own,
wrapped to the exercise's contract) with one "✓" line, treats a skeleton as "尚未实现"
(an error with solution=True), and rejects typical wrong implementations with a Chinese
hint that names the mistake."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def assert_passes(checker, candidate, capsys, **kwargs):
    assert checker(candidate, **kwargs) is True
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("✓"), lines


def assert_skeleton(checker, skeleton, capsys):
    assert checker(skeleton) is False
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("尚未实现："), lines
    assert lines[0].endswith("（写好后重新运行本单元格）"), lines
    with pytest.raises(AssertionError, match="骨架"):
        checker(skeleton, solution=True)
    assert capsys.readouterr().out == ""


def assert_rejects(checker, candidate, keyword, capsys):
    with pytest.raises(ex.ExerciseError) as info:
        checker(candidate)
    assert keyword in str(info.value), str(info.value)
    assert "✓" not in capsys.readouterr().out


# ---------------------------------------------------------------------------
# common protocol
# ---------------------------------------------------------------------------


def test_lazy_attribute_and_error_class():
    assert tc.exercises is ex
    assert issubclass(ex.ExerciseError, AssertionError)
    for name in ex.__all__:
        assert getattr(ex, name).__doc__


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ex.check_multi_head_attention(MHA)  # builds modules: draws from the global RNG
    assert torch.equal(torch.rand(3), expected)


def test_not_callable():
    with pytest.raises(ex.ExerciseError, match="函数或类"):
        ex.check_self_attention(torch.zeros(2))


def test_crash_names_the_line(capsys):
    def crashes(Q, K, V, mask=None):
        scores = Q @ K  # forgot the transpose
        return scores

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_self_attention(crashes)
    msg = str(info.value)
    assert "运行出错" in msg and "scores = Q @ K" in msg and "形状" in msg


def test_skeleton_raising_not_implemented(capsys):
    def todo(Q, K, V, mask=None):
        raise NotImplementedError

    assert_skeleton(ex.check_self_attention, todo, capsys)


# ---------------------------------------------------------------------------
# 1. self-attention
# ---------------------------------------------------------------------------


def attention(Q, K, V, mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, mask)


def attention_output_only(Q, K, V, mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, mask)[0]


def attention_written_out(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights @ V, weights


def make_attention(scale="sqrt", dim=-1, masking="ok", value="V", ret="both", tr=None):
    def fn(Q, K, V, mask=None):
        Kt = K.transpose(-2, -1) if tr is None else K.transpose(*tr)
        scores = Q @ Kt
        if scale == "sqrt":
            scores = scores / math.sqrt(Q.size(-1))
        elif scale == "d":
            scores = scores / Q.size(-1)
        if mask is not None:
            if masking == "ok" or masking == "after":
                if masking == "ok":
                    scores = scores.masked_fill(~mask, float("-inf"))
            elif masking == "inverted":
                scores = scores.masked_fill(mask, float("-inf"))
            elif masking == "zero":
                scores = scores.masked_fill(~mask, 0.0)
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and masking == "after":
            weights = weights * mask
        out = weights @ (V if value == "V" else K)
        return {
            "both": (out, weights),
            "out": out,
            "weights": weights,
            "swapped": (weights, out),
            "list": out.tolist(),
        }[ret]

    return fn


def attention_skeleton(Q, K, V, mask=None):
    pass


def test_self_attention_accepts(capsys):
    for fn in (attention, attention_output_only, attention_written_out):
        assert_passes(ex.check_self_attention, fn, capsys)
    assert_passes(ex.check_self_attention, attention, capsys, solution=True)


def test_self_attention_skeleton(capsys):
    assert_skeleton(ex.check_self_attention, attention_skeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(scale="none"), "没有除以 √d_k", id="missing scale"),
        pytest.param(dict(scale="none", ret="out"), "没有除以 √d_k", id="missing scale, output only"),
        pytest.param(dict(scale="d"), "除以了 d_k", id="scale by d instead of sqrt(d)"),
        pytest.param(dict(dim=-2), "softmax 的 dim 可能写错了", id="softmax on the wrong axis"),
        pytest.param(dict(dim=-2, ret="out"), "softmax 的 dim 可能写错了", id="softmax axis, output only"),
        pytest.param(dict(masking="inverted"), "掩码方向可能反了（True = 可以看）", id="mask inverted"),
        pytest.param(dict(masking="inverted", ret="out"), "掩码方向可能反了", id="mask inverted, output only"),
        pytest.param(dict(masking="zero"), "被屏蔽的位置仍有权重", id="masked scores set to 0"),
        pytest.param(dict(masking="zero", ret="out"), "填成了 0", id="masked scores set to 0, output only"),
        pytest.param(dict(masking="ignored"), "被屏蔽的位置仍有权重", id="mask ignored"),
        pytest.param(dict(masking="ignored", ret="out"), "掩码没有起作用", id="mask ignored, output only"),
        pytest.param(dict(masking="after", ret="out"), "softmax 之后才乘掩码", id="mask after softmax"),
        pytest.param(dict(value="K"), "应是 V", id="weights times K"),
        pytest.param(dict(tr=(1, 2)), "K.transpose(-2, -1)", id="transpose hard-coded for 3-D"),
        pytest.param(dict(ret="weights"), "weights @ V", id="returns the weights"),
        pytest.param(dict(ret="swapped"), "顺序反了", id="(weights, output)"),
        pytest.param(dict(ret="list"), "应返回 torch.Tensor", id="returns a list"),
    ],
)
def test_self_attention_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_self_attention, make_attention(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 2. causal mask
# ---------------------------------------------------------------------------


def mask_package(L):
    return tc.causal_mask(L)


def mask_skeleton(L):
    pass


def test_causal_mask(capsys):
    assert_passes(ex.check_causal_mask, mask_package, capsys)
    assert_passes(ex.check_causal_mask, lambda L: torch.tril(torch.ones(L, L)).bool(), capsys)
    assert_skeleton(ex.check_causal_mask, mask_skeleton, capsys)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).triu(1), "True = 可以看", id="blocked convention"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).triu(), "方向反了", id="upper triangle"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).tril(-1), "对角线上应为 True", id="diagonal missing"),
        pytest.param(lambda L: torch.ones(L, L).tril(), "torch.bool", id="float mask"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool), "没有屏蔽", id="all True"),
        pytest.param(lambda L: torch.ones(L, L, dtype=torch.bool).tril(1), "i + 1", id="one step ahead"),
        pytest.param(lambda L: torch.ones(L, L + 1, dtype=torch.bool).tril(), "形状", id="wrong shape"),
        pytest.param(lambda L: torch.ones(L, L).tril().tolist(), "torch.Tensor", id="returns a list"),
    ],
)
def test_causal_mask_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_causal_mask, fn, keyword, capsys)


# ---------------------------------------------------------------------------
# 3. multi-head attention
# ---------------------------------------------------------------------------


class MHA(nn.Module):
    """The package's MultiHeadAttention under the exercise's names."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.inner = tc.MultiHeadAttention(d_model, num_heads)
        self.W_q, self.W_k = self.inner.q_proj, self.inner.k_proj
        self.W_v, self.W_o = self.inner.v_proj, self.inner.out_proj

    def forward(self, Q, K, V, mask=None):
        return self.inner(Q, K, V, attn_mask=mask)[0]


def make_mha(split="ok", merge="ok", scale="head", dim=-1, masking="ok", out_proj=True, source="ok",
             heads=None, bias=True, names=("W_q", "W_k", "W_v", "W_o")):  # fmt: skip
    class Candidate(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.h = num_heads if heads is None else heads
            for n in names:
                setattr(self, n, nn.Linear(d_model, d_model, bias=bias))
            self.lin = [getattr(self, n) for n in names]

        def forward(self, Q, K, V, mask=None):
            N, L, E = Q.shape
            H, D = self.h, E // self.h
            if source == "q":
                K = V = Q
            q, k, v = (lin(x) for lin, x in zip(self.lin[:3], (Q, K, V), strict=True))

            def split_heads(x):
                if split == "view":
                    return x.reshape(N, H, x.size(1), D)
                return x.view(N, x.size(1), H, D).transpose(1, 2)

            q, k, v = split_heads(q), split_heads(k), split_heads(v)
            scores = q @ k.transpose(-2, -1)
            if scale == "head":
                scores = scores / math.sqrt(D)
            elif scale == "model":
                scores = scores / math.sqrt(E)
            if mask is not None and masking != "ignored":
                scores = scores.masked_fill(~mask if masking == "ok" else mask, float("-inf"))
            out = torch.softmax(scores, dim=dim) @ v
            out = out.reshape(N, L, E) if merge == "view" else out.transpose(1, 2).reshape(N, L, E)
            return self.lin[3](out) if out_proj else out

    return Candidate


class MHASkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()

    def forward(self, Q, K, V, mask=None):
        pass


class MHAInitNotImplemented(nn.Module):
    def __init__(self, d_model, num_heads):
        raise NotImplementedError


class MHANoSuper(nn.Module):
    def __init__(self, d_model, num_heads):
        pass

    def forward(self, Q, K, V, mask=None):
        pass


def test_multi_head_attention_accepts(capsys):
    for cls in (MHA, make_mha(), make_mha(bias=False)):
        assert_passes(ex.check_multi_head_attention, cls, capsys)


@pytest.mark.parametrize("skeleton", [MHASkeleton, MHAInitNotImplemented, MHANoSuper])
def test_multi_head_attention_skeleton(skeleton, capsys):
    assert_skeleton(ex.check_multi_head_attention, skeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(merge="view"), "合并多头时没有先转置", id="heads merged without transposing"),
        pytest.param(dict(split="view"), "拆分多头时直接 view", id="heads split without transposing"),
        pytest.param(dict(split="view", merge="view"), "都少了转置", id="split and merge without transposing"),
        pytest.param(dict(scale="none"), "没有除以 √d_k", id="missing scale"),
        pytest.param(dict(scale="model"), "√d_model", id="scale by sqrt(d_model)"),
        pytest.param(dict(dim=-2), "softmax 的 dim", id="softmax on the wrong axis"),
        pytest.param(dict(out_proj=False), "W_o", id="no output projection"),
        pytest.param(dict(source="q"), "都用 Q 算了", id="K and V projected from Q"),
        pytest.param(dict(masking="inverted"), "掩码方向可能反了", id="mask inverted"),
        pytest.param(dict(masking="ignored"), "掩码没有起作用", id="mask ignored"),
        pytest.param(dict(heads=1), "没有拆分多头", id="a single head"),
        pytest.param(dict(names=("q_proj", "k_proj", "v_proj", "out_proj")), "缺少属性 W_q", id="other names"),
    ],
)
def test_multi_head_attention_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_multi_head_attention, make_mha(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 4. layer norm
# ---------------------------------------------------------------------------


class LN(nn.Module):
    """The package's LayerNorm under the exercise's contract."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.inner = tc.LayerNorm(d_model, eps=eps)
        self.weight, self.bias = self.inner.weight, self.inner.bias

    def forward(self, x):
        return self.inner(x)


def make_ln(mistake=None, names=("gamma", "beta"), init=(1.0, 0.0), parameter=True):
    class Candidate(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps = 1e-5 if mistake == "eps_ignored" else eps
            wrap = nn.Parameter if parameter else (lambda t: t)
            setattr(self, names[0], wrap(torch.full((d_model,), init[0])))
            setattr(self, names[1], wrap(torch.full((d_model,), init[1])))

        def forward(self, x):
            g, b = getattr(self, names[0]), getattr(self, names[1])
            dim = 0 if mistake == "dim0" else -1
            mean = x.mean(dim, keepdim=True)
            var = x.var(dim, keepdim=True, unbiased=mistake == "unbiased")
            if mistake == "std_eps":
                y = (x - mean) / (var.sqrt() + self.eps)
            elif mistake == "no_eps":
                y = (x - mean) / var.sqrt()
            elif mistake == "no_center":
                y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            else:
                y = (x - mean) / torch.sqrt(var + self.eps)
            if mistake == "no_affine":
                return y
            if mistake == "swapped":
                return y * b + g
            return y * g + b

    return Candidate


class LNSkeleton(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()

    def forward(self, x):
        raise NotImplementedError


def test_layer_norm(capsys):
    for cls in (LN, make_ln(), make_ln(names=("weight", "bias"))):
        assert_passes(ex.check_layer_norm, cls, capsys)
    assert_skeleton(ex.check_layer_norm, LNSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="unbiased"), "无偏", id="unbiased variance"),
        pytest.param(dict(mistake="std_eps"), "eps 应加在根号里面", id="eps outside the square root"),
        pytest.param(dict(mistake="no_eps"), "忘了在根号里加 eps", id="no eps"),
        pytest.param(dict(mistake="dim0"), "归一化的维度不对", id="normalised over dim 0"),
        pytest.param(dict(mistake="no_center"), "没有减去均值", id="no mean subtracted"),
        pytest.param(dict(mistake="no_affine"), "γ 和 β", id="gamma and beta unused"),
        pytest.param(dict(mistake="swapped"), "用反了", id="gamma and beta swapped"),
        pytest.param(dict(mistake="eps_ignored"), "构造函数传入的 eps", id="eps argument ignored"),
        pytest.param(dict(parameter=False), "nn.Parameter", id="plain tensors"),
        pytest.param(dict(init=(0.0, 0.0)), "初始值", id="gamma initialised to 0"),
        pytest.param(dict(names=("scale", "shift")), "缺少可学习参数", id="other names"),
    ],
)
def test_layer_norm_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_layer_norm, make_ln(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 5. sinusoidal encoding
# ---------------------------------------------------------------------------


def sinusoidal(max_len, d_model):
    return tc.sinusoidal_table(max_len, d_model)


def sinusoidal_written_out(max_len, d_model):
    pos = torch.arange(max_len).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def sinusoidal_skeleton(max_len, d_model):
    pass


def make_pe(mistake):
    def fn(max_len, d_model):
        return ex._pe_variant(max_len, d_model, mistake).float()

    return fn


def test_sinusoidal_encoding(capsys):
    for fn in (sinusoidal, sinusoidal_written_out):
        assert_passes(ex.check_sinusoidal_encoding, fn, capsys)
    assert_skeleton(ex.check_sinusoidal_encoding, sinusoidal_skeleton, capsys)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        pytest.param(make_pe("swapped"), "sin 和 cos 的列放反了", id="sin/cos swapped"),
        pytest.param(make_pe("halves"), "交错排列", id="sin half, cos half"),
        pytest.param(make_pe("pos1"), "位置应从 0 开始", id="positions from 1"),
        pytest.param(make_pe("exp_i"), "指数写错了", id="exponent i instead of 2i"),
        pytest.param(make_pe("multiply"), "你乘了它", id="multiplied by the frequency"),
        pytest.param(make_pe("per_column"), "共享一个频率", id="frequency per column"),
        pytest.param(lambda n, d: sinusoidal(n, d).T, "行和列反了", id="transposed"),
        pytest.param(lambda n, d: sinusoidal(n, d).long(), "浮点", id="integer table"),
        pytest.param(lambda n, d: sinusoidal(n, d).numpy(), "numpy", id="numpy array"),
    ],
)
def test_sinusoidal_encoding_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_sinusoidal_encoding, fn, keyword, capsys)
