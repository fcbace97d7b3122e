"""Layer norm, the GELU FFN and SwiGLU.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import norms_ffn

from .support import (
    GeluFeedForward,
    assert_every_hint_reached,
    assert_passes,
    assert_rejects,
    assert_skeleton,
    rejection,
)

# 4. layer norm
# ---------------------------------------------------------------------------


class EpsHardCoded(nn.Module):  # learner test 27c, 5.5: eps written into forward
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-6)


def make_ln(mistake=None, names=("weight", "bias"), init=(1.0, 0.0), parameter=True):
    class Candidate(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps = 1e-5 if mistake == "eps_ignored" else eps
            wrap = nn.Parameter if parameter else (lambda t: t)
            setattr(self, names[0], wrap(torch.full((d_model,), init[0])))
            setattr(self, names[1], wrap(torch.full((d_model,), init[1])))

        def forward(self, x):
            g, b = getattr(self, names[0]), getattr(self, names[1])
            # learner test 21a, 3.8: "dim2" hard-codes the last dim of 3-D input
            dim = {"dim0": 0, "dim1": 1, "dim2": 2, "all": tuple(range(1, x.dim()))}.get(mistake, -1)
            dim = (0, 1) if mistake == "batch_norm" else dim  # learner test 24a, 3.1/3.8
            keep = mistake != "no_keepdim"
            # learner test 10a, 3.8: only one of the two reductions moved to dim -1
            mean = x.mean(0 if mistake == "mean_dim0" else dim, keepdim=keep)
            var = x.var(0 if mistake == "var_dim0" else dim, keepdim=keep, unbiased=mistake == "unbiased")
            if mistake == "std_eps":
                y = (x - mean) / (var.sqrt() + self.eps)
            elif mistake == "no_eps":
                y = (x - mean) / var.sqrt()
            elif mistake == "no_sqrt":
                y = (x - mean) / (var + self.eps)
            elif mistake == "numerator_not_centred":  # learner test 24a: x / sqrt(var + eps)
                y = x / torch.sqrt(var + self.eps)
            elif mistake == "no_center":
                y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            else:
                y = (x - mean) / torch.sqrt(var + self.eps)
            if mistake == "no_affine":
                return y
            if mistake == "swapped":
                return y * b + g
            if mistake == "shift_then_scale":
                return (y + b) * g
            if mistake == "no_bias":  # learner test 6a, 3.1
                return y * g
            if mistake == "no_weight":  # learner test 25a, 3.1: γ left out
                return y + b
            if mistake == "bias_inside":  # learner test 9a, 3.1: (x - mu + b) / sqrt(var + eps) * w
                return (x - mean + b) / torch.sqrt(var + self.eps) * g
            return y * g + b

    return Candidate


class LNSkeleton(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()

    def forward(self, x):
        raise NotImplementedError


def test_layer_norm(capsys):
    for cls in (tc.LayerNorm, nn.LayerNorm, make_ln()):
        assert_passes(ex.check_layer_norm, cls, capsys)
    assert_skeleton(ex.check_layer_norm, LNSkeleton, capsys)


class DefaultEps1e6(make_ln()):  # learner test 27a, 3.1: eps=1e-6 as the default
    def __init__(self, d_model, eps=1e-6):
        super().__init__(d_model, eps)


class Eps1e6WhenNoneGiven(make_ln()):  # learner test 27a, 3.1: the signature right, 1e-6 stored
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)
        self.eps = 1e-6 if eps == 1e-5 else eps


class FusedFunctional(make_ln()):
    def forward(self, x):  # the kernel, though the page asks for mean and variance
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class FusedBuiltin(make_ln()):
    def forward(self, x):
        return torch.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class FusedModule(make_ln()):
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)
        self.inner = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x):
        self.inner.weight, self.inner.bias = self.weight, self.bias
        return self.inner(x)


class PackageReference(make_ln()):
    def forward(self, x):
        return tc.layer_norm_reference(x, self.weight, self.bias, self.eps)


class ByHandMentioningTheKernel(nn.Module):
    """Correct, by hand; a comment and a string name F.layer_norm(…) and nn.LayerNorm(…)."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        # the same as F.layer_norm(x, …) or nn.LayerNorm(E)(x), written out
        note = "not F.layer_norm(x)"  # noqa: F841
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


