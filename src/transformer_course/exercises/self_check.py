"""Checkers for the self-tests that close chapter 5 (the source's criteria 2-5): the
roles of Q, K and V, the softmax Jacobian behind the 1/sqrt(d_k) scaling, a causality
probe, and greedy decoding through the KV cache (the cache's size is chapter 4's
``check_kv_cache_bytes``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ..models import GPTConfig, MiniGPT
from ._protocol import (
    FAILED,
    PASSED,
    SKELETON,
    ExerciseError,
    checker,
    fail,
    name_of,
    run_learner,
    seeded_generator,
)
from ._protocol import (
    _record as _keep_result,
)
from ._report import as_tensor, check_shape, close, where_differs
from .predictions import chosen_option

__all__ = [
    "check_qkv_answers",
    "check_softmax_jacobian",
    "check_causality_probe",
    "check_greedy_with_cache",
]

# criterion 2: the four questions, their options, and why
QKV_QUESTIONS = {
    "a": ("查询指向第 2 个键时，输出接近", ("第 2 个值", "所有值的平均")),
    "b": ("只把 V 乘以 10，注意力权重", ("不变", "也乘以 10", "重新归一化后变了")),
    "c": ("交换第 2、3 个键（查询不变），最大的权重落在", ("第 2 个键", "第 3 个键")),
    "d": ("查询的方向不变、长度变大，查表变得", ("更硬（更集中）", "更软（更平均）")),
}
_QKV_WHY = {
    "a": "分数 q·k_i 在 i = 2 时最大，softmax 把权重集中到那里，输出是值的加权和",
    "b": "权重只由 softmax(QKᵀ/√D) 决定，V 不进入分数",
    "c": "权重跟着键走：原来的第 2 个键现在在第 3 个位置",
    "d": "分数按查询的长度放大，softmax 的输入差距越大输出越接近 one-hot",
}


def _qkv_truth() -> dict[str, str]:
    """Each answer computed by an experiment on a soft lookup table."""
    keys = torch.eye(4)[None]  # (1, 4, 4): four orthogonal keys
    values = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]])
    query = 8.0 * keys[:, 2:3]
    out, w = scaled_dot_product_attention(query, keys, values)
    a = 0 if close(out[0, 0], values[0, 2], atol=0.15) else 1
    _, w_v = scaled_dot_product_attention(query, keys, 10 * values)
    b = 0 if torch.equal(w_v, w) else 2
    _, w_k = scaled_dot_product_attention(query, keys[:, [0, 1, 3, 2]], values)
    c = int(w_k[0, 0].argmax()) - 2
    _, w_s = scaled_dot_product_attention(0.5 * query, keys, values)
    d = 0 if float(w[0, 0, 2]) > float(w_s[0, 0, 2]) else 1
    return {
        k: QKV_QUESTIONS[k][1][i] for k, i in zip("abcd", (a, b, c, d), strict=True)
    }


def check_qkv_answers(
    answers: object, *, solution: bool = False, exercise: str | None = None
) -> None:
    """Grade ``answers``: a dict ``{"a": ..., "b": ..., "c": ..., "d": ...}`` whose
    values are options of :data:`QKV_QUESTIONS`; the truth is computed by experiments.
    A dict with unanswered questions (``None``) prints what is missing (raises with
    ``solution=True``); a wrong answer raises :class:`ExerciseError` with the reason.
    ``exercise`` keeps the outcome for ``progress()``, as the other checkers do."""
    __tracebackhide__ = True
    title = "检验标准 2：Q、K、V 各起什么作用"
    record = functools.partial(
        _keep_result, exercise, title, "my_qkv_answers", solution
    )
    record(FAILED)  # until it gets further
    if not isinstance(answers, dict):
        raise ExerciseError(
            f"{title}：答案应是一个 dict，例如 {{'a': '第 2 个值', ...}}，"
            f"得到 {type(answers).__name__}。"
        )
    missing = [k for k in QKV_QUESTIONS if answers.get(k) is None]
    if missing:
        if solution:
            raise ExerciseError(f"{title}：参考解答没有回答 {missing}。")
        print(f"尚未实现：{title}：还没有回答 {missing}（写好后重新运行本单元格）")
        record(SKELETON)
        return
    truth = _qkv_truth()
    wrong = []
    for key, (question, options) in QKV_QUESTIONS.items():
        given = chosen_option(answers[key], options)
        if given is None:
            raise ExerciseError(
                f"{title}：({key}) 的答案应是 {list(options)} 之一，"
                f"得到 {answers[key]!r}。"
            )
        if given != truth[key]:
            wrong.append(
                f"({key}) {question}：实验结果是“{truth[key]}”——{_QKV_WHY[key]}"
            )
    if wrong:
        raise ExerciseError(f"{title}：有答案与实验不符：\n" + "\n".join(wrong))
    print(f"✓ {title}：四个答案都与实验一致")
    record(PASSED)


def _softmax_jacobian_autograd(p_logits: Tensor) -> Tensor:
    """d softmax(z) / dz for each row of ``p_logits`` (..., L) -> (..., L, L)."""
    flat = p_logits.reshape(-1, p_logits.shape[-1])
    jac = torch.stack(
        [
            torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), row)
            for row in flat
        ]
    )
    return jac.reshape(*p_logits.shape, p_logits.shape[-1])


# a crash of the Jacobian: (pattern in "Type: message\nline", hint)
SOFTMAX_JACOBIAN_CRASHES = [
    (
        r"Expected 1-D argument|\bdiag(flat)?\(|\b(outer|ger)\(",
        "p 可以有前导（批量）维，形状 (…, L)：torch.diag、torch.outer 只接受一维。"
        "对最后一维做：torch.diag_embed(p) − p.unsqueeze(-1) * p.unsqueeze(-2)。",
    ),
]


def _outer(p: Tensor) -> Tensor:
    """p pᵀ for each row: (..., L) -> (..., L, L)."""
    return p.unsqueeze(-1) * p.unsqueeze(-2)


def _diag_minus_square(p: Tensor, dim: int) -> Tensor:
    """diag(p) minus the elementwise square p², broadcast along ``dim``."""
    return torch.diag_embed(p) - (p * p).unsqueeze(dim)


def _eye_minus(p: Tensor, dim: int) -> Tensor:
    """δ_ij − p_j (``dim=-2``) or δ_ij − p_i (``dim=-1``), (..., L, L)."""
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return eye - p.unsqueeze(dim)


# (hint, what the mistake computes from p), tried in this order
JACOBIAN_MISTAKES: list[tuple[str, Callable[[Tensor], Tensor]]] = [
    ("只有 diag(p)，漏了 −p pᵀ（p_i 变大时其余的 p_j 要变小）。", torch.diag_embed),
    (
        "只减了对角线上的 p_i²：−p pᵀ 是整个外积 p_i p_j。",
        lambda p: torch.diag_embed(p - p * p),
    ),
    *(
        (  # p.unsqueeze(-1) * p.unsqueeze(-1): (…, L, 1), p_i² per row
            "减去的是逐元素平方 p²，不是外积 p pᵀ：p.unsqueeze(-1) * "
            "p.unsqueeze(-1) 的形状是 (…, L, 1)，元素是 p_i²，广播后第 i 行"
            "处处减同一个 p_i²。外积要一列乘一行："
            "p.unsqueeze(-1) * p.unsqueeze(-2)，第 (i, j) 个元素是 p_i p_j。",
            functools.partial(_diag_minus_square, dim=d),
        )
        for d in (-1, -2)
    ),
    *(
        (  # learner test 31c: diag_embed(p) - p.unsqueeze(-1), one factor p short
            "减去的是 p 本身（广播后每一行或每一列处处减同一个 p_i），少乘了一个 p："
            "外积 p pᵀ 的第 (i, j) 个元素是 p_i p_j，写成 "
            "p.unsqueeze(-1) * p.unsqueeze(-2)；完整的是 diag(p) − p pᵀ。",
            functools.partial(lambda p, d: torch.diag_embed(p) - p.unsqueeze(d), d=d),
        )
        for d in (-1, -2)
    ),
    ("符号反了：应是 diag(p) − p pᵀ。", lambda p: _outer(p) - torch.diag_embed(p)),
    (
        "−p pᵀ 写成了 +p pᵀ：p_j 变大时 p_i 要变小（概率之和固定为 1），非对角元"
        "是 −p_i p_j。应是 diag(p) − p pᵀ。",
        lambda p: torch.diag_embed(p) + _outer(p),
    ),
    (
        "漏了 diag(p)：只有 −p pᵀ，对角线上就只剩 −p_i²。对角线上 ∂p_i/∂z_i = "
        "p_i(1 − p_i) = p_i − p_i²：完整的是 diag(p) − p pᵀ。",
        lambda p: -_outer(p),
    ),
    *(
        (
            "漏了前面的因子 p_i：∂p_i/∂z_j = p_i(δ_ij − p_j)，你算的只是括号里的 "
            "δ_ij − p_j（单位矩阵减去 p）。每一行 i 再乘 p_i，就是 diag(p) − p pᵀ。",
            functools.partial(_eye_minus, dim=d),
        )
        for d in (-2, -1)
    ),
]


@checker("检验标准 3：softmax 的雅可比矩阵")
def check_softmax_jacobian(fn: object) -> str:
    """Grade ``fn(p)``: for probabilities ``p`` of shape ``(..., L)`` (rows summing to
    1), the Jacobian of softmax at that point, ``diag(p) - p pᵀ``, shape
    ``(..., L, L)``; compared with autograd's Jacobian."""
    name = name_of(fn)
    g = seeded_generator(41)
    first = True
    for shape in ((5,), (3, 4), (2, 3, 6)):
        z = torch.randn(*shape, generator=g, dtype=torch.float64) * 2
        p = torch.softmax(z, dim=-1)
        case = f"p 的形状 {tuple(shape)}"
        got = as_tensor(
            run_learner(
                fn,
                p,
                what=name,
                case=case,
                first=first,
                causes=SOFTMAX_JACOBIAN_CRASHES,
            ),  # fmt: skip
            f"{name} 的返回值",
            case,
        )
        first = False
        ref = _softmax_jacobian_autograd(z)
        check_shape(got, (*shape, shape[-1]), f"{name} 的返回值", case)
        if not close(got, ref):
            hint = next(
                (hint for hint, wrong in JACOBIAN_MISTAKES if close(got, wrong(p))),
                None,
            )
            if hint is None and p.dim() > 1:  # the 1-D p (the first case) passed
                hint = (
                    "一维的 p 对了，批量的错了：每一行要用它自己的外积 "
                    "p.unsqueeze(-1) * p.unsqueeze(-2)（形状 (…, L, L)）；torch.outer "
                    "只接受一维，把批量拉平后再做外积会把不同行的 p 乘在一起。"
                )
            elif hint is None:
                hint = "∂p_i/∂z_j = p_i(δ_ij − p_j)，写成矩阵是 diag(p) − p pᵀ。"
            fail(
                f"{name} 与自动求导的雅可比不一致（{case}；"
                f"{where_differs(got, ref)}）。{hint}"
            )
    return "三种形状，与自动求导的雅可比相同"


