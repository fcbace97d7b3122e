"""The checker of the label-smoothed cross-entropy."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import objective

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


def with_cross_entropy(logits, labels, smoothing):
    return F.cross_entropy(logits.transpose(1, 2), labels, label_smoothing=smoothing, ignore_index=0)


def with_loss_module(logits, labels, smoothing):
    loss = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=smoothing)
    return loss(logits.flatten(0, 1), labels.flatten())


def package_loss(logits, labels, smoothing):
    return tc.label_smoothing_loss(logits.flatten(0, 1), labels.flatten(), smoothing, ignore_index=0)


def package_targets(logits, labels, smoothing):
    q = tc.smoothed_targets(labels, logits.size(-1), smoothing)
    return -(q * F.log_softmax(logits, -1)).sum(-1)[labels != 0].mean()


def test_one_line_answers_are_refused(capsys):
    for fn in (with_cross_entropy, with_loss_module, package_loss, package_targets):
        assert_rejects(
            ex.check_smoothed_loss, fn, "本题要亲手写出平滑后的目标分布：不要用 label_smoothing= 参数", capsys
        )


def by_hand(logits, labels, smoothing):
    logp = F.log_softmax(logits, dim=-1)
    V = logp.size(-1)
    q = torch.full_like(logp, smoothing / V)
    q.scatter_add_(-1, labels[..., None], torch.full_like(logp[..., :1], 1 - smoothing))
    per_token = -(q * logp).sum(-1)
    keep = labels != 0
    return (per_token * keep).sum() / keep.sum()


def mix_of_losses(logits, labels, smoothing):
    # (1 - ε)·NLL + ε·(mean of −log p over the classes), on the kept tokens
    logp = F.log_softmax(logits, -1)[labels != 0]
    y = labels[labels != 0]
    nll = -logp.gather(-1, y[:, None]).squeeze(-1)
    return ((1 - smoothing) * nll + smoothing * -logp.mean(-1)).mean()


def mix_with_ignore_index(logits, labels, smoothing):
    """(1 − ε)·F.cross_entropy(ignore_index=0) (no label_smoothing=) + ε·uniform term."""
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=0)
    uniform = -F.log_softmax(logits, -1).mean(-1)[labels != 0].mean()
    return (1 - smoothing) * nll + smoothing * uniform


def kl_plus_entropy(logits, labels, smoothing):
    """KL(q‖p) + H(q) = −Σ q·log p, with a one-hot target and F.kl_div."""
    logp = F.log_softmax(logits, -1)
    q = (1 - smoothing) * F.one_hot(labels, logp.size(-1)).to(logp.dtype) + smoothing / logp.size(-1)
    per_token = F.kl_div(logp, q, reduction="none").sum(-1) - torch.xlogy(q, q).sum(-1)
    return per_token[labels != 0].mean()


def skeleton(logits, labels, smoothing):
    pass


def test_smoothed_loss_accepts(capsys):
    for fn in (by_hand, mix_of_losses, mix_with_ignore_index, kl_plus_entropy):
        assert_passes(ex.check_smoothed_loss, fn, capsys)
    assert_skeleton(ex.check_smoothed_loss, skeleton, capsys)


def hand_loss(logits, labels, smoothing, reduction="mean"):
    """Correct per-token losses, reduced as asked: the base of the mutants below."""
    logp = F.log_softmax(logits, -1)
    q = torch.full_like(logp, smoothing / logp.size(-1))
    q = q.scatter_add(-1, labels[..., None], torch.full_like(logp[..., :1], 1 - smoothing))
    per_token = -(q * logp).sum(-1) * (labels != 0)
    if reduction == "none":
        return per_token
    if reduction == "sum":
        return per_token.sum()
    return per_token.sum() / (labels != 0).sum()


def no_smoothing(logits, labels, smoothing):
    return with_cross_entropy(logits, labels, 0.0)


def smooth_over_others(logits, labels, smoothing):
    logp = F.log_softmax(logits, -1)
    V = logp.size(-1)
    q = torch.full_like(logp, smoothing / (V - 1))
    q.scatter_(-1, labels[..., None], 1 - smoothing)
    per_token = -(q * logp).sum(-1)
    return per_token[labels != 0].mean()


def pad_counted(logits, labels, smoothing):
    logp = F.log_softmax(logits, -1)
    return -(_q(logp, labels, smoothing) * logp).sum(-1).mean()


def pad_in_denominator(logits, labels, smoothing):
    return hand_loss(logits, labels, smoothing, "none").mean()


def summed(logits, labels, smoothing):
    return hand_loss(logits, labels, smoothing, "sum")


def softmax_first(logits, labels, smoothing):  # log_softmax of probabilities
    return hand_loss(torch.softmax(logits, -1), labels, smoothing)


def as_number(logits, labels, smoothing):
    return hand_loss(logits, labels, smoothing).item()


def detached(logits, labels, smoothing):
    with torch.no_grad():
        return hand_loss(logits, labels, smoothing)


def per_token(logits, labels, smoothing):
    return hand_loss(logits, labels, smoothing, "none")


def target_share_only(logits, labels, smoothing):
    """Only (1 − ε) on the target: the uniform ε/|V| part left out."""
    logp = F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -((1 - smoothing) * logp)[labels != 0].mean()


def raw_logits_as_log_probs(logits, labels, smoothing):
    """Learner test: −Σ q·logits, the log_softmax forgotten."""
    V = logits.size(-1)
    q = torch.full_like(logits, smoothing / V)
    q = q.scatter_add(-1, labels.unsqueeze(-1), torch.full_like(logits[..., :1], 1 - smoothing))
    return -(q * logits).sum(-1)[labels != 0].mean()


def softmax_as_log_probs(logits, labels, smoothing):
    """Learner test 7a, 2.8: −Σ q·softmax(logits), the log forgotten."""
    p = logits.softmax(-1)
    q = torch.full_like(p, smoothing / p.size(-1))
    q = q.scatter_add(-1, labels.unsqueeze(-1), torch.full_like(p[..., :1], 1 - smoothing))
    return -(q * p).sum(-1)[labels != 0].mean()


# learner test 6a, 2.8: six mistakes that got only the generic hint


def _q(logp, labels, smoothing, overwrite=False):
    q = torch.full_like(logp, smoothing / logp.size(-1))
    if overwrite:
        return q.scatter(-1, labels[..., None], 1 - smoothing)
    return q.scatter_add(-1, labels[..., None], torch.full_like(logp[..., :1], 1 - smoothing))


def target_overwritten(logits, labels, smoothing):  # scatter_ where scatter_add_ is meant
    logp = F.log_softmax(logits, -1)
    return -(_q(logp, labels, smoothing, overwrite=True) * logp).sum(-1)[labels != 0].mean()


def kl_divergence(logits, labels, smoothing):  # the Annotated Transformer's F.kl_div
    logp = F.log_softmax(logits, -1)
    return F.kl_div(logp, _q(logp, labels, smoothing), reduction="none").sum(-1)[labels != 0].mean()


def mean_of_sentence_means(logits, labels, smoothing):
    logp = F.log_softmax(logits, -1)
    per_token, keep = -(_q(logp, labels, smoothing) * logp).sum(-1), (labels != 0).float()
    return ((per_token * keep).sum(1) / keep.sum(1)).mean()


def sum_over_sentences(logits, labels, smoothing):
    logp = F.log_softmax(logits, -1)
    per_token = -(_q(logp, labels, smoothing) * logp).sum(-1)
    return (per_token * (labels != 0)).sum() / labels.size(0)


def softmax_over_time(logits, labels, smoothing):
    logp = torch.log(F.softmax(logits, 1))
    return -(_q(logp, labels, smoothing) * logp).sum(-1)[labels != 0].mean()


def softmax_over_batch(logits, labels, smoothing):  # learner test 27a, 2.7: log(softmax(dim=0))
    logp = torch.log(F.softmax(logits, 0))
    return -(_q(logp, labels, smoothing) * logp).sum(-1)[labels != 0].mean()


def pad_class_zeroed(logits, labels, smoothing):  # fairseq style: q = 0 on the pad class
    logp = F.log_softmax(logits, -1)
    q = _q(logp, labels, smoothing)
    q[..., 0] = 0
    return -(q * logp).sum(-1)[labels != 0].mean()


def smoothing_term_over_pads(logits, labels, smoothing):  # learner test 8a, 2.8
    logp = F.log_softmax(logits, -1)
    nll = -logp.gather(-1, labels[..., None]).squeeze(-1)[labels != 0].mean()
    return (1 - smoothing) * nll + smoothing * (-logp.mean(-1)).mean()


def annotated_transformer(logits, labels, smoothing):  # learner test 10a, 2.8
    """ε/(|V| − 2) off the target, the padding column zeroed."""
    logp = F.log_softmax(logits, -1)
    q = torch.full_like(logp, smoothing / (logp.size(-1) - 2)).scatter(-1, labels[..., None], 1 - smoothing)
    q[..., 0] = 0
    return -(q * logp).sum(-1)[labels != 0].mean()


def mean_over_vocab(logits, labels, smoothing):  # learner test 10a, 2.8
    logp = F.log_softmax(logits, -1)
    return -(_q(logp, labels, smoothing) * logp).mean(-1)[labels != 0].mean()


def log1p_of_probs(logits, labels, smoothing):  # learner test 18a, 2.7: log(1 + p), not log p
    p = F.softmax(logits, -1)
    return -(_q(p, labels, smoothing) * p.log1p()).sum(-1)[labels != 0].mean()


def sqrt_of_probs(logits, labels, smoothing):  # another quantity that is not a log-probability
    p = F.softmax(logits, -1)
    return -(_q(p, labels, smoothing) * p.sqrt()).sum(-1)[labels != 0].mean()


REJECTS = [
    (log1p_of_probs, "损失是负数"),
    (sqrt_of_probs, "不是对数概率"),
    (annotated_transformer, "The Annotated Transformer 的写法"),
    (mean_over_vocab, "对词表求的是平均"),
    (smoothing_term_over_pads, "平滑那一项"),
    (target_overwritten, "恰好是 1 − ε"),
    (kl_divergence, "KL 散度"),
    (mean_of_sentence_means, "先对每句求平均"),
    (sum_over_sentences, "总和除以了句子数 N"),
    (softmax_over_time, "不是 dim=1（位置维，长 n）"),
    (softmax_over_batch, "dim=0 是批维"),
    (pad_class_zeroed, "填充类别（编号 0）上的 q 置 0"),
    (raw_logits_as_log_probs, "用成了原始 logits"),
    (softmax_as_log_probs, "用成了概率 softmax(logits)"),
    (target_share_only, "漏了均匀的那一份"),
    (no_smoothing, "标签平滑没有用上"),
    (smooth_over_others, "|V| − 1"),
    (pad_counted, "填充位置也算进了损失"),
    (pad_in_denominator, "除以全部位置数"),
    (summed, "损失之和"),
    (softmax_first, "不要先 softmax"),
    (as_number, "应是 torch.Tensor"),
    (detached, "不能求梯度"),
    (per_token, "0 维张量"),
]


@pytest.mark.parametrize(
    "fn, keyword",
    REJECTS,
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_smoothed_loss_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_smoothed_loss, fn, keyword, capsys)


def test_every_hint_is_reached(capsys):
    rejects = [pytest.param(ex.check_smoothed_loss, fn, k) for fn, k in REJECTS]
    assert_every_hint_reached({"_MISTAKES": objective._MISTAKES}, rejects, capsys)
