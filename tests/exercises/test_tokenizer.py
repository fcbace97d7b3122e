"""The BPE exercise checkers accept correct learner code written in different ways, treat a skeleton as
"尚未实现" (an error with solution=True), and reject hand-written wrong versions with a Chinese hint that
names the mistake."""

import re
from collections import Counter, defaultdict

import pytest

import transformer_course as tc

from .support import assert_passes as support_passes
from .support import assert_skeleton, rejection

bx = tc.exercises


def assert_passes(checker, candidate, capsys):
    support_passes(checker, candidate, capsys, solution=True)


def assert_rejects(checker, candidate, keyword, capsys):
    """``keyword`` is a regular expression that the checker's message must contain."""
    message = rejection(checker, candidate)
    assert re.search(keyword, message), message
    assert "✓" not in capsys.readouterr().out


# --- pair counts: right in several styles, then typical mistakes --------------------------------------------


def counts_counter(ids):
    return Counter(zip(ids, ids[1:], strict=False))


def counts_loop(ids):
    counts = {}
    for i in range(len(ids) - 1):
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def counts_defaultdict(ids):
    counts = defaultdict(int)
    for a, b in zip(ids, ids[1:], strict=False):
        counts[a, b] += 1
    return counts


@pytest.mark.parametrize("fn", [counts_counter, counts_loop, counts_defaultdict])
def test_pair_counts_accepts_correct_versions(fn, capsys):
    assert_passes(bx.check_pair_counts, fn, capsys)


def counts_skeleton(ids):
    pass


def counts_not_implemented(ids):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [counts_skeleton, counts_not_implemented])
def test_pair_counts_skeleton(fn, capsys):
    assert_skeleton(bx.check_pair_counts, fn, capsys)


def counts_missing_last(ids):
    return Counter((ids[i], ids[i + 1]) for i in range(len(ids) - 2))


def counts_step_two(ids):
    return Counter((ids[i], ids[i + 1]) for i in range(0, len(ids) - 1, 2))


def counts_wrap_around(ids):
    return Counter((ids[i], ids[(i + 1) % len(ids)]) for i in range(len(ids)))


def counts_set(ids):
    return dict.fromkeys(zip(ids, ids[1:], strict=False), 1)


def counts_list_keys(ids):
    return {str([a, b]): 1 for a, b in zip(ids, ids[1:], strict=False)}


def counts_list_of_pairs(ids):
    return list(zip(ids, ids[1:], strict=False))


def counts_most_common(ids):  # learner test 44b: the counts, ranked into a list
    return Counter(zip(ids, ids[1:], strict=False)).most_common()


def counts_reversed(ids):  # learner test 18b: zip(ids[1:], ids)
    return Counter(zip(ids[1:], ids, strict=False))


def counts_skipping_repeats(ids):  # learner test 18b: jumps past (a, a) as a merge does
    counts, i = Counter(), 0
    while i < len(ids) - 1:
        counts[ids[i], ids[i + 1]] += 1
        i += 2 if ids[i] == ids[i + 1] else 1
    return counts


def counts_unordered(ids):  # learner test 19: sorted pairs, (1, 2) and (2, 1) together
    return dict(Counter(tuple(sorted(p)) for p in zip(ids, ids[1:], strict=False)))


def counts_frozenset_keys(ids):  # the same mistake with sets as keys
    return dict(Counter(frozenset(p) for p in zip(ids, ids[1:], strict=False)))


def counts_crash_on_empty(ids):
    return Counter((ids[i], ids[i + 1]) for i in range(len(ids) - 1)) if ids[0] is not None else {}


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (counts_missing_last, "漏了最后一对"),
        (counts_step_two, "重叠"),
        (counts_wrap_around, "首尾相接"),
        (counts_set, "没有计数"),
        (counts_list_keys, "二元组"),
        (counts_list_of_pairs, "应返回字典.*不只是列出相邻对"),
        (counts_most_common, "most_common\\(\\) 把计数排成了"),
        (counts_crash_on_empty, r"ids=\[\].*IndexError"),
        (counts_reversed, r"顺序反了.*zip\(ids, ids\[1:\]\)"),
        (counts_skipping_repeats, r"\(a, a\) 后跳过了一个位置"),
        (counts_unordered, r"把 \(a, b\) 和 \(b, a\) 当成了同一对"),
        (counts_frozenset_keys, r"键是集合.*有序"),
    ],
)
def test_pair_counts_rejects_typical_mistakes(fn, keyword, capsys):
    assert_rejects(bx.check_pair_counts, fn, keyword, capsys)


# --- merging one pair ----------------------------------------------------------------------------------------


