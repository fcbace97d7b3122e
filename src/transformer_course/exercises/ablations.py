"""A paired, multi-seed ablation (chapter 4): run two arms of an experiment on the same
seeds and state a claim with a threshold that must hold on every seed.

The learner writes ``fn(run, arms, seeds, margin) -> (losses, holds)``:

* ``run(arm, seed) -> float`` trains one model and returns its final loss;
* every arm is run once on every seed (the same seeds for both arms: paired);
* ``losses[arm]`` lists the losses in the order of ``seeds``;
* ``holds`` is ``True`` exactly when, on every seed, the second arm's loss exceeds the
  first arm's by the relative ``margin``: ``loss_1 > (1 + margin) * loss_0``;
* fewer than two seeds, or a seed given twice, is a ``ValueError``: one run per arm is
  not an ablation.

The checker grades it with fake ``run`` functions whose losses it chooses (no training),
recording every call.
"""

from __future__ import annotations

from collections import Counter

import torch

from ._protocol import checker, fail, name_of, run_learner

__all__ = ["check_paired_ablation"]

# (hint, mistake): what each typical mistake looks like to the checker
ABLATION_HINTS = [
    (
        "每个方案要在每个种子上各跑一次（不多不少，先后顺序不限）：例如两层循环，"
        "一层方案、一层种子。",
        "calls",
    ),
    (
        "成对比较：两个方案要用同一组种子，run(arm, seed) 的 seed 直接取自 seeds，"
        "不要给第二个方案换种子或加偏移。",
        "unpaired",
    ),
    (
        "run 的参数顺序反了：签名是 run(arm, seed)，先方案、后种子；你调用的是 "
        "run(seed, arm)。",
        "swapped",
    ),
    (
        "losses[arm] 应是按 seeds 的顺序排列的每个种子的损失列表（不要排序、求均值）。",
        "losses",
    ),
    (
        "losses 应是一个字典，键是方案、值是各种子的损失列表；你返回的是 {kind}。例如 "
        "{{arm: [run(arm, s) for s in seeds] for arm in arms}}。",
        "losses_type",
    ),
    (
        "losses 的键应是两个方案 arms[0]、arms[1]，你的键是 {keys}：每个方案一个"
        "列表，列表里按 seeds 的顺序放各种子的损失。",
        "losses_keys",
    ),
    (
        "判定要逐个种子比较：均值差得再多，只要有一个种子上结论不成立，"
        "holds 就是 False。",
        "mean",
    ),
    (  # learner test 66
        "holds 在循环里被每个种子覆盖了，最后只剩最后一个种子说了算：要每个种子都"
        "成立，holds = all(...)，或者在循环里一旦不成立就设为 False 并停下。",
        "last",
    ),
    (
        "阈值是相对的：要求 loss_1 > (1 + margin) * loss_0，不只是 loss_1 > loss_0。",
        "margin",
    ),
    (
        "margin 是比例（0.15 = 15%），不要再除以 100：要求 "
        "loss_1 > (1 + margin) * loss_0。margin / 100 = 0.002 时，高出 0.2% 就算数了。",
        "percent",
    ),
    (
        "margin 是相对的比例，不是绝对的差：要求 loss_1 > (1 + margin) * loss_0，"
        "不是 loss_1 > loss_0 + margin（损失约为 5 时差 0.3 就够了，约为 0.1 时差 0.05 "
        "也不够）。",
        "absolute",
    ),
    (
        "比较要严格：「高出 margin 以上」是 loss_1 > (1 + margin) * loss_0，正好等于"
        "阈值时结论不成立；你用的是 >=。",
        "ge",
    ),
    (
        "用了 any：要每个种子上都成立（all），只在一个种子上成立的结论不算数。",
        "any",
    ),
    (
        "阈值少了 1 +：loss_1 > margin * loss_0 只要求第二个方案的损失超过第一个的 "
        "margin 倍（margin 小于 1 时几乎总成立）。「高出 margin 以上」是 "
        "loss_1 > (1 + margin) * loss_0。",
        "no_one",
    ),
    (
        "margin 是相对第一个方案（arms[0]）的损失：要求 "
        "loss_1 > (1 + margin) * loss_0，即 (loss_1 − loss_0) / loss_0 > margin。"
        "你把差值除以了第二个方案的损失，阈值就变严了：例如 margin = 0.2 时要求的损失比"
        "成了 1/(1 − 0.2) = 1.25，而不是 1.2。",
        "of_worse",
    ),
    (
        "margin 是相对第一个方案（arms[0]）的损失：要求 "
        "(loss_1 − loss_0) / loss_0 > margin。你把差值除以了两个损失的平均，阈值就"
        "变严了：margin = 0.2 时要求的损失比成了 2.2/1.8 ≈ 1.22，而不是 1.2。",
        "of_mean",
    ),
    (
        "方向：holds 说的是第二个方案（arms[1]）的损失比第一个方案（arms[0]）"
        "高出 margin。",
        "direction",
    ),
    (
        "holds 应是真假值 True 或 False（可以用 all(...) 得到；numpy 的 np.True_、"
        "0 维 bool 张量也行），不是数或列表。",
        "bool",
    ),
    (
        "种子少于 2 个或有重复时应 raise ValueError：一个种子上的差别分不清是设计的作用"
        "还是运气。",
        "seeds",
    ),
]
_HINT = {mistake: hint for hint, mistake in ABLATION_HINTS}


