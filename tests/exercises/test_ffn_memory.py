"""check_add_memory (exercise 4.20): one more memory in a key-value FFN. Graded here
on a memory FFN of other sizes and another τ than the page's, so the checker is seen to
use what it is given."""

import copy

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.exercises import check_add_memory

N_MEM, E, TAU = 12, 32, 0.65


@pytest.fixture(scope="module")
def memories():
    g = torch.Generator().manual_seed(3)
    keys = F.normalize(torch.randn(N_MEM, E - 1, generator=g), dim=-1)
    values = torch.randn(N_MEM, E, generator=g)
    ffn = tc.FeedForward(E, N_MEM, "relu", bias=False)
    with torch.no_grad():
        ffn.w1.weight.copy_(torch.cat([keys, -TAU * torch.ones(N_MEM, 1)], 1))
        ffn.w2.weight.copy_(values.T / (1 - TAU))
    k_new = F.normalize(torch.randn(1, E - 1, generator=g), dim=-1)
    assert (k_new @ keys.T).max() < TAU  # the new memory leaves the old ones alone
    return dict(ffn=ffn, keys=keys, values=values, k_new=k_new, v_new=torch.randn(1, E, generator=g), tau=TAU)


def add_memory(bias=False, scale=1.0, tau_used=None, activation="relu"):
    def fn(ffn, k_new, v_new, tau):
        t = tau if tau_used is None else tau_used
        E, d_ff = ffn.w1.in_features, ffn.w1.out_features
        bigger = tc.FeedForward(E, d_ff + 1, activation, bias=bias)
        with torch.no_grad():
            bigger.w1.weight.copy_(torch.cat([ffn.w1.weight, torch.cat([k_new, -t * torch.ones(1, 1)], 1)]))
            bigger.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new.T / (1 - t) * scale], 1))
        return bigger

    return fn


def slice_assign(ffn, k_new, v_new, tau):  # right (learner test 58)
    d, E = ffn.w1.weight.shape
    new = tc.FeedForward(E, d + 1, activation="relu", bias=False)
    with torch.no_grad():
        new.w1.weight[:d] = ffn.w1.weight
        new.w1.weight[d, :-1] = k_new[0]
        new.w1.weight[d, -1] = -tau
        new.w2.weight[:, :d] = ffn.w2.weight
        new.w2.weight[:, d] = v_new[0] / (1 - tau)
    return new


def scaled_row(ffn, k_new, v_new, tau):  # right: 1 / (1 − τ) moved into W₁'s new row
    grown = add_memory()(ffn, k_new, v_new, tau)
    with torch.no_grad():
        grown.w1.weight[-1] /= 1 - tau
        grown.w2.weight[:, -1] *= 1 - tau
    return grown


@pytest.mark.parametrize("right", [add_memory(), slice_assign, scaled_row])
def test_right_answers_pass(memories, right, capsys):
    assert check_add_memory(right, **memories) is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("✓"), lines


def test_skeleton(memories, capsys):
    assert check_add_memory(lambda ffn, k_new, v_new, tau: None, **memories) is None
    assert capsys.readouterr().out.startswith("尚未实现：")
    with pytest.raises(AssertionError, match="骨架"):
        check_add_memory(lambda ffn, k_new, v_new, tau: None, **memories, solution=True)


def gelu_activation(ffn, k_new, v_new, tau):  # learner test 25b: got the old-memory hint
    return add_memory(activation="gelu")(ffn, k_new, v_new, tau)


def replace_last(ffn, k_new, v_new, tau):  # learner test 25b
    new = copy.deepcopy(ffn)
    with torch.no_grad():
        new.w1.weight[-1] = torch.cat([k_new[0], -tau * torch.ones(1)])
        new.w2.weight[:, -1] = v_new[0] / (1 - tau)
    return new


def value_as_a_row(ffn, k_new, v_new, tau):  # learner test 63: v_new under W₂ as a row
    grown = tc.FeedForward(E, N_MEM + 1, "relu", bias=False)
    with torch.no_grad():
        grown.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new / (1 - tau)], 0))
    return grown


def shifted_threshold(ffn, k_new, v_new, tau):
    return add_memory(tau_used=-tau)(ffn, k_new, v_new, tau)


