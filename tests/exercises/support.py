"""Assertions shared by the checker tests, and the hint-coverage check."""

import contextlib
import io
import math
import re
from pathlib import Path

import jupytext
import pytest
import torch

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


def rejection(checker, candidate):
    """The checker's message for a wrong ``candidate`` (it must raise)."""
    with pytest.raises(ex.ExerciseError) as info:
        checker(candidate)
    return str(info.value)


def assert_rejects(checker, candidate, keyword, capsys):
    message = rejection(checker, candidate)
    assert keyword in message, message
    assert "✓" not in capsys.readouterr().out


def _pattern(template):
    """A hint template's literal parts, anything where its {placeholders} are."""
    return re.compile(".+?".join(re.escape(part) for part in re.split(r"\{[^}]*\}", template)))


def assert_every_hint_reached(tables, rejects, capsys):
    """Every entry of every table in ``tables`` appears in the message of at least one of
    the ``rejects`` (pytest.param(checker, candidate, keyword)). A table is
    ``[(hint, mistake), ...]``, or for crashes (``*_CRASHES``, ``CRASH_CAUSES``)
    ``[(pattern, hint), ...]``."""
    messages = [rejection(checker, candidate) for checker, candidate, _ in (p.values for p in rejects)]
    capsys.readouterr()
    missed = []
    for name, table in tables.items():
        crashes = name.endswith(("CRASHES", "CAUSES"))
        for entry in table:
            key, hint = entry if crashes else entry[::-1]
            if not any(_pattern(hint).search(m) for m in messages):
                missed.append(f"{name}[{key!r}]")
    assert not missed, f"hint-table entries no mutant reaches: {missed}"


class GeluFeedForward(tc.FeedForward):
    """The package's FFN with the exercises' activation (its default is ReLU)."""

    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff, activation="gelu")


BOOK = Path(__file__).resolve().parents[2] / "book"


def page_cells(page, markers):
    """{key: source} of the code cells of ``book/page`` that hold each marker, one each."""
    code = [c.source for c in jupytext.read(BOOK / page).cells if c.cell_type == "code"]
    found = {}
    for key, marker in markers.items():
        hits = [src for src in code if marker in src]
        assert len(hits) == 1, f"{page} has {len(hits)} cells with {marker!r}"
        found[key] = hits[0]
    return found


def run_cell(ns, source, name):
    """Execute a page cell's ``source`` in ``ns``; what it prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"<{name}>", "exec"), ns)  # noqa: S102
    return out.getvalue()


def online_softmax_reference(q, k, v, block=4):
    """Section 4.1.4's (c, ℓ, o) recurrence, divided at the end: a right answer to ex 4.4."""
    c = torch.full(q.shape[:-1] + (1,), -math.inf)
    ell = torch.zeros_like(c)
    o = torch.zeros(q.shape[:-1] + (v.size(-1),))
    for start in range(0, k.size(-2), block):
        s = q @ k[..., start : start + block, :].mT / math.sqrt(q.size(-1))
        c_new = torch.maximum(c, s.amax(-1, keepdim=True))
        fix = torch.exp(c - c_new)
        p = torch.exp(s - c_new)
        ell = ell * fix + p.sum(-1, keepdim=True)
        o = o * fix + p @ v[..., start : start + block, :]
        c = c_new
    return o / ell
