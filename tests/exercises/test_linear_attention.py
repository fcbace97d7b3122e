"""The checker of ex-7 (causal linear attention as an RNN)."""

import sys

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course import linear_attention, linear_attention_recurrent
from transformer_course.efficient_attention import linear_attention as module_linear_attention

from .support import assert_passes, assert_rejects, assert_skeleton


def phi(x):
    return F.elu(x) + 1


def rnn_loop(q, k, v):
    S = torch.zeros(q.size(1), v.size(1))
    u = torch.zeros(q.size(1))
    out = []
    for i in range(q.size(0)):
        S = S + torch.outer(phi(k[i]), v[i])
        u = u + phi(k[i])
        out.append(phi(q[i]) @ S / (phi(q[i]) @ u))
    return torch.stack(out)


def rnn_einsum(q, k, v):
    # states kept in a list, read with einsum; output written into a preallocated tensor
    out = torch.empty(q.size(0), v.size(1))
    S, u = 0.0, 0.0
    for i, (qi, ki, vi) in enumerate(zip(phi(q), phi(k), v, strict=True)):
        S = S + torch.einsum("d,e->de", ki, vi)
        u = u + ki
        out[i] = torch.einsum("d,de->e", qi, S) / torch.dot(qi, u)
    return out


def cumsum_form(q, k, v):
    kv = phi(k)[:, :, None] * v[:, None, :]
    S, u = kv.cumsum(0), phi(k).cumsum(0)
    return torch.einsum("nd,nde->ne", phi(q), S) / (phi(q) * u).sum(-1, keepdim=True)


def skeleton(q, k, v):
    raise NotImplementedError


def test_rnn_linear_attention_accepts(capsys):
    for fn in (rnn_loop, rnn_einsum, cumsum_form):
        assert_passes(ex.check_rnn_linear_attention, fn, capsys)
    assert_skeleton(ex.check_rnn_linear_attention, skeleton, capsys)


# the package's answer, reached in the ways a page that imports both names allows
def package_recurrent(q, k, v):
    return tc.linear_attention_recurrent(q, k, v, eps=0.0)


def package_causal(q, k, v):
    return tc.linear_attention(q, k, v, causal=True, eps=0.0)


def imported_recurrent(q, k, v):
    return linear_attention_recurrent(q, k, v, eps=0.0)


def imported_causal(q, k, v):
    return linear_attention(q, k, v, causal=True, eps=0.0)


def through_module_with_loop(q, k, v):
    """A loop that takes each output row from the module's function."""
    return torch.stack(
        [module_linear_attention(q[: i + 1], k[: i + 1], v[: i + 1], eps=0.0)[-1] for i in range(len(q))]
    )


def called_then_crashed(q, k, v):
    reference = linear_attention_recurrent(q, k, v, eps=0.0)
    return reference @ torch.ones(3, 3)  # a shape error after the forbidden call


@pytest.mark.parametrize(
    "fn",
    [
        package_recurrent,
        package_causal,
        imported_recurrent,
        imported_causal,
        through_module_with_loop,
        called_then_crashed,
    ],
)
def test_rnn_linear_attention_refuses_the_reference(fn, capsys):
    assert_rejects(ex.check_rnn_linear_attention, fn, "不要直接调用 linear_attention", capsys)


def test_rnn_linear_attention_restores_the_profiler(capsys):
    calls = []

    def profiler(frame, event, arg):
        calls.append(event)

    sys.setprofile(profiler)
    try:
        assert_passes(ex.check_rnn_linear_attention, rnn_loop, capsys)
        with pytest.raises(ex.ExerciseError):
            ex.check_rnn_linear_attention(package_recurrent)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)


def make_rnn(feature=phi, read_first=False, den=True, read_key=False, phi_v=False):
    def fn(q, k, v):
        S = torch.zeros(q.size(1), v.size(1))
        u = torch.zeros(q.size(1))
        out = []
        for i in range(q.size(0)):
            vi = phi(v[i]) if phi_v else v[i]
            reader = feature(k[i]) if read_key else feature(q[i])
            if read_first:
                out.append(reader @ S / (reader @ u))
            S = S + torch.outer(feature(k[i]), vi)
            u = u + feature(k[i])
            if not read_first:
                out.append(reader @ S / (reader @ u) if den else reader @ S)
        return torch.stack(out)

    return fn


