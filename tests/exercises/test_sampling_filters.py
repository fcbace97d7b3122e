"""The top-p (nucleus) filter exercise.

Correct filters written in other styles pass with one "✓" line, a skeleton is
"尚未实现", and hand-written wrong filters are rejected with a Chinese hint that names
the mistake."""

import math

import pytest
import torch

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import sampling_filters

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection

check = ex.check_top_p_filter


# correct filters in other styles
# ---------------------------------------------------------------------------


def shifted_removal(logits, p):  # remove where the inclusive sum exceeds p, shifted right by one
    sorted_logits, idx = torch.sort(logits, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    remove = cum > p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))


def threshold_style(logits, p):  # the last kept logit as a threshold
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    probs = torch.softmax(sorted_logits, dim=-1)
    n_keep = ((probs.cumsum(-1) - probs) < p).sum(-1, keepdim=True)
    return torch.where(logits < sorted_logits.gather(-1, n_keep - 1), -math.inf, logits)


def per_row_loop(logits, p):  # plain Python over the flattened rows
    flat = logits.reshape(-1, logits.size(-1))
    out = torch.full_like(flat, float("-inf"))
    for r in range(flat.size(0)):
        probs = torch.softmax(flat[r], dim=0)
        total = 0.0
        for j in torch.argsort(probs, descending=True).tolist():
            out[r, j] = flat[r, j]
            total += float(probs[j])
            if total >= p:
                break
    return out.reshape(logits.shape)


def log_probs_filtered(logits, p):  # log-probabilities (a per-row shift), -inf outside
    probs, idx = torch.sort(torch.softmax(logits, -1), descending=True)
    keep_sorted = probs.cumsum(-1) - probs < p
    keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
    return torch.log_softmax(logits, -1).masked_fill(~keep, -math.inf)


def make_finite_fill(fill):
    """Learner test 31c (F1, F3): the right nucleus, a finite fill instead of -inf."""

    def finite_fill(logits, p):
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, probs.cumsum(-1) - probs < p)
        return logits.masked_fill(~keep, fill(logits))

    return finite_fill


def log_softmax_of_filtered(logits, p):  # learner test 24c: the page's text allows a per-row shift
    sorted_logits, idx = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, -1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, probs.cumsum(-1) - probs < p)
    return torch.log_softmax(logits.masked_fill(~keep, -math.inf), -1)


def ascending_tail_removal(logits, p):  # sort ascending, drop the tail whose mass is <= 1 - p
    sorted_logits, idx = torch.sort(logits, descending=False)
    remove = torch.softmax(sorted_logits, -1).cumsum(-1) <= 1 - p
    remove[..., -1] = False
    return logits.masked_fill(remove.scatter(-1, idx, remove), -math.inf)


@pytest.mark.parametrize(
    "fn", [threshold_style, per_row_loop, log_probs_filtered, log_softmax_of_filtered, ascending_tail_removal]
)
def test_accepts_correct_styles(fn, capsys):
    assert_passes(check, fn, capsys)


def non_strict(logits, p):  # the token whose preceding mass already equals p is kept
    sorted_logits, idx = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    keep_sorted = (probs.cumsum(-1) - probs) <= p
    return logits.masked_fill(~torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted), -math.inf)


@pytest.mark.parametrize("fn", [non_strict, shifted_removal])
def test_non_strict_rule_is_rejected_naming_it(fn, capsys):
    """`<= p` and the classic `cum > p` shifted right differ from the package only when
    a token's preceding mass equals p exactly; the exercise's text defines the smallest
    set (learner tests 18c and 19 counted the former ✓ with a reminder as a miss)."""
    message = rejection(check, fn)
    assert "多留了一个词元" in message and "<= 而不是 <" in message, message
    assert "✓" not in capsys.readouterr().out


def test_accepts_the_package_style_written_out(capsys):
    def solution(logits, p):
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        keep_sorted = probs.cumsum(dim=-1) - probs < p
        keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
        return logits.masked_fill(~keep, float("-inf"))

    assert_passes(check, solution, capsys, exercise="5.15")


