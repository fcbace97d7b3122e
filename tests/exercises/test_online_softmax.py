"""check_online_softmax (exercise 4.4, the bug hunt): blockwise attention merged by
log-sum-exp, or written as the (c, ℓ, o) recurrence of section 4.1.4, passes when right;
each slip of the merge gets the hint that names it."""

import math

import pytest
import torch

from transformer_course.exercises import check_online_softmax, online_softmax

from .support import (
    assert_every_hint_reached,
    assert_passes,
    assert_rejects,
    assert_skeleton,
    online_softmax_reference,
    rejection,
)


def merged(mistake=None):
    """The page's function (exercise 4.4) with its bug fixed, or with one mistake."""

    def fn(q, k, v, block=4):
        if mistake == "equal_weights":  # learner test 64: the blocks averaged alike
            scale = math.sqrt(q.size(-1))
            parts = [
                torch.softmax(q @ k[..., i : i + block, :].mT / scale, -1) @ v[..., i : i + block, :]
                for i in range(0, k.size(-2), block)
            ]
            return sum(parts) / len(parts)
        lse = torch.full(q.shape[:-1] + (1,), 0.0 if mistake == "lse_zero" else -math.inf)
        o = torch.zeros(q.shape[:-1] + (v.size(-1),))
        end = k.size(-2) - block + 1 if mistake == "partial_dropped" else k.size(-2)
        for start in range(0, end, block):
            s = q @ k[..., start : start + block, :].mT / (1 if mistake == "unscaled" else math.sqrt(q.size(-1)))
            lse_j = torch.logsumexp(s, -1, keepdim=True)
            o_j = torch.softmax(s, -1) @ v[..., start : start + block, :]
            if mistake in ("the page's bug", "renormalised"):
                lse_new = torch.maximum(lse, lse_j)
            elif mistake == "added":
                lse_new = lse + lse_j
            elif mistake == "exp_then_log":
                lse_new = torch.log(torch.exp(lse) + torch.exp(lse_j))
            else:
                lse_new = torch.logaddexp(lse, lse_j)
            if mistake == "updated_first":
                lse = lse_new
            w_old, w_new = torch.exp(lse - lse_new), torch.exp(lse_j - lse_new)
            if mistake == "swapped":
                w_old, w_new = w_new, w_old
            if mistake == "new_block_unweighted":
                w_new = 1
            if mistake == "old_unweighted":  # learner test 64: the factor left out
                w_old = 1
            o = w_old * o + w_new * o_j
            if mistake == "renormalised":  # hides the page's bug for one merge
                o = o / (w_old + w_new)
            lse = lse_j if mistake == "lse_not_kept" else lse_new
        return o

    return fn


def by_hand_max(q, k, v, block=4):  # right: ln(e^a + e^b) with the maximum taken out
    lse = torch.full(q.shape[:-1] + (1,), -math.inf)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),))
    for start in range(0, k.size(-2), block):
        s = q @ k[..., start : start + block, :].mT / math.sqrt(q.size(-1))
        lse_j = torch.logsumexp(s, -1, keepdim=True)
        m = torch.maximum(lse, lse_j)
        lse_new = m + torch.log(torch.exp(lse - m) + torch.exp(lse_j - m))
        o = torch.exp(lse - lse_new) * o + torch.exp(lse_j - lse_new) * (
            torch.softmax(s, -1) @ v[..., start : start + block, :]
        )
        lse = lse_new
    return o


def in_float64(q, k, v, block=4):  # right (learner test 58: was a raw RuntimeError)
    return merged()(q.double(), k.double(), v.double(), block)


@pytest.mark.parametrize("right", [merged(), by_hand_max, online_softmax_reference, in_float64])
def test_right_answers_pass(right, capsys):
    assert_passes(check_online_softmax, right, capsys)


def test_skeleton(capsys):
    def skeleton(q, k, v, block=4):
        raise NotImplementedError

    assert_skeleton(check_online_softmax, skeleton, capsys)


