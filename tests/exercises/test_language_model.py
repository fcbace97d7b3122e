"""Splitting into heads, the dropout row-sum variance, and the learner's training run.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import language_model
from transformer_course.exercises.language_model import leaking_positions

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton

# splitting into heads
# ---------------------------------------------------------------------------


def split_view_transpose(t, H):
    N, T, E = t.shape
    return t.view(N, T, H, E // H).transpose(1, 2)


def split_stack(t, H):
    return torch.stack(t.chunk(H, dim=-1), dim=1)


def split_permute_contiguous(t, H):
    N, T, E = t.shape
    return t.reshape(N, T, H, -1).permute(0, 2, 1, 3).contiguous()


def split_loop(t, H):
    D = t.size(-1) // H
    return torch.stack([t[:, :, h * D : (h + 1) * D] for h in range(H)], 1)


def split_buggy_view(t, H):
    N, T, E = t.shape
    return t.view(N, H, T, E // H)


def split_interleaved(t, H):
    N, T, E = t.shape
    return t.view(N, T, E // H, H).permute(0, 3, 1, 2)


def split_no_transpose(t, H):
    N, T, E = t.shape
    return t.view(N, T, H, E // H)


def split_transpose_then_reshape(t, H):
    """Learner test: (N, E, T) reshaped into (N, H, T, D)."""
    N, T, E = t.shape
    return t.transpose(1, 2).reshape(N, H, T, E // H)


def split_transpose_reshape_mT(t, H):
    """Correct (learner test): (N, E, T) split into (N, H, D, T), then .mT."""
    N, T, E = t.shape
    return t.transpose(1, 2).reshape(N, H, E // H, T).mT


def split_wrong_swap(t, H):  # positions reversed: a hand-made mistake without a hint
    return split_view_transpose(t, H).flip(2)


def split_view_then_reshape(t, H):
    """Learner test: E is split first, then reshape (not transpose) tries to swap T and H."""
    N, T, E = t.shape
    return t.view(N, T, H, E // H).reshape(N, H, T, E // H)


def split_chunks_of_h(t, H):
    """Learner test 15 (3.10): t.split(H) cuts pieces of H features, D of them."""
    return torch.stack(t.split(H, dim=-1), dim=1)


def split_heads_reversed(t, H):  # the right positions, another head's features
    return split_view_transpose(t, H).flip(1)


def split_skeleton(t, H):
    pass


@pytest.mark.parametrize(
    "fn", [split_view_transpose, split_stack, split_permute_contiguous, split_loop, split_transpose_reshape_mT]
)
def test_split_heads_accepts(fn, capsys):
    assert_passes(ex.check_split_heads, fn, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (split_buggy_view, "看见了未来"),
        (split_interleaved, "隔 H 取一个"),
        (split_no_transpose, "没有 transpose(1, 2)"),
        (split_transpose_then_reshape, "先 transpose(1, 2) 成 (N, E, T)"),
        (split_wrong_swap, "却是 t[0, 5, 0]，位置 5 的特征：头里的第 i 行混进了别的位置"),
        (split_heads_reversed, "位置对了，特征取错了"),
        (split_chunks_of_h, "头数与每头的维数用反了"),
        (split_view_then_reshape, "先 view(N, T, H, D) 再 reshape(N, H, T, D) 也一样"),
        (split_view_then_reshape, "用 transpose(1, 2)（不是 reshape）交换"),
    ],
)
def test_split_heads_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_split_heads, fn, keyword, capsys)


def test_split_heads_skeleton(capsys):
    assert_skeleton(ex.check_split_heads, split_skeleton, capsys)


def test_leaking_positions_match_the_bug():
    """The index arithmetic agrees with a causal layer run on the buggy split: output
    position t depends on input t+1 exactly for the positions listed."""
    T, H, E = 8, 4, 8
    x = torch.zeros(1, T, E, requires_grad=True)
    rows = split_buggy_view(x, H)  # (1, H, T, D)
    mask = tc.causal_mask(T)
    scores = torch.randn(1, H, T, T).masked_fill(~mask, float("-inf"))
    out = (scores.softmax(-1) @ rows).transpose(1, 2).reshape(1, T, E)
    leaks = []
    for t in range(T - 1):
        (grad,) = torch.autograd.grad(out[0, t].sum(), x, retain_graph=True)
        if grad[0, t + 1].abs().sum() > 0:
            leaks.append(t)
    assert leaks == leaking_positions(T, H)
    assert leaking_positions(32, 1) == []  # one head: the bug is harmless


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "4"])
def test_leaking_positions_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        leaking_positions(bad, 4)


# dropout row-sum variance
# ---------------------------------------------------------------------------


def var_formula(a, p):
    return p / (1 - p) * (a**2).sum(-1)


def var_einsum(a, p):
    return torch.einsum("...s,...s->...", a, a) * (p / (1.0 - p))


def var_loop(a, p):
    if a.dim() == 1:
        return sum(float(x) ** 2 for x in a) * p / (1 - p)  # a Python float
    return torch.stack([var_loop(row, p) if row.dim() > 1 else torch.tensor(var_loop(row, p)) for row in a])


def var_no_scale(a, p):
    return p * (1 - p) * (a**2).sum(-1)


def var_not_squared(a, p):
    return p / (1 - p) * a.sum(-1)


def var_square_of_sum(a, p):  # learner test: (Σa)² instead of Σa²
    return p / (1 - p) * a.sum(-1) ** 2


def var_squared_denominator(a, p):  # learner test
    return p / (1 - p) ** 2 * (a**2).sum(-1)


def var_inverted(a, p):
    return (1 - p) / p * (a**2).sum(-1)


def var_p_only(a, p):
    return p * (a**2).sum(-1)


def var_without_p(a, p):
    return (a**2).sum(-1) / (1 - p)


def var_sum_all(a, p):  # one number for the whole tensor
    return p / (1 - p) * (a**2).sum()


def var_mean_not_sum(a, p):  # learner test 6a, 3.16
    return p / (1 - p) * (a**2).mean(-1)


def var_sample_variance(a, p):  # learner test 6a, 3.16
    return p / (1 - p) * a.var(-1)


def var_standard_deviation(a, p):  # learner test 18a, 3.16: the square root taken
    return (p / (1 - p) * (a**2).sum(-1)).sqrt()


def var_zero(a, p):  # learner test 27a, 3.16: "the row sums stay 1"
    return torch.zeros(a.shape[:-1])


def var_sampled(a, p):  # learner test 34a, 3.16: an estimate from 2000 dropout draws
    draws = F.dropout(a.unsqueeze(0).expand(2000, *a.shape), p)
    return draws.sum(-1).var(0)


def var_skeleton(a, p):
    raise NotImplementedError


@pytest.mark.parametrize("fn", [var_formula, var_einsum, var_loop])
def test_dropout_variance_accepts(fn, capsys):
    assert_passes(ex.check_dropout_row_sum_variance, fn, capsys)


VARIANCE_REJECTS = [
    pytest.param(ex.check_dropout_row_sum_variance, fn, keyword, id=fn.__name__)
    for fn, keyword in [
        (var_no_scale, "不放大"),
        (var_not_squared, "少了平方"),
        (var_square_of_sum, "先求和再平方"),
        (var_squared_denominator, "p/(1-p)²·Σa²"),
        (var_inverted, "写反了"),
        (var_p_only, "放大因子"),
        (var_without_p, "漏了因子 p"),
        (var_sum_all, "形状不对"),
        (var_mean_not_sum, "对平方取了平均"),
        (var_sample_variance, "权重本身的样本方差"),
        (var_standard_deviation, "这是标准差"),
        (var_zero, "行和不再恒为 1"),
        (var_sampled, "同样的输入调用两次，结果不一样"),
    ]
]


@pytest.mark.parametrize(("checker", "fn", "keyword"), VARIANCE_REJECTS)
def test_dropout_variance_rejects(checker, fn, keyword, capsys):
    assert_rejects(checker, fn, keyword, capsys)


def test_every_dropout_variance_hint_is_reached(capsys):
    tables = {"_DROPOUT_MISTAKES": language_model._DROPOUT_MISTAKES}
    assert_every_hint_reached(tables, VARIANCE_REJECTS, capsys)


def test_dropout_variance_skeleton(capsys):
    assert_skeleton(ex.check_dropout_row_sum_variance, var_skeleton, capsys)


def test_dropout_formula_matches_sampling():
    """The graded formula is the variance the package's attention dropout produces."""
    torch.manual_seed(0)
    q, k, v = torch.randn(20000, 1, 8), torch.randn(20000, 6, 8), torch.randn(20000, 6, 2)
    _, clean = tc.scaled_dot_product_attention(q, k, v)
    _, dropped = tc.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    sampled = dropped.sum(-1).var().item()
    assert abs(sampled / var_formula(clean, 0.3).mean().item() - 1) < 0.05