# learner test 45d, 4.13: `len(seeds) <= 2` raises on a valid pair of seeds
_VALID_SEEDS = [
    (
        r"^ValueError",
        "这组种子是合法的（至少 2 个、互不相同），不该报错：检查你报错的条件，"
        "只在种子少于 2 个（len(seeds) < 2）或有重复时 raise，2 个种子是允许的。",
    ),
]


class _FakeRun:
    """``run(arm, seed)`` with chosen losses; remembers every call."""

    def __init__(self, table: dict[tuple[str, int], float]) -> None:
        self.table, self.calls = table, []

    def __call__(self, arm, seed):
        self.calls.append((arm, seed))
        return self.table.get((arm, seed), 10.0 + len(self.calls))  # off-plan: distinct


def _case(arms, seeds, loss0, loss1) -> _FakeRun:
    table = {(arms[0], s): a for s, a in zip(seeds, loss0, strict=True)}
    table.update({(arms[1], s): b for s, b in zip(seeds, loss1, strict=True)})
    return _FakeRun(table)


# one seed's test as a typical mistake writes it (a, b: the losses of arms[0], arms[1])
_PAIR_TESTS = {
    "margin": lambda a, b, m: b > a,  # no margin
    "percent": lambda a, b, m: b > (1 + m / 100) * a,  # margin read as a percentage
    "absolute": lambda a, b, m: b > a + m,
    "ge": lambda a, b, m: b >= (1 + m) * a,
    "no_one": lambda a, b, m: b > m * a,  # the 1 + left out
    "of_worse": lambda a, b, m: (b - a) / b > m,  # relative to the worse arm's loss
    "of_mean": lambda a, b, m: (b - a) / ((a + b) / 2) > m,  # ... to the mean of both
}


def _verdict(loss0, loss1, margin, mistake=None) -> bool:
    """The claim as stated, or as one typical mistake computes it."""
    if mistake == "direction":
        loss0, loss1 = loss1, loss0
    if mistake == "mean":
        return sum(loss1) / len(loss1) > (1 + margin) * sum(loss0) / len(loss0)
    test = _PAIR_TESTS.get(mistake, lambda a, b, m: b > (1 + m) * a)
    held = [test(a, b, margin) for a, b in zip(loss0, loss1, strict=True)]
    if mistake == "last":  # holds overwritten in the loop: the last seed decides
        return held[-1]
    return any(held) if mistake == "any" else all(held)


# the wrong verdicts a learner's holds is compared with, over all the cases at once
_VERDICT_MISTAKES = (
    "direction", "margin", "percent", "absolute", "ge", "mean", "any", "no_one",
    "of_worse", "of_mean", "last",
)  # fmt: skip


# (description, arms, seeds, margin, losses of arms[0], losses of arms[1])
_CASES = [
    ("第二个方案在 3 个种子上都差 50%", ("scaled", "unscaled"), [7, 3, 11], 0.2,
     [0.10, 0.20, 0.40], [0.15, 0.30, 0.60]),
    ("均值差很多，但第 2 个种子上反过来", ("A", "B"), [0, 1, 2, 3], 0.1,
     [0.1, 0.9, 0.1, 0.1], [1.0, 0.5, 1.0, 1.0]),
    ("每个种子都更差，但只差 10%，阈值 20%", ("A", "B"), [5, 6], 0.2,
     [1.0, 2.0], [1.1, 2.2]),
    ("第二个方案在每个种子上都更好", ("A", "B"), [1, 2, 3], 0.2,
     [0.6, 0.9, 0.75], [0.2, 0.3, 0.25]),
    ("每个种子上正好高出 50%（二进制下精确相等），阈值 50%", ("A", "B"), [8, 9], 0.5,
     [1.0, 2.0], [1.5, 3.0]),
    ("损失约为 5，每个种子高出 0.3，不到 10%", ("A", "B"), [3, 4], 0.1,
     [5.0, 6.0], [5.3, 6.3]),
    ("只在一个种子上更差", ("A", "B"), [1, 2], 0.2,
     [1.0, 1.0], [1.5, 0.1]),
    # learner test 44b: a margin relative to the worse loss, or to the mean of the two
    ("每个种子上高出 22%，阈值 20%", ("A", "B"), [4, 5], 0.2,
     [1.0, 2.0], [1.22, 2.44]),
    ("每个种子上高出 23%，阈值 20%", ("A", "B"), [6, 7], 0.2,
     [1.0, 2.0], [1.23, 2.46]),
    # learner test 58: margin / 100 (a percentage) got the hint of a missing margin
    ("每个种子上只高出 0.1%，阈值 20%", ("A", "B"), [2, 3], 0.2,
     [1.0, 2.0], [1.001, 2.002]),
    # learner test 66: holds overwritten in the loop agreed with "mean" on every case
    ("只在最后一个种子上更差", ("A", "B"), [1, 2], 0.2,
     [1.0, 1.0], [0.2, 1.5]),
]  # fmt: skip


