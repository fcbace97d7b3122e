"""Checkers for the BPE build exercises (the tokenizer topic of ``tc.exercises``).

Same protocol as every checker of :mod:`transformer_course.exercises`: right -> one
``✓`` line; wrong -> :class:`~transformer_course.exercises.ExerciseError` with a Chinese
diagnosis; a skeleton (returns ``None`` or raises ``NotImplementedError``) -> prints
``尚未实现…`` (an error with ``solution=True``).

Contracts (token ids are Python ints, sequences are lists):

* :func:`check_pair_counts` ``fn(ids)`` -> a mapping ``{(a, b): count}`` of the adjacent
  pairs of ``ids``; overlapping pairs count separately (``[7, 7, 7]`` has ``(7, 7)``
  twice). A ``dict`` or ``Counter``; pairs that do not occur may be left out.
* :func:`check_merge_pair` ``fn(ids, pair, new_id)`` -> a new list in which every
  occurrence of ``pair`` is replaced by ``new_id``, scanning left to right
  (``[7, 7, 7]`` -> ``[new_id, 7]``); ``ids`` itself is left unchanged.
* :func:`check_bpe_merge` ``fn(ids, new_id)`` -> ``(pair, new_ids)``: one training step,
  the most frequent pair (ties: the smallest pair, as ``tc.BPETokenizer``) merged
  everywhere.

Each checker first runs small cases built to expose one mistake each, then random
sequences compared with :func:`transformer_course.tokenizer.count_pairs` and
:func:`~transformer_course.tokenizer.merge_pair`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from ..tokenizer import count_pairs, merge_pair
from ._protocol import SEED, checker, fail, name_of, run_learner

__all__ = ["check_pair_counts", "check_merge_pair", "check_bpe_merge"]

_NEW = 99  # the new id in the hand-made cases; the sequences use ids below it


def _random_cases(offset: int, n: int = 12) -> list[list[int]]:
    """Sequences over few symbols, so that pairs repeat and overlap."""
    rng = random.Random(SEED + offset)
    return [[rng.randrange(4) for _ in range(rng.randrange(2, 30))] for _ in range(n)]


def _explain(
    name: str,
    runs: list,
    want: Callable,
    variants: Callable,
    rule: str,
    call: Callable[[tuple], str] | None = None,
) -> None:
    """Fail if a run is wrong. ``runs`` holds ``(args, result)`` of every case; the hint
    is that of the first usual mistake (``variants(*args)``: ``{hint: result}``) that
    reproduces the candidate on *every* case, else ``rule``. ``call(args)`` shows the
    learner's call (default ``name(*args)``)."""
    wrong = [(args, got) for args, got in runs if got != want(*args)]
    if not wrong:
        return
    args, got = wrong[0]
    shown = call(args) if call else f"{name}({', '.join(repr(a) for a in args)}) "
    head = f"{shown}得到 {got}，应为 {want(*args)}。"
    for hint in variants(*args):
        if all(got_i == variants(*args_i)[hint] for args_i, got_i in runs):
            fail(head + hint)
    fail(head + rule)


# --- pair counts --------------------------------------------------------------------


def _as_counts(name: str, out: object, ids: list[int]) -> dict:
    """The candidate's result as ``{(a, b): count}`` without zero counts."""
    if not isinstance(out, Mapping):
        ranked = isinstance(out, list) and all(
            isinstance(x, tuple)
            and len(x) == 2
            and isinstance(x[0], tuple)
            and isinstance(x[1], int)
            for x in out
        )
        fail(
            f"{name}({ids}) 应返回字典 {{(a, b): 次数}}（dict 或 Counter），得到的是 "
            f"{type(out).__name__}：{out!r:.80}。"
            + (
                "most_common() 把计数排成了 [(对, 次数), …] 的列表；次数没错，"
                "但后面的代码按键查次数：直接返回 Counter 本身。"
                if ranked and out
                else "要记下每一对出现的次数，不只是列出相邻对。"
            )
        )
    bad = [k for k in out if not (isinstance(k, tuple) and len(k) == 2)]
    if any(isinstance(k, (set, frozenset)) for k in bad):
        fail(
            f"{name}({ids}) 的键是集合（frozenset）：集合没有先后，(a, b) 和 (b, a) "
            "成了同一个键。相邻对是有序的，(1, 2) 与 (2, 1) 是两种不同的对：用元组 "
            "(ids[i], ids[i + 1]) 作键。"
        )
    if bad:
        fail(
            f"{name}({ids}) 的键应是二元组 (a, b)，得到了 {bad[0]!r}"
            "：用 (ids[i], ids[i + 1]) 作键（列表不能作字典的键，字符串也不对）。"
        )
    return {k: v for k, v in out.items() if v != 0}


