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
    assert checker(candidate, **kwargs) is None  # nothing echoed under the cell
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("✓"), lines


def assert_skeleton(checker, skeleton, capsys):
    assert checker(skeleton) is None
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
        pytest.param(dict(ret="list"), "应是 torch.Tensor", id="returns a list"),
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
        out = self.inner(Q, K, V, attn_mask=mask)
        return out[0] if isinstance(out, tuple) else out  # (output, weights) in older versions


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


# ---------------------------------------------------------------------------
# 6. RoPE
# ---------------------------------------------------------------------------


def rope(x):
    return tc.RotaryEmbedding(x.size(-1))(x)


def rope_complex(x):
    """RoPE written with complex numbers (pairs (2i, 2i+1) as one complex number)."""
    N, H, L, D = x.shape
    theta = 10000.0 ** (-torch.arange(0, D, 2).float() / D)
    angles = torch.arange(L).float()[:, None] * theta
    z = torch.view_as_complex(x.float().reshape(N, H, L, D // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def make_rope(mistake):
    def fn(x):
        N, H, L, D = x.shape
        theta = 10000.0 ** (-torch.arange(0, D, 2).float() / (2 * D if mistake == "exp_i" else D))
        pos = torch.arange(L).float() + (1 if mistake == "pos1" else 0)
        angles = pos[:, None] * theta
        cos, sin = angles.cos(), angles.sin()
        if mistake == "reversed":
            sin = -sin
        if mistake == "halves":
            x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        if mistake in ("halves", "cat"):
            return torch.cat([r1, r2], dim=-1)
        if mistake == "half_output":
            return r1
        if mistake == "no_cos":
            return torch.stack([x1 - x2 * sin, x1 * sin + x2], dim=-1).flatten(-2)
        return torch.stack([r1, r2], dim=-1).flatten(-2)

    return fn


def rope_skeleton(x):
    raise NotImplementedError("TODO")


def test_rope(capsys):
    for fn in (rope, rope_complex, make_rope(None)):
        assert_passes(ex.check_rope, fn, capsys)
    assert_skeleton(ex.check_rope, rope_skeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        pytest.param("halves", "配对方式不对", id="split-halves pairing"),
        pytest.param("cat", "交错放回", id="pairs concatenated back"),
        pytest.param("reversed", "旋转方向反了", id="rotation reversed"),
        pytest.param("pos1", "位置应从 0 开始", id="positions from 1"),
        pytest.param("exp_i", "频率写错了", id="frequency exponent"),
        pytest.param("half_output", "形状", id="returns one half"),
        pytest.param("no_cos", "长度", id="cos missing"),
    ],
)
def test_rope_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_rope, make_rope(mistake), keyword, capsys)


# ---------------------------------------------------------------------------
# 7. FFN and SwiGLU
# ---------------------------------------------------------------------------


class FFN(nn.Module):
    """The package's FeedForward under the exercise's names."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.inner = tc.FeedForward(d_model, d_ff, activation="gelu")
        self.linear1, self.linear2 = self.inner.w1, self.inner.w2

    def forward(self, x):
        return self.inner(x)


def make_ffn(act=F.gelu, twice=False, residual=False, names=("linear1", "linear2")):
    class Candidate(nn.Module):
        def __init__(self, d_model, d_ff):
            super().__init__()
            setattr(self, names[0], nn.Linear(d_model, d_ff))
            setattr(self, names[1], nn.Linear(d_ff, d_model))

        def forward(self, x):
            out = getattr(self, names[1])(act(getattr(self, names[0])(x)))
            out = act(out) if twice else out
            return x + out if residual else out

    return Candidate


class FFNSkeleton(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        # TODO: self.linear1, self.linear2

    def forward(self, x):
        pass


def test_feed_forward(capsys):
    for cls in (FFN, make_ffn(), make_ffn(act=nn.GELU())):
        assert_passes(ex.check_feed_forward, cls, capsys)
    assert_skeleton(ex.check_feed_forward, FFNSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(act=F.relu), "ReLU", id="ReLU instead of GELU"),
        pytest.param(dict(act=nn.GELU(approximate="tanh")), "tanh 近似", id="tanh GELU"),
        pytest.param(dict(act=lambda t: t), "缺少激活函数", id="no activation"),
        pytest.param(dict(twice=True), "linear2 之后", id="activation after linear2 too"),
        pytest.param(dict(residual=True), "不含残差", id="residual inside the FFN"),
        pytest.param(dict(act=F.silu), "SiLU", id="SiLU"),
        pytest.param(dict(names=("fc1", "fc2")), "缺少属性 linear1", id="other names"),
    ],
)
def test_feed_forward_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_feed_forward, make_ffn(**kwargs), keyword, capsys)


class SwiGLU(nn.Module):
    """The package's SwiGLU FeedForward under the exercise's names."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.inner = tc.FeedForward(d_model, d_ff, activation="swiglu", bias=False)
        self.w1, self.w2, self.w3 = self.inner.w1, self.inner.w2, self.inner.w3

    def forward(self, x):
        return self.inner(x)


