"""One training step and language-model batches.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import training

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection

# 9. training step
# ---------------------------------------------------------------------------


def make_train_step(order=("zero_grad", "backward", "step"), reduction="mean", ret="item", shift=False):
    def fn(model, optimizer, x, y):
        logits = model(x)
        if shift:
            logits, y = logits[:, :-1], y[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction=reduction)
        for op in order:
            {"zero_grad": optimizer.zero_grad, "backward": loss.backward, "step": optimizer.step}[op]()
        if ret == "tensor":
            return loss
        if ret == "after":
            with torch.no_grad():
                return F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        return loss.item()

    return fn


def train_step_model_zero_grad(model, optimizer, x, y):
    model.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_wrong_shape(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_targets_x(model, optimizer, x, y):
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x.reshape(-1))  # x, not y
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _step_with_loss(loss_of):
    def fn(model, optimizer, x, y):
        loss = loss_of(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return fn


# learner test 6b, 5.12
train_step_nll_on_logits = _step_with_loss(lambda logits, y: F.nll_loss(logits.flatten(0, 1), y.flatten()))
train_step_targets_transposed = _step_with_loss(
    lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.t().reshape(-1))
)

# learner test 5.11: only the last position scored
train_step_last_position = _step_with_loss(lambda logits, y: F.cross_entropy(logits[:, -1], y[:, -1]))
# learner test 27c, 5.11: token 0 taken for padding
train_step_ignore_index_0 = _step_with_loss(
    lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=0)
)


# learner test 15 (5.11): probabilities into F.cross_entropy
train_step_softmax_first = _step_with_loss(
    lambda logits, y: F.cross_entropy(logits.softmax(-1).flatten(0, 1), y.flatten())
)
# log-probabilities into F.cross_entropy: log_softmax twice is log_softmax (correct)
train_step_log_softmax_first = _step_with_loss(
    lambda logits, y: F.cross_entropy(logits.log_softmax(-1).flatten(0, 1), y.flatten())
)


def train_step_sum_reported_as_mean(model, optimizer, x, y):
    """Learner test 25c (5.11): the summed loss backpropagated, its mean returned."""
    logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item() / y.numel()


def train_step_logits_transposed(model, optimizer, x, y):
    """Learner test 31c (5.11): (N, V, T) reshaped to (N·T, V)."""
    logits = model(x)
    N, T, V = logits.shape
    loss = F.cross_entropy(logits.transpose(1, 2).reshape(N * T, V), y.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_forward_without_grad(model, optimizer, x, y):
    """Learner test 31c (5.11): the forward under no_grad, the loss made to require grad."""
    with torch.no_grad():
        logits = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten()).requires_grad_()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_step_skeleton(model, optimizer, x, y):
    pass


def test_train_step(capsys):
    for fn in (
        make_train_step(),
        make_train_step(order=("backward", "step", "zero_grad")),
        train_step_model_zero_grad,
        train_step_log_softmax_first,
    ):
        assert_passes(ex.check_train_step, fn, capsys)
    assert_skeleton(ex.check_train_step, train_step_skeleton, capsys)


TRAIN_STEP_REJECTS = [
    pytest.param(ex.check_train_step, train_step_nll_on_logits, "F.nll_loss 用在了原始 logits 上", id="nll on logits"),
    pytest.param(ex.check_train_step, train_step_targets_transposed, "目标 y 转置了", id="y.t()"),
    pytest.param(ex.check_train_step, train_step_softmax_first, "logits 先过了 softmax", id="softmax first"),
    pytest.param(ex.check_train_step, train_step_last_position, "损失只用了最后一个位置", id="last position only"),
    pytest.param(ex.check_train_step, train_step_ignore_index_0, "ignore_index=0", id="ignore_index=0"),
    pytest.param(
        ex.check_train_step,
        make_train_step(order=("backward", "step")),
        "忘了 optimizer.zero_grad()",
        id="no zero_grad",
    ),
    pytest.param(
        ex.check_train_step,
        make_train_step(order=("backward", "zero_grad", "step")),
        "backward 和 step 之间",
        id="zero_grad early",
    ),
    pytest.param(
        ex.check_train_step, make_train_step(order=("zero_grad", "backward")), "optimizer.step()", id="no step"
    ),
    pytest.param(
        ex.check_train_step, make_train_step(order=("zero_grad", "step")), "loss.backward()", id="no backward"
    ),
    pytest.param(
        ex.check_train_step, make_train_step(order=("zero_grad", "step", "backward")), "之前", id="step before backward"
    ),
    pytest.param(ex.check_train_step, make_train_step(reduction="sum"), "求和", id="summed loss"),
    pytest.param(ex.check_train_step, train_step_sum_reported_as_mean, "N·T = 15 倍", id="sum, mean returned"),
    pytest.param(ex.check_train_step, make_train_step(ret="tensor"), "loss.item()", id="returns a tensor"),
    pytest.param(ex.check_train_step, make_train_step(ret="after"), "更新之前", id="loss after the update"),
    pytest.param(ex.check_train_step, make_train_step(shift=True), "不要再移位", id="shifted once more"),
    pytest.param(ex.check_train_step, train_step_wrong_shape, "类别在第 1 维", id="logits not flattened"),
    pytest.param(ex.check_train_step, train_step_targets_x, "目标用成了输入 x", id="targets = x"),
    pytest.param(ex.check_train_step, train_step_logits_transposed, "先转置成 (N, V, T)", id="transpose-reshape"),
    pytest.param(ex.check_train_step, train_step_forward_without_grad, "torch.no_grad()", id="forward no_grad"),
]


# ---------------------------------------------------------------------------
# 10. language-model batches
# ---------------------------------------------------------------------------


def lm_batch(data, batch_size, context_length, generator):
    return tc.lm_batch(data, batch_size, context_length, generator=generator)


def make_lm_batch(mistake=None):
    def fn(data, B, T, generator):
        high = len(data) - T + {"high_plus": 1, "high_minus": -1}.get(mistake, 0)
        gen = None if mistake == "no_generator" else generator
        ix = torch.randint(high, (B,), generator=gen)
        x = torch.stack([data[i : i + T] for i in ix])
        if mistake == "no_shift":
            return x, x.clone()
        if mistake == "redraw":
            iy = torch.randint(high, (B,), generator=gen)
            return x, torch.stack([data[i + 1 : i + 1 + T] for i in iy])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        if mistake == "float":
            return x.float(), y.float()
        if mistake == "list":
            return [x, y, ix]
        if mistake == "one_too_far":  # targets indexed one position further
            y = data[ix[:, None] + torch.arange(1, T + 2)][:, :T]
        if mistake == "no_cast":  # int32 ids stay int32
            return x, y
        return x.long(), y.long()

    return fn


def lm_batch_skeleton(data, batch_size, context_length, generator):
    raise NotImplementedError


def test_lm_batch(capsys):
    for fn in (lm_batch, make_lm_batch()):
        assert_passes(ex.check_lm_batch, fn, capsys)
    assert_skeleton(ex.check_lm_batch, lm_batch_skeleton, capsys)


LM_BATCH_REJECTS = [
    pytest.param(ex.check_lm_batch, make_lm_batch("no_shift"), "错后一位", id="y equals x"),
    pytest.param(ex.check_lm_batch, make_lm_batch("redraw"), "不要为 y 另抽随机数", id="y drawn separately"),
    pytest.param(
        ex.check_lm_batch, make_lm_batch("no_generator"), "没有把 generator 传给 torch.randint", id="generator not used"
    ),
    pytest.param(ex.check_lm_batch, make_lm_batch("high_plus"), "上界多了 1", id="off-by-one: one start too many"),
    pytest.param(ex.check_lm_batch, make_lm_batch("high_minus"), "上界少了 1", id="off-by-one: one start too few"),
    pytest.param(ex.check_lm_batch, make_lm_batch("float"), "torch.long", id="float ids"),
    pytest.param(ex.check_lm_batch, make_lm_batch("no_cast"), "torch.int32", id="int32 ids not cast"),
    pytest.param(ex.check_lm_batch, make_lm_batch("list"), "两个张量", id="three values"),
    pytest.param(ex.check_lm_batch, make_lm_batch("one_too_far"), "下标越界", id="index out of range"),
]


def lm_batch_reversed_rows(data, batch_size, context_length, generator):
    x, y = lm_batch(data, batch_size, context_length, generator)
    return x.flip(-1), y.flip(-1)


def lm_batch_reversed_y(data, batch_size, context_length, generator):
    x, y = lm_batch(data, batch_size, context_length, generator)
    return x, y.flip(-1)


def lm_batch_extra_draw(data, batch_size, context_length, generator):
    torch.randint(10, (1,), generator=generator)
    return lm_batch(data, batch_size, context_length, generator)


def lm_batch_swapped(data, batch_size, context_length, generator):  # learner test 6b, 5.11
    x, y = lm_batch(data, batch_size, context_length, generator)
    return y, x


MORE_REJECTS = [
    pytest.param(ex.check_lm_batch, lm_batch_swapped, "x、y 对调了", id="lm_batch: (y, x)"),
    pytest.param(ex.check_lm_batch, lm_batch_reversed_rows, "连续的一段", id="lm_batch: x not a window"),
    pytest.param(ex.check_lm_batch, lm_batch_reversed_y, "y[0] 不对", id="lm_batch: y not a window"),
    pytest.param(ex.check_lm_batch, lm_batch_extra_draw, "只抽这一次", id="lm_batch: another draw first"),
]


REJECTS = TRAIN_STEP_REJECTS + LM_BATCH_REJECTS + MORE_REJECTS


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {
        "LOSS_HINTS": training.LOSS_HINTS,
        "BATCH_CRASHES": training.BATCH_CRASHES,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)


@pytest.mark.parametrize("mistake", ["high_plus", "high_minus", "one_too_far", "no_generator", "redraw"])
def test_lm_batch_hints_do_not_give_the_bound_away(mistake):
    """5.10 asks the learner to work out randint's upper bound: no hint may state it."""
    message = rejection(ex.check_lm_batch, make_lm_batch(mistake))
    assert "len(data) - context_length" not in message, message
    assert "- context_length - 1" not in message, message