class _LeakyGPT(MiniGPT):
    """A MiniGPT whose attention sees the future: in the blocks ``leaky`` (indices;
    None: every block) without the causal mask, or with ``allowed(T)``, a bool
    ``(T, T)`` mask of the keys each position may attend to; the other blocks stay
    causal. ``rows``: the leak is only in the batch rows from ``rows`` on (the rows
    before stay causal)."""

    def __init__(
        self,
        cfg: GPTConfig,
        allowed: Callable[[int], Tensor] | None = None,
        leaky: tuple[int, ...] | None = None,
        rows: int = 0,
    ) -> None:
        super().__init__(cfg)
        if rows and allowed is None:
            allowed = _sees_all
        for i, block in enumerate(self.blocks):
            if leaky is not None and i not in leaky:
                continue
            block.causal = False
            if allowed is not None:
                block.register_forward_pre_hook(
                    functools.partial(_leak_mask, allowed, rows), with_kwargs=True
                )


def _leak_mask(
    allowed: Callable[[int], Tensor],
    rows: int,
    module: object,
    args: tuple,
    kwargs: dict,
) -> tuple:
    """Forward pre-hook of a block: attend where ``allowed(T)`` is True, in the batch
    rows from ``rows`` on; causally in the rows before."""
    N, T = args[0].shape[:2]
    mask = allowed(T)
    if rows:
        leaks = (torch.arange(N) >= rows)[:, None, None, None]
        mask = torch.where(leaks, mask, torch.ones(T, T, dtype=torch.bool).tril())
    return args, {**kwargs, "attn_mask": mask}


