"""One training step and language-model batches."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import lm_batch
from ._protocol import (
    checker,
    fail,
    name_of,
    run_learner,
    seeded_generator,
)
from ._report import as_tensor, check_shape, close, first_reproduced


class _TinyLM(nn.Module):
    """A small model for the training-step check:
    ``input_ids (N, T) -> logits (N, T, V)``."""

    def __init__(self, vocab_size: int = 13, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        return self.head(torch.tanh(self.emb(idx)))


class _RecordingSGD(torch.optim.SGD):
    """SGD that writes down when ``zero_grad`` and ``step`` are called."""

    def __init__(self, params, lr: float, events: list[str]) -> None:
        super().__init__(params, lr=lr)
        self.events = events

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.events.append("zero_grad")
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        self.events.append("step")
        return super().step(closure)


def _params_close(a: nn.Module, b: nn.Module) -> bool:
    return all(
        close(p, q, 1e-5, 1e-6)
        for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def _update_scaled(before: nn.Module, after: nn.Module, ref_after: nn.Module, k: int):
    """Whether ``before`` -> ``after`` is ``k`` times the update ``before`` ->
    ``ref_after`` (same start): a summed loss makes SGD steps ``N·T`` times too big."""
    return all(
        close(p1 - p0, k * (r1 - p0), 1e-2, 1e-6)  # float32 differences
        for p0, p1, r1 in zip(
            before.parameters(), after.parameters(), ref_after.parameters(), strict=True
        )
    )


def _lm_loss(model: nn.Module, x: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction=reduction)


def _loss_variant(
    before: nn.Module, after: nn.Module, x: Tensor, y: Tensor, mistake: str
) -> Tensor:
    """The loss a train step with one of :data:`LOSS_HINTS`' mistakes returns."""
    if mistake == "sum":
        return _lm_loss(before, x, y, "sum")
    if mistake == "after_step":
        return _lm_loss(after, x, y)
    if mistake == "targets_x":
        return _lm_loss(before, x, x)
    if mistake == "nll_on_logits":  # F.nll_loss wants log-probabilities
        return F.nll_loss(before(x).flatten(0, 1), y.flatten())
    if mistake == "targets_transposed":  # y.t(): (T, N) flattened against (N·T, V)
        return F.cross_entropy(before(x).flatten(0, 1), y.t().reshape(-1))
    if mistake == "logits_transposed":  # (N, V, T) reshaped to (N·T, V): rows mixed
        logits = before(x)
        mixed = logits.transpose(1, 2).reshape(-1, logits.shape[-1])
        return F.cross_entropy(mixed, y.flatten())
    if mistake == "softmax_first":  # probabilities into cross_entropy
        return F.cross_entropy(before(x).softmax(-1).flatten(0, 1), y.flatten())
    if mistake == "last_position":  # logits[:, -1] against y[:, -1] only
        return F.cross_entropy(before(x)[:, -1], y[:, -1])
    if mistake == "ignore_index_0":  # token 0 taken for padding
        return F.cross_entropy(before(x).flatten(0, 1), y.flatten(), ignore_index=0)
    # "shifted": x and y moved against each other once more
    return F.cross_entropy(before(x)[:, :-1].flatten(0, 1), y[:, 1:].flatten())


