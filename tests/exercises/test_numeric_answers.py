"""tc.exercises.check_number and check_answer: chapter 4's numeric answers, graded
with the hints the learner tests asked for, never showing the expected value."""

import math

import pytest

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import _protocol
from transformer_course.exercises.numeric_answers import QUESTIONS
from transformer_course.toy_tasks import attention_profile

ACC = {"acc_2": 0.84, "acc_1": 0.6}  # stand-ins for the trained accuracies
MEASURED = {"retrieved_lags": ACC}
# the right answers, written independently of the package's formulas
RIGHT = {
    "attention_bytes": (2, 8),
    "qk_norm_temperature": 0.5 * math.log(891),
    "sparsemax_slopes": (0.5, 0.25),
    "retrieved_lags": (4 * 0.84 - 0.5) * 8 / 7,
    "rope_base_period": (7 / (2 * math.pi)) ** 8,
    "weight_decay_factor": 0.999**200,
}
# (question, wrong answer, a keyword of its hint): every listed mistake and more
WRONG = [
    ("attention_bytes", (8, 2), "顺序反了"),  # learner test 24b
    ("attention_bytes", (4, 4), "只算了分数矩阵"),
    ("attention_bytes", (1.5, 32 / 3), "漏了输出"),
    ("attention_bytes", (2, 1 / 8), "倍数倒过来了"),
    ("attention_bytes", (2, 16), "倍数却取了 L/D"),  # learner test 25b
    ("attention_bytes", (1, 16), "两边按一样多的矩阵算了"),
    ("attention_bytes", (4 / 3, 32 / 3), "不是同一笔账算出来的"),
    ("attention_bytes", (3, 4), "不是同一笔账算出来的"),
    ("attention_bytes", (3, 16 / 3), "两个 L×L 矩阵各 4L² 字节"),  # the general line
    ("qk_norm_temperature", 3.392, "很接近：与正确值相差不到 1%"),  # learner test 22b
    ("qk_norm_temperature", 3.3955, "很接近"),
    ("qk_norm_temperature", 0.5 * math.log(99), "漏了因子 9"),
    ("qk_norm_temperature", 3.40, "只是有效数字不够"),
    ("qk_norm_temperature", 3.39, "很接近"),
    ("qk_norm_temperature", 0.5 * math.log(892), "多加了 1"),  # learner test 24b
    ("qk_norm_temperature", 3.397, "多加了 1"),
    ("qk_norm_temperature", math.log(9 * 99), "大了一倍"),
    ("qk_norm_temperature", 0.5 * math.log(9 * 100), "不是 S 个"),
    ("qk_norm_temperature", math.log(900), "两处"),  # learner test 36b
    ("qk_norm_temperature", 0.5 * math.log(99 / 9), "不等式解反了"),
    ("qk_norm_temperature", 0.5 * math.log10(891), "以 10 为底"),  # learner test 25b
    ("qk_norm_temperature", 0.5 * math.log2(891), "以 2 为底"),
    ("qk_norm_temperature", 1.0, "令 e^{2g}/(e^{2g}+S−1) = 0.9，解出 g"),
    ("sparsemax_slopes", (0.25, 0.5), "顺序反了"),
    ("sparsemax_slopes", (1.0, 0.25), "sparsemax 的斜率大了一倍"),
    ("sparsemax_slopes", (0.5, 0.5), "σ(0) 本身，不是斜率"),
    ("sparsemax_slopes", (0.0, 0.25), "sparsemax 在 t = 0 附近不是平的"),
    ("sparsemax_slopes", (1.0, 0.5), "两个斜率都大了一倍"),
    ("sparsemax_slopes", (0.3, 0.1), "σ′ = σ(1 − σ)"),
    ("retrieved_lags", 3.36, "漏了瞎猜的部分"),  # learner test 24b
    ("retrieved_lags", 3.15, "不是 1/4"),
    ("retrieved_lags", 2.86, "少乘了 8/7"),
    ("retrieved_lags", 3.0, "只是有效数字不够"),
    ("retrieved_lags", 2.0, "由 acc = (k + (4 − k)/8)/4 解出 k"),
    ("retrieved_lags", 2.5, "乘反了"),  # learner test 36b
    ("retrieved_lags", 0.84, "这是准确率本身"),  # learner test 25b
    ("retrieved_lags", 2.4, "这是 H = 1 的 4·acc"),
    ("retrieved_lags", (4 * 0.6 - 0.5) * 8 / 7, "这是 H = 1 的结果"),
    ("rope_base_period", (7 / (2 * math.pi)) ** 4, "要么用了 D = 8"),  # learner test 22b
    ("rope_base_period", (7 / (2 * math.pi)) ** 16, "指数用错了"),
    ("rope_base_period", 7.0**8, "漏了 2π"),
    ("rope_base_period", (7 / math.pi) ** 8, "用了 π 而不是 2π"),  # learner test 63
    ("rope_base_period", (2 * math.pi / 7) ** 8, "解反了"),
    ("rope_base_period", 5.0, "令它等于 7 解出 b"),
    ("rope_base_period", 7 / (2 * math.pi), "还要把两边取 8 次方"),  # learner test 25b
    ("rope_base_period", (8 / (2 * math.pi)) ** 8, "相对距离最远是 7"),  # review 34
    ("rope_base_period", 6.907, "相对距离最远是 7"),
    ("weight_decay_factor", 0.8187, "连续时间的近似 exp(−200ηλ)"),  # learner test 24b
    ("weight_decay_factor", 0.8186, "只是有效数字不够"),
    ("weight_decay_factor", 0.8188, "很接近：与正确值相差不到 1%"),  # was "不到 0.0%"
    ("weight_decay_factor", 0.8178, "不是 201 次方"),
    ("weight_decay_factor", 0.999**199, "不是 199 次方"),
    ("weight_decay_factor", 0.8, "不是线性的"),
    ("weight_decay_factor", 0.9**200, "不是 λ"),
    ("weight_decay_factor", 0.99**200, "不是 η"),
    ("weight_decay_factor", 0.999**5, "步数是 fit 训练的 200 步"),
    ("weight_decay_factor", 1.0, "即使梯度为 0"),
]