def _sees_all(T: int) -> Tensor:
    """No mask: every position sees every position."""
    return torch.ones(T, T, dtype=torch.bool)


def _one_ahead(T: int) -> Tensor:
    """Keys ``j <= i + 1``: a bounded leak (with 2 layers a change at t reaches back
    to t − 2, not to position 0; in the last block alone, to t − 1 only)."""
    return torch.ones(T, T, dtype=torch.bool).tril(1)


def _also_last(T: int) -> Tensor:
    """Causal, and every position also sees the last one (in the first block only,
    so a change at t < T − 1 alone does not reach back before t)."""
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    mask[:, -1] = True
    return mask


def _first_sees_all(T: int) -> Tensor:
    """Causal, except that position 0 sees every position (in the last block only,
    so no later position inherits the leak)."""
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    mask[0] = True
    return mask


@checker("检验标准 4：因果性的探针")
def check_causality_probe(fn: object) -> str:
    """Grade ``fn(model, input_ids, t) -> bool``: ``True`` iff changing the tokens from
    position ``t`` on leaves the logits at positions ``< t`` unchanged (``model(ids)``
    returns ``(logits, ...)``). Run on causal and on leaky models, at several ``t``."""
    name = name_of(fn)
    g = seeded_generator(42)
    cfg = GPTConfig(
        vocab_size=17, context_length=16, d_model=16, num_heads=2, num_layers=2
    )
    with torch.random.fork_rng(devices=[]):
        causal = MiniGPT(cfg).eval()
        # (model, causal?, what the message calls it, the leak's name)
        models = [
            (causal, True, "因果的模型", ""),
            (_LeakyGPT(cfg).eval(), False, "去掉了掩码的模型", "no_mask"),
            (
                _LeakyGPT(cfg, _one_ahead).eval(),
                False,
                "每层多看一个未来位置的模型",
                "one_ahead",
            ),
            (
                _LeakyGPT(cfg, _also_last, leaky=(0,)).eval(),
                False,
                "第一层里每个位置还看得见最后一个词元的模型",
                "also_last",
            ),
            (
                _LeakyGPT(cfg, _first_sees_all, leaky=(1,)).eval(),
                False,
                "最后一层里位置 0 看得见全部位置的模型",
                "first_sees_all",
            ),
            (
                _LeakyGPT(cfg, _one_ahead, leaky=(1,)).eval(),
                False,
                "只在最后一层多看一个未来位置的模型",
                "last_one_ahead",
            ),
            (
                _LeakyGPT(cfg, rows=1).eval(),
                False,
                "只在批里第 1 行（第二条序列）去掉了掩码的模型",
                "later_rows",
            ),
        ]
    ids = torch.randint(0, 17, (2, 12), generator=g)
    ids[:, 7] = 0  # at t = 7, "ids2[:, t:] = 0" leaves position t as it was
    first = True
    for t in (3, 7, 11):
        for model, expected, kind, leak in models:
            case = f"{kind}，t = {t}"
            fed: list[Tensor] = []
            hook = model.register_forward_pre_hook(
                functools.partial(_keep_input, fed), with_kwargs=True
            )
            given = ids.clone()  # the learner's copy: an in-place edit shows in it
            try:
                with torch.no_grad():
                    out = run_learner(
                        fn,
                        model,
                        given,
                        t,
                        what=name,
                        case=case,
                        first=first,
                        copy_inputs=False,
                    )
            finally:
                hook.remove()
            first = False
            if not torch.equal(given, ids):
                fail(
                    f"{name} 原地改动了传进来的 input_ids（{case}）：调用者的张量被"
                    "改掉了。先复制再改：ids2 = input_ids.clone(); ids2[:, t:] = …"
                )
            if not isinstance(out, bool | torch.Tensor) or (
                isinstance(out, Tensor) and out.numel() != 1
            ):
                fail(
                    f"{name} 应返回 True 或 False，"
                    f"得到 {type(out).__name__}（{case}）。"
                )
            if bool(out) != expected:
                why = _probe_mistake(fed, ids, t, leak) or _comparison_fault(
                    fn, model, fed, ids, t
                )
                fail(f"{name} 返回 {bool(out)}，应为 {expected}（{case}）：{why}")
    return "因果的模型与六种泄漏未来的模型、三个 t，判断都对"