def make_swiglu(mistake=None, bias=False):
    class Candidate(nn.Module):
        def __init__(self, d_model, d_ff):
            super().__init__()
            self.w1 = nn.Linear(d_model, d_ff, bias=bias)
            self.w3 = nn.Linear(d_model, d_ff, bias=bias)
            self.w2 = nn.Linear(d_ff, d_model, bias=bias)

        def forward(self, x):
            a, b = self.w1(x), self.w3(x)
            hidden = {
                None: lambda: F.silu(a) * b,
                "swapped": lambda: a * F.silu(b),
                "gelu": lambda: F.gelu(a) * b,
                "sigmoid": lambda: torch.sigmoid(a) * b,
                "no_gate": lambda: F.silu(a),
                "sum": lambda: F.silu(a) + b,
                "after": lambda: F.silu(a * b),
            }[mistake]()
            return self.w2(hidden)

    return Candidate


class SwiGLUSkeleton(nn.Module):
    def __init__(self, d_model, d_ff):
        raise NotImplementedError


def test_swiglu(capsys):
    for cls in (SwiGLU, make_swiglu()):
        assert_passes(ex.check_swiglu, cls, capsys)
    assert_skeleton(ex.check_swiglu, SwiGLUSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="swapped"), "silu 应作用在 w1 x 上", id="w1 and w3 swapped"),
        pytest.param(dict(mistake="gelu"), "GEGLU", id="GELU gate"),
        pytest.param(dict(mistake="sigmoid"), "GLU", id="sigmoid gate"),
        pytest.param(dict(mistake="no_gate"), "缺了门控", id="no gate"),
        pytest.param(dict(mistake="sum"), "不是相加", id="sum instead of product"),
        pytest.param(dict(mistake="after"), "不是 silu(w1 x * w3 x)", id="silu after the product"),
        pytest.param(dict(bias=True), "不应带偏置", id="with biases"),
    ],
)
def test_swiglu_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_swiglu, make_swiglu(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 8. Transformer block and GPT
# ---------------------------------------------------------------------------


def make_block(mistake=None, ln_names=("ln1", "ln2")):
    class Block(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            setattr(self, ln_names[0], nn.LayerNorm(d_model))
            setattr(self, ln_names[1], nn.LayerNorm(d_model))
            self.attn = MHA(d_model, num_heads)
            self.ffn = FFN(d_model, 4 * d_model)

        def forward(self, x):
            L = x.size(1)
            mask = {"no_causal": None, "inverted": ~tc.causal_mask(L)}.get(mistake, tc.causal_mask(L))
            ln1, ln2 = getattr(self, ln_names[0]), getattr(self, ln_names[1])

            def attn(h):
                return self.attn(h, h, h, mask)

            if mistake == "post_ln":
                x = ln1(x + attn(x))
                return ln2(x + self.ffn(x))
            if mistake == "no_res_attn":
                x = attn(ln1(x))
                return x + self.ffn(ln2(x))
            if mistake == "no_res_ffn":
                return self.ffn(ln2(x + attn(ln1(x))))
            if mistake == "res_from_norm":
                h = ln1(x)
                x = h + attn(h)
                h = ln2(x)
                return h + self.ffn(h)
            if mistake == "parallel":
                return x + attn(ln1(x)) + self.ffn(ln2(x))
            if mistake == "ln1_twice":
                x = x + attn(ln1(x))
                return x + self.ffn(ln1(x))
            x = x + attn(ln1(x))
            return x + self.ffn(ln2(x))

    return Block


class BlockSkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError("写出 ln1, attn, ln2, ffn")


def test_transformer_block(capsys):
    assert_passes(ex.check_transformer_block, make_block(), capsys)
    assert_skeleton(ex.check_transformer_block, BlockSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="no_res_attn"), "少了注意力子层的残差连接", id="missing residual (attention)"),
        pytest.param(dict(mistake="no_res_ffn"), "少了 FFN 子层的残差连接", id="missing residual (FFN)"),
        pytest.param(dict(mistake="post_ln"), "Post-LN", id="post-LN instead of pre-LN"),
        pytest.param(dict(mistake="no_causal"), "因果掩码", id="no causal mask"),
        pytest.param(dict(mistake="inverted"), "方向", id="causal mask inverted"),
        pytest.param(dict(mistake="res_from_norm"), "归一化之前的 x", id="residual from the normalised x"),
        pytest.param(dict(mistake="parallel"), "串行", id="parallel sublayers"),
        pytest.param(dict(mistake="ln1_twice"), "ln2", id="ln1 used twice"),
        pytest.param(dict(ln_names=("norm1", "norm2")), "缺少属性 ln1", id="other names"),
    ],
)
def test_transformer_block_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_transformer_block, make_block(**kwargs), keyword, capsys)