# the training run
# ---------------------------------------------------------------------------


def train_with_lm_batch(model, optimizer, train_data, num_steps):
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        x, y = tc.lm_batch(train_data, 32, T)
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_by_hand(model, optimizer, train_data, num_steps):
    """Own windows, own cross-entropy, model.zero_grad, a tensor of losses."""
    T = model.cfg.context_length
    losses = torch.empty(num_steps)
    for step in range(num_steps):
        starts = torch.randint(0, len(train_data) - T - 1, (24,))
        window = torch.stack([train_data[s : s + T + 1] for s in starts])
        logits, _ = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), window[:, 1:].reshape(-1))
        model.zero_grad()
        loss.backward()
        optimizer.step()
        losses[step] = loss.detach()
    return losses


def train_unshifted(model, optimizer, train_data, num_steps):
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        x, _ = tc.lm_batch(train_data, 32, T)
        _, loss = model(x, x)  # targets not shifted: copy the input
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_no_step(model, optimizer, train_data, num_steps):
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, T))
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
    return losses


def train_grad_cleared_late(model, optimizer, train_data, num_steps):
    """zero_grad between backward and step: nothing is ever learned."""
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, T))
        loss.backward()
        optimizer.zero_grad()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_one_batch(model, optimizer, train_data, num_steps):
    """The same batch every step: it memorises the batch."""
    T = model.cfg.context_length
    x, y = tc.lm_batch(train_data, 4, T)
    losses = []
    for _ in range(num_steps):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_few_steps(model, optimizer, train_data, num_steps):
    """Stops after 10 steps (and repeats the last loss)."""
    losses = train_with_lm_batch(model, optimizer, train_data, 10)
    return losses + losses[-1:] * (num_steps - 10)