LOSS_HINTS = [
    (
        "应对所有位置取平均（F.cross_entropy 默认的 reduction='mean'），"
        "你返回的是求和。",
        "sum",
    ),
    ("返回的应是这一步更新之前的损失，不是更新后重新算的。", "after_step"),
    (
        "x 和 y 已经错开一位了（y[t] 就是 x[t] 的下一个词元），"
        "不要再移位：直接对展平的 logits 和 y 算交叉熵。",
        "shifted",
    ),
    (
        "目标用成了输入 x：损失要拿 logits 与 y 比较（y[t] 是 x[t] 的下一个词元），"
        "F.cross_entropy(logits.view(-1, V), y.view(-1))，不是与 x 比较。",
        "targets_x",
    ),
    (
        "F.nll_loss 用在了原始 logits 上：nll_loss 要的是对数概率，"
        "先 F.log_softmax(logits, dim=-1)，或直接用 F.cross_entropy（它自己做 "
        "log_softmax）。",
        "nll_on_logits",
    ),
    (
        "logits 先过了 softmax 再进 F.cross_entropy：cross_entropy 要的是原始 logits，"
        "它自己会做 log_softmax，先 softmax 就做了两次，损失和梯度都不对。",
        "softmax_first",
    ),
    (
        "目标 y 转置了（y.t() 或 y.T）：logits 按 (N, T) 的顺序展平成 N·T 行，"
        "目标也要按同样的顺序展平，y.reshape(-1)，不要先转置。",
        "targets_transposed",
    ),
    (
        "logits 先转置成 (N, V, T) 再 reshape 成 (N·T, V)：转置后每一行不再是"
        "一个位置的 V 个 logits，而是把不同位置的数拼在了一起。"
        "F.cross_entropy 的二维输入要每行一个位置：直接 logits.reshape(-1, V)"
        "（不转置）；若想用 (N, V, T) 的形式，就不要 reshape，"
        "F.cross_entropy(logits.transpose(1, 2), y)。",
        "logits_transposed",
    ),
    (
        "损失只用了最后一个位置（logits[:, -1] 对 y[:, -1]）：每个位置都在预测它的"
        "下一个词元（y[:, t] 是 x[:, t] 的下一个），T 个位置都是训练信号。对全部 N·T "
        "个位置取平均：F.cross_entropy(logits.view(-1, V), y.view(-1))。",
        "last_position",
    ),
    (
        "交叉熵里写了 ignore_index=0：编号 0 也是一个普通的词元（这里没有填充符），"
        "目标是 0 的位置也要算进损失。去掉 ignore_index："
        "F.cross_entropy(logits.view(-1, V), y.view(-1))。",
        "ignore_index_0",
    ),
]


def step_order_hint(events: list[str]) -> str | None:
    """The ordering mistake in one call's events, if any."""
    if "backward" not in events:
        return (
            "参数没有得到梯度：没有调用 loss.backward()，或者损失与模型断开了"
            "（前向放在 torch.no_grad() 里，或 .detach() 之后再 requires_grad_()）："
            "没有梯度，参数不会更新。"
        )
    if "step" not in events:
        return "没有调用 optimizer.step()：梯度算出来了，参数却没有更新。"
    first_backward, last_step = (
        events.index("backward"),
        len(events) - 1 - events[::-1].index("step"),
    )
    if events.index("step") < first_backward:
        return (
            "optimizer.step() 在 loss.backward() 之前：这一步用的是上一次的梯度，"
            "顺序应为 zero_grad → backward → step。"
        )
    if "zero_grad" in events[first_backward:last_step]:
        return (
            "optimizer.zero_grad() 放在了 backward 和 step 之间：梯度刚算出来就被清掉"
            "了。顺序应为 zero_grad → backward → step。"
        )
    return None