def _count_variants(ids: list[int]) -> dict:
    """Results of the usual wrong pair counts, with the hint for each."""
    want = count_pairs(ids)
    variants = {
        "漏了最后一对 (ids[-2], ids[-1])：i 要一直取到 len(ids) - 2，"
        "即 range(len(ids) - 1)。": dict(count_pairs(ids[:-1])),
        "只数了从偶数位置开始的对：相邻对会重叠，[7, 7, 7] 里 (7, 7) 出现两次"
        "（位置 0-1 和 1-2），每次只前进一个位置。": dict(
            Counter(zip(ids[::2], ids[1::2], strict=False))
        ),
        "多了首尾相接的一对：最后一个元素后面没有元素，不要绕回开头。": dict(
            count_pairs([*ids, ids[0]]) if ids else {}
        ),
        "只记了哪些对出现过，没有计数：同一对每出现一次加 1。": dict.fromkeys(want, 1),
        "对的两个元素顺序反了：位置 i 贡献 (ids[i], ids[i + 1])，左边的在前，"
        "即 zip(ids, ids[1:])，不是 zip(ids[1:], ids)。": {
            (b, a): n for (a, b), n in want.items()
        },
        "把 (a, b) 和 (b, a) 当成了同一对（像是键用了 tuple(sorted(...))）：相邻对"
        "是有序的，(1, 2) 是 1 后面跟着 2，(2, 1) 是 2 后面跟着 1，合并时是两种不同的"
        "对。键直接用 (ids[i], ids[i + 1])，不要排序。": dict(
            Counter(tuple(sorted(pair)) for pair in zip(ids, ids[1:], strict=False))
        ),
        "数到两个相同元素组成的对 (a, a) 后跳过了一个位置：计数时每次只前进一个位置"
        "，重叠的对都要数（[7, 7, 7] 里 (7, 7) 出现两次）；跳过两个是合并时的规则。": (
            _count_skipping_repeats(ids)
        ),
    }
    return {hint: {k: v for k, v in c.items() if v} for hint, c in variants.items()}


def _count_skipping_repeats(ids: list[int]) -> dict:
    """Pair counts that jump past a pair of two equal ids, as a merge would."""
    counts: Counter = Counter()
    i = 0
    while i < len(ids) - 1:
        counts[ids[i], ids[i + 1]] += 1
        i += 2 if ids[i] == ids[i + 1] else 1
    return dict(counts)


def _want_counts(ids: list[int]) -> dict:
    return dict(count_pairs(ids))


@checker("相邻对计数")
def check_pair_counts(fn: Callable) -> str:
    """Grade ``fn(ids)`` -> ``{(a, b): count}`` (see the module docstring)."""
    name = name_of(fn)
    cases = [[7, 7, 7], [1, 2, 3, 1, 2], [5, 6, 5, 6, 5], [1, 2], [3], []]
    runs = []
    for i, ids in enumerate(cases + _random_cases(1)):
        out = run_learner(fn, list(ids), what=name, case=f"ids={ids}", first=i == 0)
        runs.append(((ids,), _as_counts(name, out, ids)))
    rule = "每个相邻位置 i（0 ≤ i < len(ids) - 1）贡献一对 (ids[i], ids[i + 1])。"
    _explain(name, runs, _want_counts, _count_variants, rule)
    return (
        f"{len(cases)} 个构造的序列（含重叠对、只有一个元素和空序列）和 12 个随机序列"
    )


# --- merging one pair ---------------------------------------------------------------