def test_skeleton(capsys):
    def my_top_p_filter(logits, p):
        pass

    assert_skeleton(check, my_top_p_filter, capsys)


def test_calling_the_package_is_refused(capsys):
    assert_rejects(check, lambda logits, p: tc.top_p_filter(logits, p), "tc.top_p_filter", capsys)


def test_the_rule_the_checker_follows_is_the_packages():
    """Every graded case: the kept set is what tc.top_p_filter keeps, no mass within 1e-3
    of p (p < 1), and the first row of the first case keeps only its top token."""
    cases = sampling_filters._cases()
    for case, logits, p in cases:
        if case == sampling_filters.TIE_CASE:
            probs = torch.sort(torch.softmax(logits, -1), descending=True).values
            assert float((probs.cumsum(-1) - probs)[0, 2]) == p  # exactly, in float32 too
            assert float((probs.float().cumsum(-1) - probs.float())[0, 2]) == p
            assert int(torch.isfinite(tc.top_p_filter(logits, p)).sum()) == 2
            assert int(torch.isfinite(tc.top_p_filter(logits.float(), p)).sum()) == 2
            assert int(non_strict(logits, p).isfinite().sum()) == 3
        elif p < 1.0:
            probs = torch.sort(torch.softmax(logits, -1), descending=True).values
            assert float(((probs.cumsum(-1) - probs) - p).abs().min()) > 1e-3
    first = cases[0][1]
    assert torch.isfinite(tc.top_p_filter(first, cases[0][2]))[0].sum() == 1
    assert any(p == 1.0 for _, _, p in cases)
    assert any(logits.dim() == 3 for _, logits, _ in cases)


# wrong filters
# ---------------------------------------------------------------------------


def make_filter(mistake):
    def fn(logits, p):
        descending = mistake != "ascending"
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=descending)
        if mistake in ("unsorted", "unsorted_cumsum"):  # learner test 20c: the latter scatters
            sorted_logits = logits
        probs = torch.softmax(sorted_logits, dim=-1)
        weights = sorted_logits if mistake == "cumsum_logits" else probs
        cum = weights.cumsum(-1)
        if mistake in ("inclusive", "inclusive_no_first"):
            keep_sorted = cum <= p
            if mistake == "inclusive":
                keep_sorted[..., 0] = True
        elif mistake == "double_shift":
            keep_sorted = torch.ones_like(cum, dtype=torch.bool)
            keep_sorted[..., 1:] = (cum - weights)[..., :-1] < p
        elif mistake == "shift_in_place":  # the shifted removal without .clone()
            remove = cum > p
            remove[..., 1:] = remove[..., :-1]
            remove[..., 0] = False
            keep_sorted = ~remove
        else:
            keep_sorted = cum - weights < p
        if mistake in ("unsorted", "no_scatter"):
            keep = keep_sorted
        elif mistake == "gather":  # the sorted marks gathered by idx, not scattered
            keep = keep_sorted.gather(-1, idx)
        else:
            keep = torch.zeros_like(keep_sorted).scatter(-1, idx, keep_sorted)
        if mistake == "sorted_returned":
            return sorted_logits.masked_fill(~keep_sorted, float("-inf"))
        if mistake == "zeros":
            return logits.masked_fill(~keep, 0.0)
        if mistake in ("probs", "probs_renormalised"):
            out = torch.softmax(logits, -1) * keep
            return out / out.sum(-1, keepdim=True) if mistake == "probs_renormalised" else out
        if mistake == "scaled":
            return (logits / 0.7).masked_fill(~keep, float("-inf"))
        if mistake == "nan":
            return logits.masked_fill(~keep, float("-inf")) * keep  # -inf * 0 = NaN
        if mistake == "bool":
            return keep
        if mistake == "dim1":
            return logits.masked_fill(~torch.zeros_like(keep_sorted).scatter(1, idx, keep_sorted), -math.inf)
        return logits.masked_fill(~keep, float("-inf"))

    fn.__name__ = f"top_p_{mistake}"
    return fn