def _keep_input(fed: list[Tensor], module: object, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: keep the ids the learner fed the model."""
    ids = args[0] if args else kwargs.get("input_ids")
    if isinstance(ids, Tensor):
        fed.append(ids.detach().clone())


def _changed_positions(fed: list[Tensor], ids: Tensor) -> list[int]:
    """The positions where some input the learner fed the model differs from
    ``ids``."""
    changed = torch.zeros(ids.size(1), dtype=torch.bool)
    for x in fed:
        if x.shape == ids.shape:
            changed |= (x != ids).any(0)
    return changed.nonzero().flatten().tolist()


def _probe_mistake(fed: list[Tensor], ids: Tensor, t: int, leak: str) -> str:
    """Why a probe that fed the model ``fed`` misjudged it at ``t``, when the inputs it
    changed say so (empty: they do not); ``leak`` names the model's leak (see
    :func:`check_causality_probe`; empty: the causal model)."""
    changed = _changed_positions(fed, ids)
    last = ids.size(1) - 1
    if changed and changed[0] < t:
        return (
            f"你改动了位置 {changed[0]} 的词元，它在 t = {t} 之前。只改位置 t 及以后"
            "（ids2[:, t:] = …），位置 < t 的输入保持不变，再比较 [:, :t]。"
        )
    if not leak:
        return (
            "这个模型是因果的，位置 < t 的 logits 不会变：比较时只取 [:, :t]，"
            "用 torch.allclose（浮点误差）而不是 ==。"
        )
    if not fed:
        return "探针没有调用模型：要比较模型在原输入与改动后的输入上的 logits。"
    if not changed:
        return (
            "送进模型的输入一个词元也没有改，logits 当然不变：把位置 "
            f"t = {t} 及以后换成别的词元编号（ids2[:, t:] = …），再比较 [:, :t]。"
        )
    same = _unchanged_fill(fed, ids, t)
    if same is not None and t not in changed:
        return (
            f"你把位置 t 及以后都换成了词元 {same}，可位置 t = {t} 的词元原来就是 "
            f"{same}：这个位置其实没有换，只来自位置 t 的泄漏就漏掉了。题目要求换成"
            "“别的词元”，也就是每个位置都与原来不同，例如 ids2[:, t:] = "
            "(input_ids[:, t:] + 1) % vocab_size。"
        )
    if leak == "later_rows":
        return _rows_missed(fed, ids, t)
    where = "、".join(str(p) for p in changed)
    if leak == "one_ahead" and t not in changed:
        return (
            f"你没有改位置 t = {t} 的词元，只改了位置 {where}。这个模型每层只多看"
            "一个未来位置，两层下来位置 p 的词元只影响位置 p − 2、p − 1 的 logits："
            f"改位置 {where} 动不到 [:, :{t}]，泄漏就漏掉了。只改后面的词元"
            "（如最后一个），对完全没有掩码的模型够用，对这种有限的泄漏不够："
            "把位置 t 及以后全部换掉（ids2[:, t:] = …）。"
        )
    if leak == "last_one_ahead" and t not in changed:
        return (
            f"你没有改位置 t = {t} 的词元，只改了位置 {where}。这个模型只在最后一层"
            "多看一个未来位置，位置 p 的词元只影响位置 p − 1 的 logits："
            f"改位置 {where} 动不到 [:, :{t}]，泄漏就漏掉了。泄漏可能只来自位置 t："
            "要把位置 t 及以后全部换掉。"
        )
    if leak == "also_last" and last not in changed:
        return (
            f"你只改了位置 {where}，没有改后面的词元。这个模型里每个位置还看得见最后"
            f"一个词元（位置 {last}），却看不见位置 t：只改位置 t 一个词元，"
            "[:, :t] 的 logits 不变，泄漏就漏掉了。泄漏可能来自 t 之后的任何位置："
            "把位置 t 及以后全部换掉（ids2[:, t:] = …）。"
        )
    return ""


def _rows_missed(fed: list[Tensor], ids: Tensor, t: int) -> str:
    """The hint for a probe that calls the model leaking only in batch row 1 causal:
    it fed row 1 unchanged (row 0 alone changed, or the replacements equal to the
    originals), or compared row 0 alone."""
    changed_rows = [x[1:, t:] != ids[1:, t:] for x in fed if x.shape == ids.shape]
    what = (
        "多半只比较了第 0 行（logits[0, :t]）"
        if any(bool(c.any()) for c in changed_rows)
        # learner test 38c: random replacements that happened to equal the originals
        else f"送进模型的第 1 行，位置 ≥ {t} 的词元一个也没变（只改了第 0 行，"
        "或换上的恰好与原来相同，例如随机抽的；每个位置都要换成别的词元，例如 "
        "ids2[:, t:] = (input_ids[:, t:] + 1) % vocab_size）"
    )
    return (
        f"这个模型的第 0 行是因果的，只有第 1 行看得见未来：你的探针{what}。"
        "批里每一行都是一条独立的序列，泄漏可能只出现在某几行：每一行都要改"
        "（ids2[:, t:] = …），比较整块 logits[:, :t]。"
    )


def _unchanged_fill(fed: list[Tensor], ids: Tensor, t: int) -> int | None:
    """The token ``c`` when the probe fed ``ids`` with every position from ``t`` on set
    to ``c`` and position ``t`` already was ``c`` (so it did not change); else
    ``None``."""
    for x in fed:
        if x.shape != ids.shape:
            continue
        tail = x[:, t:]
        c = int(tail.flatten()[0])
        if bool((tail == c).all()) and bool((ids[:, t] == c).all()):
            return c
    return None


class _PlantedLeak(MiniGPT):
    """A causal MiniGPT with a planted leak, to see what a probe's comparison misses:
    in each row whose tokens from ``t`` on differ from ``ids``, the logits at
    ``positions`` move by ``size``; ``flip``: the smallest logit is raised (the argmax
    changes), else every logit but the largest is lowered (the argmax stays)."""

    def __init__(self, cfg: GPTConfig, ids: Tensor, t: int, positions, size: float,
                 flip: bool) -> None:  # fmt: skip
        super().__init__(cfg)
        self.ids, self.t, self.size, self.flip = ids, t, size, flip
        self.where = torch.zeros(1, ids.size(1), 1, dtype=torch.bool)
        self.where[0, list(positions)] = True

    def forward(self, input_ids: Tensor, *args, **kwargs):
        logits, loss = super().forward(input_ids, *args, **kwargs)
        if input_ids.shape != self.ids.shape:
            return logits, loss
        t = self.t
        rows = (input_ids[:, t:] != self.ids[:, t:]).any(1)[:, None, None]
        pick = logits.argmin(-1) if self.flip else logits.argmax(-1)
        one_hot = torch.nn.functional.one_hot(pick, logits.size(-1)).to(logits.dtype)
        move = self.size * (one_hot if self.flip else one_hot - 1)
        return logits + move * (rows & self.where), loss


def _says_causal(fn: Callable, model: MiniGPT, ids: Tensor, t: int) -> bool | None:
    """The probe's answer on ``model`` (None: it crashed or gave no boolean)."""
    try:
        with torch.no_grad():
            out = fn(model, ids.clone(), t)
        return bool(out)
    except Exception:  # the diagnosis only: the graded call already ran cleanly
        return None


