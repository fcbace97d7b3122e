import numpy as np
import pytest

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