def message(question, answer, **kwargs):
    with pytest.raises(ex.ExerciseError) as info:
        ex.check_number(question, answer, **MEASURED.get(question, {}), **kwargs)
    return str(info.value)


def shown_forms(expected):
    """How the expected value would appear in a message that gave it away."""
    values = expected if isinstance(expected, tuple) else (expected,)
    forms = {", ".join(f"{v:.{n}g}" for v in values) for n in (3, 4, 5)}
    return forms | {", ".join(str(float(v)) for v in values)}


@pytest.mark.parametrize("question", sorted(RIGHT))
def test_a_right_answer_passes_and_is_kept_for_progress(question, capsys):
    _protocol.RESULTS.clear()
    ex.check_number(question, RIGHT[question], exercise="4.99", **MEASURED.get(question, {}))
    assert capsys.readouterr().out.startswith(f"✓ 练习 4.99：{QUESTIONS[question].title}")
    ex.progress(4)
    assert "✓ 练习 4.99" in capsys.readouterr().out
    _protocol.RESULTS.clear()


@pytest.mark.parametrize(("question", "answer", "keyword"), WRONG)
def test_a_wrong_answer_gets_its_hint_and_never_the_expected_value(question, answer, keyword, capsys):
    text = message(question, answer, exercise="4.99")
    assert keyword in text, text
    assert text.startswith(f"练习 4.99：{QUESTIONS[question].title}：你的答案")
    told = text.split("不对（", 1)[1]  # what follows the learner's own answer
    for form in shown_forms(RIGHT[question]):
        assert form not in told, (form, text)
    assert "✓" not in capsys.readouterr().out


def test_every_listed_mistake_is_reached():
    texts = [message(q, a) for q, a, _ in WRONG]
    for question, (_, _, grading) in QUESTIONS.items():
        args = {"answer": RIGHT[question]} if "answer" in grading.__code__.co_varnames else {}
        for _, why in grading(**args, **MEASURED.get(question, {})).mistakes:
            assert any(why in t for t in texts), (question, why)


