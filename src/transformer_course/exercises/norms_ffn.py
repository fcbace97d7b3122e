"""Layer normalisation and the feed-forward networks (GELU FFN, SwiGLU), named as in
:class:`transformer_course.LayerNorm` and :class:`transformer_course.FeedForward`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..feedforward import FeedForward
from ..norms import layer_norm_reference
from ._protocol import (
    calls_refused,
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
    apply_linear,
    as_tensor,
    bug_hunt_hints,
    check_finite,
    check_float,
    check_no_dropout,
    check_shape,
    close,
    first_reproduced,
    linear_attr,
    where_differs,
)


def _norm_params(module: nn.Module, what: str) -> tuple[Tensor, Tensor]:
    """``(weight, bias)`` of the learner's norm, named as in ``tc.LayerNorm``."""
    w, b = getattr(module, "weight", None), getattr(module, "bias", None)
    if w is None and b is None:
        fail(
            f"{what} 缺少可学习参数：应有 "
            "self.weight = nn.Parameter(torch.ones(d_model))"
            " 和 self.bias = nn.Parameter(torch.zeros(d_model))（即 γ 和 β）。"
        )
    for n, p in (("weight", w), ("bias", b)):
        if p is None:
            fail(f"{what} 缺少参数 {n}：weight 和 bias 要成对定义。")
        if not isinstance(p, nn.Parameter):
            fail(
                f"{what}.{n} 应是 nn.Parameter（得到 {type(p).__name__}）："
                "普通张量不会出现在 parameters() 里，优化器就不会训练它。"
            )
    return w, b


# eps values a learner may write into forward by hand
_USUAL_EPS = (1e-6, 1e-5, 1e-8, 1e-12, 1e-7, 1e-4, 1e-3, 1e-2)


def _other_eps_hint(out: Tensor, xwb: tuple[Tensor, Tensor, Tensor], eps: float) -> str:
    """The hint when ``out`` is layer norm with a usual eps other than ``eps`` (the
    constructor's), else empty."""
    x, w, b = xwb
    for other in _USUAL_EPS:
        if other != eps and close(
            out, layer_norm_reference(x, w, b, other), 1e-4, 1e-4
        ):
            return (
                f"公式对，但用的 eps 是 {other:g}，这里应为 {eps:g}：eps 是构造函数"
                "的参数（默认 1e-5），在 __init__ 里存成 self.eps，forward 里用 "
                "self.eps，不要在 forward 里写死一个数。"
            )
    return ""


def _ln_variant(
    x: Tensor,
    w: Tensor,
    b: Tensor,
    eps: float,
    eps_given: bool,
    mistake: str,
    default_eps: float | None = None,
) -> Tensor | None:
    """What layer norm with one of :data:`LAYER_NORM_HINTS`' mistakes outputs
    (``default_eps``: the learner's default for ``eps``, when it is not 1e-5)."""
    if mistake == "eps_ignored":
        return layer_norm_reference(x, w, b) if eps_given else None
    if mistake == "default_eps":
        if eps_given or default_eps is None:
            return None
        return layer_norm_reference(x, w, b, default_eps)
    dims = {"dim0": 0, "dim1": 1, "all": tuple(range(1, x.dim()))}.get(mistake, -1)
    dims = (0, 1) if mistake == "batch_norm" else dims
    mean = x.mean(dim=0 if mistake == "mean_dim0" else dims, keepdim=True)
    var = x.var(
        dim=0 if mistake == "var_dim0" else dims,
        keepdim=True,
        unbiased=mistake == "unbiased",
    )
    if mistake == "no_center":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w + b
    if mistake == "numerator_not_centred":  # the variance centred, x itself divided
        return x / torch.sqrt(var + eps) * w + b
    if mistake == "bias_inside":  # β added to x - mean, then normalised and scaled
        return (x - mean + b) / torch.sqrt(var + eps) * w
    if mistake == "std_eps":
        y = (x - mean) / (var.sqrt() + eps)
    elif mistake == "no_sqrt":
        y = (x - mean) / (var + eps)
    else:
        y = (x - mean) / torch.sqrt(var + eps)
    affine = {"no_affine": lambda: y, "swapped": lambda: y * b + w}
    affine["no_bias"] = lambda: y * w
    affine["no_weight"] = lambda: y + b
    affine["shift_then_scale"] = lambda: (y + b) * w
    return affine.get(mistake, lambda: y * w + b)()


