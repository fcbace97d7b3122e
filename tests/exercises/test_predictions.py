import numpy as np
import pytest
import torch

import transformer_course as tc


@pytest.mark.parametrize(
    ("prediction", "actual", "expected"),
    [
        (None, 4.17, "尚未预测：未训练的损失。先在上面写下你的预测，再运行这一格看结果"),
        (4.0, 4.17, "未训练的损失：你的预测 4.0，实际 4.17。✓ 在 10% 以内（相差 4.1%）"),
        (2.0, 4.17, "未训练的损失：你的预测 2.0，实际 4.17。相差 52%，偏小：对照解答里的推理，看看哪一步想得不一样"),
        (9, 4.17, "未训练的损失：你的预测 9，实际 4.17。相差 116%，偏大：对照解答里的推理，看看哪一步想得不一样"),
        ("B", "B", "未训练的损失：你的预测 'B'，实际 'B'。✓ 一致"),
        ("A", "B", "未训练的损失：你的预测 'A'，实际 'B'。不一致：对照解答里的推理"),
    ],
)
def test_prints_the_prediction_next_to_the_result(capsys, prediction, actual, expected):
    options = ["A", "B"] if isinstance(actual, str) else None
    tc.exercises.compare_prediction(prediction, actual, what="未训练的损失", options=options)
    assert capsys.readouterr().out.strip() == expected


@pytest.mark.parametrize(
    ("prediction", "actual", "wanted"),
    [
        ("10.66", 10.656, "一个数（如 10.5）"),
        ("True", True, " True 或 False"),
        ("True", np.bool_(True), " True 或 False"),
    ],
)
def test_a_string_for_a_number_or_bool_is_named_not_judged(capsys, prediction, actual, wanted):
    # learner test 20b: "True" or "10.66" was reported as a wrong prediction
    tc.exercises.compare_prediction(prediction, actual, what="x")
    out = capsys.readouterr().out.strip()
    head = f"x：你的预测 {prediction!r} 是字符串（str），"
    assert out == head + f"这里要写{wanted}，不加引号。改好后重新运行这一格"
    assert "✓" not in out and "实际" not in out  # neither passed nor the answer given away


def test_np_bool_is_shown_as_a_bool(capsys):
    tc.exercises.compare_prediction(True, np.bool_(True), what="x")
    assert capsys.readouterr().out.strip() == "x：你的预测 True，实际 True。✓ 一致"


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="what must be a non-empty str"):
        tc.exercises.compare_prediction(1, 1, what="")
    with pytest.raises(ValueError, match="rel_tol must be a number in"):
        tc.exercises.compare_prediction(1, 1, what="x", rel_tol=1.5)


GRADIENT = ["恰好为 0", "很小", "差不多大"]  # ch02's options
VERSUS = ["更低", "差不多", "更高"]  # ch05's


@pytest.mark.parametrize(
    ("prediction", "actual", "options"),
    [
        ("恰好为0", "恰好为 0", GRADIENT),  # learner test 21a: the page spells it with a space
        ("恰好为 0 ", "恰好为 0", GRADIENT),
        ("恰好为０", "恰好为 0", GRADIENT),  # a full-width digit
        ("X", "x", ["1", "x"]),
        (" 更低", "更低", VERSUS),
        # learner tests 22a and 22c: right, but punctuated or with 的
        (" 更低。", "更低", VERSUS),
        ("更低!", "更低", VERSUS),
        ("“更低”", "更低", VERSUS),
        ("有限的", "有限", ["nan", "有限"]),
        ("有限的。", "有限", ["nan", "有限"]),
        ("不变。", "不变", ["变多", "不变", "变少"]),
        # the part before or inside an option's parenthesis
        ("缩放", "x", ["1（平移）", "x（缩放）"]),
        ("x", "x", ["1（平移）", "x（缩放）"]),
        ("x (缩放)", "x", ["1（平移）", "x（缩放）"]),
        ("更低（0.1 nats）", "更低", VERSUS),
    ],
)
def test_spellings_of_the_answer_agree(capsys, prediction, actual, options):
    tc.exercises.compare_prediction(prediction, actual, what="x", options=options)
    assert capsys.readouterr().out.strip().endswith("✓ 一致")


