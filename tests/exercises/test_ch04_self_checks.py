"""Chapter 4's exercise cells, read from the page and run here: the cells of 4.3, 4.4,
4.16 and 4.20 reach their ``tc.exercises`` checkers with the page's objects and count in
``progress()`` (the checkers' hints are tested in ``test_attention_maps``,
``test_online_softmax``, ``test_receptive_field`` and ``test_ffn_memory``); the cells of the
numeric answers and of prediction 4.2 reach ``tc.exercises.check_number`` (whose hints
``test_numeric_answers`` tests); the sentence before ``progress()`` names what it lists.
Untrained models stand in for 4.3's trained pair."""

import math
import re

import pytest
import torch

import transformer_course as tc

from .support import BOOK, online_softmax_reference, page_cells, run_cell

# one marker per code cell the graders need (definitions and cheap set-up only)
MARKERS = {
    "imports": "import transformer_course as tc",
    "seeds": "def seeds(k, n=5)",
    "progression": "def progression_batch",
    "memory": "n_mem, E_m, tau = 20, 64, 0.7",
    "4.2": "my_prediction_distance = None",
    "4.2 check": "uniform_32 = torch.full((32, 32)",
    "4.3 skeleton": "def my_weight_on_next",
    "4.3": "check_weight_on_next(my_weight_on_next",
    "4.1": 'check_number("attention_bytes", my_bytes_answer',
    "4.11": 'check_number("qk_norm_temperature", my_g_min',
    "4.12": 'check_number("sparsemax_slopes", my_slopes',
    "4.16 skeleton": "def my_receptive_field",
    "4.16": 'check_receptive_field(my_receptive_field, exercise="4.16")',
    "4.14": 'check_number("retrieved_lags", my_k_h2',
    "4.18": 'check_number("weight_decay_factor", my_decay',
    "4.17": 'check_number("rope_base_period", my_base',
    "4.20 skeleton": "def my_add_memory",
    "4.20": 'check_add_memory(my_add_memory, **page_memories, exercise="4.20")',
    "4.4 bug": "def buggy_online_softmax",
    "4.4": 'check_online_softmax(my_fixed_online_softmax, exercise="4.4")',
    "progress": "tc.exercises.progress()",
}


@pytest.fixture(scope="module")
def cells():
    return page_cells("ch04_design_deep_dive.md", MARKERS)


def run(ns, source, name):
    return run_cell(ns, source, f"ch04: {name}")


@pytest.fixture(scope="module")
def page(cells):
    ns: dict = {}
    for key in ("imports", "seeds", "progression", "memory"):
        run(ns, cells[key], key)
    ns["causal_runs"] = {
        name: (tc.toy_tasks.TinyTransformer(16, 16, 12, causal=causal).eval(), None, None)
        for name, causal in (("有掩码", True), ("无掩码", False))
    }  # untrained stand-ins for the two trained models
    for key in ("4.3 skeleton", "4.20 skeleton", "4.4 bug", "4.16 skeleton"):
        run(ns, cells[key], key)
    return ns


def rejected(fn, *args):
    with pytest.raises(AssertionError) as info:
        fn(*args)
    return str(info.value)


# ---- the numeric answers and prediction 4.2: the page's cells reach check_number ----


def test_4_2_cell_shows_the_prediction_next_to_the_measurement(page, cells):
    source = cells["4.2"].replace("my_prediction_distance = None", "my_prediction_distance = 32 / 3")
    out = run(page, source + "\n" + cells["4.2 check"], "4.2")
    assert "这是大 L 的近似 L/3" in out and "实际 10.656。" in out, out
    assert out.count("尚未预测") == 2, out  # the causal pair, not yet predicted


def test_4_2_cells_grade_the_causal_pair_and_count_once_in_progress(page, cells):
    source = (
        cells["4.2"]
        .replace("my_prediction_distance = None", "my_prediction_distance = (32**2 - 1) / (3 * 32)")
        .replace("my_causal_distance = None", "my_causal_distance = 31 / 4")
        .replace("my_causal_keys = None", "my_causal_keys = 16")
    )
    tc.exercises._protocol.RESULTS.clear()
    try:
        out = run(page, source + "\n" + cells["4.2 check"], "4.2")
        assert "实际 7.75。✓" in out and "大 L 的近似 L/2" in out and "实际 16.5。" in out, out
        progress = run(page, cells["progress"], "progress")
        assert "1 道未通过（共 1 道，3 项检查）" in progress, progress
    finally:
        tc.exercises._protocol.RESULTS.clear()