def softmax_over_the_batch(logits, p):  # learner test 19, 5.15: softmax(logits, 0)
    probs = logits.softmax(0)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < p
    return logits.masked_fill(~torch.zeros_like(keep).scatter(-1, order, keep), float("-inf"))


def cumsum_over_the_batch(logits, p):  # the sorted probabilities summed down the rows
    sorted_logits, order = logits.sort(-1, descending=True)
    probs = sorted_logits.softmax(-1)
    keep = (probs.cumsum(0) - probs) < p
    return logits.masked_fill(~torch.zeros_like(keep).scatter(-1, order, keep), float("-inf"))


def keep_above_one_minus_p(logits, p):  # a probability threshold, not a nucleus
    return logits.masked_fill(logits.softmax(-1) < 1 - p, float("-inf"))


def one_count_for_the_batch(logits, p):  # learner test 19, 5.15: int() over all rows
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(-1, descending=True)
    k = int(((sorted_probs.cumsum(-1) - sorted_probs) < p).sum())
    out = torch.full_like(logits, float("-inf"))
    out[..., order[..., :k]] = logits[..., order[..., :k]]
    return out


def one_threshold_for_the_batch(logits, p):  # the smallest kept probability of any row
    probs = logits.softmax(-1)
    sorted_probs, _ = probs.sort(-1, descending=True)
    smallest = sorted_probs[(sorted_probs.cumsum(-1) - sorted_probs) < p].min()
    return logits.masked_fill(probs < smallest, float("-inf"))


def filtered_in_place(logits, p):  # learner test 27c, F1: the nanoGPT idiom edits the caller's logits
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    remove_sorted = (probs.cumsum(-1) - probs) >= p
    logits[remove_sorted.scatter(-1, idx, remove_sorted)] = float("-inf")
    return logits


def masked_fill_underscore(logits, p):  # the same with masked_fill_
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, idx, probs.cumsum(-1) - probs < p)
    return logits.masked_fill_(~keep, float("-inf"))


def everything_along_dim_1(logits, p):  # learner test 27c: right on (N, V), wrong on (N, T, V)
    sorted_logits, idx = torch.sort(logits, dim=1, descending=True)
    probs = sorted_logits.softmax(1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(1, idx, (probs.cumsum(1) - probs) < p)
    return logits.masked_fill(~keep, float("-inf"))


def shifted_left(logits, p):  # learner test 27c: the classic shift, written the wrong way round
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    remove = sorted_logits.softmax(-1).cumsum(-1) > p
    remove[..., :-1] = remove[..., 1:].clone()
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))


def one_nucleus_for_the_batch(logits, p):  # learner test 38c, 5.15: all rows as one distribution
    sorted_logits, idx = torch.sort(logits.view(-1), descending=True)
    probs = torch.softmax(sorted_logits, -1)
    drop = (probs.cumsum(-1) - probs) >= p
    return logits.masked_fill(drop.scatter(-1, idx, drop).view(logits.shape), float("-inf"))