def _scan(
    ids: list[int],
    pair: tuple,
    new_id: int,
    skip: int = 2,
    stop: int = 0,
    ahead: int = 1,
    first_only: bool = False,
) -> list[int]:
    """A left-to-right merge with three knobs that reproduce common bugs: ``skip=1``
    forgets to skip the second element of a match, ``stop=1`` ends the loop one
    element early, ``ahead=2`` only matches where ``i + 2 < len(ids)`` (the final pair
    is never merged), ``first_only`` matches ``ids[i] == pair[0]`` alone."""
    out, i = [], 0
    while i < len(ids) - stop:
        here = (ids[i],) if first_only else tuple(ids[i : i + 2])
        if i + ahead < len(ids) and here == tuple(pair[: len(here)]):
            out.append(new_id)
            i += skip
        else:
            out.append(ids[i])
            i += 1
    return out


def _look_behind(
    ids: list[int], pair: tuple, new_id: int, behind_first: bool
) -> list[int]:
    """A merge that drops ``ids[i]`` when ``(ids[i - 1], ids[i])`` is the pair instead
    of remembering whether ``ids[i - 1]`` was merged; ``behind_first``: that test comes
    before the test of ``(ids[i], ids[i + 1])``."""
    out = []
    for i, x in enumerate(ids):
        ahead = i + 1 < len(ids) and (x, ids[i + 1]) == pair
        if i > 0 and (ids[i - 1], x) == pair and (behind_first or not ahead):
            continue
        out.append(new_id if ahead else x)
    return out


def _replace_in_text(ids: list[int], pair: tuple, new_id: int) -> list[int]:
    """The merge done with ``str.replace`` on the ids joined by spaces."""
    text = " ".join(map(str, ids)).replace(f"{pair[0]} {pair[1]}", str(new_id))
    return [int(t) for t in text.split()]


_LOOK_BEHIND = (
    "用“前一对 (ids[i − 1], ids[i]) 是不是 pair”来决定丢不丢 ids[i]，重叠时会错："
    "{}要记住的是上一步有没有合并（合并后 i += 2，或设一个 skip 标志），"
    "而不是再比较一次前一对。"
)


_TEXT_REPLACE = (
    "把 id 用空格拼成字符串再 replace：多位数的 id 会被从中间拆开（'11 2' 里也有 "
    "'1 2'）。直接在列表上比较相邻的两个元素 (ids[i], ids[i + 1])。"
)


def _merge_variants(ids: list[int], pair: tuple[int, int], new_id: int) -> dict:
    """Results of the usual wrong merges, with the hint for each."""
    end = _first_end(ids, pair)
    return {
        "只替换了第一次出现：要替换所有出现，扫描到序列末尾。": _scan(
            ids[:end], pair, new_id
        )
        + ids[end:],
        "合并了位置 i、i+1 之后又从 i+1 接着看：应跳过已经合并的两个元素，从 i+2 接着看"
        "（[7, 7, 7] 应变成 [new_id, 7]）。": _scan(ids, pair, new_id, skip=1),
        "从右往左合并了：约定从左往右扫描（[7, 7, 7] 应变成 [new_id, 7]，"
        "不是 [7, new_id]）。": merge_pair(ids[::-1], pair[::-1], new_id)[::-1],
        "漏了最后一个元素：最后一个元素没有参与合并时，也要把它放进结果。": _scan(
            ids, pair, new_id, stop=1
        ),
        "漏了结尾的那一对：最后一对是位置 len(ids) − 2 和 len(ids) − 1，条件应是 "
        "i + 1 < len(ids)，不是 i + 2 < len(ids)。": _scan(ids, pair, new_id, ahead=2),
        "有两处错：合并之后没有跳过第二个元素（[7, 7, 7] 应变成 [new_id, 7]），"
        "而且循环只走到倒数第二个位置，最后一个元素没有放进结果。"
        "for i in range(len(ids) - 1) 做不到跳过：用 while 循环，合并时 i += 2，"
        "否则 i += 1，最后一个元素没被合并时也要放进结果。": _scan(
            ids, pair, new_id, skip=1, stop=1
        ),
        "只比较了 ids[i] == pair[0]，没有看 ids[i + 1]：两个元素都要对上，"
        "(ids[i], ids[i + 1]) == pair 才合并。": _scan(
            ids, pair, new_id, first_only=True
        ),
        "最后一个元素放了两次：它已经并进了最后一个 new_id，循环结束后只在它没有被"
        "合并时才补上 ids[-1]。": _scan(ids, pair, new_id, stop=1) + ids[-1:],
        _LOOK_BEHIND.format(
            "[7, 7, 7] 中间的 7 已经并进了第一个 new_id，又和后面的 7 组成一对，"
            "得到 [new_id, new_id]，应为 [new_id, 7]。"
        ): _look_behind(ids, pair, new_id, behind_first=False),
        _LOOK_BEHIND.format(
            "[7, 7, 7] 最后一个 7 前面也是 (7, 7)，被当成已合并丢掉了，得到 [new_id]，"
            "应为 [new_id, 7]。"
        ): _look_behind(ids, pair, new_id, behind_first=True),
        _TEXT_REPLACE: (_replace_in_text(ids, pair, new_id)),
        "没有做任何替换：比较的是相邻的两个元素 (ids[i], ids[i + 1]) 与 pair，"
        "注意 pair 是元组，列表切片 ids[i:i + 2] 要先转成元组再比较。": list(ids),
    }


