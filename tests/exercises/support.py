"""Assertions shared by the checker tests."""

import pytest

import transformer_course as tc
from transformer_course import exercises as ex


def assert_passes(checker, candidate, capsys, **kwargs):
    assert checker(candidate, **kwargs) is None  # nothing echoed under the cell
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("✓"), lines


def assert_skeleton(checker, skeleton, capsys):
    assert checker(skeleton) is None
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("尚未实现："), lines
    assert lines[0].endswith("（写好后重新运行本单元格）"), lines
    with pytest.raises(AssertionError, match="骨架"):
        checker(skeleton, solution=True)
    assert capsys.readouterr().out == ""


def assert_rejects(checker, candidate, keyword, capsys):
    with pytest.raises(ex.ExerciseError) as info:
        checker(candidate)
    assert keyword in str(info.value), str(info.value)
    assert "✓" not in capsys.readouterr().out


class GeluFeedForward(tc.FeedForward):
    """The package's FFN with the exercises' activation (its default is ReLU)."""

    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff, activation="gelu")
