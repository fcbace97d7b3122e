"""The teacher-forcing batch checker of chapter 1's find-the-bug exercise: correct
variants pass, a skeleton is "尚未实现", each typical mistake gets its own hint."""

import pytest
import torch

from transformer_course import exercises as ex
from transformer_course.exercises.translation_bugs import DECODER_BATCH_HINTS

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


def slicing(tgt, pad_id):
    labels = tgt[:, 1:].clone()
    labels[labels == pad_id] = -100
    return tgt[:, :-1], labels


def with_where(tgt, pad_id):
    t = tgt.size(1)
    dec_in = tgt.narrow(1, 0, t - 1)
    nxt = tgt.narrow(1, 1, t - 1)
    return dec_in, torch.where(nxt == pad_id, torch.full_like(nxt, -100), nxt)


def skeleton(tgt, pad_id):
    pass


def unshifted(tgt, pad_id):  # the page's bug: the labels are not shifted
    dec_in = tgt[:, :-1]
    return dec_in, dec_in.masked_fill(dec_in == pad_id, -100)


def reversed_shift(tgt, pad_id):
    labels = tgt[:, :-1].masked_fill(tgt[:, :-1] == pad_id, -100)
    return tgt[:, 1:], labels


def pad_kept(tgt, pad_id):
    return tgt[:, :-1], tgt[:, 1:]


def input_masked(tgt, pad_id):
    masked = tgt.masked_fill(tgt == pad_id, -100)
    return masked[:, :-1], masked[:, 1:]


def input_shifted(tgt, pad_id):  # learner test: labels right, the input shifted as well
    labels = tgt[:, 1:]
    return tgt[:, 1:], labels.masked_fill(labels == pad_id, -100)


def input_full(tgt, pad_id):  # learner test 15 (1.9): the decoder input not truncated
    labels = tgt[:, 1:]
    return tgt, labels.masked_fill(labels == pad_id, -100)


def mask_from_input(tgt, pad_id):  # learner test: -100 where the decoder input is padding
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    return dec_in, labels.masked_fill(dec_in == pad_id, -100)


def pad_as_zero(tgt, pad_id):  # always replaces token 0, whatever pad_id is
    return tgt[:, :-1], tgt[:, 1:].masked_fill(tgt[:, 1:] == 0, -100)


def pair_swapped(tgt, pad_id):  # learner test 6a, 1.9: (labels, dec_in)
    dec_in, labels = slicing(tgt, pad_id)
    return labels, dec_in


def rolled(tgt, pad_id):  # learner test 8a, 1.9: labels by a cyclic shift of dec_in
    dec_in = tgt[:, :-1]
    labels = torch.roll(dec_in, -1, 1)
    return dec_in, labels.masked_fill(labels == pad_id, -100)


def shifted_two(tgt, pad_id):  # learner test 34a, 1.9: labels tgt[:, 2:], padded back
    labels = torch.cat([tgt[:, 2:], torch.full_like(tgt[:, :1], pad_id)], 1)
    return tgt[:, :-1], labels.masked_fill(labels == pad_id, -100)


def labels_edited_in_place(tgt, pad_id):  # learner test 9a, 1.9: labels is a view of tgt
    labels = tgt[:, 1:]
    labels[labels == pad_id] = -100
    return tgt[:, :-1], labels


def eos_masked(tgt, pad_id):  # learner test 10a, 1.9: <eos> dropped from the loss too
    labels = tgt[:, 1:]
    return tgt[:, :-1], labels.masked_fill((labels == pad_id) | (labels == 2), -100)


def float_labels(tgt, pad_id):
    dec_in, labels = slicing(tgt, pad_id)
    return dec_in, labels.float()


def int32_labels(tgt, pad_id):  # learner test 27a, 1.9: label_smoothing_loss wants int64
    lab = tgt[:, 1:]
    return tgt[:, :-1], lab.masked_fill(lab == pad_id, -100).int()


def int32_input(tgt, pad_id):  # the model's embedding wants an int64 decoder input
    dec_in, labels = slicing(tgt, pad_id)
    return dec_in.to(torch.int32), labels


def one_tensor(tgt, pad_id):
    return tgt[:, :-1]


@pytest.mark.parametrize("fn", [slicing, with_where])
def test_correct_variants_pass(fn, capsys):
    assert_passes(ex.check_decoder_batch, fn, capsys)


def test_skeleton(capsys):
    assert_skeleton(ex.check_decoder_batch, skeleton, capsys)


REJECTS = [
    pytest.param(ex.check_decoder_batch, unshifted, "照抄", id="copy"),
    pytest.param(ex.check_decoder_batch, reversed_shift, "方向反了", id="reversed"),
    pytest.param(ex.check_decoder_batch, pad_kept, "pad_id 换成 -100", id="pad-kept"),
    pytest.param(ex.check_decoder_batch, input_masked, "只有标签", id="input-masked"),
    pytest.param(ex.check_decoder_batch, pad_as_zero, "pad_id 换成 -100", id="pad-id-ignored"),
    pytest.param(ex.check_decoder_batch, float_labels, "整数", id="float"),
    pytest.param(ex.check_decoder_batch, input_shifted, "解码器输入却也右移了", id="input-shifted"),
    pytest.param(ex.check_decoder_batch, input_full, "没有去掉最后一个词元", id="input-full"),
    pytest.param(ex.check_decoder_batch, mask_from_input, "-100 放错了位置", id="mask-from-input"),
    pytest.param(ex.check_decoder_batch, int32_labels, "labels 是 torch.int32，应是 torch.long", id="int32-labels"),
    pytest.param(ex.check_decoder_batch, int32_input, "dec_in 是 torch.int32，应是 torch.long", id="int32-input"),
    pytest.param(ex.check_decoder_batch, one_tensor, "两个张量", id="one-tensor"),
    pytest.param(ex.check_decoder_batch, pair_swapped, "两个返回值的顺序反了", id="pair-swapped"),
    pytest.param(ex.check_decoder_batch, rolled, "torch.roll", id="rolled"),
    pytest.param(ex.check_decoder_batch, shifted_two, "标签右移了两位", id="shifted-two"),
    pytest.param(ex.check_decoder_batch, eos_masked, "<eos> 也换成了 -100", id="eos-masked"),
    pytest.param(ex.check_decoder_batch, labels_edited_in_place, "原地修改了传进来的 tgt", id="in-place"),
]


@pytest.mark.parametrize("checker, fn, keyword", REJECTS)
def test_mistakes_get_their_hint(checker, fn, keyword, capsys):
    assert_rejects(checker, fn, keyword, capsys)


def test_every_hint_is_reached(capsys):
    assert_every_hint_reached({"DECODER_BATCH_HINTS": DECODER_BATCH_HINTS}, REJECTS, capsys)