def _first_end(ids: list[int], pair: tuple[int, int]) -> int:
    """The end of the first occurrence of ``pair`` (``len(ids)`` if none)."""
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return i + 2
    return len(ids)


def _as_list(name: str, out: object) -> list:
    if not isinstance(out, Sequence) or isinstance(out, str):
        fail(
            f"{name} 应返回一个列表（元组也可以），得到 "
            f"{type(out).__name__}：{out!r:.80}"
        )
    return list(out)


_MERGE_RULE = (
    "从左往右扫描：位置 i 与 i+1 恰好是 pair 时放入 new_id 并前进两步，"
    "否则放入 ids[i] 并前进一步。"
)


def _merge_cases() -> list[tuple[list[int], tuple[int, int]]]:
    fixed = [
        ([1, 2, 3, 1, 2], (1, 2)), ([7, 7, 7], (7, 7)), ([7, 7, 7, 7], (7, 7)),
        ([1, 2, 3, 4], (3, 4)), ([1, 2, 3], (2, 1)), ([5], (5, 5)), ([], (1, 2)),
        ([11, 2, 1, 2], (1, 2)), ([3, 12, 1, 21], (1, 2)),  # ids of several digits
    ]  # fmt: skip
    rng = random.Random(SEED + 2)
    return fixed + [
        (ids, (rng.randrange(4), rng.randrange(4))) for ids in _random_cases(3)
    ]


def _check_unchanged(name: str, ids: list, before: list) -> None:
    if ids != before:
        fail(
            f"{name} 改动了传进来的 ids（{before} 变成了 {ids}）：新建一个列表返回，"
            "不要在原列表上删改（训练时同一个序列还要用来数下一轮的对）。"
        )


@checker("合并一个相邻对")
def check_merge_pair(fn: Callable) -> str:
    """Grade ``fn(ids, pair, new_id)`` -> the merged list (see the module docstring)."""
    name = name_of(fn)
    cases, runs = _merge_cases(), []
    for i, (ids, pair) in enumerate(cases):
        arg, case = list(ids), f"ids={ids}, pair={pair}"
        out = run_learner(fn, arg, pair, _NEW, what=name, case=case, first=i == 0)
        _check_unchanged(name, arg, ids)
        if out is arg:
            fail(
                f"{name}({ids}, {pair}, {_NEW}) 返回的就是传进来的 ids 这个列表本身"
                "（不是副本）：练习要求返回一个新列表，否则调用者以后改结果时会把 ids "
                "一起改掉。pair 不出现时也要新建：return list(ids) 或 ids[:]。"
            )
        runs.append(((ids, pair, _NEW), _as_list(name, out)))
    for (ids, pair, _), out in runs:
        alien = [x for x in out if x not in ids and x != _NEW]
        if alien:  # a number that is neither an old id nor the new one: text surgery
            fail(
                f"{name}({ids}, {pair}, {_NEW}) 得到 {out}，其中 {alien[0]!r} 既不是"
                f"原来的 id，也不是 new_id：{_TEXT_REPLACE}"
            )
    _explain(name, runs, merge_pair, _merge_variants, _MERGE_RULE)
    return (
        f"{len(cases)} 个序列：多次出现、重叠的 [7, 7, 7]、末尾、不出现、空序列、"
        "多位数的 id"
    )