LAYER_NORM_HINTS = [
    (
        "方差用了无偏估计（除以 n − 1）：torch.var / x.std 默认 unbiased=True，"
        "LayerNorm 要有偏方差，写 x.var(-1, keepdim=True, unbiased=False)。",
        "unbiased",
    ),
    (
        "eps 应加在根号里面：(x − mean) / sqrt(var + eps)，不是 / (std + eps)。",
        "std_eps",
    ),
    ("忘了开根号：应除以 sqrt(var + eps)，不是 (var + eps)。", "no_sqrt"),
    (
        "归一化的维度不对：应在最后一维上求均值和方差（dim=-1, keepdim=True），"
        "不是第 0 维。",
        "dim0",
    ),
    (
        "归一化的维度不对：应在最后一维上求均值和方差（dim=-1, keepdim=True），"
        "不是第 1 维。",
        "dim1",
    ),
    (
        "均值已在最后一维上求，方差却仍沿第 0 维（x.var(0, …)）：两者都要在最后一维"
        "上算，x.var(-1, keepdim=True, unbiased=False)。",
        "var_dim0",
    ),
    (
        "方差已在最后一维上求，均值却仍沿第 0 维（x.mean(0, …)）：两者都要在最后一维"
        "上算，x.mean(-1, keepdim=True)。",
        "mean_dim0",
    ),
    (
        "归一化的维度不对：只在最后一维（特征维）上求均值和方差，不要把其它维也算进去。",
        "all",
    ),
    (
        "这是 BatchNorm 的做法：沿批和位置（dim=(0, 1)）对每个特征求均值和方差，一个"
        "词元的输出于是取决于同一批里的其他词元。LayerNorm 对每个词元自己的特征归一化："
        "x.mean(-1, keepdim=True)，x.var(-1, keepdim=True, unbiased=False)。",
        "batch_norm",
    ),
    ("没有减去均值：这是 RMSNorm 的做法；LayerNorm 要 (x − mean)。", "no_center"),
    (
        "分子忘了减去均值：方差是围绕均值算的，分子却是 x 本身。"
        "应为 (x − mean) / sqrt(var + eps)。",
        "numerator_not_centred",
    ),
    ("没有用上 γ 和 β：标准化之后要 * weight + bias。", "no_affine"),
    ("乘了 γ，却漏了 + β：应为 x̂ * weight + bias。", "no_bias"),
    ("加了 β，却漏了 * γ（weight）：应为 x̂ * weight + bias。", "no_weight"),
    ("weight 和 bias 用反了：应为 x̂ * weight + bias。", "swapped"),
    ("先加 β 再乘 γ 了：应先乘再加，x̂ * weight + bias。", "shift_then_scale"),
    (
        "β 加在了归一化里面：(x − mean + bias) / sqrt(var + eps) 让 β 也被除以了"
        "标准差。先标准化 x̂ = (x − mean) / sqrt(var + eps)，"
        "最后才加 β：x̂ * weight + bias。",
        "bias_inside",
    ),
    (
        "没有使用构造函数传入的 eps：把它存成 self.eps，forward 里用 self.eps。",
        "eps_ignored",
    ),
    (
        "不传 eps 时用的是 {default_eps}：默认应为 1e-5（与 nn.LayerNorm、tc.LayerNorm "
        "相同），签名写 (d_model, eps=1e-5)，存成 self.eps，forward 里用 self.eps。",
        "default_eps",
    ),
]


def _number(value: object) -> float | None:
    return (
        None if isinstance(value, bool) or not isinstance(value, int | float) else value
    )


def _default_eps(module: nn.Module, cls: type) -> float | None:
    """The eps the learner's layer uses when none is passed, where it is not 1e-5:
    its ``self.eps``, else the default in ``cls``'s signature; None: 1e-5 or unknown."""
    used = _number(getattr(module, "eps", None))
    if used is None:
        try:
            param = inspect.signature(cls).parameters.get("eps")
        except (TypeError, ValueError):
            param = None
        used = None if param is None else _number(param.default)
    return None if used is None or used == 1e-5 else float(used)