def _truth_value(verdict: object) -> object:
    """``verdict`` as a Python bool when it is one: numpy's ``np.bool_`` and a
    one-element bool tensor work in ``if holds:`` like True/False; anything else is
    returned as is."""
    if isinstance(verdict, torch.Tensor):
        if verdict.dtype == torch.bool and verdict.numel() == 1:
            return bool(verdict)
    elif type(verdict).__module__ == "numpy" and type(verdict).__name__ in (
        "bool",
        "bool_",
    ):
        return bool(verdict)
    return verdict


def _losses_mistake(losses: object, want: dict) -> str | None:
    """What is wrong with the learner's ``losses`` (``None``: nothing)."""
    if not isinstance(losses, dict):
        return _HINT["losses_type"].format(kind=type(losses).__name__)
    if set(losses) != set(want):
        return _HINT["losses_keys"].format(keys=list(losses))
    if any([float(x) for x in losses[a]] != want[a] for a in want):
        return _HINT["losses"]
    return None


@checker("成对的多种子对照实验")
def check_paired_ablation(fn) -> str:
    """Grade ``fn(run, arms, seeds, margin) -> (losses, holds)`` (see the module)."""
    name = name_of(fn)
    verdicts = []
    for i, (case, arms, seeds, margin, loss0, loss1) in enumerate(_CASES):
        run = _case(arms, seeds, loss0, loss1)
        what = f"{name}(run, {arms}, {seeds}, margin={margin})"
        out = run_learner(fn, run, arms, list(seeds), margin, what=what, case=case,
                          first=i == 0, causes=_VALID_SEEDS)  # fmt: skip
        expected_calls = [(a, s) for a in arms for s in seeds]
        if Counter(run.calls) != Counter(expected_calls):
            seen = {s for _, s in run.calls}
            swapped = Counter((s, a) for a, s in run.calls) == Counter(expected_calls)
            key = "swapped" if swapped else "unpaired" if seen - set(seeds) else "calls"
            fail(
                f"{what} 调用 run 的 (方案, 种子) 是 {run.calls}，"
                f"应是 {expected_calls} 各一次（{case}）。\n可能的原因：{_HINT[key]}"
            )
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            fail(f"{what} 应返回 (losses, holds) 两个值，得到 {out!r:.80}。")
        losses, verdict = out
        want = {arms[0]: loss0, arms[1]: loss1}
        why = _losses_mistake(losses, want)
        if why is not None:
            fail(
                f"{what} 返回的 losses 是 {losses!r:.120}，应是 {want}（{case}）。\n"
                f"可能的原因：{why}"
            )
        verdict = _truth_value(verdict)
        if not isinstance(verdict, bool):
            fail(
                f"{what} 返回的 holds 是 {type(verdict).__name__}"
                f"（{verdict!r:.40}）。\n"
                f"可能的原因：{_HINT['bool']}"
            )
        verdicts.append(verdict)
    right = [_verdict(c[4], c[5], c[3]) for c in _CASES]
    if verdicts != right:
        i = next(
            i for i, (a, b) in enumerate(zip(verdicts, right, strict=True)) if a != b
        )
        case, arms, seeds, margin = _CASES[i][:4]
        mistake = next(
            (m for m in _VERDICT_MISTAKES
             if [_verdict(c[4], c[5], c[3], m) for c in _CASES] == verdicts),
            None,
        )  # fmt: skip
        fail(
            f"{name}(run, {arms}, {seeds}, margin={margin}) 判定 holds = "
            f"{verdicts[i]}，应是 {right[i]}（{case}）。\n可能的原因："
            + (
                _HINT[mistake]
                if mistake
                else "对照定义逐个种子检查 loss_1 > (1 + margin) * loss_0。"
            )
        )
    for bad in ([4], [2, 2, 5]):
        what = f"{name}(run, ('A', 'B'), {bad}, margin=0.1)"
        run = _FakeRun({})
        try:
            fn(run, ("A", "B"), list(bad), 0.1)
        except ValueError:
            continue
        except Exception as err:  # noqa: BLE001 - the learner's crash is the finding
            fail(
                f"{what} 抛出了 {type(err).__name__}: {err}，应是 ValueError。\n"
                f"可能的原因：{_HINT['seeds']}"
            )
        fail(f"{what} 没有报错。\n可能的原因：{_HINT['seeds']}")
    return f"{len(_CASES)} 组成对实验的判定都对，种子少于 2 个或重复时报错"
