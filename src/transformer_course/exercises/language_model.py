"""A decoder-only language model from the learner's own parts: splitting
``(N, T, E)`` into heads without leaking the future, the variance of an attention
row's sum after dropout, and a training loop that brings
:class:`~transformer_course.MiniGPT` to a stated validation loss."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from numbers import Real

import torch
from torch import Tensor

from ..data import CharTokenizer, lm_batch, load_text_corpus
from ..models import GPTConfig, MiniGPT
from ._protocol import checker, fail, name_of, run_learner, seeded_generator
from ._report import (
    as_tensor,
    bug_hunt_hints,
    check_float,
    check_shape,
    close,
    first_reproduced,
)
from .training import step_order_hint

# ---------------------------------------------------------------------------
# splitting into heads
# ---------------------------------------------------------------------------

_SPLIT_MISTAKES = [
    (
        "结果等于把 t 直接 view/reshape 成 (N, H, T, D)：view 和 reshape 只按内存顺序"
        "重新划分形状，不会交换轴，所以先 view(N, T, H, D) 再 reshape(N, H, T, D) "
        "也一样。第 h 个头的第 i 行因此不再是位置 i，而是位置 (h·T + i)·D / E 的"
        "一段特征。"
        "因果掩码按行下标屏蔽，于是许多位置的输出读到了它自己之后的字符——模型看见了未来"
        "（训练损失在这些位置接近 0，生成却一塌糊涂）。应先 view(N, T, H, D)，再用 "
        "transpose(1, 2)（不是 reshape）交换位置轴与头轴。",
        "view",
    ),
    (
        "拆成了 (N, T, D, H)：第 h 个头拿到的是特征 h, h+H, h+2H, …（隔 H 取一个），"
        "不是连续的第 h 段 hD … (h+1)D-1。应 view(N, T, H, D)，头的维度在前。",
        "interleaved",
    ),
    (
        "view(N, T, H, D) 之后没有 transpose(1, 2)：返回的是 (N, T, H, D)，位置轴和头轴"
        "的顺序反了。",
        "no_transpose",
    ),
    (
        "先 transpose(1, 2) 成 (N, E, T) 再 reshape(N, H, T, D)：转置之后 reshape 按"
        "「特征 e 的所有位置」连着切，切出的「行」不再是一个位置的特征。"
        "应先拆最后一维 view(N, T, H, D)，再 transpose(1, 2) 交换位置轴与头轴。",
        "transpose_first",
    ),
]


# the find-the-bug exercise on this checker (chapter 3): the page's split is the bare
# view(N, H, T, D); the hint gives the symptom and where to look
_BUG_HUNT = {
    "3.10": {
        "view": (
            "结果等于把 t 直接 view/reshape 成 (N, H, T, D)（先 view(N, T, H, D) 再 "
            "reshape 也一样）：view 和 reshape 只按内存顺序重新划分形状，不会交换轴，"
            "第 h 个头的第 i 行因此不再是位置 i 的特征；因果掩码按行下标屏蔽，许多位置"
            "就读到了自己之后的字符。想一想：哪种操作才真正交换两根轴？"
        )
    }
}


def _split_variant(t: Tensor, H: int, mistake: str) -> Tensor:
    N, T, E = t.shape
    D = E // H
    if mistake == "view":
        return t.reshape(N, H, T, D)
    if mistake == "interleaved":
        return t.reshape(N, T, D, H).permute(0, 3, 1, 2)
    if mistake == "transpose_first":
        return t.transpose(1, 2).reshape(N, H, T, D)
    return t.reshape(N, T, H, D)  # no_transpose


@checker("拆成多头")
def check_split_heads(fn: Callable, exercise: str | None = None) -> str:
    """Grade ``fn(t, H)``: ``(N, T, E) -> (N, H, T, D)`` with ``D = E // H``, head
    ``h`` holding features ``h*D .. (h+1)*D - 1`` of every position, positions in
    order (``out[n, h, i] == t[n, i, h*D:(h+1)*D]``). A non-contiguous view is fine."""
    name = name_of(fn)
    g = seeded_generator(31)
    hints = bug_hunt_hints(_SPLIT_MISTAKES, exercise, _BUG_HUNT)
    cases = [(2, 6, 8, 2), (1, 5, 12, 3), (3, 8, 16, 4), (2, 4, 6, 1)]
    for i, (N, T, E, H) in enumerate(cases):
        t = torch.randn(N, T, E, generator=g)
        case = f"t 形状 {(N, T, E)}，H = {H}"
        got = as_tensor(
            run_learner(fn, t, H, what=name, case=case, first=i == 0), name, case
        )
        D = E // H
        ref = torch.stack([t[..., h * D : (h + 1) * D] for h in range(H)], dim=1)
        if tuple(got.shape) == (N, T, H, D) and H != T:
            fail(
                f"{name} 的输出形状是 (N, T, H, D) = {(N, T, H, D)}（{case}）："
                + _SPLIT_MISTAKES[2][0]
            )
        if tuple(got.shape) == (N, D, T, H) and H != D:
            fail(
                f"{name} 的输出形状是 {tuple(got.shape)}，应为 {(N, H, T, D)}"
                f"（{case}）：头数与每头的维数用反了，拆出了 D = {D} 个头、"
                f"每头 H = {H} 维。"
            )
        check_shape(got, (N, H, T, D), f"{name} 的输出", case)
        if close(got, ref, 0.0, 0.0):
            continue
        hint = first_reproduced(
            got, hints, functools.partial(_split_variant, t, H), 0.0, 0.0
        )
        fail(f"{name} 拆出的头不对（{case}）：{hint or _split_where(got, ref, t)}")
    return "4 种 (N, T, E, H)，每个头拿到每个位置的第 h 段特征"


def _split_where(got: Tensor, ref: Tensor, t: Tensor) -> str:
    """Where the first wrong element of a split came from in ``t`` (random, so each
    value stands once), and what that says."""
    n, h, i, d = (got != ref).nonzero()[0].tolist()
    want = f"t[{n}, {i}, {h}*D + {d}]"
    found = (t[n] == got[n, h, i, d]).nonzero().tolist()
    if len(found) != 1:
        return (
            f"例如 out[{n}, {h}, {i}, {d}] 应等于 {want}，它却不是 t 里的任何一个元素："
            "拆头只重排元素，不改变数值。"
        )
    pos, feat = found[0]
    if pos != i:
        return (
            f"例如 out[{n}, {h}, {i}, {d}] 应等于 {want}，却是 t[{n}, {pos}, {feat}]，"
            f"位置 {pos} 的特征：头里的第 i 行混进了别的位置，不再是位置 i 的特征，"
            "因果掩码按行屏蔽就屏蔽错了位置。"
        )
    return (
        f"例如 out[{n}, {h}, {i}, {d}] 应等于 {want}，却是 t[{n}, {i}, {feat}]："
        f"位置对了，特征取错了。第 h 个头应拿到连续的第 h 段特征 hD … (h+1)D − 1。"
    )


def leaking_positions(T: int, H: int) -> list[int]:
    """Output positions ``t`` (of ``T``) that can read the input at ``t + 1`` in a
    causal layer whose heads are split with the bug ``view(N, H, T, D)`` and merged with
    the correct ``transpose(1, 2).reshape(N, T, E)``.

    Under the bug, row ``i`` of head ``h`` is a segment of position
    ``(h*T + i) // H``; the causal mask lets row ``t`` read rows ``j <= t``, i.e.
    positions ``(h*T) // H .. (h*T + t) // H``, and the merge puts head ``h``'s row
    ``t`` back at output position ``t``. One layer; stacked layers can leak more.
    """
    for value, label in ((T, "T"), (H, "H")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    return [
        t
        for t in range(T - 1)
        if any((h * T) // H <= t + 1 <= (h * T + t) // H for h in range(H))
    ]


# ---------------------------------------------------------------------------
# attention dropout: the variance of a row's sum
# ---------------------------------------------------------------------------

_DROPOUT_MISTAKES = [
    (
        "这是不放大时的方差 p(1-p)·Σa²：dropout 把保留下来的权重乘以 1/(1-p)，"
        "ã_j = a_j·m_j/(1-p)，方差要再除以 (1-p)²。",
        "no_scale",
    ),
    (
        "这是 p/(1-p)：一行权重加起来是 1，你算的是 p/(1-p)·Σa（少了平方）或 "
        "p/(1-p)·(Σa)²（先求和再平方）。各项独立，方差逐项相加，"
        "Var(c·X) = c²·Var(X)，每一项贡献 a_j² 倍：p/(1-p)·Σ a_j²。",
        "not_squared",
    ),
    (
        "这是 p/(1-p)²·Σa²：单项 a_j·m_j/(1-p) 的方差是 a_j²·p(1-p)/(1-p)²，"
        "伯努利方差 p(1-p) 里的 (1-p) 要与分母约掉一个，结果是 p/(1-p)·Σa²。",
        "squared_denominator",
    ),
    (
        "这是 (1-p)/p·Σa²：p 是丢弃的概率，保留的概率是 1-p，比值写反了。",
        "inverted",
    ),
    ("这是 p·Σa²：漏了放大因子 1/(1-p) 带来的 1/(1-p)。", "p_only"),
    (
        "这是 Σa²/(1-p)：漏了因子 p。每一项 a_j·m_j/(1-p) 的方差是 "
        "a_j²·p(1-p)/(1-p)² = a_j²·p/(1-p)。",
        "no_p",
    ),
    (
        "这是 p/(1-p)·mean(a²)：对平方取了平均，应求和。行和的方差是各项方差之和，"
        "p/(1-p)·Σ a_j²（(a ** 2).sum(-1)，不是 .mean(-1)）。",
        "mean_not_sum",
    ),
    (
        "这是 p/(1-p)·a.var(-1)：用的是权重本身的样本方差（各 a_j 离平均值有多散），"
        "不是平方和。行和的方差是各项方差之和：p/(1-p)·Σ a_j²，(a ** 2).sum(-1)。",
        "sample_variance",
    ),
    (
        "得到 0：dropout 之后行和不再恒为 1。它独立地丢掉各个权重、把留下的放大 "
        "1/(1-p)，只有行和的期望仍是 1，行和本身是随机的。把行和写成 "
        "Σ a_j·m_j/(1-p)，m_j 是独立的伯努利(1-p) 变量，再逐项求方差。",
        "zero",
    ),
]


def _dropout_variant(a: Tensor, p: float, mistake: str) -> Tensor:
    s2, s1 = (a**2).sum(-1), a.sum(-1)
    return {
        "no_scale": p * (1 - p) * s2,
        "not_squared": p / (1 - p) * s1,
        "squared_denominator": p / (1 - p) ** 2 * s2,
        "inverted": (1 - p) / p * s2,
        "p_only": p * s2,
        "no_p": s2 / (1 - p),
        "mean_not_sum": p / (1 - p) * (a**2).mean(-1),
        "sample_variance": p / (1 - p) * a.var(-1),
        "zero": torch.zeros_like(s2),
    }[mistake]


def _random_result(
    fn: Callable, a: Tensor, p: float, got: Tensor, name: str, case: str
) -> bool:
    """Whether ``fn(a, p)`` called once more (under another random state, the
    caller's left as it was) returns something other than ``got``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        again = run_learner(fn, a, p, what=name, case=case)
    if not isinstance(again, Tensor) or again.shape != got.shape:
        return False
    return not close(again, got)


@checker("注意力 dropout 后行和的方差")
def check_dropout_row_sum_variance(fn: Callable) -> str:
    """Grade ``fn(a, p)``: ``a`` holds attention rows ``(..., S)`` (each a probability
    distribution), ``p`` is the dropout probability; return the variance of each row's
    sum after dropout (``(...)``, one number per row): ``p/(1-p) * sum_j a_j**2``."""
    name = name_of(fn)
    g = seeded_generator(32)
    cases = [
        ("一行 (S,) = (5,)，p = 0.1", torch.randn(5, generator=g).softmax(-1), 0.1),
        (
            "(4, 7) 的 4 行，p = 0.3",
            (2 * torch.randn(4, 7, generator=g)).softmax(-1),
            0.3,
        ),
        (
            "(2, 3, 6)，p = 0.5",
            (3 * torch.randn(2, 3, 6, generator=g)).softmax(-1),
            0.5,
        ),
        ("独热的行与均匀的行，p = 0.2", torch.eye(4)[:2].clone(), 0.2),
    ]
    cases[3][1][1] = 0.25
    for i, (case, a, p) in enumerate(cases):
        got = run_learner(fn, a, p, what=name, case=case, first=i == 0)
        if isinstance(got, Real) and not isinstance(got, bool) and a.dim() == 1:
            got = torch.tensor(float(got))
        got = as_tensor(got, f"{name} 的返回值", case)
        check_float(got, f"{name} 的返回值")
        check_shape(got, a.shape[:-1], f"{name} 的返回值", case, "每行一个方差。")
        ref = p / (1 - p) * (a**2).sum(-1)
        if close(got, ref):
            continue
        hint = first_reproduced(
            got, _DROPOUT_MISTAKES, functools.partial(_dropout_variant, a, p)
        )
        if hint is None and close(got.double() ** 2, ref.double()):
            hint = (
                "这是标准差 √(p/(1-p)·Σa²)：题目要的是方差本身，最后不要开平方根"
                "（去掉 .sqrt() / ** 0.5）。"
            )
        if hint is None and _random_result(fn, a, p, got, name, case):
            hint = (
                "同样的输入调用两次，结果不一样：你像是用 dropout 抽样、再算样本方差。"
                "抽样只能给出近似值（样本越多越准，但永远有误差）；题目要的是精确值："
                "把行和写成 Σ a_j·m_j/(1-p)，m_j 是独立的伯努利(1-p) 变量，逐项求方差，"
                "得到一个只含 a 和 p 的公式。"
            )
        fail(
            f"{name} 的方差不对（{case}）：应为 {ref.flatten()[:3].tolist()}，"
            f"得到 {got.flatten()[:3].tolist()}。"
            + (
                hint
                or "把行和写成 Σ a_j·m_j/(1-p)，m_j 是独立的伯努利(1-p) 变量，"
                "再逐项求方差。"
            )
        )
    return "4 组权重、p 从 0.1 到 0.5，包括独热和均匀的行"


# ---------------------------------------------------------------------------
# the learner's training run
# ---------------------------------------------------------------------------

#: the stated goal of the training exercise, in nats per character
VAL_LOSS_TARGET = 2.0
TRAINING_STEPS = 100
#: the second, short call: a loop must run ``num_steps`` times, not a fixed count
SHORT_STEPS = 3
TRAINING_LR = 1e-2
_TRAINING_CONFIG = dict(context_length=16, d_model=32, num_heads=4, num_layers=1)


def _corpus_splits() -> tuple[Tensor, Tensor, int]:
    text = load_text_corpus()
    tok = CharTokenizer(text)
    data = torch.tensor(tok.encode(text))
    split = int(0.9 * len(data))
    return data[:split], data[split:], tok.vocab_size


def _validation_loss(model: MiniGPT, val_data: Tensor, T: int) -> float:
    g = seeded_generator(34)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        losses = [model(*lm_batch(val_data, 64, T, generator=g))[1] for _ in range(4)]
    model.train(was_training)
    return float(torch.stack(losses).mean())


def _training_losses(out: object, name: str, num_steps: int) -> list[float]:
    if isinstance(out, Tensor):
        out = out.tolist()
    if not isinstance(out, (list, tuple)) or len(out) != num_steps:
        got = len(out) if isinstance(out, (list, tuple)) else type(out).__name__
        fail(
            f"{name} 应返回每一步的训练损失（{num_steps} 个 float 的列表，"
            f"loss.item()），得到 {got}。"
        )
    losses = []
    for x in out:
        if isinstance(x, Tensor):
            kept = "，连同它的整张计算图" if x.grad_fn is not None else ""
            fail(
                f"{name} 返回的列表里是 loss 张量本身{kept}：每步应保存 "
                "loss.item()（一个 Python float），否则这些张量一直占着内存。"
            )
        if not isinstance(x, Real) or isinstance(x, bool):
            fail(f"{name} 返回的损失应是数（loss.item()），得到 {type(x).__name__}。")
        losses.append(float(x))
    return losses


def _record_calls(optimizer: torch.optim.Optimizer) -> list[str]:
    """A list that gets "zero_grad" and "step" each time ``optimizer`` runs them."""
    events: list[str] = []
    zero_grad = optimizer.zero_grad

    def recorded_zero_grad(*args, **kwargs) -> None:
        events.append("zero_grad")
        zero_grad(*args, **kwargs)

    optimizer.zero_grad = recorded_zero_grad
    optimizer.register_step_pre_hook(lambda *_: events.append("step"))
    return events


def _check_step_count(
    fn: Callable,
    name: str,
    train_data: Tensor,
    cfg: GPTConfig,
    events: list[str] | None,
    num_steps: int,
) -> None:
    """Fail unless ``fn`` ran ``optimizer.step()`` and returned a loss ``num_steps``
    times; ``events`` None: run ``fn`` again on a fresh model for ``num_steps``."""
    if events is None:
        model = MiniGPT(cfg)
        optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING_LR)
        events = _record_calls(optimizer)
        out = run_learner(
            fn,
            model,
            optimizer,
            train_data,
            num_steps,
            what=name,
            case=f"num_steps = {num_steps}",
        )
        n_losses = len(out) if isinstance(out, (list, tuple, Tensor)) else None
    else:
        n_losses = num_steps  # already checked by _training_losses
    n_steps = events.count("step")
    if n_losses != num_steps or n_steps != num_steps:
        fail(
            f"num_steps = {num_steps} 时 {name} 返回了 {n_losses} 个损失、"
            f"optimizer.step() 运行了 {n_steps} 次，两者都应是 {num_steps}："
            "循环次数要由参数 num_steps 决定（for _ in range(num_steps)），"
            "不能写死，每次循环恰好一次 optimizer.step()。"
        )