@pytest.mark.parametrize(
    ("prediction", "actual", "options"),
    [
        ("很小", "恰好为 0", GRADIENT),
        ("差不多大。", "恰好为 0", GRADIENT),
        ("更高的", "更低", VERSUS),
        ("nan", "有限", ["nan", "有限"]),
        ("平移", "x", ["1（平移）", "x（缩放）"]),
    ],
)
def test_another_option_disagrees(capsys, prediction, actual, options):
    tc.exercises.compare_prediction(prediction, actual, what="x", options=options)
    out = capsys.readouterr().out.strip()
    assert out.endswith("不一致：对照解答里的推理"), out


@pytest.mark.parametrize(
    ("prediction", "options", "listed"),
    [
        # learner tests 22a and 22c: ideas in other words were told "不一致"
        ("lower", VERSUS, '"更低"、"差不多" 或 "更高"'),
        ("低", VERSUS, '"更低"、"差不多" 或 "更高"'),
        ("finite", ["nan", "有限"], '"nan" 或 "有限"'),
        ("第0层", ["层 0", "层 1"], '"层 0" 或 "层 1"'),
        ("0", ["层 0", "层 1"], '"层 0" 或 "层 1"'),
        ("beta", ["β", "输入 x", "全 0", "随输入变化"], '"β"、"输入 x"、"全 0" 或 "随输入变化"'),
        ("", ["nan", "有限"], '"nan" 或 "有限"'),
    ],
)
def test_a_prediction_that_is_no_option_is_named_without_the_answer(capsys, prediction, options, listed):
    tc.exercises.compare_prediction(prediction, options[0], what="x", options=options)
    out = capsys.readouterr().out.strip()
    assert out == f"x：你的预测 {prediction!r} 不是选项之一。从 {listed} 里选一个照抄（加引号），再运行这一格"
    assert "实际" not in out and "✓" not in out and "不一致" not in out


def test_a_number_for_an_option_lists_the_options(capsys):
    tc.exercises.compare_prediction(0, "层 0", what="x", options=["层 0", "层 1"])
    out = capsys.readouterr().out.strip()
    assert out == 'x：你的预测 0 是一个 int，这里要写选项之一，加引号："层 0" 或 "层 1"。改好后重新运行这一格'


def test_the_answer_is_shown_as_its_option(capsys):
    tc.exercises.compare_prediction("1", "x", what="x", options=["1（平移）", "x（缩放）"])
    assert capsys.readouterr().out.strip() == "x：你的预测 '1'，实际 'x（缩放）'。不一致：对照解答里的推理"


@pytest.mark.parametrize(
    ("actual", "options", "error", "match"),
    [
        ("y", ["a", "b"], ValueError, "'y' is not one of options"),
        ("a", None, TypeError, "needs options="),
        (1.0, ["a", "b"], TypeError, "options= is for str answers"),
        ("a", ["a", "a。"], ValueError, "spelled like another option"),
        ("a", ["更硬（更集中）", "更集中"], ValueError, "spelled like another option"),
        ("a", "ab", TypeError, "a list of at least two str"),
        ("a", ["a"], TypeError, "a list of at least two str"),
        ("a", ["a", 1], TypeError, "a list of at least two str"),
    ],
)
def test_options_must_name_the_answer(actual, options, error, match):
    with pytest.raises(error, match=match):
        tc.exercises.compare_prediction("a", actual, what="x", options=options)