# --- one training step ---------------------------------------------------------------


def _best_pair(ids: list[int]) -> tuple[int, int]:
    counts = count_pairs(ids)
    return min(counts, key=lambda p: (-counts[p], p))


def _holds_new_id(seq: object) -> bool:
    """Whether ``seq`` holds the merge's new id (a pair of old ids never does)."""
    return isinstance(seq, Sequence) and not isinstance(seq, str) and _NEW in seq


def _first_seen(counts: Mapping) -> tuple[int, int]:
    """What ``max(counts, key=counts.get)`` picks: ties go to the pair seen first."""
    return max(counts, key=counts.get)


def _first_id(counts: Mapping) -> tuple[int, int]:
    """Ties broken on the first id alone: the pair seen first among those."""
    return min(counts, key=lambda p: (-counts[p], p[0]))


def _largest(counts: Mapping) -> tuple[int, int]:
    """Ties broken toward the largest pair, ``max`` of ``(count, pair)``."""
    return max(counts, key=lambda p: (counts[p], p))


def _is_most_frequent(ids: list[int], pair: tuple) -> bool:
    counts = count_pairs(ids)
    return counts.get(pair, 0) == max(counts.values())


def _picked_by_count(picks: list[tuple[list[int], tuple]], hint: str) -> bool:
    """Whether every pick is the most frequent pair of the wrong count ``hint`` names
    (ties: the smallest pair)."""
    for ids, pair in picks:
        counts = _count_variants(ids)[hint]
        if not counts or pair != min(counts, key=lambda p: (-counts[p], p)):
            return False
    return True


def _diagnose_choices(name: str, picks: list[tuple[list[int], tuple]]) -> None:
    """Fail if a pick of ``picks`` (``(ids, the learner's pair)`` of every case) is
    not the most frequent pair. The hint comes from the picks on all cases, compared
    with the true counts: a tie-break when every pick is a most frequent pair, a wrong
    count when they are the picks of a usual wrong count, else the rule."""
    wrong = [(ids, pair) for ids, pair in picks if pair != _best_pair(ids)]
    if not wrong:
        return
    ids, pair = wrong[0]
    counts, want = count_pairs(ids), _best_pair(ids)
    head = (
        f"{name}({ids}, {_NEW}) 选了 {pair}（出现 {counts.get(pair, 0)} 次），"
        f"应选 {want}。"
    )
    rules = (_first_seen, _largest, _first_id)
    tie_break = any(all(p == r(count_pairs(i)) for i, p in picks) for r in rules)
    counted = [h for h in _count_variants(ids) if _picked_by_count(picks, h)]
    if tie_break or (not counted and all(_is_most_frequent(i, p) for i, p in picks)):
        # the remark fits only code that picks what the usual one-liner picks
        first_seen = all(p == _first_seen(count_pairs(i)) for i, p in picks)
        fail(
            head + f"这几对都出现 {counts[want]} 次，并列时约定取最小的一对（元组按"
            "字典序比较：先比第一个 id，再比第二个），与 tc.BPETokenizer 一致，训练才"
            "可复现。"
            + (
                "max(counts, key=counts.get) 和 Counter.most_common(1) 在并列时取的"
                "都是最先出现的一对。"
                if first_seen
                else "你在并列时取了最大的一对：key 里带上 p 时，max 在次数相同的对里"
                "选的是最大的。"
                if all(p == _largest(count_pairs(i)) for i, p in picks)
                else "你在并列时只比了第一个 id：第一个 id 也相同时还要比第二个，"
                "key 里直接放整个对 p（元组逐项比较）。"
                if all(p == _first_id(count_pairs(i)) for i, p in picks)
                else ""
            )
        )
    if all(p == min(count_pairs(i)) for i, p in picks):
        fail(
            head
            + "你每次选的都是最小的一对，与次数无关：像是 min(counts)，它比较的是对"
            "本身（元组的大小），不看次数；或者你数的时候只记了哪些对出现过。选的时候先比"
            "次数（次数多的在前），次数相同再比对本身（小的在前）。"
        )
    if counted:
        fail(head + f"你选的是数错了的相邻对里最多的一对：{counted[0]}")
    if counts.get(pair, 0) == counts[want]:  # a tie that wrong counts hid
        fail(
            head + f"{pair} 与 {want} 都出现 {counts[want]} 次，并列时取最小的一对 "
            f"{want}；你的选择不是按这条规则做出的，多半是你数出的次数与此不同："
            "先用上一题的检查确认相邻对的计数（重叠的对也要数）。"
        )
    fail(
        head + f"要合并的是出现次数最多的一对，{pair} 却只出现 "
        f"{counts.get(pair, 0)} 次（最多的出现 {counts[want]} 次）："
        "选的时候要先比次数，次数相同再比对本身。若选法没错，先用上一题的检查确认"
        "相邻对的计数（重叠的对也要数）。"
    )


