"""Chapter 5's own checkers: the Witten-Bell interpolation of the n-gram baseline."""

import math
from collections import Counter

import pytest
import torch

from transformer_course import exercises as ex
from transformer_course.exercises import roadmap_checks

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection


def right(counts, history, c, vocab_size):
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def right_recursive(counts, history, c, vocab_size):
    """The same model written top-down, as the formula reads."""

    def p(k):
        if k < 0:
            return 1.0 / vocab_size
        after = counts[k].get(history[len(history) - k :]) if k <= len(history) else None
        if not after:
            return p(k - 1)
        n, u = sum(after.values()), len(after)
        return (after[c] + u * p(k - 1)) / (n + u)

    top = len(counts) - 1
    while top > len(history) or not counts[top].get(history[len(history) - top :]):
        if top == 0:
            return 1.0 / vocab_size
        top -= 1
    return p(top)


def skeleton(counts, history, c, vocab_size):
    pass


def no_uniform_base(counts, history, c, vocab_size):
    p = 0.0
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def escape_missing_in_denominator(counts, history, c, vocab_size):
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / total
    return p


def escape_mass_from_token_count(counts, history, c, vocab_size):
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total = sum(after.values())
        p = (after[c] + total * p) / (total + total)
    return p


def unseen_history_not_skipped(counts, history, c, vocab_size):
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :], Counter())
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def only_longest_history(counts, history, c, vocab_size):
    for k in reversed(range(min(len(counts), len(history) + 1))):
        after = counts[k].get(history[len(history) - k :])
        if after:
            total, types = sum(after.values()), len(after)
            return (after[c] + types / vocab_size) / (total + types)
    return 1 / vocab_size


def first_k_characters(counts, history, c, vocab_size):
    """Learner test: the order-k history taken from the front of ``history``."""
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[:k])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def last_k_by_negative_index(counts, history, c, vocab_size):
    """Learner test 24c: history[-k:], which is the whole history at k = 0."""
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[-k:])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def add_one_escape(counts, history, c, vocab_size):  # learner test: u(h) = 1
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        p = (after[c] + p) / (sum(after.values()) + 1)
    return p


def escape_to_uniform(counts, history, c, vocab_size):  # learner test: p_短 = 1/V at every order
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types / vocab_size) / (total + types)
    return p


def test_right_implementations_pass(capsys):
    assert_passes(ex.check_witten_bell, right, capsys)
    assert_passes(ex.check_witten_bell, right_recursive, capsys)


def test_skeleton(capsys):
    assert_skeleton(ex.check_witten_bell, skeleton, capsys)


def escape_mass_vocab_size(counts, history, c, vocab_size):  # learner test: u(h) = |V|
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        p = (after[c] + vocab_size * p) / (sum(after.values()) + vocab_size)
    return p


def unigram_skipped(counts, history, c, vocab_size):  # learner test: the loop starts at k = 1
    p = 1 / vocab_size
    for k in range(1, len(counts)):
        if k > len(history):
            break
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def back_off(counts, history, c, vocab_size):  # learner test 6b, 5.10: the longest seen history decides
    for k in range(len(counts) - 1, -1, -1):
        h = history[len(history) - k :]
        if h in counts[k] and counts[k][h][c] > 0:
            return counts[k][h][c] / (sum(counts[k][h].values()) + len(counts[k][h]))
    return 1 / vocab_size


def types_twice_in_denominator(counts, history, c, vocab_size):  # learner test 27c, 5.9: u(h) + u(h)
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        p = (after.get(c, 0) + len(after) * p) / (len(after) + len(after))
    return p


def escape_missing_in_numerator(counts, history, c, vocab_size):  # count(h c) / (count(h) + u(h)) only
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        p = after[c] / (sum(after.values()) + len(after))
    return p


def back_off_relative_frequency(counts, history, c, vocab_size):  # learner test 27c, 5.9
    for k in range(len(counts) - 1, -1, -1):
        h = history[len(history) - k :] if k <= len(history) else None
        if h in counts[k] and counts[k][h][c] > 0:
            return counts[k][h][c] / sum(counts[k][h].values())
    return 1 / vocab_size


def highest_order_skipped(counts, history, c, vocab_size):  # learner test 38c, 5.9
    p = 1.0 / vocab_size
    for k in range(min(len(counts) - 1, len(history))):
        after = counts[k].get(history[len(history) - k :])
        if not after:
            break
        u = len(after)
        p = (after[c] + u * p) / (sum(after.values()) + u)
    return p


