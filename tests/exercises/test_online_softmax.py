"""check_online_softmax (exercise 4.4, the bug hunt): hand-written fixes pass, each slip
the learner tests found gets the hint that names it."""

import math

import pytest
import torch

from transformer_course.exercises import check_online_softmax

from .support import assert_passes, assert_rejects, assert_skeleton


def online_softmax(mistake=None):
    def fn(q, k, v, block=4):
        c = torch.full(q.shape[:-1] + (1,), -math.inf)
        ell = torch.zeros_like(c)
        o = torch.zeros(q.shape[:-1] + (v.size(-1),))
        end = k.size(-2) - block + 1 if mistake == "partial_dropped" else k.size(-2)
        for start in range(0, end, block):
            s = q @ k[..., start : start + block, :].mT / (1 if mistake == "unscaled" else math.sqrt(q.size(-1)))
            block_max = s.amax(-1, keepdim=True)
            c_new = block_max if mistake == "block_max_only" else torch.maximum(c, block_max)
            fix = torch.exp(c_new - c) if mistake == "inverted" else torch.exp(c - c_new)
            p = torch.exp(s - (s.amax(-1, keepdim=True) if mistake == "block_max" else c_new))
            pv = p @ v[..., start : start + block, :]
            if mistake == "fix_after_add":  # learner test 24b
                ell = (ell + p.sum(-1, keepdim=True)) * fix
                o = (o + pv) * fix
            elif mistake == "ell_fixed_after_add":  # learner test 25b: inf, not nan
                ell = (ell + p.sum(-1, keepdim=True)) * fix
                o = o * fix + pv
            elif mistake == "ell_not_carried":  # learner test 36b: ℓ restarts every block
                ell = p.sum(-1, keepdim=True)
                o = o * fix + pv
            elif mistake in ("neither_rescaled", "the page's bug"):
                ell = ell + p.sum(-1, keepdim=True)
                o = o + pv if mistake == "neither_rescaled" else o * fix + pv
            elif mistake == "o_fixed_twice":
                ell = ell * fix + p.sum(-1, keepdim=True)
                o = (o * fix + pv) * fix
            else:
                ell = ell * fix + p.sum(-1, keepdim=True)
                o = (o if mistake == "o_not_rescaled" else o * fix) + pv
            c = c if mistake == "c_not_updated" else c_new
        return o if mistake == "no_division" else o / ell

    return fn


def normalized_running(q, k, v, block=4):  # right (learner test 58): o kept divided by ℓ
    c = torch.full(q.shape[:-1] + (1,), -math.inf)
    ell = torch.zeros_like(c)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),))
    for start in range(0, k.size(-2), block):
        s = q @ k[..., start : start + block, :].transpose(-1, -2) / math.sqrt(q.size(-1))
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix = torch.exp(c - c_new)
        p = torch.exp(s - c_new)
        ell_new = ell * fix + p.sum(-1, keepdim=True)
        o = (o * ell * fix + p @ v[..., start : start + block, :]) / ell_new
        ell, c = ell_new, c_new
    return o


def in_float64(q, k, v, block=4):  # right (learner test 58: was a raw RuntimeError)
    return online_softmax()(q.double(), k.double(), v.double(), block)


@pytest.mark.parametrize("right", [online_softmax(), normalized_running, in_float64])
def test_right_answers_pass(right, capsys):
    assert_passes(check_online_softmax, right, capsys)


def test_skeleton(capsys):
    def skeleton(q, k, v, block=4):
        raise NotImplementedError

    assert_skeleton(check_online_softmax, skeleton, capsys)


@pytest.mark.parametrize(
    ("mistake", "keyword"),
    [
        ("the page's bug", "ell = ell * fix + p.sum"),  # outside the bug hunt: the fix
        ("inverted", "校正因子倒过来了"),  # learner test 23: was sent to the score scaling
        ("o_not_rescaled", "分子 o 里旧块的项没有按新的最大值缩小"),  # learner test 22b
        ("fix_after_add", "校正放在了加法之后"),
        ("ell_fixed_after_add", "校正放在了加法之后"),
        ("o_fixed_twice", "o 被校正了两次"),
        ("unscaled", "分数没有除以 √D"),  # learner test 25b: was "缩放与最后的 o / ℓ"
        ("neither_rescaled", "ℓ 和 o 都没有乘校正因子"),
        ("ell_not_carried", "ℓ 没有跨块累加"),  # learner test 36b: was sent to o
        ("c_not_updated", "c 没有更新"),  # learner test 30b: got the generic hint
        ("block_max", "减的是这一块自己的最大值"),  # learner test 30b
        ("no_division", "最后要除以 ℓ"),  # learner test 58: was sent to the fix factor
        # learner test 59: the block's own maximum as c_new passed (nan on sharp scores)
        ("block_max_only", "只取了这一块的最大值"),
        # learner test 59: range(0, S - block + 1, block) was told "校正了两次"
        ("partial_dropped", "不满的块被丢掉了"),
    ],
)
def test_each_mistake_gets_its_hint(mistake, keyword, capsys):
    assert_rejects(check_online_softmax, online_softmax(mistake), keyword, capsys)


def test_full_matrix_attention_is_not_the_fix(capsys):  # learner test 59: it passed
    def full(q, k, v, block=4):
        return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v

    assert_rejects(check_online_softmax, full, "整矩阵", capsys)


def test_in_the_bug_hunt_the_pages_bug_is_told_unchanged_not_fixed():
    with pytest.raises(AssertionError) as info:
        check_online_softmax(online_softmax("the page's bug"), exercise="4.4")
    assert "那一行还没改" in str(info.value) and "ell * fix" not in str(info.value), info.value


def test_the_missing_division_is_not_sent_to_the_fix_factor():
    with pytest.raises(AssertionError) as info:
        check_online_softmax(online_softmax("no_division"))
    assert "fix" not in str(info.value), info.value


def test_a_wrong_shape_is_named(capsys):
    assert_rejects(check_online_softmax, lambda q, k, v, block=4: q.sum(-1), "输出应是形状", capsys)