def noncausal(q, k, v):
    """The state summed over the whole sequence before any read."""
    S, u = phi(k).T @ v, phi(k).sum(0)
    return phi(q) @ S / (phi(q) @ u)[:, None]


def read_first_guarded(q, k, v):
    """Learner test: the output read from S_{i-1} (before the update), with an eps that
    turns position 0 into 0 instead of NaN."""
    S, u, out = torch.zeros(q.size(1), v.size(1)), torch.zeros(q.size(1)), []
    for i in range(q.size(0)):
        out.append(phi(q[i]) @ S / (phi(q[i]) @ u + 1e-6))
        S, u = S + torch.outer(phi(k[i]), v[i]), u + phi(k[i])
    return torch.stack(out)


def read_first_tiny_start(q, k, v):
    """Learner test: read before the update, S and u started at 1e-9 (position 0 gives ones)."""
    S, u, out = torch.full((q.size(1), v.size(1)), 1e-9), torch.full((q.size(1),), 1e-9), []
    for i in range(q.size(0)):
        out.append(phi(q[i]) @ S / (phi(q[i]) @ u))
        S, u = S + torch.outer(phi(k[i]), v[i]), u + phi(k[i])
    return torch.stack(out)


def mean_instead_of_normaliser(q, k, v):
    """Learner test: divided by the number of positions seen, not φ(q_i)ᵀ u_i."""
    S, out = torch.zeros(q.size(1), v.size(1)), []
    for i in range(q.size(0)):
        S = S + torch.outer(phi(k[i]), v[i])
        out.append(phi(q[i]) @ S / (i + 1))
    return torch.stack(out)


def denominator_with_key(q, k, v):
    """The normaliser read with φ(k_i) instead of φ(q_i)."""
    S, u, out = torch.zeros(q.size(1), v.size(1)), torch.zeros(q.size(1)), []
    for i in range(q.size(0)):
        S, u = S + torch.outer(phi(k[i]), v[i]), u + phi(k[i])
        out.append(phi(q[i]) @ S / (phi(k[i]) @ u))
    return torch.stack(out)


def relu_with_eps(q, k, v):
    return make_rnn(feature=lambda x: F.relu(x) + 1e-6)(q, k, v)


def relu_with_larger_eps(q, k, v):  # learner test 9a, 2.11
    return make_rnn(feature=lambda x: F.relu(x) + 1e-3)(q, k, v)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        (make_rnn(feature=lambda x: x), "φ"),
        (relu_with_eps, "φ 用成了 relu"),
        (relu_with_larger_eps, "φ 用成了 relu"),
        (make_rnn(feature=lambda x: F.relu(x) + 1), "φ 用成了 relu(x) + 1"),  # learner test 7a, 2.11
        (make_rnn(feature=F.elu), "少了 + 1"),
        (make_rnn(feature=torch.exp), "exp"),
        (make_rnn(phi_v=True), "φ 也作用在了 v 上"),
        (make_rnn(den=False), "漏了分母"),
        (noncausal, "不是因果的"),
        (make_rnn(read_first=True), "先读后更新"),
        (make_rnn(read_key=True), "用查询读出"),
        (read_first_guarded, "S_{i-1}"),
        (mean_instead_of_normaliser, "已见位置的个数 i + 1"),
        (denominator_with_key, "分母用了 φ(k_i)ᵀ u_i"),
        (read_first_tiny_start, "状态 S_{i-1}）"),
    ],
    ids=[
        "no phi",
        "relu",
        "relu + 1e-3",
        "relu + 1",
        "elu",
        "exp",
        "phi on v",
        "no denominator",
        "non-causal",
        "read before update",
        "read with key",
        "read before update, eps-guarded",
        "mean over positions",
        "denominator with the key",
        "read before update, tiny start",
    ],
)
def test_rnn_linear_attention_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_rnn_linear_attention, fn, keyword, capsys)
