"""The checker protocol shared by every checker: skeletons, crashes, RNG isolation, wrong kinds of candidate.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pathlib

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import _protocol

from . import test_attention, test_blocks_gpt, test_training
from .support import assert_every_hint_reached, assert_rejects, assert_skeleton, rejection

# common protocol
# ---------------------------------------------------------------------------


def test_lazy_attribute_and_error_class():
    assert tc.exercises is ex
    assert issubclass(ex.ExerciseError, AssertionError)
    for name in ex.__all__:
        assert getattr(ex, name).__doc__


def test_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ex.check_multi_head_attention(tc.MultiHeadAttention)  # builds modules: draws from the global RNG
    assert torch.equal(torch.rand(3), expected)


def test_not_callable():
    with pytest.raises(ex.ExerciseError, match="函数或类"):
        ex.check_self_attention(torch.zeros(2))


def test_crash_names_the_line(capsys):
    def crashes(Q, K, V, attn_mask=None):
        scores = Q @ K  # forgot the transpose
        return scores

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_self_attention(crashes)
    msg = str(info.value)
    assert "运行出错" in msg and "scores = Q @ K" in msg and "形状" in msg


def test_traceback_shows_only_the_checker_call(capsys):
    def wrong(Q, K, V, attn_mask=None):
        return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0] * 2

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_self_attention(wrong)
    package = pathlib.Path(ex.__file__).parent
    inner = [entry.frame.code.name for entry in info.traceback if pathlib.Path(entry.frame.code.path).parent == package]
    assert inner == ["check"], inner  # the @checker wrapper, hidden by IPython/pytest


def test_skeleton_raising_not_implemented(capsys):
    def todo(Q, K, V, attn_mask=None):
        raise NotImplementedError

    assert_skeleton(ex.check_self_attention, todo, capsys)


def test_learner_copies_keep_shared_inputs_shared():
    # f(x, x, x) is self-attention: the copies the learner gets must alias the same way,
    # and the caller's tensors never change
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    x0 = x.clone()
    seen = []

    def scale_first(a, b, c, d):
        a.mul_(2)
        seen.append((a, b, c, d))
        return a

    _protocol.run_learner(scale_first, x, x, y, 3, what="f")
    a, b, c, d = seen[0]
    assert a is b and a is not c and d == 3
    assert torch.equal(b, 2 * x0) and torch.equal(x, x0)


def test_unexpected_return_value_gives_a_hint(capsys):
    class Odd(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
                setattr(self, n, nn.Linear(d_model, d_model))

        def forward(self, Q, K, V, attn_mask=None):
            return (Q, K, V)  # three values

    assert_rejects(ex.check_multi_head_attention, Odd, "torch.Tensor", capsys)


def test_instance_instead_of_class():
    with pytest.raises(ex.ExerciseError, match="类本身"):
        ex.check_multi_head_attention(tc.MultiHeadAttention(12, 3))


def _done(Q, K, V, attn_mask=None):
    return tc.scaled_dot_product_attention(Q, K, V, attn_mask)[0]


def _todo(L):
    pass


def test_progress_by_exercise_number(capsys):
    _protocol.RESULTS.clear()

    def wrong(Q, K, V, attn_mask=None):
        return _done(Q, K, V, attn_mask) * 2

    ex.check_self_attention(_done, exercise="5.10")
    ex.check_causal_mask(_todo, exercise="5.2")
    with pytest.raises(ex.ExerciseError):
        ex.check_self_attention(wrong, exercise="4.3")
    ex.check_self_attention(_done, solution=True, exercise="4.3")  # solutions are not counted
    ex.check_self_attention(_done)  # no number: not counted
    capsys.readouterr()
    ex.progress(5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "练习：1 道通过，1 道尚未实现，0 道未通过（共 2 道）", lines
    assert lines[1].startswith("  ✓ 练习 5.10 ") and "done" in lines[1], lines
    assert lines[2] == "  … 尚未实现：练习 5.2", lines
    ex.progress()
    out = capsys.readouterr().out
    assert "✗ 练习 4.3" in out and "未通过" in out
    _protocol.RESULTS.clear()
    ex.progress()
    assert "还没有运行过" in capsys.readouterr().out


def test_progress_counts_an_exercise_with_two_checkers_once(capsys):
    _protocol.RESULTS.clear()

    ex.check_self_attention(_done, exercise="2.5")
    ex.check_causal_mask(_todo, exercise="2.5")
    ex.check_self_attention(_done, exercise="2.6")
    capsys.readouterr()
    ex.progress(2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "练习：1 道通过，1 道尚未实现，0 道未通过（共 2 道，3 项检查）", lines
    assert len(lines) == 3, lines  # 2.5 is half done, so it is listed as a skeleton
    assert lines[2] == "  … 尚未实现：练习 2.5", lines
    _protocol.RESULTS.clear()


def test_crash_message_quotes_the_learner(capsys):
    def crashes(Q, K, V, attn_mask=None):
        return Q.undefined_method()

    message = str(pytest.raises(ex.ExerciseError, ex.check_self_attention, crashes).value)
    assert "AttributeError" in message and "undefined_method" in message
    assert "return Q.undefined_method()" in message  # the learner's own line
    assert "可能的原因" not in message  # no cause is known: no guess


def test_the_learners_line_does_not_set_off_a_cause(capsys):
    """A cause is read from the exception, not from the learner's line: a line that
    mentions batch_size or a FloatTensor says nothing about the error."""

    def crashes(Q, K, V, attn_mask=None):
        batch_size, FloatTensor = Q.shape[0], Q.undefined_size(-1)
        return batch_size, FloatTensor

    message = str(pytest.raises(ex.ExerciseError, ex.check_self_attention, crashes).value)
    assert "Q.undefined_size(-1)" in message
    assert "可能的原因" not in message


def train_step_before_backward(model, optimizer, train_data, num_steps):
    """Learner test: step() before backward(); autograd finds the weights changed."""
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, model.cfg.context_length))
        optimizer.step()
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
    return losses


def _by_id(rejects, *ids):
    return [p for p in rejects if p.id in ids]


def cat_without_a_list(Q, K, V, attn_mask=None):  # a TypeError from torch on the learner's line
    both = torch.cat(Q, K)
    return both


def bool_matrix_product(L, n_w, layers):  # torch: "not implemented for 'Bool'"
    band = tc.causal_mask(L, window=n_w + 1)
    reach = band
    for _ in range(layers - 1):
        reach = reach @ band
    return int(reach[-1].sum())


# one mutant per entry of _protocol.CRASH_CAUSES, in its order
GENERAL_CRASHES = [
    pytest.param(ex.check_receptive_field, bool_matrix_product, "不支持布尔张量", id="bool @ bool"),
    *_by_id(test_attention.REJECTS, ".view after .transpose", "a tuple used as a tensor"),
    pytest.param(
        ex.check_lm_training, train_step_before_backward, "放在了 loss.backward() 之前", id="step before backward"
    ),
    *_by_id(test_blocks_gpt.REJECTS, "ModuleList reassigned to a list (crashes)"),
    *_by_id(test_training.REJECTS, "logits not flattened"),
    pytest.param(ex.check_self_attention, cat_without_a_list, "torch.cat([a, b], dim=-1)", id="torch.cat(a, b)"),
    *_by_id(test_attention.REJECTS, "Q @ K without the transpose", "float times long"),
]


@pytest.mark.parametrize("checker, candidate, keyword", GENERAL_CRASHES)
def test_general_crash_causes(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_general_crash_cause_is_reached(capsys):
    assert len(GENERAL_CRASHES) == len(_protocol.CRASH_CAUSES)
    assert_every_hint_reached({"CRASH_CAUSES": _protocol.CRASH_CAUSES}, GENERAL_CRASHES, capsys)


def test_a_type_error_names_the_signature_only_when_the_call_did_not_bind(capsys):
    """learner test: torch.cat(Q, K) in the learner's body was told "签名要与练习说明的一致";
    a call to the learner's function (or forward) that does not bind still is"""

    class WrongForward(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.inner = tc.MultiHeadAttention(d_model, num_heads)

        def forward(self, x):  # the checker passes (Q, K, V, attn_mask)
            return self.inner(x, x, x)

    inside = rejection(ex.check_self_attention, cat_without_a_list)
    assert "签名" not in inside and "both = torch.cat(Q, K)" in inside, inside
    for checker, candidate in (
        (ex.check_self_attention, test_attention.bad_signature),
        (ex.check_multi_head_attention, WrongForward),
    ):
        message = rejection(checker, candidate)
        assert "签名要与练习说明的一致" in message and "出错的位置" not in message, message


def test_call_watch_records_whether_a_call_passed_its_test():
    tested = []

    def square_out(func, args, out):
        tested.append(func)
        return _protocol.ends_in(out, (3, 3))

    x = torch.ones(3, 2)
    with _protocol.CallWatch(square_out) as watch:
        y = x @ x.mT
        total = y.sum()
    assert watch.seen and torch.equal(y, torch.full((3, 3), 2.0)) and total.item() == 18.0
    assert torch.Tensor.sum not in tested  # no test after the first true one
    with _protocol.CallWatch(lambda func, args, out: _protocol.ends_in(out, (4, 4))) as watch:
        x @ x.mT
    assert not watch.seen
    assert not _protocol.ends_in([[1.0]], (1, 1)) and not _protocol.ends_in(x, (1, 3, 2))


def test_calls_refused_watches_c_functions_as_well():
    """A C function (torch.layer_norm) counts however it is reached: directly, through
    F.layer_norm or nn.LayerNorm; code that only computes the same numbers does not."""
    x = torch.randn(2, 4)
    for reach in (
        lambda: torch.layer_norm(x, (4,)),
        lambda: torch.nn.functional.layer_norm(x, (4,)),
        lambda: nn.LayerNorm(4)(x),
    ):
        with pytest.raises(ex.ExerciseError, match="kernel"):
            with _protocol.calls_refused([torch.layer_norm], "kernel"):
                reach()
    with _protocol.calls_refused([torch.layer_norm], "kernel"):
        (x - x.mean(-1, keepdim=True)) / x.var(-1, keepdim=True, unbiased=False).add(1e-5).sqrt()