def merge_while(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i : i + 2] == list(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_recursive(ids, pair, new_id):
    if len(ids) < 2:
        return list(ids)
    if (ids[0], ids[1]) == pair:
        return [new_id, *merge_recursive(ids[2:], pair, new_id)]
    return [ids[0], *merge_recursive(ids[1:], pair, new_id)]


def merge_skip_flag(ids, pair, new_id):  # the right version of the one above
    out, skip = [], False
    for i, x in enumerate(ids):
        if skip:
            skip = False
        elif i + 1 < len(ids) and (x, ids[i + 1]) == pair:
            out.append(new_id)
            skip = True
        else:
            out.append(x)
    return out


def merge_tuple_result(ids, pair, new_id):
    return tuple(merge_while(ids, pair, new_id))


@pytest.mark.parametrize("fn", [merge_while, merge_recursive, merge_tuple_result, merge_skip_flag])
def test_merge_pair_accepts_correct_versions(fn, capsys):
    assert_passes(bx.check_merge_pair, fn, capsys)


def merge_skeleton(ids, pair, new_id):
    pass


def test_merge_pair_skeleton(capsys):
    assert_skeleton(bx.check_merge_pair, merge_skeleton, capsys)


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2 :]
    return list(ids)


def merge_no_skip(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        out.append(new_id if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair else ids[i])
    return out


def merge_for_range_no_skip(ids, pair, new_id):  # learner test 44b: no skip, last id dropped
    return [new_id if (ids[i], ids[i + 1]) == pair else ids[i] for i in range(len(ids) - 1)]


def merge_first_id_only(ids, pair, new_id):  # learner test 44b: ids[i] == pair[0] alone
    out, i = [], 0
    while i < len(ids):
        if ids[i] == pair[0] and i + 1 < len(ids):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_right_to_left(ids, pair, new_id):
    return merge_while(ids[::-1], pair[::-1], new_id)[::-1]


def merge_drops_tail(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_list_slice_vs_tuple(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i : i + 2] == pair:  # a list never equals a tuple
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_in_place(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i : i + 2] = [new_id]
        i += 1
    return ids


def merge_same_list_when_absent(ids, pair, new_id):  # learner test 18b: no copy when nothing merges
    if pair not in set(zip(ids, ids[1:], strict=False)):
        return ids
    return merge_while(ids, pair, new_id)


def merge_by_string_replace(ids, pair, new_id):  # learner test 19: digits merge across ids
    text = " ".join(map(str, ids)).replace(f"{pair[0]} {pair[1]}", str(new_id))
    return [int(t) for t in text.split()]


def merge_misses_final_pair(ids, pair, new_id):  # learner test 20b: i + 2 < len(ids)
    out, i = [], 0
    while i < len(ids):
        if i + 2 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_look_behind(ids, pair, new_id):  # learner test 20b: [7, 7, 7] -> [99, 99]
    out = []
    for i, x in enumerate(ids):
        if i + 1 < len(ids) and (x, ids[i + 1]) == pair:
            out.append(new_id)
        elif i > 0 and (ids[i - 1], x) == pair:
            continue
        else:
            out.append(x)
    return out


def merge_look_behind_first(ids, pair, new_id):  # the same test made first: [7, 7, 7] -> [99]
    out = []
    for i, x in enumerate(ids):
        if i > 0 and ids[i - 1] == pair[0] and x == pair[1]:
            continue
        out.append(new_id if ids[i : i + 2] == list(pair) else x)
    return out


def merge_tail_twice(ids, pair, new_id):  # a skip flag, then ids[-1] appended unconditionally
    out, skip = [], False
    for i in range(len(ids) - 1):
        if skip:
            skip = False
        elif (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            skip = True
        else:
            out.append(ids[i])
    return out + ids[-1:]


def merge_by_padded_string_replace(ids, pair, new_id):  # learner test 25b: a trailing space
    text = " ".join(map(str, ids)) + " "
    return [int(t) for t in text.replace(f"{pair[0]} {pair[1]} ", f"{new_id} ").split()]


def merge_returns_string(ids, pair, new_id):
    return " ".join(map(str, merge_while(ids, pair, new_id)))


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (merge_first_only, "只替换了第一次出现"),
        (merge_no_skip, "i\\+2"),
        (merge_right_to_left, "从右往左"),
        (merge_for_range_no_skip, "有两处错：合并之后没有跳过"),
        (merge_first_id_only, "只比较了 ids\\[i\\] == pair\\[0\\]"),
        (merge_drops_tail, "漏了最后一个元素"),
        (merge_list_slice_vs_tuple, "没有做任何替换"),
        (merge_in_place, "改动了传进来的 ids"),
        (merge_returns_string, "应返回一个列表"),
        (merge_same_list_when_absent, "返回的就是传进来的 ids 这个列表本身"),
        (merge_by_string_replace, "拼成字符串再 replace"),
        (merge_by_padded_string_replace, "既不是原来的 id，也不是 new_id：把 id 用空格拼成字符串"),
        (merge_misses_final_pair, "漏了结尾的那一对"),
        (merge_look_behind, r"得到 \[new_id, new_id\]"),
        (merge_look_behind_first, r"得到 \[new_id\]，"),
        (merge_tail_twice, "最后一个元素放了两次"),
    ],
)
def test_merge_pair_rejects_typical_mistakes(fn, keyword, capsys):
    assert_rejects(bx.check_merge_pair, fn, keyword, capsys)


# --- one training step ----------------------------------------------------------------------------------------


def step_min(ids, new_id):
    counts = counts_loop(ids)
    pair = min(counts, key=lambda p: (-counts[p], p))
    return pair, merge_while(ids, pair, new_id)


def step_sorted(ids, new_id):
    counts = Counter(zip(ids, ids[1:], strict=False))
    best = max(counts.values())
    pair = sorted(p for p, n in counts.items() if n == best)[0]
    return pair, merge_recursive(ids, pair, new_id)


@pytest.mark.parametrize("fn", [step_min, step_sorted])
def test_bpe_merge_accepts_correct_versions(fn, capsys):
    assert_passes(bx.check_bpe_merge, fn, capsys)


def step_skeleton(ids, new_id):
    raise NotImplementedError


def test_bpe_merge_skeleton(capsys):
    assert_skeleton(bx.check_bpe_merge, step_skeleton, capsys)


def step_first_of_ties(ids, new_id):
    counts = Counter(zip(ids, ids[1:], strict=False))
    pair = max(counts, key=counts.get)  # ties: the pair seen first
    return pair, merge_while(ids, pair, new_id)


def step_largest_of_ties(ids, new_id):  # learner test: ties broken toward the largest pair
    counts = Counter(zip(ids, ids[1:], strict=False))
    pair = max(counts, key=lambda p: (counts[p], p))
    return pair, merge_while(ids, pair, new_id)


def test_bpe_tie_hint_names_the_one_liner_only_when_it_is_the_code(capsys):
    """The remark on max(counts, key=counts.get) fits only code that picks the pair seen first."""
    largest = rejection(bx.check_bpe_merge, step_largest_of_ties)
    first = rejection(bx.check_bpe_merge, step_first_of_ties)
    assert "并列时约定取最小的一对" in largest and "最先出现" not in largest, largest
    assert "你在并列时取了最大的一对" in largest, largest  # learner test 25b
    assert "最先出现的一对" in first, first


def step_first_id_ties(ids, new_id):  # learner test 45d: ties broken on the first id alone
    counts = tc.tokenizer.count_pairs(ids)
    pair = min(counts, key=lambda p: (-counts[p], p[0]))
    return pair, merge_while(ids, pair, new_id)


def step_most_common(ids, new_id):  # learner test 45d: Counter.most_common(1), first seen
    pair = Counter(tc.tokenizer.count_pairs(ids)).most_common(1)[0][0]
    return pair, merge_while(ids, pair, new_id)


def test_bpe_tie_on_the_first_id_only_is_named(capsys):
    message = rejection(bx.check_bpe_merge, step_first_id_ties)
    assert "并列时约定取最小的一对" in message, message
    message = rejection(bx.check_bpe_merge, step_most_common)
    assert "most_common(1)" in message, message


def step_counts_skipping_repeats(ids, new_id):  # learner test 18b: right tie-break, wrong count
    counts = counts_skipping_repeats(ids)
    pair = min(counts, key=lambda p: (-counts[p], p))
    return pair, merge_while(ids, pair, new_id)


def test_bpe_wrong_count_is_not_blamed_on_the_tie_break(capsys):
    """Learner test 18b: a pick that ties by the true counts on one input, from a
    count that skips overlapping repeats, is diagnosed as the count, not the tie-break."""
    message = rejection(bx.check_bpe_merge, step_counts_skipping_repeats)
    assert "数错了的相邻对" in message and "(a, a) 后跳过了一个位置" in message, message
    assert "并列" not in message and "max(counts" not in message, message


def counts_skipping_seen_pairs(ids):  # a pair seen before: count it, skip a position
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        i += 2 if pair in counts else 1
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def step_counts_skipping_seen_pairs(ids, new_id):  # learner test 24b
    counts = counts_skipping_seen_pairs(ids)
    pair = min(counts, key=lambda p: (-counts[p], p))
    return pair, merge_while(ids, pair, new_id)


def test_bpe_tie_hidden_by_a_wrong_count_names_both_pairs(capsys):
    """Learner test 24b: on [11, 2, 1, 2, 1, 2] (2, 1) and (1, 2) both occur twice; the
    hint said "(2, 1) 却只出现 2 次" as if (1, 2) occurred more often."""
    message = rejection(bx.check_bpe_merge, step_counts_skipping_seen_pairs)
    assert "(2, 1) 与 (1, 2) 都出现 2 次，并列时取最小的一对 (1, 2)" in message, message
    assert "重叠的对也要数" in message and "却只出现" not in message, message


def step_smallest_pair_ignoring_counts(ids, new_id):  # learner test 25b
    pair = min(tc.tokenizer.count_pairs(ids))
    return pair, merge_while(ids, pair, new_id)


def test_bpe_pick_that_ignores_the_counts_is_told_to_compare_counts(capsys):
    message = rejection(bx.check_bpe_merge, step_smallest_pair_ignoring_counts)
    assert "与次数无关" in message and "min(counts)" in message, message
    assert "max(counts, key=counts.get)" not in message, message  # the text forbids it (ties)


def step_least_frequent_pair(ids, new_id):  # min where max was meant
    counts = tc.tokenizer.count_pairs(ids)
    pair = min(counts, key=counts.get)
    return pair, merge_while(ids, pair, new_id)


def test_bpe_pick_of_a_rarer_pair_is_told_to_compare_counts(capsys):
    message = rejection(bx.check_bpe_merge, step_least_frequent_pair)
    assert "却只出现" in message and "选的时候要先比次数" in message, message


def step_returns_input(ids, new_id):  # learner test 18b: the merge computed, its result dropped
    pair, _ = step_min(ids, new_id)
    return pair, ids


def step_merge_does_nothing(ids, new_id):
    pair, _ = step_min(ids, new_id)
    return pair, merge_list_slice_vs_tuple(ids, pair, new_id)


def test_bpe_unmerged_result_gets_its_own_hint(capsys):
    """Learner test 18b: new_ids equal to ids is told as such, with the step's own
    two-argument call and not the pair-merge checker's tuple-vs-list hint."""
    returned = rejection(bx.check_bpe_merge, step_returns_input)
    assert "传进来的 ids 本身" in returned and "return pair, new_ids" in returned, returned
    nothing = rejection(bx.check_bpe_merge, step_merge_does_nothing)
    assert "一处也没合并" in nothing and "本身" not in nothing, nothing
    for message in (returned, nothing):
        assert "99)" in message and ", 99)" in message and "), 99)" not in message, message
        assert "元组" not in message, message


def step_least_frequent(ids, new_id):
    counts = Counter(zip(ids, ids[1:], strict=False))
    pair = min(counts, key=lambda p: (counts[p], p))
    return pair, merge_while(ids, pair, new_id)


def step_no_skip(ids, new_id):
    pair, _ = step_min(ids, new_id)
    return pair, merge_no_skip(ids, pair, new_id)


def step_list_pair(ids, new_id):
    """The right pair as a list: the page's next cell compares it with tc.BPETokenizer's tuples and fails."""
    pair, new_ids = step_min(ids, new_id)
    return list(pair), new_ids


def step_swapped(ids, new_id):  # learner test: (new_ids, pair)
    pair, new_ids = step_min(ids, new_id)
    return new_ids, pair


def step_string_replace(ids, new_id):
    pair, _ = step_min(ids, new_id)
    return pair, merge_by_string_replace(ids, pair, new_id)


def step_one_value(ids, new_id):
    return step_min(ids, new_id)[1]


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (step_first_of_ties, "并列时约定取最小的一对"),
        (step_least_frequent, "出现次数最多"),
        (step_no_skip, "i\\+2"),
        (step_one_value, r"\(pair, new_ids\)"),
        (step_list_pair, "pair 是 list.*应是元组"),
        (step_swapped, "两项顺序反了"),
        (step_string_replace, "拼成字符串再 replace"),
    ],
)
def test_bpe_merge_rejects_typical_mistakes(fn, keyword, capsys):
    assert_rejects(bx.check_bpe_merge, fn, keyword, capsys)


def test_checker_refuses_a_called_function(capsys):
    with pytest.raises(tc.exercises.ExerciseError, match="函数"):
        bx.check_pair_counts(counts_loop([1, 2]))