def train_keeps_loss_tensors(model, optimizer, train_data, num_steps):
    """Appends the loss tensor (with its graph) instead of loss.item()."""
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, T))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return losses


def train_no_zero_grad(model, optimizer, train_data, num_steps):
    """Never clears the gradients: they pile up from step to step."""
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, T))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_step_before_backward(model, optimizer, train_data, num_steps):
    """step() before backward(): the weights change under the graph (autograd raises)."""
    T = model.cfg.context_length
    losses = []
    for _ in range(num_steps):
        _, loss = model(*tc.lm_batch(train_data, 32, T))
        optimizer.step()
        optimizer.zero_grad()
        loss.backward()
        losses.append(loss.item())
    return losses


def train_own_optimizer(model, optimizer, train_data, num_steps):
    """Ignores the optimizer passed in and builds its own Adam."""
    return train_with_lm_batch(model, torch.optim.Adam(model.parameters(), lr=3e-3), train_data, num_steps)


def train_fixed_steps(model, optimizer, train_data, num_steps):
    """Ignores num_steps: always 100 steps."""
    return train_with_lm_batch(model, optimizer, train_data, 100)


def train_returns_nothing_useful(model, optimizer, train_data, num_steps):
    train_with_lm_batch(model, optimizer, train_data, num_steps)
    return 1.0


def train_skeleton(model, optimizer, train_data, num_steps):
    pass


@pytest.mark.parametrize("fn", [train_with_lm_batch, train_by_hand])
def test_lm_training_accepts(fn, capsys):
    torch.manual_seed(1)  # the learner's own batches come from the global RNG
    assert_passes(ex.check_lm_training, fn, capsys)


@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (train_unshifted, "右移一位"),
        (train_no_step, "没有调用 optimizer.step()"),
        (train_grad_cleared_late, "放在了 backward 和 step 之间"),
        (train_one_batch, "同一批数据"),
        (train_few_steps, "没有达到目标"),
        (train_returns_nothing_useful, "每一步的训练损失"),
        (train_keeps_loss_tensors, "loss 张量本身"),
        (train_no_zero_grad, "忘了 optimizer.zero_grad()"),
        (train_step_before_backward, "optimizer.step() 放在了 loss.backward() 之前"),
        (train_own_optimizer, "应使用参数 optimizer"),
        (train_fixed_steps, "要由参数 num_steps 决定"),
    ],
)
def test_lm_training_rejects(fn, keyword, capsys):
    torch.manual_seed(2)
    assert_rejects(ex.check_lm_training, fn, keyword, capsys)


def test_lm_training_skeleton(capsys):
    assert_skeleton(ex.check_lm_training, train_skeleton, capsys)
