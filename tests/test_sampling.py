"""Exact tests of greedy / temperature / top-k / top-p sampling (transformer_course.sampling).

Expectations come from a plain-Python reference (``_reference_probs``) or from probabilities
written out by hand, never from the functions under test. The top-p boundary is pinned with
``torch.softmax(...).cumsum(...)`` of the sorted row, i.e. the float32 mass the rule is defined on.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from transformer_course.sampling import check_sampling_args, sample_next_token, top_k_filter, top_p_filter

NEG_INF = float("-inf")


def _kept(filtered: torch.Tensor) -> list[int]:
    return torch.nonzero(filtered != NEG_INF).flatten().tolist()


def _expect_kept(logits: torch.Tensor, filtered: torch.Tensor, kept: list[int]) -> None:
    """``filtered`` is ``logits`` on the ``kept`` positions and -inf elsewhere, exactly."""
    mask = torch.zeros(logits.shape, dtype=torch.bool)
    mask[kept] = True
    expected = torch.where(mask, logits, torch.full_like(logits, NEG_INF))
    assert torch.equal(filtered, expected), (filtered, expected)


def _reference_probs(logits: list[float], temperature: float, top_k: int | None, top_p: float | None) -> list[float]:
    """Plain-Python float64 reference: softmax(logits / T), then top-k, then top-p, renormalised."""
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    kept = set(order)
    if top_k is not None:
        kept = set(order[:top_k])
    if top_p is not None:
        total = sum(weights[i] for i in kept)
        mass, nucleus = 0.0, set()
        for i in (i for i in order if i in kept):
            if mass >= top_p:
                break
            nucleus.add(i)
            mass += weights[i] / total
        kept = nucleus
    total = sum(weights[i] for i in kept)
    return [weights[i] / total if i in kept else 0.0 for i in range(len(weights))]


# ---------------------------------------------------------------------------------------- top-k
LOGITS = torch.tensor([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0])
DESCENDING = [5, 4, 2, 0, 6, 3, 1]  # indices of LOGITS by decreasing value, written by hand


@pytest.mark.parametrize("k", range(1, 8))
def test_top_k_keeps_the_k_th_token_and_drops_the_next(k):
    _expect_kept(LOGITS, top_k_filter(LOGITS, k), DESCENDING[:k])


def test_top_k_larger_than_vocabulary_keeps_everything():
    assert torch.equal(top_k_filter(LOGITS, 100), LOGITS)


def test_top_k_keeps_every_token_tied_with_the_k_th():
    logits = torch.tensor([1.0, 2.0, 2.0, 0.0, 2.0])
    _expect_kept(logits, top_k_filter(logits, 1), [1, 2, 4])
    _expect_kept(logits, top_k_filter(logits, 3), [1, 2, 4])
    _expect_kept(logits, top_k_filter(logits, 4), [0, 1, 2, 4])


def test_top_k_filters_each_row_of_a_batch_on_the_last_dim():
    rows = torch.stack([LOGITS, -LOGITS, LOGITS.flip(0)]).reshape(3, 1, 7)
    out = top_k_filter(rows, 2)
    assert out.shape == (3, 1, 7)
    _expect_kept(rows[0, 0], out[0, 0], [5, 4])
    _expect_kept(rows[1, 0], out[1, 0], [1, 3])
    _expect_kept(rows[2, 0], out[2, 0], [1, 2])


# ---------------------------------------------------------------------------------------- top-p
# Distinct logits in a shuffled order; SORTED[i] is the position of the i-th most likely token.
P_LOGITS = torch.tensor([0.5, 2.0, -1.0, 1.0, -3.0])
SORTED = [1, 3, 0, 2, 4]


def _masses(logits: torch.Tensor) -> torch.Tensor:
    """float32 cumulative probability of the 1, 2, ... most likely tokens."""
    return torch.softmax(logits.sort(descending=True).values, dim=-1).cumsum(-1)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_top_p_boundary_mass_exactly_p_keeps_that_prefix_only(m):
    mass = _masses(P_LOGITS)[m - 1].item()  # the top m tokens hold exactly this (float32) mass
    _expect_kept(P_LOGITS, top_p_filter(P_LOGITS, mass), SORTED[:m])
    # a hair more mass needs one more token; a hair less is still reached by the same m
    above = torch.nextafter(torch.tensor(mass), torch.tensor(2.0)).item()
    below = torch.nextafter(torch.tensor(mass), torch.tensor(0.0)).item()
    _expect_kept(P_LOGITS, top_p_filter(P_LOGITS, above), SORTED[: m + 1])
    _expect_kept(P_LOGITS, top_p_filter(P_LOGITS, below), SORTED[:m])


def test_top_p_keeps_the_top_token_alone_when_it_is_above_p():
    logits = torch.tensor([0.0, 5.0, 1.0])  # the top token has probability 0.976
    for p in (1e-6, 0.5, 0.97):
        _expect_kept(logits, top_p_filter(logits, p), [1])
    _expect_kept(logits, top_p_filter(logits, 0.98), [1, 2])


def test_top_p_keeps_tokens_tied_with_the_last_kept_one():
    logits = torch.tensor([1.0, 0.0, 1.0, -2.0])  # the two 1.0 tokens are tied
    _expect_kept(logits, top_p_filter(logits, 0.1), [0, 2])  # the first alone reaches 0.1
    logits = torch.tensor([math.log(2.0), 0.0, 0.0])  # 0.5, 0.25, 0.25
    _expect_kept(logits, top_p_filter(logits, 0.6), [0, 1, 2])


def test_top_p_one_keeps_even_tokens_lost_to_float32_rounding():
    logits = torch.tensor([0.0, -20.0, -30.0, -40.0])  # 1 + 2e-9 == 1 in float32
    assert _masses(logits)[1].item() == 1.0  # so the cumulative sum reaches 1 before the tail
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    _expect_kept(logits, top_p_filter(logits, 0.999), [0])


def test_top_p_filters_rows_independently():
    rows = torch.stack([P_LOGITS, torch.tensor([0.0, 0.0, 0.0, 0.0, 9.0]), P_LOGITS.flip(0)])
    p = _masses(P_LOGITS)[1].item()
    out = top_p_filter(rows, p)
    _expect_kept(rows[0], out[0], SORTED[:2])
    _expect_kept(rows[1], out[1], [4])
    _expect_kept(rows[2], out[2], [4 - i for i in SORTED[:2]])


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=8), st.floats(0.01, 1.0), st.integers(1, 9), st.randoms())
def test_filters_do_not_depend_on_token_order(values, p, k, rnd):
    """Permuting a row permutes the result (ties included); kept logits all beat dropped ones."""
    logits = torch.tensor(values, dtype=torch.float32)
    perm = list(range(len(values)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    for out, out_perm in (
        (top_k_filter(logits, k), top_k_filter(logits[perm], k)),
        (top_p_filter(logits, p), top_p_filter(logits[perm], p)),
    ):
        assert torch.equal(out[perm], out_perm)
        kept = out != NEG_INF
        assert kept[logits.argmax()]
        if not kept.all():
            assert logits[kept].min() > logits[~kept].max()
    assert int((top_k_filter(logits, k) != NEG_INF).sum()) >= min(k, len(values))


# ------------------------------------------------------------------------- sample_next_token
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, None), (0.7, None, None), (2.0, None, None), (1.0, 3, None), (1.3, None, 0.8), (0.8, 4, 0.7)],
)
def test_empirical_frequencies_match_the_filtered_softmax(temperature, top_k, top_p):
    """20,000 draws with a fixed generator: zero draws of filtered tokens, chi-square within bounds.

    The generator is seeded, so the test is deterministic; the bound 30 for at most 5 degrees of
    freedom would be exceeded by a correct sampler with probability < 2e-5 for a new seed, while
    a wrong temperature, filter or order of filters moves the statistic into the hundreds.
    """
    logits = [1.2, -0.3, 0.4, 2.0, -1.5, 0.9]
    expected = _reference_probs(logits, temperature, top_k, top_p)
    n = 20_000
    gen = torch.Generator().manual_seed(1234)
    row = torch.tensor(logits).expand(n, -1)
    kwargs = {"top_k": top_k, "top_p": top_p, "generator": gen}
    if temperature != 1.0:  # otherwise rely on the default temperature, 1
        kwargs["temperature"] = temperature
    ids = sample_next_token(row, **kwargs)
    assert ids.shape == (n, 1) and ids.dtype == torch.long
    counts = torch.bincount(ids.flatten(), minlength=len(logits)).tolist()
    chi2 = 0.0
    for count, prob in zip(counts, expected, strict=True):
        if prob == 0.0:
            assert count == 0
        else:
            chi2 += (count - n * prob) ** 2 / (n * prob)
    assert chi2 < 30.0, (counts, [round(n * q) for q in expected])


def test_sampling_is_reproducible_with_a_generator():
    logits = torch.randn(4, 10)
    a = sample_next_token(logits, generator=torch.Generator().manual_seed(5))
    b = sample_next_token(logits, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_greedy_returns_the_argmax_and_ignores_temperature():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, -5.0, 1.9]])
    assert sample_next_token(logits, greedy=True).tolist() == [[1], [0]]
    assert sample_next_token(logits, temperature=0.0, greedy=True).tolist() == [[1], [0]]
    # greedy decoding still rejects bad filter arguments instead of silently ignoring them
    with pytest.raises(ValueError, match="top_k"):
        sample_next_token(logits, greedy=True, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        sample_next_token(logits, greedy=True, top_p=2.0)


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("nan"), float("inf"), float("-inf"), "1.0", None, True])
def test_bad_temperature_is_named_with_its_value(bad):
    """TypeError for a wrong type, ValueError for a wrong value; the message names both."""
    if isinstance(bad, (int, float)) and not isinstance(bad, bool):
        error, message = ValueError, r"must be a finite positive number \(use greedy=True for argmax\)"
    else:
        error, message = TypeError, "must be a real number"
    with pytest.raises(error, match=rf"^temperature {message}, got {re.escape(repr(bad))}$"):
        sample_next_token(torch.zeros(1, 3), temperature=bad)


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [(0, ValueError, "must be positive"), (-2, ValueError, "must be positive"), (2.0, TypeError, "must be an int"),
     (True, TypeError, "must be an int"), ("3", TypeError, "must be an int")],
)  # fmt: skip
def test_bad_top_k_is_named_with_its_value(bad, error, message):
    with pytest.raises(error, match=rf"^top_k {message}, got {re.escape(repr(bad))}$"):
        sample_next_token(torch.zeros(1, 3), top_k=bad)
    with pytest.raises(error, match="top_k"):
        top_k_filter(torch.zeros(3), bad)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.0000001, float("nan"), "0.9", True])
def test_bad_top_p_is_named_with_its_value(bad):
    wrong_type = isinstance(bad, (str, bool))
    error, message = (TypeError, "must be a real number") if wrong_type else (ValueError, r"must be in \(0, 1\]")
    with pytest.raises(error, match=rf"^top_p {message}, got {re.escape(repr(bad))}$"):
        sample_next_token(torch.zeros(1, 3), top_p=bad)
    with pytest.raises(error, match="top_p"):
        top_p_filter(torch.zeros(3), bad)


def test_check_sampling_args_accepts_good_values_and_checks_greedy():
    check_sampling_args(0.5, 3, 0.9)
    check_sampling_args(1, None, 1)  # ints are real numbers
    check_sampling_args(float("nan"), greedy=True)  # greedy decoding ignores temperature
    with pytest.raises(ValueError, match="temperature"):
        check_sampling_args(float("nan"))  # sampling (greedy=False) is the default
    with pytest.raises(ValueError, match="greedy must be a bool, got 'yes'"):
        check_sampling_args(1.0, greedy="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("logits", "message"),
    [
        (torch.zeros(3), r"torch.float32 \(3,\)"),
        (torch.zeros(1, 2, 3), r"\(1, 2, 3\)"),
        (torch.zeros(2, 3, dtype=torch.long), "torch.int64"),
        ([[0.0, 1.0]], "list"),
    ],
)
def test_bad_logits_are_rejected(logits, message):
    with pytest.raises(TypeError if isinstance(logits, list) else ValueError, match=message):
        sample_next_token(logits)