@pytest.mark.parametrize(
    ("answer", "keyword"),
    [
        (add_memory(bias=True), "新的 FFN 带了偏置"),  # learner test 22b
        (add_memory(scale=1 - TAU), "W₂ 的新列要除以 1 − τ"),
        (add_memory(scale=2.0), f"旧的 {N_MEM} 条取回得对，新的一条不对"),
        (gelu_activation, "激活函数是 gelu"),
        (replace_last, "要新加一个神经元"),
        (shifted_threshold, "旧记忆取回的值变了"),
        (value_as_a_row, "新列 v_new.T / (1 − τ) 的形状是 (E, 1)"),
    ],
)
def test_each_mistake_gets_its_hint(memories, answer, keyword):
    with pytest.raises(AssertionError) as info:
        check_add_memory(answer, **memories)
    assert keyword in str(info.value), info.value


def test_reading_the_pages_ffn_instead_of_the_parameter_is_named(memories):
    """learner test 30b: the page's memory_ffn (here: the ffn given to the checker) read
    from a global passed when graded only with that FFN"""

    def page_ffn(ffn, k_new, v_new, tau):
        return add_memory()(memories["ffn"], k_new, v_new, tau)

    with pytest.raises(AssertionError, match="取回的还是页面上的记忆：函数里用的是页面上的变量（如 memory_ffn"):
        check_add_memory(page_ffn, **memories)


def sized_by_the_page(ffn, k_new, v_new, tau):  # learner test: the page's n_mem (a global) for d_ff
    grown = tc.FeedForward(E, N_MEM + 1, "relu", bias=False)
    with torch.no_grad():
        grown.w1.weight.copy_(torch.cat([ffn.w1.weight, torch.cat([k_new, -tau * torch.ones(1, 1)], 1)]))
        grown.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new.T / (1 - tau)], 1))
    return grown


def test_the_pages_variables_in_place_of_the_parameters_are_named(memories):
    """learner test: a function that passed on the page's FFN but read the page's memory
    count (it crashed on the checker's own FFN: "形状对不上") or the page's memories
    (named as memory_ffn alone)"""

    def from_page_memories(ffn, k_new, v_new, tau):
        keys = torch.cat([memories["keys"], k_new])
        values = torch.cat([memories["values"], v_new])
        grown = tc.FeedForward(E, len(keys), "relu", bias=False)
        with torch.no_grad():
            grown.w1.weight.copy_(torch.cat([keys, -tau * torch.ones(len(keys), 1)], 1))
            grown.w2.weight.copy_(values.T / (1 - tau))
        return grown

    with pytest.raises(AssertionError) as info:
        check_add_memory(sized_by_the_page, **memories)
    assert "换一个 FFN 就出错" in str(info.value) and "页面上的变量" in str(info.value), info.value
    with pytest.raises(AssertionError) as info:
        check_add_memory(from_page_memories, **memories)
    assert "取回的还是页面上的记忆" in str(info.value) and "mem_keys" in str(info.value), info.value


@pytest.mark.parametrize("fixed", [TAU, 0.5, 0.6])
def test_a_hard_coded_tau_is_caught_and_not_named_as_another_value(memories, fixed):
    """learner test 58: τ = 0.5 hard-coded passed (the second τ was 0.5), and 0.6 was told
    "τ 写成了 0.7" """
    with pytest.raises(AssertionError) as info:
        check_add_memory(add_memory(tau_used=fixed), **memories)
    assert "函数没有用参数 tau" in str(info.value) and "0.7" not in str(info.value), info.value


def test_changing_ffn_in_place_is_told_and_the_given_ffn_is_kept(memories):
    """learner test 25b: zeroing w2 in place was accepted, and changing ffn in place broke
    the next (correct) attempt"""
    right = add_memory()

    def zero_w2_then_right(ffn, k_new, v_new, tau):
        with torch.no_grad():
            ffn.w2.weight.zero_()
        return right(ffn, k_new, v_new, tau)

    def grow_in_place(ffn, k_new, v_new, tau):
        grown = right(ffn, k_new, v_new, tau)
        ffn.w1, ffn.w2 = grown.w1, grown.w2
        return grown

    for changes_ffn in (zero_w2_then_right, grow_in_place):
        with pytest.raises(AssertionError, match="不要改动传入的 ffn"):
            check_add_memory(changes_ffn, **memories)
        check_add_memory(right, **memories)  # the given ffn is unchanged


@pytest.mark.parametrize(
    ("change", "error", "names"),
    [
        (dict(tau=1.0), ValueError, "tau"),
        (dict(k_new=torch.zeros(2, E - 1)), ValueError, "k_new"),
        (dict(values=None), TypeError, "values"),
        (dict(ffn=tc.FeedForward(E, N_MEM, "relu")), TypeError, "ffn"),
    ],
)
def test_bad_arguments_are_named(memories, change, error, names):
    with pytest.raises(error, match=names):
        check_add_memory(add_memory(), **{**memories, **change})
