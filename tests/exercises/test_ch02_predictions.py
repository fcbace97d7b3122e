"""Chapter 2's graded predictions with a listed mistake, read from the page and run
here with hand-written predictions: the typical wrong answer gets its own hint."""

import pytest

from .support import page_cells, run_cell

MARKERS = {
    "imports": "def count_flops(fn):",
    "performer": "e_small, e_large = rel_error(64), rel_error(1024)",
    "crossover": "def decode_step_minus_ffn",
}


@pytest.fixture(scope="module")
def cells():
    return page_cells("ch02_formula_derivations.md", MARKERS)


def printed(cells, key, prediction):
    """What the page's cell ``key`` prints after ``my_prediction = prediction``."""
    ns: dict = {}
    run_cell(ns, cells["imports"], "ch02: imports")
    ns["my_prediction"] = prediction
    return run_cell(ns, cells[key], f"ch02: {key}")


@pytest.mark.parametrize(
    ("prediction", "verdict"),
    [
        (0.25, "你写的是 e(1024)/e(64)，即缩小后的比例"),  # learner test 24a: a false alarm before
        (16, "对照解答里的推理"),
    ],
)
def test_performer_ratio(cells, prediction, verdict):
    assert verdict in printed(cells, "performer", prediction)


@pytest.mark.parametrize(
    ("prediction", "verdict"),
    [
        (16512, "✓"),
        (16384, "4d 只在 d_ff 恰为 8d/3 时成立"),  # learner test 24a: the prompt's own guess
        (11008, "对照解答里的推理"),
    ],
)
def test_crossover(cells, prediction, verdict):
    assert verdict in printed(cells, "crossover", prediction)