def make_gpt(mistake=None, block=None, names=("ln_f",), tie=False):
    Block = block or make_block()

    class GPT(nn.Module):
        def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Embedding(context_length, d_model)
            self.blocks = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
            setattr(self, names[0], nn.LayerNorm(d_model))
            self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
            if tie:
                self.lm_head.weight = self.tok_emb.weight

        def forward(self, idx):
            N, L = idx.shape
            pos = idx if mistake == "pos_by_id" else torch.arange(L)
            x = self.tok_emb(idx) + (0 if mistake == "no_pos" else self.pos_emb(pos))
            h = x
            for blk in self.blocks:
                h = blk(x if mistake == "same_input" else h)
            if mistake != "no_ln_f":
                h = getattr(self, names[0])(h)
            logits = self.lm_head(h)
            if mistake == "softmax":
                return torch.softmax(logits, -1)
            if mistake == "last":
                return logits[:, -1]
            if mistake == "flat":
                return logits.view(N * L, -1)
            if mistake == "tuple":
                return logits, None
            return logits

    return GPT


class GPTSkeleton(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()

    def forward(self, idx):
        pass


class MiniGPTWrapped(nn.Module):
    """tc.MiniGPT under the exercise's names (the package model grades itself); the
    names come from the checker's one name map, so a renamed package attribute breaks
    nothing here."""

    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()
        self.inner = ex._gpt_reference(vocab_size, context_length, d_model, num_heads, num_layers)
        self.blocks = nn.ModuleList(nn.Module() for _ in range(num_layers))
        for path, module in ex._gpt_name_map(self.inner):
            *parents, leaf = path.split(".")
            owner = self
            for part in parents:
                if part.isdigit():
                    owner = owner[int(part)]
                    continue
                if not hasattr(owner, part):
                    setattr(owner, part, nn.Module())
                owner = getattr(owner, part)
            setattr(owner, leaf, module)

    def forward(self, idx):
        return self.inner(idx)


def test_gpt(capsys):
    for cls in (make_gpt(), make_gpt(tie=True), make_gpt(mistake="tuple"), MiniGPTWrapped):
        assert_passes(ex.check_gpt, cls, capsys)
    assert_skeleton(ex.check_gpt, GPTSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="no_pos"), "忘了加位置嵌入", id="no position embedding"),
        pytest.param(dict(mistake="pos_by_id"), "torch.arange(L)", id="positions looked up by token id"),
        pytest.param(dict(mistake="no_ln_f"), "ln_f", id="no final norm"),
        pytest.param(dict(mistake="softmax"), "未经 softmax", id="returns probabilities"),
        pytest.param(dict(mistake="same_input"), "上一个块的输出", id="every block gets the embeddings"),
        pytest.param(dict(mistake="last"), "只返回了最后一个位置", id="last position only"),
        pytest.param(dict(mistake="flat"), "展平", id="flattened logits"),
        pytest.param(dict(block=make_block("no_causal")), "因果掩码", id="block without causal mask"),
        pytest.param(dict(block=make_block("post_ln")), "check_transformer_block", id="post-LN block"),
        pytest.param(dict(names=("ln_final",)), "缺少属性 ln_f", id="other names"),
    ],
)
def test_gpt_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_gpt, make_gpt(**kwargs), keyword, capsys)


# ---------------------------------------------------------------------------
# 9. training step
# ---------------------------------------------------------------------------


def make_train_step(order=("zero_grad", "backward", "step"), reduction="mean", ret="item", shift=False):
    def fn(model, optimizer, x, y):
        logits = model(x)
        if shift:
            logits, y = logits[:, :-1], y[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction=reduction)
        for op in order:
            {"zero_grad": optimizer.zero_grad, "backward": loss.backward, "step": optimizer.step}[op]()
        if ret == "tensor":
            return loss
        if ret == "after":
            with torch.no_grad():
                return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        return loss.item()

    return fn