# the exercises whose text asks for layer norm written with the basic operations
# (mean, variance): the fused kernels and the package's reference are refused there
_BASIC_OPS_ONLY = ("3.1",)
# torch.layer_norm: the kernel that F.layer_norm, nn.LayerNorm and tc.LayerNorm call
_FUSED_LAYER_NORM = (torch.layer_norm, layer_norm_reference)


def _basic_ops_message(what: str) -> str:
    return (
        f"{what} 的 forward 用了现成的 LayerNorm：请用均值、方差等基本运算写，不要调用 "
        "F.layer_norm（nn.LayerNorm、torch.layer_norm、tc.LayerNorm、"
        "tc.layer_norm_reference 也一样，它们就是要你写的东西）。"
        "按公式：mean = x.mean(-1, keepdim=True)，有偏方差，"
        "(x − mean) / sqrt(var + eps) * weight + bias。"
    )


# the find-the-bug exercise on this checker (chapter 3): the page's norm reduces over
# the batch; the hint gives the symptom and where to look
_BUG_HUNT = {
    "3.8": {
        "dim0": (
            "均值和方差都是沿第 0 维（批）求的：一个词元的输出取决于同一批里的其他"
            "序列。看 mean 和 var 的维度参数：LayerNorm 对每个词元自己的特征归一化。"
        )
    }
}

LAYER_NORM_CRASHES = [
    (
        r"must match the size[\s\S]*\b(mean|var|std)\b",
        "求均值或方差时少了 keepdim=True：(…, E) 减去形状 (…,) 的均值无法广播，"
        "写 x.mean(-1, keepdim=True)。",
    ),
    (
        r"^IndexError: Dimension out of range",
        "求均值或方差时写了固定的维度编号（如 mean(2)）：它只对某个维数的输入对。"
        "输入可以是 2 维、3 维或 4 维，特征维总是最后一维：写 dim=-1"
        "（x.mean(-1, keepdim=True)），任意维数的输入都对。",
    ),
]


