"""Chapter 3's entropy-slope check (ch03-ex-10), read from the page and run here with
hand-written slopes: a formula off by a power of ν passes at ν = 1 only, so the cell
compares at a second ν and names the slip there."""

import pytest
import torch

import transformer_course as tc

from .support import page_cells, run_cell

MARKER = "mine = my_entropy_slope(z_ex, nu)"


@pytest.fixture(scope="module")
def cell():
    return page_cells("ch03_math_essence_minigpt.md", {"slope": MARKER})["slope"]


def variance(z, nu):
    p = (nu * z).softmax(-1)
    return (p * z**2).sum() - ((p * z).sum()) ** 2


def printed(cell, slope):
    """What the cell prints for the learner's ``slope(z, nu)``, on fixed logits."""
    logits = torch.randn(1, 3, 11, generator=torch.Generator().manual_seed(0))
    ns = {
        "torch": torch,
        "tc": tc,
        "model": lambda x: (logits,),
        "xv": torch.zeros(1, 3, dtype=torch.long),
        "my_entropy_slope": slope,
        "my_entropy_at_infinity": None,
    }
    return run_cell(ns, cell, "ch03: entropy slope")


def test_the_right_slope_passes_at_both_nu(cell):
    out = printed(cell, lambda z, nu: -nu * variance(z, nu))
    assert out.count("✓") == 2, out


@pytest.mark.parametrize(
    ("slope", "hint"),
    [
        (lambda z, nu: -variance(z, nu), "少了因子 ν"),
        (lambda z, nu: -(nu**2) * variance(z, nu), "多乘了一个 ν"),
        (lambda z, nu: -variance(z, nu) / nu, "多除了 ν²"),
    ],
    ids=["nu dropped", "nu squared", "divided by nu"],
)
def test_a_wrong_power_of_nu_is_named_at_the_second_nu(cell, slope, hint):
    out = printed(cell, slope)
    first, second = out.splitlines()[:2]
    assert first.startswith("ν = 1 处") and "✓" in first, out  # ν = 1 cannot tell
    assert second.startswith("ν = 0.5 处") and hint in second, out


QK_MARKER = "my_var_qk, var_exact"


@pytest.fixture(scope="module")
def qk_cell():
    return page_cells("ch03_math_essence_minigpt.md", {"qk": QK_MARKER})["qk"]


def qk_printed(cell, mean, var):
    """The two lines the ch03-ex-1 cell prints for the learner's two numbers."""
    return run_cell({"torch": torch, "tc": tc, "my_mean_qk": mean, "my_var_qk": var}, cell, "ch03: q·k").splitlines()


def test_the_exact_moments_pass(qk_cell):
    lines = qk_printed(qk_cell, -32, 324.0)
    assert all("✓" in line for line in lines) and len(lines) == 2, lines


@pytest.mark.parametrize(
    ("mean", "var", "hint"),
    [
        (-32, 340, "减去均值的平方"),  # learner test 27a, 3.12: D E[q²] E[k²], within 5% of a sample
        (-32, 64, "只在均值为 0 时成立"),
        (-32, 320, "漏了 σ_k² μ_q² 一项"),
        (-32, 68, "漏了 σ_q² μ_k² 一项"),
        (-32, 5.0625, "方差要乘 D"),
        (32, 324, "符号反了"),
        (-0.5, 324, "要乘 D"),
    ],
    ids=["second moment", "zero mean", "no mu_q term", "no mu_k term", "one term", "mean sign", "mean one term"],
)
def test_a_typical_slip_is_named(qk_cell, mean, var, hint):
    lines = qk_printed(qk_cell, mean, var)
    wrong = [line for line in lines if "✓" not in line]
    assert len(wrong) == 1 and hint in wrong[0], lines