# (cell, the learner's variable, a right answer, a wrong answer and a keyword of its hint)
NUMERIC_CELLS = [
    ("4.1", "my_bytes_answer", (2, 8), (8, 2), "顺序反了"),
    ("4.11", "my_g_min", 0.5 * math.log(891), 3.40, "只是有效数字不够"),
    ("4.12", "my_slopes", (0.5, 0.25), (0.25, 0.5), "顺序反了"),
    ("4.14", "my_k_h2", (4 * 0.84 - 0.5) * 8 / 7, 3.36, "漏了瞎猜的部分"),
    ("4.17", "my_base", (7 / (2 * math.pi)) ** 8, 7.0**8, "漏了 2π"),
    ("4.18", "my_decay", 0.999**200, 0.8187, "连续时间的近似"),
]


@pytest.mark.parametrize(("key", "name", "right", "wrong", "keyword"), NUMERIC_CELLS)
def test_numeric_cells_grade_the_learners_variable(page, cells, key, name, right, wrong, keyword):
    page["acc_h"] = {(2, 2): 0.84, (1, 1): 0.6}  # stand-ins for the trained accuracies
    try:
        for answer in (None, right):
            page[name] = answer
            out = run(page, cells[key], key)
            assert out.startswith(("尚未作答：" if answer is None else "✓ ") + f"练习 {key}："), out
        page[name] = wrong
        assert keyword in rejected(run, page, cells[key], key)
    finally:
        page[name] = None


# ---- 4.3, 4.4, 4.16, 4.20: the page's calls reach the package checkers -----------------


def weight_on_next(model, x):
    with torch.no_grad(), tc.notebook.record_attention(model) as maps:
        model(x)
    return maps[model.layers[0].self_attn].diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=(0, 2))


def receptive_field(L, n_w, layers):
    band = tc.causal_mask(L, window=n_w + 1).double()  # int64 counts overflow at (40, 3, 40)
    return torch.linalg.matrix_power(band, layers)[-1].count_nonzero().item()


def add_memory(ffn, k_new, v_new, tau):
    E, d_ff = ffn.w1.in_features, ffn.w1.out_features
    bigger = tc.FeedForward(E, d_ff + 1, "relu", bias=False)
    with torch.no_grad():
        bigger.w1.weight.copy_(torch.cat([ffn.w1.weight, torch.cat([k_new, -tau * torch.ones(1, 1)], 1)]))
        bigger.w2.weight.copy_(torch.cat([ffn.w2.weight, v_new.T / (1 - tau)], 1))
    return bigger


# (cell, the learner's name, a right answer, a wrong one and a keyword of its hint)
CHECKED_CELLS = [
    ("4.3", "my_weight_on_next", weight_on_next, lambda m, x: weight_on_next(m, x) * 2, "4.3"),
    ("4.4", "my_fixed_online_softmax", online_softmax_reference, "buggy_online_softmax", "那一行还没改"),
    (
        "4.16",
        "my_receptive_field",
        receptive_field,
        lambda L, n_w, layers: min(layers * n_w + 1, L),
        "没有做 (L, L) 掩码矩阵的乘积",
    ),
    ("4.20", "my_add_memory", add_memory, lambda ffn, k, v, tau: add_memory(ffn, k, v, 0.5), "参数 tau"),
]


@pytest.mark.parametrize(("key", "name", "right", "wrong", "keyword"), CHECKED_CELLS)
def test_checked_cells_grade_the_learners_function_and_count_in_progress(page, cells, key, name, right, wrong, keyword):
    tc.exercises._protocol.RESULTS.clear()
    skeleton = page[name]
    try:
        assert run(page, cells[key], key).startswith("尚未实现："), key
        page[name] = page[wrong] if isinstance(wrong, str) else wrong
        assert keyword in rejected(run, page, cells[key], key)
        page[name] = right
        assert run(page, cells[key], key).startswith("✓ "), key
        progress = run(page, cells["progress"], "progress")
        assert f"练习 {key}" in progress and "1 道通过" in progress, progress
    finally:
        page[name] = skeleton
        tc.exercises._protocol.RESULTS.clear()


# ---- the sentence before progress(): which exercises it lists and which it does not ------


def _numbers(text):
    """The exercise numbers a sentence names: 4.3, and 4.3～4.7 as 4.3 … 4.7."""
    found = set()
    for a, b in re.findall(r"4\.(\d+)(?:～4\.(\d+))?", text):
        found |= {f"4.{n}" for n in range(int(a), int(b or a) + 1)}
    return found


def test_the_sentence_before_progress_names_what_it_lists():
    source = (BOOK / "ch04_design_deep_dive.md").read_text(encoding="utf-8")
    exercises = set(re.findall(r":label: ch04-ex-(\d+)", source))
    graded = set(re.findall(r'exercise="(4\.\d+)"', source))
    end = source.index("tc.exercises.progress()")
    sentence = source[: source.rindex("```{code-cell}", 0, end)].strip().splitlines()[-1]
    listed, rest = sentence.split("；")
    assert _numbers(listed) == graded, sentence
    assert _numbers(rest) == {f"4.{n}" for n in exercises} - graded, sentence