@checker("层归一化", wants_class=True)
def check_layer_norm(cls: type, exercise: str | None = None) -> str:
    """Grade ``cls(d_model, eps=1e-5)``: layer normalisation.

    Learnable ``weight`` (init 1) and ``bias`` (init 0), as in ``tc.LayerNorm``;
    ``forward(x)`` normalises the last dimension with the biased
    variance: ``(x - mean) / sqrt(var + eps) * weight + bias``. Compared with
    :func:`transformer_course.layer_norm_reference`.
    """
    name = name_of(cls)
    g = seeded_generator(4)
    hints = bug_hunt_hints(LAYER_NORM_HINTS, exercise, _BUG_HUNT)
    basic_only = str(exercise) in _BASIC_OPS_ONLY

    def refused():  # a fresh watch for each run of the learner's forward
        return calls_refused(
            _FUSED_LAYER_NORM if basic_only else (), _basic_ops_message(name)
        )

    small = randn(g, 3, 6, scale=3e-3)
    small[1] = 0.5  # a constant row: zero variance
    # (description, d_model, eps or None for the default, x)
    cases = [
        ("d_model=6, x (2, 5, 6)", 6, None, randn(g, 2, 5, 6, scale=3.0) + 2.0),
        ("d_model=6, 方差很小或为 0 的行 x (3, 6)", 6, None, small),
        ("d_model=8, 4 维 x (2, 3, 4, 8)", 8, None, randn(g, 2, 3, 4, 8) - 1.0),
        ("d_model=6, eps=0.01, x (3, 6) 方差很小", 6, 0.01, small * 10),
        ("d_model=5（奇数）, x (4, 5)", 5, None, randn(g, 4, 5, scale=2.0)),
    ]
    for i, (case, E, eps, x) in enumerate(cases):
        kwargs = {} if eps is None else {"eps": eps}
        module = construct(cls, E, what=name, **kwargs)
        what = f"{name}{fmt_args((E,), kwargs)}"
        with torch.no_grad(), refused():
            out = run_module(
                module, x, what=what, case=case, first=i == 0, causes=LAYER_NORM_CRASHES
            )
        w, b = _norm_params(module, what)
        for p, n, init in ((w, "weight（γ）", 1.0), (b, "bias（β）", 0.0)):
            check_shape(p, (E,), f"{what} 的 {n}", "", " 每个特征一个参数。")
            if i == 0 and not bool((p == init).all()):
                fail(
                    f"{what} 的 {n} 初始值应全为 {init:g}"
                    "（初始时 LayerNorm 只做标准化）"
                    f"，得到例如 {p.flatten()[0].item():.4g}。"
                )
        with torch.no_grad():  # random γ, β: both must be used, and used right
            w.copy_(randn(g, E, scale=0.5) + 1.0)
            b.copy_(randn(g, E))
        with torch.no_grad(), refused():
            out = run_module(module, x, what=what, case=case, causes=LAYER_NORM_CRASHES)
        out = as_tensor(out, f"{what} 的输出", case)
        check_shape(
            out,
            x.shape,
            f"{what} 的输出",
            case,
            " LayerNorm 不改变形状：求均值和方差时要 keepdim=True。",
        )
        check_float(out, f"{what} 的输出")
        e = 1e-5 if eps is None else eps
        check_finite(
            out,
            f"{what} 的输出",
            case,
            "方差为 0 的行除以了 0：忘了在根号里加 eps（sqrt(var + eps)）。",
        )
        ref = layer_norm_reference(x, w.detach(), b.detach(), e)
        if close(out, ref, 1e-4, 1e-4):
            continue
        default_eps = _default_eps(module, cls)
        variant = functools.partial(
            _ln_variant, x, w.detach(), b.detach(), e, eps is not None,
            default_eps=default_eps,
        )  # fmt: skip
        shown = "" if default_eps is None else f"{default_eps:g}"
        hint = (
            first_reproduced(out, hints, variant, 1e-4, 1e-4, default_eps=shown)
            or _other_eps_hint(out, (x, w.detach(), b.detach()), e)
            or (
                "对照公式：mean、有偏方差都在最后一维上算（keepdim=True），"
                "y = (x − mean) / sqrt(var + eps) * weight + bias。"
            )
        )
        fail(
            f"{what} 的输出与参考不一致（{case}；{where_differs(out, ref)}）。"
            f"\n可能的原因：{hint}"
        )
    return "2 到 4 维输入、奇数 d_model、方差为 0 的行、自定义 eps、随机 γ/β，共 5 组"


# feed-forward networks