def _comparison_fault(
    fn: Callable, model: MiniGPT, fed: list[Tensor], ids: Tensor, t: int
) -> str:
    """Why a probe that changed the tokens from ``t`` on still called the leaky
    ``model`` causal: what its comparison misses, found by planted leaks (a large one
    at each position < t alone; one that keeps every argmax; a small one)."""
    with torch.no_grad():
        ref = model(ids)[0][:, :t]
        moved = max(float((model(x)[0][:, :t] - ref).abs().max()) for x in fed)
    with torch.random.fork_rng(devices=[]):

        def says(positions, size, flip):
            leak = _PlantedLeak(model.cfg, ids, t, positions, size, flip).eval()
            return _says_causal(fn, leak, ids, t)

        missed = [p for p in range(t) if says([p], 1e3, True)]
        keeps_argmax = says(range(t), 1e3, False)
        small = moved > 0 and says(range(t), moved, False)
    if missed:
        return _positions_missed(missed, t)
    if keeps_argmax:
        return (
            f"这个模型里位置 < t 的 logits 最多变了 {moved:.1e}，预测的词元（argmax）"
            "却可能不变。让每个位置最大的 logit 不变、其余都变 1000，你的探针仍说不变："
            "它只比较了 argmax，看不见 logits 本身的变化。"
        )
    if small:
        return (
            f"这个模型里位置 < t 的 logits 最多变了 {moved:.1e}；让它们全都变这么多，"
            "你的探针仍说不变：比较的容差太大，把泄漏当成了浮点误差。"
        )
    return (
        f"这个模型泄漏了未来：位置 < t 的 logits 最多变了 {moved:.1e}，"
        "你的探针没有看出来。"
    )