REJECTS = [
    pytest.param(check, one_nucleus_for_the_batch, "整批被当成了一个分布", id="flattened-batch"),
    pytest.param(check, filtered_in_place, "原地改动了传进来的 logits", id="index-assign-in-place"),
    pytest.param(check, masked_fill_underscore, "不带下划线的 logits.masked_fill", id="masked-fill-in-place"),
    pytest.param(check, everything_along_dim_1, "第 1 维却是位置 T", id="everything-along-dim-1"),
    pytest.param(check, shifted_left, "移反了方向", id="shifted-left"),
    pytest.param(check, softmax_over_the_batch, "softmax 沿第 0 维", id="softmax-dim-0"),
    pytest.param(check, cumsum_over_the_batch, "累加沿错了维", id="cumsum-dim-0"),
    pytest.param(check, one_count_for_the_batch, "每一行单独送进来时保留的词元都对", id="one-k-for-the-batch"),
    pytest.param(check, one_threshold_for_the_batch, "整批的一个阈值", id="one-threshold-for-the-batch"),
    pytest.param(check, make_filter("inclusive"), "少留了跨过 p 的那个词元", id="inclusive"),
    pytest.param(check, make_filter("inclusive_no_first"), "一个词元也没留下", id="inclusive-no-first"),
    pytest.param(check, make_filter("double_shift"), "多留了一个词元", id="one-extra"),
    pytest.param(check, make_filter("unsorted"), "没有按概率从大到小排序", id="unsorted"),
    pytest.param(check, make_filter("unsorted_cumsum"), "先按概率从大到小排序再累加", id="unsorted-cumsum-scattered"),
    pytest.param(check, make_filter("gather"), "用了 gather(-1, idx)", id="gather-not-scatter"),
    pytest.param(check, make_filter("shift_in_place"), "原地赋值", id="shift-in-place"),
    pytest.param(check, make_filter("ascending"), "排序方向反了", id="ascending"),
    pytest.param(check, make_filter("no_scatter"), "放回原来的位置", id="mask-in-sorted-order"),
    pytest.param(check, make_filter("sorted_returned"), "还是排好序的顺序", id="sorted-returned"),
    pytest.param(check, make_filter("cumsum_logits"), "累加的是 logits，不是概率", id="cumsum-logits"),
    pytest.param(check, make_filter("zeros"), "设成了 0", id="zeros"),
    pytest.param(check, make_finite_fill(lambda x: torch.finfo(x.dtype).min), "用 float('-inf')", id="finfo-min"),
    pytest.param(check, make_finite_fill(lambda x: -1e4), "有限的 -10000", id="minus-1e4"),
    pytest.param(check, make_finite_fill(lambda x: -1e9), "isfinite", id="minus-1e9"),
    pytest.param(check, make_filter("probs"), "没有重新归一化", id="probs"),
    pytest.param(check, make_filter("probs_renormalised"), "过滤后的概率", id="probs-renormalised"),
    pytest.param(check, make_filter("scaled"), "logits 被改了", id="scaled"),
    pytest.param(check, make_filter("nan"), "NaN", id="nan"),
    pytest.param(check, make_filter("bool"), "浮点", id="bool"),
    pytest.param(check, make_filter("dim1"), "一律写 dim=-1", id="dim1"),
]


@pytest.mark.parametrize(("checker", "candidate", "keyword"), REJECTS)
def test_rejects_with_the_mistake_named(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_probabilities_renormalised_are_not_called_unnormalised(capsys):
    message = str(pytest.raises(ex.ExerciseError, check, make_filter("probs_renormalised")).value)
    assert "没有重新归一化" not in message, message


def test_the_message_shows_the_row(capsys):
    message = str(pytest.raises(ex.ExerciseError, check, make_filter("inclusive")).value)
    assert "应保留" in message and "你保留了" in message, message


def test_every_hint_reached(capsys):
    tables = {"TOP_P_HINTS": sampling_filters.TOP_P_HINTS, "TOP_P_CRASHES": sampling_filters.TOP_P_CRASHES}
    assert_every_hint_reached(tables, REJECTS, capsys)


def test_an_empty_row_does_not_claim_the_top_token_exceeds_p(capsys):
    # learner test 20 (extra): every token below 1 - p removed, a flat row loses all;
    # its top probability (0.15) is below p, the message must not say it exceeds p
    message = rejection(check, keep_above_one_minus_p)
    assert "一个词元也没留下" in message and "已经超过 p" not in message, message


def test_a_copy_edited_in_place_is_accepted(capsys):
    """Cloning first, then editing the clone in place, leaves the caller's logits alone."""

    def clone_then_edit(logits, p):
        logits = logits.clone()
        return masked_fill_underscore(logits, p)

    assert_passes(check, clone_then_edit, capsys)