def by_hand_beside_a_kernel_branch(use_kernel=False):
    """Correct when the branch it takes is by hand (learner test 27a wrote variants this
    way): only what runs counts, not what the source mentions."""

    class Branches(make_ln()):
        def forward(self, x):
            if use_kernel:
                return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
            return super().forward(x)

    return Branches


def by_hand_without_source():
    """Correct, defined by exec: inspect.getsource fails, the checker still runs."""
    ns = {"nn": nn, "torch": torch}
    exec(  # noqa: S102
        "class NoSource(nn.Module):\n"
        "    def __init__(self, d_model, eps=1e-5):\n"
        "        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.ones(d_model))\n"
        "        self.bias = nn.Parameter(torch.zeros(d_model))\n"
        "        self.eps = eps\n"
        "    def forward(self, x):\n"
        "        mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)\n"
        "        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias\n",
        ns,
    )
    return ns["NoSource"]


def test_exercise_3_1_asks_for_the_basic_operations(capsys):
    """Its text: written with mean and variance, no F.layer_norm; the checker enforces it
    there only (5.5's text states no such rule, and the package's LayerNorm passes
    elsewhere)."""
    for cls in (ByHandMentioningTheKernel, by_hand_without_source(), by_hand_beside_a_kernel_branch(), make_ln()):
        assert_passes(lambda c: ex.check_layer_norm(c, exercise="3.1"), cls, capsys)
    fused = (FusedFunctional, FusedBuiltin, FusedModule, PackageReference, by_hand_beside_a_kernel_branch(True))
    for cls in (*fused, nn.LayerNorm, tc.LayerNorm):
        message = rejection(lambda c: ex.check_layer_norm(c, exercise="3.1"), cls)
        assert "请用均值、方差等基本运算写，不要调用 F.layer_norm" in message, message
        assert_passes(lambda c: ex.check_layer_norm(c, exercise="5.5"), cls, capsys)


def test_bug_hunt_fix_with_a_fixed_dim_is_told_to_use_dim_minus_1():
    # learner test 21a, 3.8: the "fix" x.mean(2) crashed on 2-D input with only "print .shape"
    message = rejection(lambda c: ex.check_layer_norm(c, exercise="3.8"), make_ln(mistake="dim2"))
    assert "IndexError" in message and "mean(2)" in message and "dim=-1" in message, message
    assert "任意维数" in message and "打印各个张量的 .shape" not in message, message


class CentredInPlace(nn.Module):  # learner test 34a, 3.1/3.8: x -= mean
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        x -= x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True)
        return x / torch.sqrt(var + self.eps) * self.weight + self.bias