def test_none_is_not_yet_answered(capsys):
    _protocol.RESULTS.clear()
    assert ex.check_number("qk_norm_temperature", None, exercise="4.99") is None
    assert capsys.readouterr().out == "尚未作答：练习 4.99：温度 g 的下界\n"
    ex.progress(4)
    assert "尚未实现：练习 4.99" in capsys.readouterr().out
    _protocol.RESULTS.clear()
    with pytest.raises(ex.ExerciseError, match="参考解答"):
        ex.check_number("qk_norm_temperature", None, solution=True)


def test_a_wrong_shape_or_type_is_named():
    assert "答案的形状是 ()，应该是 (2,)" in message("attention_bytes", 2)
    assert "答案的形状是 (3,)" in message("sparsemax_slopes", (0.5, 0.25, 0.0))
    assert "答案应是数或一组数" in message("qk_norm_temperature", "3.396")


def test_bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="'qk_norm'"):
        ex.check_number("qk_norm", 1.0)
    with pytest.raises(ValueError, match="acc_1"):
        ex.check_number("retrieved_lags", 3.0, acc_2=0.84)
    with pytest.raises(ValueError, match="acc_2"):
        ex.check_number("qk_norm_temperature", 3.0, acc_2=0.84)
    with pytest.raises(TypeError, match="'0.84'"):
        ex.check_number("retrieved_lags", 3.0, acc_2="0.84", acc_1=0.6)
    with pytest.raises(ValueError, match="rel_tol"):
        ex.check_answer(1.0, 1.0, what="x", rel_tol=0)
    with pytest.raises(TypeError, match="what"):
        ex.check_answer(1.0, 1.0, what="")


@pytest.mark.parametrize(
    ("prediction", "verdict"),
    [
        ("(32**2 - 1) / (3 * 32)", "✓"),
        ("10.66", "✓"),
        ("32 / 3", "这是大 L 的近似 L/3"),  # learner tests 22b and 23
        ("10.667", "这是大 L 的近似 L/3"),
        ("(32 + 1) / 3", "只对 j ≠ i 的 L(L − 1) 对求了平均"),
        ("10.4", "对照解答里的推理"),
        ("7.75", "这是因果均匀"),  # learner test 24b
        ("16", "L/2 大约是一端的查询"),
        ("10.7", "只是位数不够"),
        ("10.65", "很接近"),  # learner test 25b: truncated, not rounded
        ("31 / 3", "(L − 1)/3 也是近似"),
        ("(31**2 - 1) / (3 * 31)", "代入的 L 错了"),
        ("16.5", "因果均匀的有效键数"),
        ("32", "双向均匀的有效键数"),
        ("15.5", "(L − 1)/2 是第 0 个查询"),
    ],
)
def test_the_uniform_distance_prediction_is_shown_with_its_hint(prediction, verdict, capsys):
    measured = (32**2 - 1) / (3 * 32)  # what attention_profile measures
    assert ex.check_number("uniform_distance", eval(prediction), measured_distance=measured)
    out = capsys.readouterr().out
    assert verdict in out, out
    assert "实际 10.656。" in out  # learner test 23: "实际 10.66" while 10.6667 was wrong


def test_the_uniform_distance_prediction_needs_the_measurement():
    with pytest.raises(ValueError, match="measured_distance"):
        ex.check_number("uniform_distance", 10.66)


@pytest.mark.parametrize(
    ("prediction", "status"),
    [("None", "尚未实现"), ("10.66", "通过"), ("32 / 3", "未通过"), ("'10.66'", "未通过")],
)
def test_a_numbered_prediction_is_kept_for_progress(prediction, status):
    from transformer_course.exercises import _protocol

    _protocol.RESULTS.clear()
    try:
        ex.check_number(
            "uniform_distance",
            eval(prediction),
            exercise="4.2",
            measured_distance=(32**2 - 1) / (3 * 32),
        )
        [(key, (got, _))] = _protocol.RESULTS.items()
        assert key[0] == "4.2" and got == status
    finally:
        _protocol.RESULTS.clear()