def _check_merged(name: str, ids: list[int], new_ids: list, same: bool) -> None:
    """A step's ``new_ids`` must differ from ``ids`` (its pair always occurs);
    ``same``: the learner returned the list it was given."""
    if same or new_ids == ids:
        fail(
            f"{name}({ids}, {_NEW}) 返回的 new_ids 与输入 ids 一样，一处也没合并"
            + (
                "：返回的就是传进来的 ids 本身。把合并的结果存下来再返回："
                "new_ids = 合并函数(ids, pair, new_id)，return pair, new_ids。"
                if same
                else "：选的对是对的，检查合并那一步（它应先通过上一题的检查）。"
            )
        )


@checker("BPE 的一步合并")
def check_bpe_merge(fn: Callable) -> str:
    """Grade ``fn(ids, new_id)`` -> ``(pair, new_ids)`` (see the module docstring)."""
    name = name_of(fn)
    cases = [
        [1, 2, 3, 1, 2],
        [5, 6, 1, 2, 5, 6, 1, 2],
        [7, 7, 7, 7],
        [3, 1, 3, 1, 1, 3],
        [11, 2, 1, 2, 1, 2],  # ids of several digits: 11, 2 is not the pair (1, 2)
        [1, 3, 1, 2, 1, 3, 1, 2],  # learner test 45d: tied pairs sharing the first id
    ]
    cases += [ids for ids in _random_cases(4) if len(ids) >= 2]
    runs, picks, same = [], [], []
    for i, ids in enumerate(cases):
        arg = list(ids)
        out = run_learner(fn, arg, _NEW, what=name, case=f"ids={ids}", first=i == 0)
        _check_unchanged(name, arg, ids)
        if not (isinstance(out, Sequence) and len(out) == 2):
            fail(f"{name} 应返回 (pair, new_ids) 两项，得到 {out!r:.80}")
        if _holds_new_id(out[0]) and not _holds_new_id(out[1]):  # the new id: new_ids
            fail(
                f"{name} 返回的两项顺序反了：第一项 {out[0]!r:.40} 里有新 id {_NEW}，"
                "是合并后的序列。应先返回要合并的一对，再返回合并后的序列："
                "return pair, new_ids。"
            )
        if not isinstance(out[0], tuple):
            fail(
                f"{name} 返回的 pair 是 {type(out[0]).__name__} {out[0]!r:.40}，"
                "应是元组 (a, b)：tc.BPETokenizer.merges 里的合并都是元组，下一格把你的"
                "合并与它逐个比较，"
                "[a, b] == (a, b) 为 False。用 tuple(...) 或直接返回 counts 的键。"
            )
        picks.append((ids, out[0]))
        runs.append(((ids, _best_pair(ids), _NEW), _as_list(name, out[1])))
        same.append(out[1] is arg)
    _diagnose_choices(name, picks)
    for ((ids, *_), new_ids), is_arg in zip(runs, same, strict=True):
        _check_merged(name, ids, new_ids, is_arg)
    _explain(
        name,
        runs,
        merge_pair,
        _merge_variants,
        _MERGE_RULE,
        call=lambda args: f"{name}({args[0]}, {_NEW}) 选对了 {args[1]}，合并后",
    )
    return f"{len(cases)} 个序列，含出现次数并列的对和重叠的 [7, 7, 7, 7]"