LAYER_NORM_REJECTS = [
    pytest.param(ex.check_layer_norm, CentredInPlace, "原地改动了", id="input centred in place"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="unbiased"), "无偏", id="unbiased variance"),
    pytest.param(
        ex.check_layer_norm, make_ln(mistake="std_eps"), "eps 应加在根号里面", id="eps outside the square root"
    ),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_eps"), "忘了在根号里加 eps", id="no eps"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="dim0"), "归一化的维度不对", id="normalised over dim 0"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_center"), "没有减去均值", id="no mean subtracted"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="batch_norm"), "BatchNorm 的做法", id="over dims (0, 1)"),
    pytest.param(
        ex.check_layer_norm, make_ln(mistake="numerator_not_centred"), "分子忘了减去均值", id="x / sqrt(var + eps)"
    ),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_affine"), "γ 和 β", id="gamma and beta unused"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_bias"), "漏了 + β", id="beta missing"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_weight"), "漏了 * γ", id="gamma missing"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="swapped"), "用反了", id="gamma and beta swapped"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="eps_ignored"), "构造函数传入的 eps", id="eps argument ignored"),
    pytest.param(ex.check_layer_norm, EpsHardCoded, "用的 eps 是 1e-06，这里应为 1e-05", id="eps 1e-6 hard-coded"),
    pytest.param(ex.check_layer_norm, make_ln(parameter=False), "nn.Parameter", id="plain tensors"),
    pytest.param(ex.check_layer_norm, make_ln(init=(0.0, 0.0)), "初始值", id="gamma initialised to 0"),
    pytest.param(ex.check_layer_norm, make_ln(names=("scale", "shift")), "缺少可学习参数", id="other names"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_sqrt"), "忘了开根号", id="no square root"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="dim1"), "不是第 1 维", id="normalised over dim 1"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="var_dim0"), "方差却仍沿第 0 维", id="variance still over dim 0"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="mean_dim0"), "均值却仍沿第 0 维", id="mean still over dim 0"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="all"), "不要把其它维也算进去", id="normalised over all dims"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="shift_then_scale"), "先加 β 再乘 γ", id="(x̂ + β)γ"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="bias_inside"), "β 加在了归一化里面", id="β inside"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="no_keepdim"), "keepdim=True", id="no keepdim"),
    pytest.param(ex.check_layer_norm, make_ln(mistake="dim2"), "写 dim=-1", id="mean(2): only 3-D input"),
    pytest.param(ex.check_layer_norm, DefaultEps1e6, "不传 eps 时用的是 1e-06：默认应为 1e-5", id="default eps 1e-6"),
    pytest.param(ex.check_layer_norm, Eps1e6WhenNoneGiven, "不传 eps 时用的是 1e-06", id="1e-6 stored"),
    pytest.param(
        ex.check_layer_norm,
        make_ln(names=("gamma", "beta")),
        "缺少可学习参数",
        id="gamma and beta instead of weight and bias",
    ),
]


# 7. FFN and SwiGLU
# ---------------------------------------------------------------------------


def make_ffn(act=F.gelu, twice=False, residual=False, names=("w1", "w2"), bias=True, dropout=0.0):
    class Candidate(nn.Module):
        def __init__(self, d_model, d_ff):
            super().__init__()
            setattr(self, names[0], nn.Linear(d_model, d_ff, bias=bias))
            setattr(self, names[1], nn.Linear(d_ff, d_model))
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            out = self.drop(getattr(self, names[1])(act(getattr(self, names[0])(x))))
            out = act(out) if twice else out
            return x + out if residual else out

    return Candidate


