"""Tests of the chapter-2 checker: the key-padding mask from sentence lengths."""

import pytest
import torch

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import derivation_checks

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


def from_token_ids(lengths, S):
    tokens = torch.ones(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        tokens[b, n:] = 0
    return tc.padding_mask(tokens, pad_id=0)


def test_accepts(capsys):
    assert_passes(ex.check_padding_mask, from_token_ids, capsys)
    assert_passes(
        ex.check_padding_mask,
        lambda lengths, S: (torch.arange(S)[None, :] < lengths[:, None]).view(-1, 1, 1, S),
        capsys,
    )
    assert_passes(
        ex.check_padding_mask,
        lambda lengths, S: ~(torch.arange(S) >= lengths.unsqueeze(1))[:, None, None],
        capsys,
    )


def test_skeleton(capsys):
    def my_padding_mask(lengths, S):
        pass

    assert_skeleton(ex.check_padding_mask, my_padding_mask, capsys)


def check(fn, keyword, id):
    return pytest.param(ex.check_padding_mask, fn, keyword, id=id)


REJECTS = [
    check(lambda L, S: torch.arange(S) >= L[:, None, None, None], "反了", "inverted"),
    check(lambda L, S: (torch.arange(S) <= L[:, None])[:, None, None], "pos <= ℓ", "one-more"),
    check(lambda L, S: (torch.arange(S) + 1 < L[:, None])[:, None, None], "少了最后一个", "one-less"),
    check(lambda L, S: torch.arange(S) < L[:, None], "[:, None, None, :]", "flat"),
    check(lambda L, S: (torch.arange(S) < L[:, None]).float()[:, None, None], "torch.bool", "float"),
    check(  # learner test 9a, 2.5
        lambda L, S: (torch.arange(S) < L[:, None]).long()[:, None, None], "torch.int64：非布尔的掩码", "int64"
    ),
    check(lambda L, S: (torch.arange(S) < L[:, None])[None, None], "形状不对", "shape"),
    check(  # learner test 20a, 2.2: the mask of a left-padded batch
        lambda L, S: (torch.arange(S) >= (S - L)[:, None])[:, None, None, :], "左填充", "left-padded"
    ),
    check(lambda L, S: (torch.arange(S) < (S - L)[:, None])[:, None, None, :], "而且 True/False 反了", "left-inverted"),
    check(lambda L, S: torch.ones(len(L), 1, 1, S, dtype=torch.bool), "位置 0..ℓ−1", "all-true"),
    check(  # learner test 25a, 2.2: the positions on the query axis
        lambda L, S: (torch.arange(S) < L[:, None])[:, None, :, None], "放在了查询那一维", "query-side"
    ),
    check(lambda L, S: L.tolist(), "torch.Tensor", "list"),
    check(lambda L, S: L[S], "IndexError", "crash"),
]


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {"PADDING_MASK_HINTS": derivation_checks.PADDING_MASK_HINTS}
    assert_every_hint_reached(tables, REJECTS, capsys)


def test_learner_cannot_change_the_lengths(capsys):
    def in_place(lengths, S):
        lengths.zero_()
        return torch.zeros(len(lengths), 1, 1, S, dtype=torch.bool)

    assert_rejects(ex.check_padding_mask, in_place, "位置 0..ℓ−1", capsys)


def test_chapter_2_messages_use_the_papers_letters(capsys):
    def flat(lengths, S):
        return torch.arange(S) < lengths[:, None]

    with pytest.raises(ex.ExerciseError) as info:
        ex.check_padding_mask(flat, exercise="2.5")
    message = str(info.value)
    assert "m = 5" in message and "(N, h, n, m)" in message and "(N, 1, 1, m)" in message, message
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_padding_mask(flat)
    message = str(info.value)
    assert "S = 5" in message and "(N, H, L, S)" in message and "(N, 1, 1, S)" in message, message