def train_step_model_zero_grad(model, optimizer, x, y):
    model.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_wrong_shape(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_skeleton(model, optimizer, x, y):
    pass


def test_train_step(capsys):
    for fn in (
        make_train_step(),
        make_train_step(order=("backward", "step", "zero_grad")),
        train_step_model_zero_grad,
    ):
        assert_passes(ex.check_train_step, fn, capsys)
    assert_skeleton(ex.check_train_step, train_step_skeleton, capsys)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        pytest.param(make_train_step(order=("backward", "step")), "忘了 optimizer.zero_grad()", id="no zero_grad"),
        pytest.param(
            make_train_step(order=("backward", "zero_grad", "step")), "backward 和 step 之间", id="zero_grad early"
        ),
        pytest.param(make_train_step(order=("zero_grad", "backward")), "optimizer.step()", id="no step"),
        pytest.param(make_train_step(order=("zero_grad", "step")), "loss.backward()", id="no backward"),
        pytest.param(make_train_step(order=("zero_grad", "step", "backward")), "之前", id="step before backward"),
        pytest.param(make_train_step(reduction="sum"), "求和", id="summed loss"),
        pytest.param(make_train_step(ret="tensor"), "loss.item()", id="returns a tensor"),
        pytest.param(make_train_step(ret="after"), "更新之前", id="loss after the update"),
        pytest.param(make_train_step(shift=True), "不要再移位", id="shifted once more"),
        pytest.param(train_step_wrong_shape, "类别在第 1 维", id="logits not flattened"),
    ],
)
def test_train_step_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_train_step, fn, keyword, capsys)


# ---------------------------------------------------------------------------
# 10. language-model batches
# ---------------------------------------------------------------------------


def lm_batch(data, batch_size, context_length, generator):
    return tc.lm_batch(data, batch_size, context_length, generator=generator)


def make_lm_batch(mistake=None):
    def fn(data, B, T, generator):
        high = len(data) - T + {"high_plus": 1, "high_minus": -1}.get(mistake, 0)
        gen = None if mistake == "no_generator" else generator
        ix = torch.randint(high, (B,), generator=gen)
        x = torch.stack([data[i : i + T] for i in ix])
        if mistake == "no_shift":
            return x, x.clone()
        if mistake == "redraw":
            iy = torch.randint(high, (B,), generator=gen)
            return x, torch.stack([data[i + 1 : i + 1 + T] for i in iy])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        if mistake == "float":
            return x.float(), y.float()
        if mistake == "list":
            return [x, y, ix]
        return x, y

    return fn


def lm_batch_skeleton(data, batch_size, context_length, generator):
    raise NotImplementedError


def test_lm_batch(capsys):
    for fn in (lm_batch, make_lm_batch()):
        assert_passes(ex.check_lm_batch, fn, capsys)
    assert_skeleton(ex.check_lm_batch, lm_batch_skeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        pytest.param("no_shift", "错后一位", id="y equals x"),
        pytest.param("redraw", "不要为 y 另抽随机数", id="y drawn separately"),
        pytest.param("no_generator", "没有把 generator 传给 torch.randint", id="generator not used"),
        pytest.param("high_plus", "len(data) - context_length", id="off-by-one: one start too many"),
        pytest.param("high_minus", "len(data) - context_length", id="off-by-one: one start too few"),
        pytest.param("float", "torch.long", id="float ids"),
        pytest.param("list", "两个张量", id="three values"),
    ],
)
def test_lm_batch_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_lm_batch, make_lm_batch(mistake), keyword, capsys)


# ---------------------------------------------------------------------------
# 11. generation
# ---------------------------------------------------------------------------