@checker("一步训练")
def check_train_step(fn: Callable) -> str:
    """Grade ``fn(model, optimizer, x, y)``: one optimisation step of a language model.

    ``model(x)`` returns logits ``(N, T, V)`` for ids ``x (N, T)``; the loss is the mean
    cross-entropy over all ``N·T`` positions against ``y (N, T)``; then ``zero_grad``,
    ``backward``, ``step``. ``fn`` returns the loss (before the update) as a Python
    ``float`` (``loss.item()``). Checked over two steps with plain SGD against the same
    step done by the checker on a copy of the model.
    """
    name = name_of(fn)
    g = seeded_generator(11)
    V, N, T = 13, 3, 5
    model = _TinyLM(V)
    reference = copy.deepcopy(model)
    events: list[str] = []
    optimizer = _RecordingSGD(model.parameters(), lr=0.5, events=events)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda _p: (
                events.append("backward") if events[-1:] != ["backward"] else None
            )
        )
    for step in range(2):
        case = f"第 {step + 1} 步，x 和 y 形状 ({N}, {T})，V = {V}"
        x = torch.randint(V, (N, T), generator=g)
        y = torch.randint(V, (N, T), generator=g)
        events.clear()
        before = copy.deepcopy(model)
        loss = run_learner(
            fn,
            model,
            optimizer,
            x,
            y,
            what=name,
            case=case,
            first=step == 0,
        )
        ref_opt.zero_grad()
        ref_loss = _lm_loss(reference, x, y)
        ref_loss.backward()
        ref_opt.step()
        if isinstance(loss, Tensor):
            fail(
                f"{name} 应返回 Python float（loss.item()），得到张量 "
                f"{tuple(loss.shape)}：返回张量会把整张计算图留在内存里。"
            )
        if not isinstance(loss, float):
            fail(f"{name} 应返回损失（float），得到 {type(loss).__name__}。")
        if not math.isclose(loss, ref_loss.item(), rel_tol=1e-5, abs_tol=1e-6):
            hint = first_reproduced(
                torch.tensor(loss),
                LOSS_HINTS,
                functools.partial(_loss_variant, before, model, x, y),
                rtol=1e-5,
                atol=1e-6,
            ) or ("损失应为 F.cross_entropy(logits.view(-1, V), y.view(-1))。")
            fail(
                f"{name} 返回的损失不对（{case}）：应为 {ref_loss.item():.6f}，"
                f"得到 {loss:.6f}。{hint}"
            )
        if _params_close(model, reference):
            continue
        hint = step_order_hint(events)
        summed = step == 0 and _update_scaled(before, model, reference, N * T)
        if hint is None and summed:
            hint = (
                f"参数的更新恰好是参考的 N·T = {N * T} 倍：反向传播的是"
                "所有位置损失的和（reduction='sum'）。损失要对所有位置求平均"
                "（默认的 reduction='mean'），再 backward。"
            )
        if hint is None and step == 1 and "zero_grad" not in events:
            hint = (
                "第二步的参数不对：梯度在两步之间累积了——忘了 optimizer.zero_grad()"
                "（每步在 backward 之前清零梯度）。"
            )
        if hint is None and _params_close(model, before):
            hint = "调用之后参数没有变化：检查 backward 和 optimizer.step()。"
        fail(
            f"{name} 之后的参数与参考不一致（{case}）。"
            + (hint or "顺序应为 zero_grad → 前向 → 损失 → backward → step。")
        )
    return "连续两步 SGD：损失的值、参数更新、梯度清零"


# language-model batches


@checker("语言模型批次")
def check_lm_batch(fn: Callable) -> str:
    """Grade ``fn(data, batch_size, context_length, generator)`` -> ``(x, y)``.

    ``data`` is a 1-D int64 tensor of token ids. The ``batch_size`` window starts are
    drawn by ``torch.randint(len(data) - context_length, (batch_size,),
    generator=generator)``; ``x[b] = data[i : i+T]``, ``y[b] = data[i+1 : i+T+1]``, both
    int64 ``(batch_size, context_length)``. Compared with
    :func:`transformer_course.lm_batch` using a generator with the same seed.
    """
    name = name_of(fn)
    g = seeded_generator(12)
    # (len(data), batch_size, context_length)
    cases = [(40, 4, 8), (10, 3, 9), (25, 5, 1), (30, 2, 7)]
    for i, (n, B, T) in enumerate(cases):
        data = torch.randperm(200, generator=g)[:n]  # distinct ids: positions traceable
        # the last case hands over int32 ids ("一维整数张量"); the batches are int64
        given = data.to(torch.int32) if i == len(cases) - 1 else data
        case = f"len(data)={n}, batch_size={B}, context_length={T}, data {given.dtype}"
        seed = 100 + i
        out = run_learner(
            fn,
            given.clone(),
            B,
            T,
            seeded_generator(seed),
            what=name,
            case=case,
            first=i == 0,
            causes=BATCH_CRASHES,
        )
        x, y = _lm_batch_outputs(name, out, B, T, case)
        ref_x, ref_y = lm_batch(data, B, T, generator=seeded_generator(seed))
        if torch.equal(x, ref_x) and torch.equal(y, ref_y):
            continue
        again = run_learner(
            fn, given.clone(), B, T, seeded_generator(seed), what=name, case=case
        )
        if not (isinstance(again, (tuple, list)) and torch.equal(again[0], x)):
            fail(
                f"{name} 用同一个种子的 generator 调用两次，结果却不同（{case}）："
                "没有把 generator 传给 torch.randint（generator=generator）。"
            )
        starts = _window_starts(name, x, data, T, case)
        _check_targets(name, x, y, data, starts, case)
        ref_starts = _window_starts(name, ref_x, data, T, case)
        fail(
            f"{name} 抽到的起点 {starts} 与约定的抽样 {ref_starts} 不一致（{case}）："
            + _randint_hint(starts, n, T, seed)
        )
    return "4 组 (len(data), batch_size, context_length)，含只有一个可选起点的情形"


