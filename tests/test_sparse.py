"""Tests for transformer_course.sparse (sparsemax and sparsemax attention)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.sparse import (
    SparsemaxFunction,
    sparsemax,
    sparsemax_attention,
    sparsemax_threshold,
)


def reference_sparsemax(z: list[float]) -> list[float]:
    """Pure-Python sparsemax by the sorting algorithm of Martins & Astudillo (2016)."""
    zs = sorted(z, reverse=True)
    k, total = 0, 0.0
    for i, zi in enumerate(zs, start=1):
        if 1 + i * zi > total + zi:
            k, total = i, total + zi
        else:
            break
    tau = (total - 1) / k
    return [max(zi - tau, 0.0) for zi in z]


def projection_by_bisection(z: torch.Tensor, iters: int = 200) -> torch.Tensor:
    """Simplex projection of a 1-d tensor by bisection on tau (independent of the closed form)."""
    lo, hi = z.min().item() - 1.0, z.max().item()
    for _ in range(iters):
        mid = (lo + hi) / 2
        if torch.clamp(z - mid, min=0).sum().item() > 1:
            lo = mid
        else:
            hi = mid
    return torch.clamp(z - (lo + hi) / 2, min=0)


def test_known_values() -> None:
    torch.testing.assert_close(sparsemax(torch.tensor([2.0, 1.0, -1.0])), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(sparsemax(torch.tensor([1.0, 0.6, -0.5])), torch.tensor([0.7, 0.3, 0.0]))
    # equal scores: uniform distribution (no zero)
    torch.testing.assert_close(sparsemax(torch.zeros(4)), torch.full((4,), 0.25))


def test_rows_sum_to_one_and_exact_zeros() -> None:
    torch.manual_seed(0)
    z = 3 * torch.randn(64, 10)
    p = sparsemax(z, dim=-1)
    torch.testing.assert_close(p.sum(-1), torch.ones(64))
    assert (p >= 0).all()
    assert (p == 0).any()  # exact zeros, not just small numbers
    assert ((p == 0).sum(-1) > 0).float().mean() > 0.9


def test_matches_reference_and_threshold() -> None:
    torch.manual_seed(1)
    z = torch.randn(20, 7, dtype=torch.float64)
    p = sparsemax(z)
    ref = torch.tensor([reference_sparsemax(row.tolist()) for row in z], dtype=torch.float64)
    torch.testing.assert_close(p, ref)
    tau = sparsemax_threshold(z)
    assert tau.shape == (20, 1)
    torch.testing.assert_close(p, torch.clamp(z - tau, min=0))


def test_is_euclidean_projection() -> None:
    torch.manual_seed(2)
    for _ in range(5):
        z = torch.randn(9, dtype=torch.float64) * 2
        torch.testing.assert_close(sparsemax(z), projection_by_bisection(z), atol=1e-9, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=12,
    ),
    st.floats(min_value=-20, max_value=20, allow_nan=False, allow_infinity=False),
)
def test_properties(values: list[float], shift: float) -> None:
    z = torch.tensor(values, dtype=torch.float64)
    p = sparsemax(z)
    assert (p >= 0).all()
    assert abs(p.sum().item() - 1.0) < 1e-9
    # invariant to adding a constant
    torch.testing.assert_close(sparsemax(z + shift), p, atol=1e-9, rtol=0)
    # order preserving: larger score never gets a smaller probability
    order = torch.argsort(z)
    assert (p[order].diff() >= -1e-12).all()
    torch.testing.assert_close(p, torch.tensor(reference_sparsemax(values), dtype=torch.float64))


def test_dim_argument() -> None:
    torch.manual_seed(3)
    z = torch.randn(3, 5, 4)
    for dim in (0, 1, 2, -1, -2):
        p = sparsemax(z, dim=dim)
        torch.testing.assert_close(p.sum(dim), torch.ones_like(p.sum(dim)))
        moved = sparsemax(z.movedim(dim, -1), dim=-1).movedim(-1, dim)
        torch.testing.assert_close(p, moved)


def test_large_spread_is_one_hot_and_small_spread_is_dense() -> None:
    z = torch.tensor([0.0, 0.1, 0.2, 0.3])
    assert (sparsemax(z) > 0).all()
    assert (sparsemax(100 * z) == torch.tensor([0.0, 0.0, 0.0, 1.0])).all()


def test_masked_entries_and_fully_masked_rows() -> None:
    z = torch.tensor([[0.3, -math.inf, 0.1], [-math.inf, -math.inf, -math.inf]])
    p = sparsemax(z)
    torch.testing.assert_close(p[0], torch.tensor([0.6, 0.0, 0.4]))
    assert p[0, 1] == 0
    torch.testing.assert_close(p[1], torch.zeros(3))
    assert torch.isfinite(p).all()
    assert torch.isinf(sparsemax_threshold(z)[1]).all()


def test_gradcheck_float64() -> None:
    torch.manual_seed(4)
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: sparsemax(x, dim=-1), (z,))
    z2 = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: sparsemax(x, dim=1), (z2,))


def test_gradient_matches_closed_form_jacobian() -> None:
    torch.manual_seed(5)
    z = torch.randn(7, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(sparsemax, z)
    s = (sparsemax(z) > 0).to(torch.float64)
    expected = torch.diag(s) - torch.outer(s, s) / s.sum()
    torch.testing.assert_close(jac, expected)


def test_gradient_with_masked_entries_is_finite() -> None:
    z = torch.tensor([0.5, -math.inf, 0.2, 0.4], dtype=torch.float64, requires_grad=True)
    sparsemax(z).pow(2).sum().backward()
    assert z.grad is not None and torch.isfinite(z.grad).all()
    assert z.grad[1] == 0


def test_autograd_function_direct() -> None:
    z = torch.tensor([[1.0, 0.6, -0.5]])
    torch.testing.assert_close(SparsemaxFunction.apply(z, 1), sparsemax(z))


@pytest.mark.parametrize(
    ("bad", "dim", "exc", "match"),
    [
        (torch.tensor([1, 2, 3]), -1, ValueError, "floating"),
        (torch.tensor(1.0), -1, ValueError, "0-d"),
        (torch.randn(2, 3), 2, ValueError, "dim=2"),
        (torch.randn(2, 0), -1, ValueError, "size 0"),
        (torch.tensor([1.0, float("nan")]), -1, ValueError, "NaN"),
        (torch.tensor([1.0, float("inf")]), -1, ValueError, r"\+inf"),
        ([1.0, 2.0], -1, TypeError, "torch.Tensor"),
        (torch.randn(3), 1.5, TypeError, "dim must be an int"),
    ],
)
def test_bad_input(bad: object, dim: object, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        sparsemax(bad, dim=dim)  # type: ignore[arg-type]
    with pytest.raises(exc, match=match):
        sparsemax_threshold(bad, dim=dim)  # type: ignore[arg-type]


def test_attention_shapes_and_weights() -> None:
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 5)
    out, w = sparsemax_attention(q, k, v)
    assert out.shape == (2, 3, 4, 5) and w.shape == (2, 3, 4, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 4))
    expected_w = sparsemax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


def test_attention_masks() -> None:
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 3)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    _, w = sparsemax_attention(q, k, v, attn_mask=causal)
    assert (w[..., ~causal] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 4))
    additive = torch.zeros(4, 4).masked_fill(~causal, -math.inf)
    _, w2 = sparsemax_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(w, w2)
    # a fully masked row gives zero weights and a zero output
    mask = causal.clone()
    mask[2] = False
    out, w3 = sparsemax_attention(q, k, v, attn_mask=mask)
    assert (w3[0, 2] == 0).all() and (out[0, 2] == 0).all()
    assert torch.isfinite(out).all()


def test_attention_scale_and_gradcheck() -> None:
    torch.manual_seed(8)
    q = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    _, w = sparsemax_attention(q, k, v, scale=10.0)
    torch.testing.assert_close(w, sparsemax(10.0 * q @ k.T))
    assert torch.autograd.gradcheck(lambda a, b, c: sparsemax_attention(a, b, c)[0], (q, k, v))


@pytest.mark.parametrize(
    ("shapes", "kwargs", "exc", "match"),
    [
        (
            ((3, 4), (5, 3), (5, 2)),
            {},
            ValueError,
            r"^query and key must share the last dim D, got query \(3, 4\) and key \(5, 3\)$",
        ),
        (
            ((3, 4), (5, 4), (6, 2)),
            {},
            ValueError,
            r"^key and value must share the length S, got key \(5, 4\) and value \(6, 2\)$",
        ),
        (((4,), (5, 4), (5, 2)), {}, ValueError, r"^query must have at least 2 dims, got shape \(4,\)$"),
        (((3, 4), (5, 4), (5, 2)), {"scale": 0.0}, ValueError, "scale must be positive"),
        (
            ((3, 4), (5, 4), (5, 2)),
            {"attn_mask": torch.ones(4, 5, dtype=torch.bool)},
            ValueError,
            "does not broadcast",
        ),
    ],
)
def test_attention_bad_input(
    shapes: tuple[tuple[int, ...], ...], kwargs: dict, exc: type[Exception], match: str
) -> None:
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(exc, match=match):
        sparsemax_attention(q, k, v, **kwargs)