class FFNSkeleton(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        # TODO: self.w1, self.w2

    def forward(self, x):
        pass


def test_feed_forward(capsys):
    for cls in (GeluFeedForward, make_ffn(), make_ffn(act=nn.GELU())):
        assert_passes(ex.check_feed_forward, cls, capsys)
    assert_skeleton(ex.check_feed_forward, FFNSkeleton, capsys)


class GeluAfterW2(GeluFeedForward):
    def forward(self, x):
        return F.gelu(self.w2(self.w1(x)))


class SwappedLinears(nn.Module):
    """Learner test: w1 and w2 built with each other's sizes."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_ff, d_model)
        self.w2 = nn.Linear(d_model, d_ff)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


FEED_FORWARD_REJECTS = [
    pytest.param(ex.check_feed_forward, GeluAfterW2, "GELU 放在了 w2 之后", id="GELU after w2"),
    pytest.param(ex.check_feed_forward, SwappedLinears, "检查两层的参数是否写反", id="w1 and w2 sizes swapped"),
    pytest.param(ex.check_feed_forward, make_ffn(act=F.relu), "ReLU", id="ReLU instead of GELU"),
    pytest.param(ex.check_feed_forward, make_ffn(act=nn.GELU(approximate="tanh")), "tanh 近似", id="tanh GELU"),
    pytest.param(ex.check_feed_forward, make_ffn(act=lambda t: t), "缺少激活函数", id="no activation"),
    pytest.param(ex.check_feed_forward, make_ffn(twice=True), "w2 之后", id="activation after w2 too"),
    pytest.param(ex.check_feed_forward, make_ffn(residual=True), "不含残差", id="residual inside the FFN"),
    pytest.param(ex.check_feed_forward, make_ffn(act=F.silu), "SiLU", id="SiLU"),
    pytest.param(ex.check_feed_forward, make_ffn(names=("fc1", "fc2")), "缺少属性 w1", id="other names"),
    pytest.param(ex.check_feed_forward, make_ffn(act=torch.sigmoid), "sigmoid；", id="sigmoid"),
    pytest.param(
        ex.check_feed_forward,
        make_ffn(act=lambda h: h * torch.sigmoid(1.702 * h)),
        "sigmoid 近似",
        id="sigmoid approximation of GELU",
    ),
    pytest.param(ex.check_feed_forward, make_ffn(bias=False), "应带偏置", id="bias-free w1"),
    pytest.param(ex.check_feed_forward, make_ffn(dropout=0.1), "dropout", id="nanoGPT dropout"),
    pytest.param(
        ex.check_feed_forward,
        make_ffn(act=lambda h: F.dropout(F.gelu(h), 0.1, training=True)),
        "两次调用，输出不同",
        id="functional dropout",
    ),  # learner test 8a, 3.2
]


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
                "relu": lambda: F.relu(a) * b,
                "both": lambda: F.silu(a) * F.silu(b),
            }[mistake]()
            return self.w2(hidden)

    return Candidate


class SwiGLUSkeleton(nn.Module):
    def __init__(self, d_model, d_ff):
        raise NotImplementedError


def test_swiglu(capsys):
    for cls in (make_swiglu(),):
        assert_passes(ex.check_swiglu, cls, capsys)
    assert_skeleton(ex.check_swiglu, SwiGLUSkeleton, capsys)


SWIGLU_REJECTS = [
    pytest.param(ex.check_swiglu, make_swiglu(mistake="swapped"), "silu 应作用在 w1 x 上", id="w1 and w3 swapped"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="gelu"), "GEGLU", id="GELU gate"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="sigmoid"), "GLU", id="sigmoid gate"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="no_gate"), "缺了门控", id="no gate"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="sum"), "不是相加", id="sum instead of product"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="after"), "不是 silu(w1 x * w3 x)", id="silu after the product"),
    pytest.param(ex.check_swiglu, make_swiglu(bias=True), "不应带偏置", id="with biases"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="relu"), "ReLU", id="ReLU gate"),
    pytest.param(ex.check_swiglu, make_swiglu(mistake="both"), "那一支不过激活", id="both branches activated"),
]


REJECTS = LAYER_NORM_REJECTS + FEED_FORWARD_REJECTS + SWIGLU_REJECTS


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {
        "LAYER_NORM_HINTS": norms_ffn.LAYER_NORM_HINTS,
        "LAYER_NORM_CRASHES": norms_ffn.LAYER_NORM_CRASHES,
        "FFN_HINTS": norms_ffn.FFN_HINTS,
        "FFN_CRASHES": norms_ffn.FFN_CRASHES,
        "SWIGLU_HINTS": norms_ffn.SWIGLU_HINTS,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)


@pytest.mark.parametrize(
    ("mistake", "keyword"), [("batch_norm", "BatchNorm 的做法"), ("numerator_not_centred", "分子忘了减去均值")]
)
def test_bug_hunt_3_8_names_batch_norm_and_the_uncentred_numerator(mistake, keyword):
    """Learner test 24a: both got the generic "对照公式" in 3.1 and in the find-the-bug 3.8."""
    message = rejection(lambda c: ex.check_layer_norm(c, exercise="3.8"), make_ln(mistake=mistake))
    assert keyword in message and "对照公式" not in message, message