# ---- exercise 4.2's causal-uniform pair: predictions next to attention_profile --------


def causal_uniform_profile(L=32):
    """attention_profile of causal uniform attention: query i reads 0..i equally."""
    w = tc.causal_mask(L).float()
    dist, keys = attention_profile((w / w.sum(-1, keepdim=True))[None, None])
    return dist.item(), keys.item()


def test_the_causal_uniform_formulas_are_what_attention_profile_measures():
    for L in (8, 32):
        dist, keys = causal_uniform_profile(L)
        assert dist == pytest.approx((L - 1) / 4, rel=1e-6)
        assert keys == pytest.approx((L + 1) / 2, rel=1e-6)


@pytest.mark.parametrize(
    ("question", "prediction", "verdict"),
    [
        ("causal_distance", "31 / 4", "✓"),
        ("causal_distance", "7.75", "✓"),
        ("causal_distance", "32 / 4", "大 L 的近似 L/4"),
        ("causal_distance", "33 / 4", "距离从 0 数起"),
        ("causal_distance", "31 / 3", "对所有 (i, j ≤ i) 对等权平均"),
        ("causal_distance", "15.5", "最后一个查询的平均距离"),
        ("causal_distance", "7.5", "代入的 L 错了"),
        ("causal_distance", "(32**2 - 1) / (3 * 32)", "这是双向均匀的平均距离"),
        ("causal_distance", "16.5", "这里问的是平均注意距离"),
        ("causal_distance", "9.0", "对照解答里的推理"),
        ("causal_distance", "7.8", "只是位数不够"),
        ("causal_keys", "33 / 2", "✓"),
        ("causal_keys", "16", "大 L 的近似 L/2"),
        ("causal_keys", "15.5", "不是 i 个"),
        ("causal_keys", "math.exp(math.lgamma(33) / 32)", "先把熵对查询平均"),
        ("causal_keys", "65 / 3", "按 (i, j) 对加权平均了"),
        ("causal_keys", "32", "这是双向均匀的有效键数"),
        ("causal_keys", "7.75", "这里问的是有效键数"),
        ("causal_keys", "18", "对照解答里的推理"),
    ],
)
def test_the_causal_uniform_predictions_are_shown_with_their_hints(question, prediction, verdict, capsys):
    dist, keys = causal_uniform_profile()
    measured = {"measured_distance": dist} if question == "causal_distance" else {"measured_keys": keys}
    assert ex.check_number(question, eval(prediction), **measured)
    out = capsys.readouterr().out
    assert verdict in out, out
    assert ("实际 7.75。" if question == "causal_distance" else "实际 16.5。") in out, out


def test_the_causal_uniform_predictions_need_their_measurement():
    with pytest.raises(ValueError, match="measured_keys"):
        ex.check_number("causal_keys", 16.5, measured_distance=7.75)
    with pytest.raises(ValueError, match="measured_distance"):
        ex.check_number("causal_distance", 7.75)


@pytest.mark.parametrize(
    ("causal_keys", "counted"),
    [
        (16.5, "1 道通过，0 道尚未实现，0 道未通过"),
        (None, "0 道通过，1 道尚未实现，0 道未通过"),
        (16.0, "0 道通过，0 道尚未实现，1 道未通过"),
    ],
)
def test_exercise_4_2_counts_once_with_the_worst_of_its_predictions(causal_keys, counted, capsys):
    dist, keys = causal_uniform_profile()
    _protocol.RESULTS.clear()
    try:
        ex.check_number("uniform_distance", 1023 / 96, exercise="4.2", measured_distance=1023 / 96)
        ex.check_number("causal_distance", 7.75, exercise="4.2", measured_distance=dist)
        ex.check_number("causal_keys", causal_keys, exercise="4.2", measured_keys=keys)
        capsys.readouterr()
        ex.progress(4)
        out = capsys.readouterr().out
        assert f"练习：{counted}" in out and "共 1 道，3 项检查" in out, out
    finally:
        _protocol.RESULTS.clear()