def test_mistakes_get_their_hint(capsys):
    assert_rejects(ex.check_witten_bell, back_off, "这是回退（back-off），不是插值", capsys)
    assert_rejects(ex.check_witten_bell, back_off_relative_frequency, "这是回退（back-off），不是插值", capsys)
    assert_rejects(ex.check_witten_bell, escape_mass_vocab_size, "u(h) 写成了词表大小", capsys)
    assert_rejects(ex.check_witten_bell, unigram_skipped, "跳过了 k = 0 这一阶", capsys)
    assert_rejects(ex.check_witten_bell, highest_order_skipped, "少了最高的一阶", capsys)
    assert_rejects(ex.check_witten_bell, no_uniform_base, "均匀分布", capsys)
    assert_rejects(ex.check_witten_bell, escape_missing_in_denominator, "分母里少了 u(h)", capsys)
    assert_rejects(ex.check_witten_bell, types_twice_in_denominator, "分母写成了 u(h) + u(h)", capsys)
    assert_rejects(ex.check_witten_bell, escape_missing_in_numerator, "分子里少了 u(h)·p_短", capsys)
    assert_rejects(ex.check_witten_bell, escape_missing_in_numerator, "插值的起点 p 写成了 0", capsys)
    assert_rejects(ex.check_witten_bell, escape_mass_from_token_count, "不同字符的个数", capsys)
    assert_rejects(ex.check_witten_bell, unseen_history_not_skipped, "没见过的历史", capsys)
    assert_rejects(ex.check_witten_bell, only_longest_history, "交叉熵", capsys)
    assert_rejects(ex.check_witten_bell, first_k_characters, "history[len(history) - k:]", capsys)
    assert_rejects(ex.check_witten_bell, last_k_by_negative_index, "history[-0:]", capsys)
    assert_rejects(ex.check_witten_bell, add_one_escape, "u(h) 写成了 1", capsys)
    assert_rejects(ex.check_witten_bell, escape_to_uniform, "每一阶都退回到均匀分布", capsys)
    message = rejection(ex.check_witten_bell, first_k_characters)
    assert "history[:k]" in message and "不同字符的个数" not in message, message


def indexes(counts, history, c, vocab_size):  # counts[k][h]: a KeyError on an unseen history
    p = 1 / vocab_size
    for k in range(min(len(counts), len(history) + 1)):
        after = counts[k][history[len(history) - k :]]
        total, types = sum(after.values()), len(after)
        p = (after[c] + types * p) / (total + types)
    return p


def test_a_missing_history_key_is_explained(capsys):
    assert_rejects(ex.check_witten_bell, indexes, "counts[k].get", capsys)


def test_witten_bell_hints_all_reached(capsys):
    mutants = (
        escape_mass_vocab_size, unigram_skipped, escape_mass_from_token_count, first_k_characters,
        last_k_by_negative_index,
        add_one_escape, escape_to_uniform, unseen_history_not_skipped, indexes,
        escape_missing_in_denominator, types_twice_in_denominator, highest_order_skipped,
    )  # fmt: skip
    rejects = [pytest.param(ex.check_witten_bell, fn, None) for fn in mutants]
    tables = {
        "_WITTEN_BELL_HINTS": roadmap_checks._WITTEN_BELL_HINTS,
        "_NOT_A_DISTRIBUTION_HINTS": roadmap_checks._NOT_A_DISTRIBUTION_HINTS,
        "WITTEN_BELL_CRASHES": roadmap_checks.WITTEN_BELL_CRASHES,
    }
    assert_every_hint_reached(tables, rejects, capsys)


def test_returns_a_number():
    assert math.isclose(right([{"": Counter("aab")}], "", "a", 3), (2 + 2 / 3) / 5)


# ---- the bug hunt, graded by its symptom -------------------------------------------


def fixed_attention(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def softmax_over_queries(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-2) @ V


def mask_ignored_and_unscaled(Q, K, V, attn_mask=None):
    return torch.softmax(Q @ K.transpose(-2, -1), dim=-1) @ V


def causal_but_unscaled(Q, K, V, attn_mask=None):
    scores = Q @ K.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def not_yet(Q, K, V, attn_mask=None):
    pass


def test_fixed_attention_passes(capsys):
    assert_passes(ex.check_leak_fixed, fixed_attention, capsys)


def test_leak_skeleton(capsys):
    assert_skeleton(ex.check_leak_fixed, not_yet, capsys)


def softmax_over_the_batch(Q, K, V, attn_mask=None):  # learner test 6b, 5.4
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=0) @ V


def test_nan_is_reported_as_nan(capsys):
    message = rejection(ex.check_leak_fixed, softmax_over_the_batch)
    assert "NaN" in message and "得到 nan" not in message, message


def mask_inverted(Q, K, V, attn_mask=None):  # learner test 9b, 5.4: the ~ dropped
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if attn_mask is not None:
        scores = scores.masked_fill(attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


def test_an_inverted_mask_is_named_as_in_the_attention_check(capsys):
    for checker in (ex.check_leak_fixed, ex.check_self_attention):
        assert_rejects(checker, mask_inverted, "掩码方向可能反了（True = 可以看）", capsys)


def test_the_bug_is_reported_by_its_symptom_not_its_line(capsys):
    for wrong in (softmax_over_queries, mask_ignored_and_unscaled):
        message = rejection(ex.check_leak_fixed, wrong)
        assert "症状还在" in message, message
        assert "dim" not in message and "softmax" not in message, message
    assert "✓" not in capsys.readouterr().out


def test_once_the_symptom_is_gone_the_full_attention_check_grades(capsys):
    assert_rejects(ex.check_leak_fixed, causal_but_unscaled, "√d_k", capsys)
