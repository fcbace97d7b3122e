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
    tc.exercises.compare_prediction(prediction, actual, what="未训练的损失")
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


@pytest.mark.parametrize(
    ("prediction", "actual"),
    [
        ("恰好为0", "恰好为 0"),  # learner test 21a: the page spells it with a space
        ("恰好为 0 ", "恰好为 0"),
        ("恰好为０", "恰好为 0"),  # a full-width digit
        ("X", "x"),
        (" 更低", "更低"),
    ],
)
def test_strings_that_differ_only_in_spelling_agree(capsys, prediction, actual):
    tc.exercises.compare_prediction(prediction, actual, what="x")
    assert capsys.readouterr().out.strip().endswith("✓ 一致")


@pytest.mark.parametrize(("prediction", "actual"), [("很小", "恰好为 0"), ("恰好为 1", "恰好为 0"), ("xy", "x")])
def test_different_strings_still_disagree(capsys, prediction, actual):
    tc.exercises.compare_prediction(prediction, actual, what="x")
    assert capsys.readouterr().out.strip().endswith("不一致：对照解答里的推理")


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
    tc.exercises.compare_prediction(1, "1", what="x")  # ch03: "1"（平移）或 "x"（缩放）
    out = capsys.readouterr().out.strip()
    assert out == 'x：你的预测 1 是一个 int，这里要写一个字符串，加引号（如 "很小"）。改好后重新运行这一格'


def test_small_tolerances_and_gaps_do_not_print_as_zero_percent(capsys):
    # learner test 22b: 32/3 against (L²−1)/(3L) at L = 32 printed "相差 0%，偏大"
    tc.exercises.compare_prediction(32 / 3, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "相差 0.098%，偏大" in capsys.readouterr().out
    tc.exercises.compare_prediction(10.66, 1023 / 96, what="4.2", rel_tol=5e-4)
    assert "✓ 在 0.05% 以内（相差 0.035%）" in capsys.readouterr().out
