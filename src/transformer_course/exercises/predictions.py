"""Predict-then-run exercises: the learner writes a prediction before a cell computes
the answer, and :func:`compare_prediction` prints both side by side.

A prediction is never an error (a wrong guess is what the exercise is for), so a page
still runs from top to bottom with any prediction, or none yet; without a prediction the
result is not printed, so the built book does not give the answer away.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

__all__ = ["compare_prediction"]


def _is_number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _wanted_kind(actual: object) -> str:
    """What a prediction of ``actual`` is written as, for the learner."""
    if isinstance(actual, (bool, np.bool_)):
        return " True 或 False"
    if _is_number(actual):
        return "一个数（如 10.5）"
    return f"一个 {type(actual).__name__}"


def _number_verdict(prediction: float, actual: float, rel_tol: float) -> str:
    if not math.isfinite(prediction):
        return f"你的预测 {prediction} 不是有限的数"
    err = abs(prediction - actual) / max(abs(actual), 1e-12)
    if err <= rel_tol:
        return f"✓ 在 {rel_tol:.0%} 以内（相差 {err:.1%}）"
    side = "偏大" if prediction > actual else "偏小"
    return f"相差 {err:.0%}，{side}：对照解答里的推理，看看哪一步想得不一样"


def compare_prediction(
    prediction: object, actual: object, *, what: str, rel_tol: float = 0.1
) -> None:
    """Print the learner's ``prediction`` next to the computed ``actual`` value of
    ``what``: for numbers, whether they agree within ``rel_tol`` (relative); otherwise,
    whether they are equal. ``prediction=None`` means "not predicted yet"; a string
    where the answer is not one (``"True"``, ``"10.66"``) is named as such, without
    the answer."""
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if not _is_number(rel_tol) or not 0 <= rel_tol < 1:
        raise ValueError(f"rel_tol must be a number in [0, 1), got {rel_tol!r}")
    if prediction is None:  # the answer stays hidden until there is a prediction
        print(f"尚未预测：{what}。先在上面写下你的预测，再运行这一格看结果")
        return
    if isinstance(prediction, str) and not isinstance(actual, str):
        # a type slip, not a wrong guess: the answer stays hidden so it can be fixed
        print(
            f"{what}：你的预测 {prediction!r} 是字符串（str），这里要写"
            f"{_wanted_kind(actual)}，不加引号。改好后重新运行这一格"
        )
        return
    if isinstance(actual, np.bool_):  # shown as True, not np.True_
        actual = bool(actual)
    shown = f"{actual:.4g}" if _is_number(actual) else repr(actual)
    if _is_number(actual) and _is_number(prediction):
        verdict = _number_verdict(float(prediction), float(actual), rel_tol)
    elif prediction == actual:
        verdict = "✓ 一致"
    else:
        verdict = "不一致：对照解答里的推理"
    print(f"{what}：你的预测 {prediction!r}，实际 {shown}。{verdict}")