def _positions_missed(missed: list[int], t: int) -> str:
    """The hint for a probe blind to the logits at the positions ``missed`` (< t)."""
    seen = [p for p in range(t) if p not in missed]
    if missed == [t - 1]:
        return (
            f"位置 t − 1 = {t - 1} 的 logits 变了，你的探针看不出：比较的范围差了一个，"
            "漏了位置 t − 1。位置 < t 是 0 到 t − 1，[:, :t] 包括 t − 1。"
        )
    if len(seen) == 1:
        only = "t − 1" if seen[0] == t - 1 else str(seen[0])
        return (
            f"只比较位置 {only}（或某一个位置）就漏掉了其余位置的变化：泄漏可能只动"
            "某几个位置的 logits。要比较整个 [:, :t]。"
        )
    where = "、".join(str(p) for p in missed)
    return f"位置 {where} 的 logits 变了，你的探针看不出：要比较整个 [:, :t]。"


def _counted(make: Callable, made: list[int], *args, **kwargs):
    """``make(*args, **kwargs)``, noting the call in ``made``."""
    made.append(1)
    return make(*args, **kwargs)


def _check_greedy_picks(
    name: str,
    case: str,
    model_prompt: tuple[MiniGPT, Tensor],
    got: Tensor,
    ref: Tensor,
    last_piece: int,
) -> None:
    """Learner test 38c (5.22b): the first new token read at the first position of the
    last prefill chunk (``logits[:, 0]``), or one argmax over the whole batch."""
    model, prompt = model_prompt
    t0 = prompt.size(1)
    if torch.equal(got, ref):
        return
    with torch.no_grad():
        at_chunk_start = model(prompt)[0][:, t0 - last_piece].argmax(-1)
    if (
        last_piece > 1
        and not torch.equal(got[:, t0], ref[:, t0])
        and torch.equal(got[:, t0], at_chunk_start)
    ):
        fail(
            f"{name} 生成的第一个新词元取自最后一块提示的第一个位置（logits[:, 0]，"
            f"即提示的位置 {t0 - last_piece}）（{case}）：那个位置还没看到这一块后面"
            "的词元。下一个词元的分布在最后一个位置：logits[:, -1].argmax(-1)。"
        )
    if torch.equal(got[0, t0:], got[1, t0:]) and not torch.equal(
        ref[0, t0:], ref[1, t0:]
    ):
        fail(
            f"{name} 给批里两行生成了完全相同的新词元（{case}），不用缓存的贪心生成"
            "两行并不相同：argmax 没有写 dim=-1，整批 logits 取了一个最大值。"
            "每一行各取各的：logits[:, -1].argmax(dim=-1, keepdim=True)。"
        )


