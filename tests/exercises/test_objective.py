"""The checker of the shifted, label-smoothed training objective."""

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex

from .support import assert_passes, assert_rejects, assert_skeleton


def with_cross_entropy(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], label_smoothing=smoothing, ignore_index=0)


def by_hand(model, src, tgt, smoothing):
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    logp = F.log_softmax(model(src, dec_in), dim=-1)
    V = logp.size(-1)
    q = torch.full_like(logp, smoothing / V)
    q.scatter_add_(-1, labels[..., None], torch.full_like(logp[..., :1], 1 - smoothing))
    per_token = -(q * logp).sum(-1)
    keep = labels != 0
    return (per_token * keep).sum() / keep.sum()


def package_loss(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1]).flatten(0, 1)
    return tc.label_smoothing_loss(logits, tgt[:, 1:].flatten(), smoothing, ignore_index=0)


def mix_of_losses(model, src, tgt, smoothing):
    # (1 - ε)·NLL + ε·(mean of −log p over the classes), on the kept tokens
    labels = tgt[:, 1:]
    logp = F.log_softmax(model(src, tgt[:, :-1]), -1)[labels != 0]
    y = labels[labels != 0]
    nll = -logp.gather(-1, y[:, None]).squeeze(-1)
    return ((1 - smoothing) * nll + smoothing * -logp.mean(-1)).mean()


def skeleton(model, src, tgt, smoothing):
    pass


def test_shifted_loss_accepts(capsys):
    for fn in (with_cross_entropy, by_hand, package_loss, mix_of_losses):
        assert_passes(ex.check_shifted_loss, fn, capsys)
    assert_skeleton(ex.check_shifted_loss, skeleton, capsys)


def unshifted(model, src, tgt, smoothing):
    logits = model(src, tgt)
    return F.cross_entropy(logits.transpose(1, 2), tgt, label_smoothing=smoothing, ignore_index=0)


def labels_unshifted(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tgt[:, :-1], label_smoothing=smoothing, ignore_index=0)


def reversed_shift(model, src, tgt, smoothing):
    logits = model(src, tgt[:, 1:])
    return F.cross_entropy(logits.transpose(1, 2), tgt[:, :-1], label_smoothing=smoothing, ignore_index=0)


def no_smoothing(model, src, tgt, smoothing):
    return with_cross_entropy(model, src, tgt, 0.0)


def smooth_over_others(model, src, tgt, smoothing):
    labels = tgt[:, 1:]
    logp = F.log_softmax(model(src, tgt[:, :-1]), -1)
    V = logp.size(-1)
    q = torch.full_like(logp, smoothing / (V - 1))
    q.scatter_(-1, labels[..., None], 1 - smoothing)
    per_token = -(q * logp).sum(-1)
    return per_token[labels != 0].mean()


def pad_counted(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], label_smoothing=smoothing)


def pad_in_denominator(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    per_token = F.cross_entropy(
        logits.transpose(1, 2),
        tgt[:, 1:],
        label_smoothing=smoothing,
        ignore_index=0,
        reduction="none",
    )
    return per_token.mean()


def summed(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(
        logits.transpose(1, 2),
        tgt[:, 1:],
        label_smoothing=smoothing,
        ignore_index=0,
        reduction="sum",
    )


def softmax_first(model, src, tgt, smoothing):
    probs = torch.softmax(model(src, tgt[:, :-1]), -1)
    return F.cross_entropy(probs.transpose(1, 2), tgt[:, 1:], label_smoothing=smoothing, ignore_index=0)


def as_number(model, src, tgt, smoothing):
    return with_cross_entropy(model, src, tgt, smoothing).item()


def detached(model, src, tgt, smoothing):
    with torch.no_grad():
        return with_cross_entropy(model, src, tgt, smoothing)


def per_token(model, src, tgt, smoothing):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(
        logits.transpose(1, 2),
        tgt[:, 1:],
        label_smoothing=smoothing,
        ignore_index=0,
        reduction="none",
    )


@pytest.mark.parametrize(
    "fn, keyword",
    [
        (unshifted, "没有右移"),
        (labels_unshifted, "标签没有右移"),
        (reversed_shift, "方向反了"),
        (no_smoothing, "标签平滑没有用上"),
        (smooth_over_others, "|V| − 1"),
        (pad_counted, "填充位置也算进了损失"),
        (pad_in_denominator, "除以全部位置数"),
        (summed, "损失之和"),
        (softmax_first, "不要先 softmax"),
        (as_number, "应是 torch.Tensor"),
        (detached, "不能求梯度"),
        (per_token, "0 维张量"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_shifted_loss_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_shifted_loss, fn, keyword, capsys)