MISTAKES = [
    ("the page's bug", "lse_new = torch.logaddexp(lse, lse_j)"),  # outside the bug hunt: the fix
    ("renormalised", "但 lse 仍是两者的最大值"),
    ("added", "对数相加是两个和相乘"),
    ("exp_then_log", "只有分数上百的那一组不对"),  # the general hint by symptom
    ("updated_first", "先更新了 lse"),
    ("swapped", "两部分的权重互换了"),
    ("unscaled", "分数没有除以 √D"),  # learner test 25b: was "缩放与最后的 o / ℓ"
    # learner test 59: range(0, S - block + 1, block) was told "校正了两次"
    ("partial_dropped", "不满的块被丢掉了"),
    ("new_block_unweighted", "值全为 1 时输出大于 1"),  # the general hint by symptom
    ("lse_zero", "lse 的初值是 0"),  # learner test 63: was "问题在合并上"
    ("lse_not_kept", "lse 没有累积"),  # learner test 64: was "问题在合并上"
    ("equal_weights", "等权平均"),  # learner test 64
    ("old_unweighted", "漏乘了这个因子"),  # learner test 64: was told "lse updated first"
]


@pytest.mark.parametrize(("mistake", "keyword"), MISTAKES)
def test_each_mistake_gets_its_hint(mistake, keyword, capsys):
    assert_rejects(check_online_softmax, merged(mistake), keyword, capsys)


def test_every_listed_mistake_is_reached(capsys):
    rejects = [pytest.param(check_online_softmax, merged(m), k) for m, k in MISTAKES]
    assert_every_hint_reached({"_MISTAKES": online_softmax._MISTAKES}, rejects, capsys)


def test_a_naive_exp_elsewhere_is_told_by_its_symptom(capsys):
    def exp_weights(q, k, v, block=4):  # the right lse, but weights e^lse / e^lse_new
        lse = torch.full(q.shape[:-1] + (1,), -math.inf)
        o = torch.zeros(q.shape[:-1] + (v.size(-1),))
        for start in range(0, k.size(-2), block):
            s = q @ k[..., start : start + block, :].mT / math.sqrt(q.size(-1))
            lse_j = torch.logsumexp(s, -1, keepdim=True)
            lse_new = torch.logaddexp(lse, lse_j)
            o_j = torch.softmax(s, -1) @ v[..., start : start + block, :]
            o = (torch.exp(lse) * o + torch.exp(lse_j) * o_j) / torch.exp(lse_new)
            lse = lse_new
        return o

    assert_rejects(check_online_softmax, exp_weights, "只有分数上百的那一组不对", capsys)


def test_the_recurrence_without_the_denominators_fix_is_told_by_its_symptom(capsys):
    def ell_not_rescaled(q, k, v, block=4):  # the bug this exercise printed before
        c = torch.full(q.shape[:-1] + (1,), -math.inf)
        ell = torch.zeros_like(c)
        o = torch.zeros(q.shape[:-1] + (v.size(-1),))
        for start in range(0, k.size(-2), block):
            s = q @ k[..., start : start + block, :].mT / math.sqrt(q.size(-1))
            c_new = torch.maximum(c, s.amax(-1, keepdim=True))
            p = torch.exp(s - c_new)
            ell = ell + p.sum(-1, keepdim=True)
            o = o * torch.exp(c - c_new) + p @ v[..., start : start + block, :]
            c = c_new
        return o / ell

    assert_rejects(check_online_softmax, ell_not_rescaled, "值全为 1 时输出小于 1", capsys)


def test_full_matrix_attention_is_not_the_fix(capsys):  # learner test 59: it passed
    def full(q, k, v, block=4):
        return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v

    assert_rejects(check_online_softmax, full, "整矩阵", capsys)


def test_in_the_bug_hunt_the_pages_bug_is_told_unchanged_not_fixed():
    message = rejection(lambda c: check_online_softmax(c, exercise="4.4"), merged("the page's bug"))
    assert "那一行还没改" in message and "logaddexp" not in message, message


def test_in_the_bug_hunt_the_bug_hidden_by_dividing_is_not_fixed_for_the_learner():
    message = rejection(lambda c: check_online_softmax(c, exercise="4.4"), merged("renormalised"))
    assert "有 bug 的那一行还在" in message and "logaddexp" not in message, message


def test_a_wrong_shape_is_named(capsys):
    assert_rejects(check_online_softmax, lambda q, k, v, block=4: q.sum(-1), "输出应是形状", capsys)