@checker("训练 MiniGPT")
def check_lm_training(fn: Callable) -> str:
    """Grade ``fn(model, optimizer, train_data, num_steps)``: a training loop.

    The checker builds a fresh :class:`~transformer_course.MiniGPT` (context 16,
    ``d_model`` 32, 4 heads, 1 layer) on the package's corpus (split 90/10 as in the
    book) and ``AdamW(lr=1e-2)``; ``fn`` trains it for ``num_steps`` steps on random
    windows of ``train_data`` (1-D character ids) and returns the list of training
    losses, one float per step. Passes when the model's validation loss, measured by
    the checker on held-out windows, is at most :data:`VAL_LOSS_TARGET` nats, the given
    optimizer's ``step`` ran once per step, and a second call with ``num_steps`` =
    :data:`SHORT_STEPS` runs exactly that many steps.
    """
    name = name_of(fn)
    train_data, val_data, V = _corpus_splits()
    cfg = GPTConfig(vocab_size=V, **_TRAINING_CONFIG)
    model = MiniGPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING_LR)
    before = [p.detach().clone() for p in model.parameters()]
    # for each backward pass: did the gradient of the last norm still hold the previous
    # step's (a hook on a leaf runs before the new gradient is added to .grad)?
    probe, stale = model.norm_f.weight, []
    events = _record_calls(optimizer)  # "backward", "zero_grad", "step" in order

    def on_backward(_grad: Tensor) -> None:
        events.append("backward")
        stale.append(probe.grad is not None and bool(probe.grad.any()))

    hook = probe.register_hook(on_backward)
    try:
        out = run_learner(
            fn,
            model,
            optimizer,
            train_data,
            TRAINING_STEPS,
            what=name,
            case=f"num_steps = {TRAINING_STEPS}",
            first=True,
        )
    finally:
        hook.remove()
    losses = _training_losses(out, name, TRAINING_STEPS)
    if all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)):
        fail(
            f"{name} 运行后模型参数一点没变："
            + (
                step_order_hint(events)
                or "每步的顺序应为 zero_grad → backward → step（model.zero_grad() "
                "也不能放在 backward 和 step 之间），训练的应是传进来的 model。"
            )
        )
    if "step" not in events:
        fail(
            f"{name} 改动了模型参数，传进来的 optimizer 却一次 step() 也没有运行："
            "循环里另建了优化器？应使用参数 optimizer（检查器给的是 "
            f"AdamW(lr={TRAINING_LR})）。"
        )
    val = _validation_loss(model, val_data, cfg.context_length)
    tail = sum(losses[-10:]) / 10
    if val <= VAL_LOSS_TARGET and tail > 0.5 * val:
        _check_step_count(fn, name, train_data, cfg, events, TRAINING_STEPS)
        _check_step_count(fn, name, train_data, cfg, None, SHORT_STEPS)
        return (
            f"{TRAINING_STEPS} 步后验证损失 {val:.3f} ≤ 目标 {VAL_LOSS_TARGET}；"
            f"num_steps = {SHORT_STEPS} 时恰好 {SHORT_STEPS} 步"
        )
    if sum(stale) > len(stale) // 2:
        fail(
            f"{TRAINING_STEPS} 步后验证损失 {val:.3f}（目标 ≤ {VAL_LOSS_TARGET}）："
            "每次 backward 之前上一步的梯度还在——忘了 optimizer.zero_grad()。"
            "梯度在各步之间一直累加，更新越来越偏。每步的顺序是 zero_grad → 前向 → "
            "backward → step。"
        )
    if not math.isfinite(val):
        fail(f"训练后验证损失是 {val}：损失发散了，检查学习率与损失的写法。")
    if tail < 0.5 * val:
        fail(
            f"训练损失最后 10 步平均 {tail:.3f}，验证损失却是 {val:.3f}：训练时模型"
            "看见了答案。目标 y 是不是没有右移一位（y 应为 data[i+1 : i+T+1]），"
            "或者训练只用了同一批数据？"
        )
    if val > math.log(V) - 0.3:
        fail(
            f"验证损失 {val:.3f}，不比均匀猜测的 log V = {math.log(V):.3f} 好多少："
            "模型几乎没学到东西。"
            "检查顺序 zero_grad → backward → step，以及每步是否抽了新的批次。"
        )
    fail(
        f"{TRAINING_STEPS} 步后验证损失 {val:.3f}，没有达到目标 {VAL_LOSS_TARGET}"
        f"（最后 10 步训练损失平均 {tail:.3f}）：每步都要从 train_data 随机抽新的窗口"
        "（tc.lm_batch），批大小至少 16，并且每步先 optimizer.zero_grad()。"
    )
    return ""  # unreachable