def make_generate(mistake=None):
    def fn(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
        start = idx
        for _ in range(max_new_tokens):
            ctx = {"no_crop": idx, "first": idx[:, :context_length]}.get(mistake, idx[:, -context_length:])
            logits = model(ctx)
            logits = logits[:, 0, :] if mistake == "pos0" else logits[:, -1, :]
            if generator is None and mistake != "always_sample":
                nxt = logits.argmax(dim=-1, keepdim=True)
            elif mistake == "argmax_always":
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                if top_k is not None and mistake != "ignore_top_k":
                    v, _ = torch.topk(logits, top_k)
                    threshold = v[:, [-2]] if mistake == "k_minus_1" else v[:, [-1]]
                    logits = logits.masked_fill(logits < threshold, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                gen = None if mistake == "no_generator" else generator
                nxt = torch.multinomial(probs, num_samples=1, generator=gen)
            idx = torch.cat([idx, nxt], dim=1)
        if mistake == "new_only":
            return idx[:, start.size(1) :]
        return idx

    return fn


def generate_topk_gather(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Sampling among torch.topk's values and mapping back: accepted too."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        elif top_k is None:
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        else:
            v, i = torch.topk(logits, top_k)
            nxt = i.gather(-1, torch.multinomial(F.softmax(v, dim=-1), 1, generator=generator))
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def generate_skeleton(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    pass


def test_generate(capsys):
    for fn in (make_generate(), generate_topk_gather):
        assert_passes(ex.check_generate, fn, capsys)
    assert_skeleton(ex.check_generate, generate_skeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        pytest.param("no_crop", "idx[:, -context_length:]", id="generate not cropping the context"),
        pytest.param("first", "最前面", id="keeps the first tokens"),
        pytest.param("pos0", "最后一个位置", id="first position's logits"),
        pytest.param("k_minus_1", "k − 1", id="top-k keeping k-1"),
        pytest.param("ignore_top_k", "top_k 没有起作用", id="top-k ignored"),
        pytest.param("no_generator", "generator=generator", id="generator not passed"),
        pytest.param("always_sample", "argmax", id="samples when greedy"),
        pytest.param("argmax_always", "按概率抽样", id="greedy when sampling"),
        pytest.param("new_only", "只返回了新生成的词元", id="returns only the new tokens"),
    ],
)
def test_generate_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_generate, make_generate(mistake), keyword, capsys)


# ---------------------------------------------------------------------------
# 12. KV cache
# ---------------------------------------------------------------------------


def make_cache(mistake=None):
    class Cache:
        shared = []

        def __init__(self):
            self.k = self.v = None
            self.updates = 0

        def update(self, k, v):
            self.updates += 1
            if mistake == "shared":
                self.shared.append(k)
            dim = {"dim0": 0, "dim1": 1, "dim_last": -1}.get(mistake, -2)
            if self.k is None or mistake == "new_only":
                self.k, self.v = k, v
            elif mistake == "reversed":
                self.k, self.v = torch.cat([k, self.k], dim), torch.cat([v, self.v], dim)
            else:
                self.k, self.v = torch.cat([self.k, k], dim), torch.cat([self.v, v], dim)
            return (self.v, self.k) if mistake == "swapped" else (self.k, self.v)

        def __len__(self):
            if mistake == "shared":
                return sum(t.size(-2) for t in self.shared)
            if mistake == "count_updates":
                return self.updates
            return 0 if self.k is None else self.k.size(-2)

    return Cache


class CacheSkeleton:
    def __init__(self):
        pass

    def update(self, k, v):
        pass

    def __len__(self):
        pass


def test_kv_cache(capsys):
    for cls in (tc.KVCache, make_cache()):
        assert_passes(ex.check_kv_cache, cls, capsys)
    assert_skeleton(ex.check_kv_cache, CacheSkeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        pytest.param("dim0", "dim=0", id="cache concatenated on dim 0"),
        pytest.param("dim1", "dim=1", id="cache concatenated on dim 1"),
        pytest.param("dim_last", "最后一维", id="cache concatenated on the last dim"),
        pytest.param("new_only", "只返回了这一步", id="returns only the new k/v"),
        pytest.param("reversed", "旧的位置在前", id="new before old"),
        pytest.param("swapped", "K 和 V 顺序反了", id="(V, K)"),
        pytest.param("count_updates", "调用次数", id="len counts updates"),
        pytest.param("shared", "共享", id="class-level storage"),
    ],
)
def test_kv_cache_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_kv_cache, make_cache(mistake), keyword, capsys)


def test_inputs_changed_in_place_do_not_matter(capsys):
    def in_place(Q, K, V, mask=None):
        Q /= math.sqrt(Q.size(-1))  # scales the query in place: still correct
        scores = Q @ K.transpose(-2, -1)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ V

    assert_passes(ex.check_self_attention, in_place, capsys)