def _copy_linear(src: nn.Linear, dst: nn.Linear) -> None:
    """Copy ``src`` into ``dst`` (:func:`linear_attr` checked that the biases agree)."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            dst.bias.copy_(src.bias)


def _ffn_variant(l1: nn.Linear, l2: nn.Linear, x: Tensor, mistake: str) -> Tensor:
    acts = {
        "relu": F.relu,
        "tanh": functools.partial(F.gelu, approximate="tanh"),
        "none": lambda t: t,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "sigmoid_gelu": lambda t: t * torch.sigmoid(1.702 * t),
    }
    act = acts.get(mistake, F.gelu)
    out = apply_linear(l2, act(apply_linear(l1, x)))
    if mistake == "twice":
        return F.gelu(out)
    if mistake == "after_w2":
        return F.gelu(apply_linear(l2, apply_linear(l1, x)))
    if mistake == "residual":
        return x + out
    return out


def _ffn_cases(g: torch.Generator) -> list[tuple[str, int, int, Tensor]]:
    return [
        ("d_model=8, d_ff=32, x (2, 5, 8)", 8, 32, randn(g, 2, 5, 8)),
        ("d_model=6, d_ff=10, x (3, 6)", 6, 10, randn(g, 3, 6, scale=2.0)),
        ("d_model=4, d_ff=12, x (2, 3, 1, 4)", 4, 12, randn(g, 2, 3, 1, 4)),
    ]


def _ffn_runs(
    cls: type, seed: int
) -> Iterator[tuple[str, int, int, Tensor, str, nn.Module, object]]:
    """Build the learner's FFN for each of :func:`_ffn_cases` and run it on ``x``:
    ``(case, d_model, d_ff, x, what, module, out)``, ``what`` like ``MyFFN(8, 32)``."""
    name = name_of(cls)
    for i, (case, E, d_ff, x) in enumerate(_ffn_cases(seeded_generator(seed))):
        what = f"{name}({E}, {d_ff})"
        module = construct(cls, E, d_ff, what=name)
        with torch.no_grad():
            out = run_module(
                module, x, what=what, case=case, first=i == 0, causes=FFN_CRASHES
            )
        yield case, E, d_ff, x, what, module, out


FFN_CRASHES = [
    (
        r"mat1 and mat2 shapes cannot be multiplied",
        "某个 nn.Linear 的输入维数与送进来的张量不符：w1 = nn.Linear(d_model, d_ff)"
        "（SwiGLU 的 w3 也是），把 d_model 维升到 d_ff；w2 = nn.Linear(d_ff, d_model)"
        "，再降回 d_model。检查两层的参数是否写反、调用顺序是否是先 w1 后 w2。",
    ),
]


def _check_repeatable(module: nn.Module, x: Tensor, out: object, what: str, case: str):
    """A second call on the same ``x`` must give the same output: a functional
    dropout (``F.dropout``, whose ``training`` defaults to True) makes it random."""
    with torch.no_grad():
        again = module(x)
    if isinstance(out, Tensor) and isinstance(again, Tensor) and not close(out, again):
        fail(
            f"{what} 对同一个输入两次调用，输出不同（{case}）：像是留了 dropout"
            "（例如 F.dropout(h, p)：它的 training 默认为 True，"
            "model.eval() 也关不掉）。"
            "题目写明“不加 dropout”：去掉它，FFN 就是 w2(gelu(w1(x)))。"
        )


def _check_ffn_output(
    out: object,
    x: Tensor,
    ref_mod: nn.Module,
    mistakes: Sequence[tuple[str, str]],
    variant: Callable[[str], Tensor],
    formula: str,
    what: str,
    case: str,
) -> None:
    """``out`` must equal ``ref_mod(x)``; otherwise the hint of the typical mistake
    that it reproduces (``variant(mistake)`` computes one), or the ``formula``."""
    out = as_tensor(out, f"{what} 的输出", case)
    check_shape(
        out, x.shape, f"{what} 的输出", case, " FFN 逐位置作用，输出与输入同形。"
    )
    check_float(out, f"{what} 的输出")
    with torch.no_grad():
        ref = ref_mod(x)
    if close(out, ref):
        return
    hint = first_reproduced(out, mistakes, variant) or f"对照公式：{formula}。"
    fail(
        f"{what} 的输出与参考不一致（{case}；{where_differs(out, ref)}）。"
        f"\n可能的原因：{hint}"
    )


FFN_HINTS = [
    ("激活函数用了 ReLU；本练习用 GELU（F.gelu 或 nn.GELU()）。", "relu"),
    (
        "用了 GELU 的 tanh 近似（approximate='tanh'）；本练习用精确的 GELU"
        "（F.gelu 的默认）。",
        "tanh",
    ),
    ("两层之间缺少激活函数：两个线性层叠在一起仍是一个线性变换。", "none"),
    ("激活只在两层之间：w2 之后不要再过 GELU。", "twice"),
    (
        "GELU 放在了 w2 之后：激活在两层之间，w2(gelu(w1(x)))，不是 gelu(w2(w1(x)))。",
        "after_w2",
    ),
    ("FFN 本身不含残差：x + … 由 Transformer 块去加。", "residual"),
    ("激活函数用了 SiLU；本练习用 GELU。", "silu"),
    ("激活函数用了 sigmoid；本练习用 GELU。", "sigmoid"),
    (
        "用了 GELU 的 sigmoid 近似 x·σ(1.702x)；本练习用精确的 GELU（F.gelu 的默认）。",
        "sigmoid_gelu",
    ),
]


@checker("前馈网络 FFN", wants_class=True)
def check_feed_forward(cls: type) -> str:
    """Grade ``cls(d_model, d_ff)``: the position-wise FFN ``w2(gelu(w1 x))``.

    ``w1 = nn.Linear(d_model, d_ff)``, ``w2 = nn.Linear(d_ff, d_model)``
    (with biases, as the book's ``tc.FeedForward``), the exact GELU (``F.gelu`` /
    ``nn.GELU()``) between them, no dropout; ``forward(x)`` works on any leading
    dimensions. Compared with :class:`transformer_course.FeedForward`
    (``activation="gelu"``) holding the same weights.
    """
    for case, E, d_ff, x, what, module, out in _ffn_runs(cls, seed=7):
        l1 = linear_attr(module, "w1", E, d_ff, what, bias=True)
        l2 = linear_attr(module, "w2", d_ff, E, what, bias=True)
        check_no_dropout(module, what)
        _check_repeatable(module, x, out, what, case)
        ref_mod = FeedForward(E, d_ff, activation="gelu")
        _copy_linear(l1, ref_mod.w1)
        _copy_linear(l2, ref_mod.w2)
        variant = functools.partial(_ffn_variant, l1, l2, x)
        formula = "w2(gelu(w1(x)))"
        _check_ffn_output(out, x, ref_mod, FFN_HINTS, variant, formula, what, case)
    return "2 到 4 维输入，3 组 (d_model, d_ff)"


def _swiglu_variant(
    w1: nn.Linear, w2: nn.Linear, w3: nn.Linear, x: Tensor, mistake: str
) -> Tensor:
    a, b = apply_linear(w1, x), apply_linear(w3, x)
    hidden = {
        "swapped": lambda: F.silu(b) * a,
        "gelu": lambda: F.gelu(a) * b,
        "sigmoid": lambda: torch.sigmoid(a) * b,
        "relu": lambda: F.relu(a) * b,
        "no_gate": lambda: F.silu(a),
        "sum": lambda: F.silu(a) + b,
        "after": lambda: F.silu(a * b),
        "both": lambda: F.silu(a) * F.silu(b),
    }[mistake]()
    return apply_linear(w2, hidden)


SWIGLU_HINTS = [
    (
        "silu 应作用在 w1 x 上，w3 x 是不过激活的另一支：w2(silu(w1 x) * w3 x)。",
        "swapped",
    ),
    (
        "SwiGLU 的激活是 SiLU（F.silu，即 x·sigmoid(x)），不是 GELU（那是 GEGLU）。",
        "gelu",
    ),
    (
        "用了 sigmoid（那是 GLU）：SwiGLU 用 SiLU(x) = x·sigmoid(x)，即 F.silu。",
        "sigmoid",
    ),
    ("激活函数用了 ReLU；SwiGLU 用 SiLU（F.silu）。", "relu"),
    ("缺了门控：silu(w1 x) 还要逐元素乘以 w3 x。", "no_gate"),
    ("门控是逐元素相乘，不是相加：silu(w1 x) * w3 x。", "sum"),
    (
        "silu 只作用在 w1 x 上，之后再乘 w3 x：silu(w1 x) * w3 x，"
        "不是 silu(w1 x * w3 x)。",
        "after",
    ),
    ("w3 x 那一支不过激活：silu(w1 x) * w3 x。", "both"),
]


@checker("SwiGLU 前馈网络", wants_class=True)
def check_swiglu(cls: type) -> str:
    """Grade ``cls(d_model, d_ff)``: the SwiGLU FFN ``w2(silu(w1 x) * w3 x)``.

    Three bias-free layers: ``w1 = nn.Linear(d_model, d_ff, bias=False)``, ``w3`` the
    same, ``w2 = nn.Linear(d_ff, d_model, bias=False)``. Compared with
    :class:`transformer_course.FeedForward` (``activation="swiglu"``, ``bias=False``)
    holding the same weights.
    """
    for case, E, d_ff, x, what, module, out in _ffn_runs(cls, seed=8):
        w1 = linear_attr(module, "w1", E, d_ff, what, bias=False)
        w3 = linear_attr(module, "w3", E, d_ff, what, bias=False)
        w2 = linear_attr(module, "w2", d_ff, E, what, bias=False)
        ref_mod = FeedForward(E, d_ff, activation="swiglu", bias=False)
        for src, dst in ((w1, ref_mod.w1), (w2, ref_mod.w2), (w3, ref_mod.w3)):
            _copy_linear(src, dst)
        variant = functools.partial(_swiglu_variant, w1, w2, w3, x)
        formula = "w2(silu(w1(x)) * w3(x))"
        _check_ffn_output(out, x, ref_mod, SWIGLU_HINTS, variant, formula, what, case)
    return "2 到 4 维输入，3 组 (d_model, d_ff)"