def _record(seen: list[int], module: object, args: tuple, out: object) -> None:
    """Forward hook: how many tokens the model was fed."""
    seen.append(args[0].shape[1])


def _note_caches(cached: list[bool], module: object, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: whether the learner passed ``caches`` to this model call."""
    given = kwargs.get("caches", args[2] if len(args) > 2 else None)
    cached.append(given is not None)


def _tail_dropped(seen: list[int], pieces: list[int], n_new: int) -> int | None:
    """How many of the prompt's pieces were fed when the prefill loop stopped early
    (``range(0, T0 - chunk + 1, chunk)``) and decoding went on one token at a time;
    ``None`` when the prefill was not cut short."""
    for k in range(1, len(pieces)):
        if seen[:k] == pieces[:k] and seen[k:] == [1] * (n_new - 1):
            return k
    return None


def _check_prefill(
    name: str,
    case: str,
    calls: tuple[list[int], list[bool]],
    pieces: list[int],
    n_new: int,
) -> None:
    """Name a wrong prefill (learner test 31c): the loop stopped before the prompt's
    tail, or the pieces fed without caches. ``calls``: per model call, the tokens fed
    and whether ``caches`` was passed."""
    seen, cached = calls
    fed = _tail_dropped(seen, pieces, n_new)
    if fed is not None:
        fail(
            f"{name} 预填充时每次送进模型的长度是 {seen[:fed]}，应为 {pieces}"
            f"（{case}）：提示末尾的 {sum(pieces) - sum(pieces[:fed])} 个词元没有送进"
            "模型，生成是从没读完的提示接着写的。循环的上界少了最后一块："
            "range(0, T0 - chunk + 1, chunk) 只走完整的块；用 range(0, T0, chunk)，"
            "最后一块可以短一些。"
        )
    if any(cached) and not all(cached[: len(pieces)]):
        fail(
            f"{name} 的结果与不用缓存的贪心生成不同（{case}）：预填充时调用模型没有传 "
            "caches=caches，提示的键和值没有写进缓存，之后的新词元只看得见它自己和"
            "生成的词元，看不见提示。预填充的每一块也要 model(piece, caches=caches)。"
        )


# a crash of the cached greedy loop: (pattern in "Type: message\nline", hint)
GREEDY_CACHE_CRASHES = [
    (
        r"cached [1-9]\d* \+ new [1-9]\d*\) exceeds context_length",
        "每一步把整段 ids 又送进了同一组缓存：缓存里已经有前面的位置，再送一遍就"
        "重复了，位置很快超出 context_length。预填充整段提示之后，每步只送新词元："
        "model(next_id, caches=caches)。",
    ),
]


@checker("检验标准 5(b)：用包里的缓存做贪心解码")
def check_greedy_with_cache(fn: object) -> str:
    """Grade ``fn(model, input_ids, max_new_tokens)``: greedy decoding of a
    :class:`MiniGPT` through ``model.new_caches()`` and ``model(ids, caches=...)``; it
    must equal ``model.generate(..., greedy=True, use_cache=False)`` and feed the model
    the prompt in pieces of ``chunk`` tokens (the default 4, and 2), then one token per
    step, ``T0 + n - 1`` positions in all: the last new token is not fed back."""
    name = name_of(fn)
    g = seeded_generator(43)
    first = True
    for V, t0, n_new, chunk in ((19, 6, 12, None), (23, 5, 20, 2)):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 10**6, (1,), generator=g)))
            model = MiniGPT(
                GPTConfig(
                    vocab_size=V,
                    context_length=32,
                    d_model=16,
                    num_heads=2,
                    num_layers=2,
                )
            ).eval()
        prompt = torch.randint(0, V, (2, t0), generator=g)
        seen: list[int] = []
        hook = model.tok_emb.register_forward_hook(functools.partial(_record, seen))
        cached: list[bool] = []  # per model call: were caches passed?
        cache_hook = model.register_forward_pre_hook(
            functools.partial(_note_caches, cached), with_kwargs=True
        )
        made: list[int] = []  # one entry per model.new_caches() call of the learner
        model.new_caches = functools.partial(_counted, model.new_caches, made)
        case = f"词表 {V}，提示 {t0} 个词元，生成 {n_new} 个，chunk={chunk or 4}"
        given = {} if chunk is None else {"chunk": chunk}  # None: the default, 4
        try:
            with torch.no_grad():
                out = run_learner(
                    fn, model, prompt, n_new, what=name, case=case, first=first,
                    causes=GREEDY_CACHE_CRASHES, **given,
                )  # fmt: skip
        finally:
            hook.remove()
            cache_hook.remove()
            del model.new_caches
        first = False
        got = as_tensor(out, f"{name} 的返回值", case)
        if tuple(got.shape) == (2, n_new):
            fail(
                f"{name} 返回的形状是 {tuple(got.shape)}，应为 (2, {t0 + n_new})"
                f"（{case}）：只有新生成的 {n_new} 个词元，少了提示。返回值要像 "
                f"model.generate 那样包括提示：前 {t0} 个是提示，后面是新词元。"
            )
        check_shape(got, (2, t0 + n_new), f"{name} 的返回值", case)
        ref = model.generate(prompt, n_new, greedy=True, use_cache=False)
        if len(made) >= n_new or (len(made) > 1 and not torch.equal(got, ref)):
            fail(
                f"{name} 调用了 {len(made)} 次 model.new_caches()（{case}）"
                "——每一步都换了一组空缓存，前面的位置就丢了，"
                "新词元只看得见它自己。缓存在循环之前建一次，之后每步传同一个 caches。"
            )
        pieces = [min(chunk or 4, t0 - start) for start in range(0, t0, chunk or 4)]
        if not torch.equal(got, ref):
            _check_prefill(name, case, (seen, cached), pieces, n_new)
        with torch.no_grad():
            first_piece = model(prompt[:, : chunk or 4])[0][:, -1].argmax(-1)
        new = got[:, t0]
        if not torch.equal(new, ref[:, t0]) and torch.equal(new, first_piece):
            fail(
                f"{name} 生成的第一个新词元来自第一块提示的 logits（{case}）："
                "它只看到了提示的前几个词元。要用最后一块的 logits："
                "最后一块的最后一个位置才看过整段提示。"
            )
        _check_greedy_picks(name, case, (model, prompt), got, ref, pieces[-1])
        if not torch.equal(got, ref):
            fail(
                f"{name} 的结果与不用缓存的贪心生成不同（{case}）：预填充整段提示后，"
                "每一步只把新词元送进 model(next_id, caches=caches)，"
                "取最后一个位置的 argmax。"
            )
        after = seen[len(pieces) :] if seen[: len(pieces)] == pieces else seen[1:]
        if max(after, default=1) != 1:
            fail(
                f"{name} 在预填充之后仍把多个词元送进模型（每次的长度 {seen}）："
                "用了缓存就只送新词元。"
            )
        if seen[: len(pieces)] != pieces:
            fail(
                f"{name} 预填充时每次送进模型的长度是 {seen[: len(pieces)]}，"
                f"chunk={chunk or 4} 时应为 {pieces}（{case}）："
                + (
                    "整段提示一次送完了，没有用 chunk 分块。"
                    if seen[0] == t0
                    else "提示要每次 chunk 个词元送进缓存，最后一块可以短一些。"
                )
            )
        if sum(seen) != t0 + n_new - 1:
            fed_back = sum(seen) == t0 + n_new
            again = "最后选出的词元又送进了模型，它的输出没人用；" if fed_back else ""
            fail(
                f"{name} 让模型处理了 {sum(seen)} 个位置，应为 {t0} + {n_new} − 1 = "
                f"{t0 + n_new - 1}（{case}）：{again}最后一个新词元已经选出，"
                "不必再送进模型。循环里先判断是否已够 n 个，再调用模型。"
            )
    return "两个模型，与不用缓存的贪心生成逐词元相同，共处理 T₀ + n − 1 个位置"