def _lm_batch_outputs(
    name: str, out: object, B: int, T: int, case: str
) -> tuple[Tensor, Tensor]:
    """``out`` must be ``(x, y)``: two int64 tensors
    ``(batch_size, context_length)``."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        fail(
            f"{name} 应返回两个张量 (x, y)，得到 {type(out).__name__}"
            + (f"（{len(out)} 个元素）" if isinstance(out, (tuple, list)) else "")
            + "。"
        )
    x, y = (
        as_tensor(t, f"{name} 返回的 {n_}", case)
        for t, n_ in zip(out, "xy", strict=True)
    )
    for t, n_ in ((x, "x"), (y, "y")):
        check_shape(
            t,
            (B, T),
            f"{name} 返回的 {n_}",
            case,
            " 应为 (batch_size, context_length)。",
        )
        if t.dtype != torch.int64:
            fail(
                f"{name} 返回的 {n_} 应是 torch.long（int64），得到 {t.dtype}："
                "nn.Embedding 和 F.cross_entropy 都要整数 id。"
            )
    return x, y


def _window_starts(name: str, x: Tensor, data: Tensor, T: int, case: str) -> list[int]:
    """Where each row of ``x`` starts in ``data``; each row must be a window of it."""
    pos = {int(v): j for j, v in enumerate(data)}
    starts = []
    for b in range(x.size(0)):
        j = pos.get(int(x[b, 0]), -1)
        if j < 0 or j + T > len(data) or not torch.equal(x[b], data[j : j + T]):
            fail(
                f"{name} 返回的 x[{b}] 不是 data 里连续的一段（{case}）："
                "每一行应为 data[i : i + context_length]。"
            )
        starts.append(j)
    return starts


def _check_targets(
    name: str, x: Tensor, y: Tensor, data: Tensor, starts: list[int], case: str
) -> None:
    """Each row of ``y`` is the window of ``x``'s row moved on by one:
    ``data[i+1 : i+1+T]``."""
    n, T = len(data), y.size(1)
    for b, j in enumerate(starts):
        if torch.equal(y[b], x[b]):
            fail(
                f"{name} 返回的 y 与 x 相同（{case}）：y 应比 x 错后一位，"
                "y = data[i + 1 : i + 1 + context_length]。"
            )
        if torch.equal(y[b], data[j + 1 : j + 1 + T]):
            continue
        shifted = [k for k in range(n - T + 1) if torch.equal(y[b], data[k : k + T])]
        if shifted == [j - 1]:
            fail(
                f"{name} 返回的 x、y 对调了（{case}）：y[{b}] 比 x[{b}] 早一位。"
                "输入在前、目标在后：x = data[i : i+T]，y = data[i+1 : i+1+T]，"
                "返回 (x, y)。"
            )
        if shifted and shifted[0] != j + 1:
            fail(
                f"{name} 返回的 y[{b}] 从 data[{shifted[0]}] 开始，x[{b}] 从 "
                f"data[{j}] 开始（{case}）：y 应正好错后一位，与 x 用同一个"
                "起点 i（y = data[i+1 : i+1+T]），不要为 y 另抽随机数。"
            )
        fail(f"{name} 返回的 y[{b}] 不对（{case}）：应为 data[{j + 1} : {j + 1 + T}]。")


def _randint_hint(starts: list[int], n: int, T: int, seed: int) -> str:
    """Why the drawn ``starts`` differ from the contract's: an off-by-one bound?"""
    why = {
        1: "最后一个起点的 y 会越过 data 的末尾（y 要用到 data[i + context_length]）",
        -1: "最后一个合法的起点永远抽不到（torch.randint(high) 只抽 0 … high−1）",
    }
    for delta, word in ((1, "多"), (-1, "少")):
        high = n - T + delta
        if high > 0:
            alt = torch.randint(high, (len(starts),), generator=seeded_generator(seed))
            if alt.tolist() == starts:
                return f"torch.randint 的上界{word}了 1：{why[delta]}。"
    return (
        "起点应该用一次 torch.randint(high, (batch_size,), generator=generator) "
        "抽出，在其它随机调用之前只抽这一次；high 是合法起点的个数。"
    )


BATCH_CRASHES = [
    (
        r"out of (range|bounds)|IndexError",
        "下标越界：y 的最后一个元素 data[i + context_length] 也得在 data 里，"
        "想一想起点 i 最大能取多少，torch.randint 的上界就比它大 1。",
    ),
]