def test_a_typical_wrong_prediction_gets_its_own_hint(capsys):
    # learner tests 22b and 23: 4.2's large-L approximation L/3 got the general advice
    mistakes = [(32 / 3, "这是大 L 的近似 L/3"), (11, "分母少算了 j = i 的 L 项")]
    for prediction, why in [(32 / 3, "这是大 L 的近似 L/3"), (10.6667, "这是大 L 的近似 L/3"),
                            (11.0, "分母少算了 j = i 的 L 项")]:  # fmt: skip
        tc.exercises.compare_prediction(prediction, 1023 / 96, what="4.2", rel_tol=5e-4, mistakes=mistakes)
        assert capsys.readouterr().out.strip().endswith(f"偏大：{why}")
    tc.exercises.compare_prediction(10.4, 1023 / 96, what="4.2", rel_tol=5e-4, mistakes=mistakes)
    assert capsys.readouterr().out.strip().endswith("偏小：对照解答里的推理，看看哪一步想得不一样")
    tc.exercises.compare_prediction(5, 4, what="x", mistakes=[(5, "多数了一个")])
    assert capsys.readouterr().out.strip().endswith("偏大：答案是一个整数，要完全一致；多数了一个")
    wrong = [("很小。", "exp 永远为正")]
    tc.exercises.compare_prediction("很小", "恰好为 0", what="x", options=GRADIENT, mistakes=wrong)
    assert capsys.readouterr().out.strip().endswith("不一致：exp 永远为正")


@pytest.mark.parametrize(
    ("mistakes", "error"),
    [([("10", "x")], TypeError), ([(10, 3)], TypeError), ([("y", "x")], None)],
)
def test_mistakes_must_be_of_the_answers_kind(mistakes, error):
    if error is None:  # a str mistake must be an option
        with pytest.raises(ValueError, match="'y' is not one of options"):
            tc.exercises.compare_prediction("a", "a", what="x", options=["a", "b"], mistakes=mistakes)
    else:
        with pytest.raises(error, match="mistakes must be"):
            tc.exercises.compare_prediction(1.0, 1.5, what="x", mistakes=mistakes)