def test_unexpected_return_value_gives_a_hint(capsys):
    class Odd(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            for n in ("W_q", "W_k", "W_v", "W_o"):
                setattr(self, n, nn.Linear(d_model, d_model))

        def forward(self, Q, K, V, mask=None):
            return (Q, K, V)  # three values

    assert_rejects(ex.check_multi_head_attention, Odd, "torch.Tensor", capsys)


def test_instance_instead_of_class():
    with pytest.raises(ex.ExerciseError, match="类本身"):
        ex.check_multi_head_attention(MHA(12, 3))


def test_inverted_random_mask_with_weights(capsys):
    def inverted(Q, K, V, mask=None):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)  # -1e9: no NaN in fully masked rows
        w = torch.softmax(scores, dim=-1)
        return w @ V, w

    assert_rejects(ex.check_self_attention, inverted, "掩码方向可能反了（True = 可以看）", capsys)


def test_gpt_name_map_covers_every_minigpt_parameter():
    ref = ex._gpt_reference(11, 6, 12, 3, 2)
    mapped = {id(p) for _, module in ex._gpt_name_map(ref) for p in module.parameters()}
    missing = [name for name, p in ref.named_parameters() if id(p) not in mapped]
    assert not missing, missing


# ---------------------------------------------------------------------------
# more rejected mistakes: one per remaining branch of the checkers' diagnoses
# ---------------------------------------------------------------------------


def attention_three_values(Q, K, V, mask=None):
    out, weights = tc.scaled_dot_product_attention(Q, K, V, mask)
    return out, weights, None


def attention_swapped(Q, K, V, mask=None):
    out, weights = tc.scaled_dot_product_attention(Q, K, V, mask)
    return weights, out


def attention_nan(Q, K, V, mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, mask)[0] * math.nan


def lm_batch_reversed_rows(data, batch_size, context_length, generator):
    x, y = lm_batch(data, batch_size, context_length, generator)
    return x.flip(-1), y.flip(-1)


def lm_batch_reversed_y(data, batch_size, context_length, generator):
    x, y = lm_batch(data, batch_size, context_length, generator)
    return x, y.flip(-1)


def lm_batch_extra_draw(data, batch_size, context_length, generator):
    torch.randint(10, (1,), generator=generator)
    return lm_batch(data, batch_size, context_length, generator)


def generate_float(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    return make_generate()(model, idx, max_new_tokens, context_length, top_k, generator).float()


def generate_changed_prompt(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    out = make_generate()(model, idx, max_new_tokens, context_length, top_k, generator)
    out[:, 0] += 1
    return out


def generate_hot(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Samples at temperature 2 (logits / 2): a mistake the checker has no hint for."""

    def hot_model(ctx):
        return model(ctx) / 2

    return make_generate()(hot_model, idx, max_new_tokens, context_length, top_k, generator)


class CacheWithoutUpdate:
    def __len__(self):
        return 0


def make_cache_returning(result):
    base = make_cache()

    class Cache(base):
        def update(self, k, v):
            return result(*super().update(k, v))

    return Cache


@pytest.mark.parametrize(
    "checker, candidate, keyword",
    [
        pytest.param(ex.check_self_attention, attention_three_values, "3 个值的元组", id="attention: three values"),
        pytest.param(ex.check_self_attention, attention_swapped, "顺序反了", id="attention: (weights, output)"),
        pytest.param(ex.check_self_attention, attention_nan, "含 NaN 或 inf", id="attention: NaN without a mask"),
        pytest.param(ex.check_lm_batch, lm_batch_reversed_rows, "连续的一段", id="lm_batch: x not a window"),
        pytest.param(ex.check_lm_batch, lm_batch_reversed_y, "y[0] 不对", id="lm_batch: y not a window"),
        pytest.param(ex.check_lm_batch, lm_batch_extra_draw, "只抽这一次", id="lm_batch: another draw first"),
        pytest.param(ex.check_generate, generate_float, "torch.long", id="generate: float ids"),
        pytest.param(ex.check_generate, generate_changed_prompt, "原样是输入 idx", id="generate: prompt changed"),
        pytest.param(ex.check_generate, generate_hot, "对照：裁剪", id="generate: unknown sampling mistake"),
        pytest.param(ex.check_kv_cache, CacheWithoutUpdate, "缺少方法 update", id="kv cache: no update"),
        pytest.param(
            ex.check_kv_cache, make_cache_returning(lambda k, v: (k, v, k)), "两个张量", id="kv cache: three values"
        ),
        pytest.param(
            ex.check_kv_cache,
            make_cache_returning(lambda k, v: (2 * k, 2 * v)),
            "逐次拼接的结果不一致",
            id="kv cache: wrong values",
        ),
    ],
)
def test_rejects_more_mistakes(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)
