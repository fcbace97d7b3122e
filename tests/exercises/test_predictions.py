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
        # learner test 20b: a string where a number or a bool is asked for is named
        ("10.66", 10.656, "未训练的损失：你的预测 '10.66' 是字符串（str），这里要写一个数（如 10.5），不加引号。改好后重新运行这一格"),
        ("True", True, "未训练的损失：你的预测 'True' 是字符串（str），这里要写 True 或 False，不加引号。改好后重新运行这一格"),
        ("True", np.bool_(True), "未训练的损失：你的预测 'True' 是字符串（str），这里要写 True 或 False，不加引号。改好后重新运行这一格"),
        (True, np.bool_(True), "未训练的损失：你的预测 True，实际 True。✓ 一致"),
    ],
)
def test_prints_the_prediction_next_to_the_result(capsys, prediction, actual, expected):
    tc.exercises.compare_prediction(prediction, actual, what="未训练的损失")
    assert capsys.readouterr().out.strip() == expected


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="what must be a non-empty str"):
        tc.exercises.compare_prediction(1, 1, what="")
    with pytest.raises(ValueError, match="rel_tol must be a number in"):
        tc.exercises.compare_prediction(1, 1, what="x", rel_tol=1.5)