def test_the_value_is_printed_to_the_tolerance(capsys):
    # learner test 23: "实际 10.66" while 10.6667 was judged wrong
    tc.exercises.compare_prediction(10.6667, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "实际 10.656。" in capsys.readouterr().out
    tc.exercises.compare_prediction(10.656, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "✓" in capsys.readouterr().out
    tc.exercises.compare_prediction(4.0, 4.1666, what="x")  # the default 10%: 4 digits
    assert "实际 4.167。" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("prediction", "actual"),
    [
        (6, 5),  # learner test 21a: 10% of 5.5 let 6 pass
        (6.5, 7),
        (6.5, 385 / 55),  # ch01 kv-dots: a ratio of counts, exactly 7.0
        (30, 32.000000000000004),  # ch02 ‖PE‖² = d_model / 2 summed in float64
        (5, np.int64(4)),
        (5, torch.tensor(4)),
    ],
)
def test_an_exact_integer_answer_needs_an_exact_match(capsys, prediction, actual):
    tc.exercises.compare_prediction(prediction, actual, what="x")
    out = capsys.readouterr().out.strip()
    assert "✓" not in out and "答案是一个整数，要完全一致" in out, out


@pytest.mark.parametrize(
    ("prediction", "actual", "shown"),
    [
        (7, 385 / 55, "7"),
        (7.0, 7, "7"),
        (32, 31.999999999999996, "32"),
        (4, torch.tensor(4), "4"),
        (3, np.int64(3), "3"),
    ],
)
def test_the_right_integer_agrees(capsys, prediction, actual, shown):
    tc.exercises.compare_prediction(prediction, actual, what="x")
    assert capsys.readouterr().out.strip() == f"x：你的预测 {prediction!r}，实际 {shown}。✓ 一致"


def test_an_explicit_tolerance_applies_to_integers_too(capsys):
    tc.exercises.compare_prediction(6.5, 7, what="x", rel_tol=0.1)
    assert "✓ 在 10% 以内" in capsys.readouterr().out
    tc.exercises.compare_prediction(0.9, 0.91, what="x")  # not an integer: the default 10%
    assert "✓ 在 10% 以内" in capsys.readouterr().out


@pytest.mark.parametrize(("prediction", "actual"), [(1, True), (0, False), (1.0, True), (0, np.bool_(False))])
def test_a_number_for_a_bool_is_named_not_judged(capsys, prediction, actual):
    # learner test 21a: compare_prediction(1, True) passed because 1 == True
    tc.exercises.compare_prediction(prediction, actual, what="x")
    out = capsys.readouterr().out.strip()
    kind = type(prediction).__name__
    assert out == f"x：你的预测 {prediction!r} 是一个 {kind}，这里要写 True 或 False。改好后重新运行这一格"


def test_a_number_for_a_string_is_named_not_judged(capsys):
    tc.exercises.compare_prediction(1, "1", what="x", options=["1（平移）", "x（缩放）"])  # ch03
    out = capsys.readouterr().out.strip()
    assert out == 'x：你的预测 1 是一个 int，这里要写选项之一，加引号："1（平移）" 或 "x（缩放）"。改好后重新运行这一格'


def test_small_tolerances_and_gaps_do_not_print_as_zero_percent(capsys):
    # learner test 22b: 32/3 against (L²−1)/(3L) at L = 32 printed "相差 0%，偏大"
    tc.exercises.compare_prediction(32 / 3, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "相差 0.098%，偏大" in capsys.readouterr().out
    tc.exercises.compare_prediction(10.66, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "✓ 在 0.05% 以内（相差 0.035%）" in capsys.readouterr().out


def test_the_tolerance_boundary_is_inclusive_despite_rounding(capsys):
    # learner test 22a: 0.55 against 0.5 printed "相差 10%" and was rejected (0.1000…09)
    tc.exercises.compare_prediction(0.55, 0.5, what="x")
    assert "✓ 在 10% 以内（相差 10%）" in capsys.readouterr().out
    tc.exercises.compare_prediction(0.5501, 0.5, what="x")
    assert "✓" not in capsys.readouterr().out


def test_a_prediction_equal_up_to_rounding_is_not_given_a_tiny_percentage(capsys):
    tc.exercises.compare_prediction(0.9, 0.9000000000000001, what="tr J", rel_tol=1e-3)  # torch.trace
    assert capsys.readouterr().out.strip().endswith("✓ 在 0.1% 以内（与实际相同，舍入误差除外）")


@pytest.mark.parametrize("prediction", [True, False, np.bool_(True), [1.2], (1.2,)])
def test_a_bool_or_a_list_for_a_number_is_named_not_judged(capsys, prediction):
    # learner test 24c: True against 1.2 printed "相差 17%，偏小" and was judged wrong at 20%
    tc.exercises.compare_prediction(prediction, 1.2, what="x", rel_tol=0.2)
    out = capsys.readouterr().out.strip()
    prediction = prediction.item() if isinstance(prediction, np.generic) else prediction
    kind = type(prediction).__name__
    assert out == f"x：你的预测 {prediction!r} 是一个 {kind}，这里要写一个数（如 10.5）。改好后重新运行这一格"


@pytest.mark.parametrize("prediction", [float("nan"), float("inf"), -float("inf"), np.float64("nan")])
def test_a_prediction_that_is_not_finite_is_named(capsys, prediction):
    # learner test 24c: NaN printed "相差 nan%，偏小"
    tc.exercises.compare_prediction(prediction, 1.2, what="x")
    out = capsys.readouterr().out.strip()
    prediction = float(prediction)
    assert (
        out
        == f"x：你的预测 {prediction!r} 是非有限的数（NaN 或 ±inf），这里要写一个数（如 10.5）。改好后重新运行这一格"
    )


@pytest.mark.parametrize(
    ("prediction", "rel_tol", "shown"),
    [
        (0.5501, None, "相差 10.02%，偏大"),
        (1.2 * 1.2004, 0.2, "相差 20.04%，偏大"),
        (0.4499, None, "相差 10.02%，偏小"),
    ],
)
def test_a_gap_judged_outside_the_tolerance_prints_outside_it(capsys, prediction, rel_tol, shown):
    # a gap that rounds onto the tolerance ("相差 10%" judged wrong at 10%) gets more digits
    tc.exercises.compare_prediction(prediction, 0.5 if rel_tol is None else 1.2, what="x", rel_tol=rel_tol)
    out = capsys.readouterr().out
    assert shown in out and "✓" not in out, out


@pytest.mark.parametrize(
    ("prediction", "actual", "note"),
    [
        (64, 0.642, "（这里的答案是 0 到 1 之间的小数；若 64 是百分数，写成 0.64）"),
        (94.58, 0.9, "（这里的答案是 0 到 1 之间的小数；若 94.58 是百分数，写成 0.9458）"),
        (-0.1, 0.9, "（这里的答案是 0 到 1 之间的小数）"),
    ],
)
def test_a_prediction_outside_0_1_for_a_fraction_is_told_so(capsys, prediction, actual, note):
    tc.exercises.compare_prediction(prediction, actual, what="准确率")
    assert capsys.readouterr().out.strip().endswith(note)


@pytest.mark.parametrize(("prediction", "actual"), [(0.5, 0.9), (9, 4.17), (0.25, 4.1)])
def test_no_fraction_note_inside_0_1_or_for_a_larger_answer(capsys, prediction, actual):
    tc.exercises.compare_prediction(prediction, actual, what="比值")
    assert "0 到 1" not in capsys.readouterr().out


@pytest.mark.parametrize(("prediction", "actual"), [(10.7, 10.656), (0.64, 0.6425), (3, 3.4)])
def test_the_answer_rounded_to_the_predictions_digits_is_told_so(capsys, prediction, actual):
    tc.exercises.compare_prediction(prediction, actual, what="距离", rel_tol=5e-4)
    assert "只是位数不够" in capsys.readouterr().out


def test_a_listed_mistake_comes_before_the_digits(capsys):
    tc.exercises.compare_prediction(10.7, 10.656, what="距离", rel_tol=1e-3, mistakes=[(10.705, "这是那个错误")])
    assert "这是那个错误" in capsys.readouterr().out


def test_a_tuple_with_the_numbers_of_a_list_answer_agrees(capsys):
    # learner test 25a: (1, 2, 3) against [1, 2, 3] was "不一致"
    tc.exercises.compare_prediction((1, 2, 3), [1, 2, 3], what="x")
    assert capsys.readouterr().out == "x：你的预测 (1, 2, 3)，实际 [1, 2, 3]。✓ 一致\n"
    tc.exercises.compare_prediction([1, 2, 3], (1, 2, 3), what="x")
    assert "✓ 一致" in capsys.readouterr().out
    tc.exercises.compare_prediction((1, 2, 4), [1, 2, 3], what="x")
    assert "不一致" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("prediction", "rel_tol", "close"),
    [
        (10.65, 5e-4, True),  # learner test 25b: 10.656 truncated, not rounded
        (10.5, 5e-4, False),  # 1.5% off: a reasoning slip, not a rounding one
        (10.5, None, False),  # within the default 10%: agrees, nothing to name
        (9.0, None, False),  # a loose tolerance never calls a miss a rounding slip
    ],
)
def test_a_near_miss_of_a_tight_answer_is_called_a_rounding_slip(capsys, prediction, rel_tol, close):
    tc.exercises.compare_prediction(prediction, 1023 / 96, what="x", rel_tol=rel_tol)
    assert ("很接近" in capsys.readouterr().out) == close


def test_compare_prediction_says_whether_it_graded(capsys):
    """A cell shows its measurements only after a gradable prediction (learner test 30b)."""
    graded = tc.exercises.compare_prediction
    options = ("低", "高")
    assert graded(None, 3, what="x").graded is False
    assert graded("3", 3, what="x").graded is False  # a number written as a string
    assert graded("中", "高", what="x", options=options).graded is False  # not an option
    assert graded("低", "高", what="x", options=options).graded is True  # wrong, but graded
    assert graded(3, 3, what="x").graded is True
    assert graded(True, False, what="x").graded is True
    capsys.readouterr()
    assert bool(graded(3, 3, what="x")) and not graded(None, 3, what="x")
    assert graded(3, 3, what="x")._ipython_display_() is None  # a cell shows no value
