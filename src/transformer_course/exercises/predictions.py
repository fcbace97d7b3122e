"""Predict-then-run exercises: the learner writes a prediction before a cell computes
the answer, and :func:`compare_prediction` prints both side by side.

A prediction is never an error (a wrong guess is what the exercise is for), so a page
still runs from top to bottom with any prediction, or none yet; without a prediction the
result is not printed, so the built book does not give the answer away.
"""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real

import numpy as np

__all__ = ["compare_prediction"]

_DEFAULT_REL_TOL = 0.1
_NO_QUOTES = "，不加引号"
# a float answer this close to an integer (a ratio of counts, d_model / 2 summed in
# float64) is an exact integer answer, not a measurement
_INTEGRAL_FLOAT_TOL = 1e-6


def _is_number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, (bool, np.bool_))


def _is_bool(x: object) -> bool:
    return isinstance(x, (bool, np.bool_))


def _as_scalar(x: object) -> object:
    """A 0-d tensor or array, or a NumPy scalar, as the Python scalar it holds."""
    if isinstance(x, np.generic) or getattr(x, "ndim", None) == 0:
        return x.item()  # type: ignore[union-attr]
    return x


def _integer_answer(actual: object) -> int | None:
    """``actual`` as an int when it is an exact integer answer, else None."""
    if isinstance(actual, Integral) and not _is_bool(actual):
        return int(actual)
    if _is_number(actual) and math.isfinite(actual):
        nearest = round(actual)
        if abs(actual - nearest) <= _INTEGRAL_FLOAT_TOL * max(1.0, abs(nearest)):
            return int(nearest)
    return None


def _normalized(text: str) -> str:
    """Spelling-insensitive form: full-width characters as half-width, no whitespace,
    Latin letters in one case ("恰好为0" and "恰好为 0 " are the same answer)."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(text.split()).casefold()


def _wanted_kind(actual: object) -> str:
    """What a prediction of ``actual`` is written as, for the learner."""
    if _is_bool(actual):
        return " True 或 False"
    if _is_number(actual):
        return "一个数（如 10.5）"
    if isinstance(actual, str):
        return '一个字符串，加引号（如 "很小"）'
    return f"一个 {type(actual).__name__}"


def _type_slip(prediction: object, actual: object) -> str | None:
    """The name of the prediction's type when it cannot be an answer of ``actual``'s
    kind (a type slip, not a wrong guess), else None."""
    if isinstance(prediction, str) and not isinstance(actual, str):
        return "字符串（str）"
    if (_is_bool(actual) and not _is_bool(prediction)) or (
        isinstance(actual, str) and not isinstance(prediction, str)
    ):  # 1 == True in Python, but 1 is not a yes-or-no answer
        return f"一个 {type(prediction).__name__}"
    return None


def _percent(x: float) -> str:
    """A relative error as a percentage with two significant digits below 10%, so a
    tolerance of 0.05% or a gap of 0.1% never prints as "0%"."""
    return f"{x:.0%}" if x >= 0.095 else f"{x * 100:.2g}%"


def _number_verdict(prediction: float, actual: float, rel_tol: float) -> str:
    if not math.isfinite(prediction):
        return f"你的预测 {prediction} 不是有限的数"
    err = abs(prediction - actual) / max(abs(actual), 1e-12)
    if err <= rel_tol:
        return f"✓ 在 {_percent(rel_tol)} 以内（相差 {_percent(err)}）"
    side = "偏大" if prediction > actual else "偏小"
    return f"相差 {_percent(err)}，{side}：对照解答里的推理，看看哪一步想得不一样"


def _integer_verdict(prediction: float, actual: int) -> str:
    if prediction == actual:
        return "✓ 一致"
    if not math.isfinite(prediction):
        return f"你的预测 {prediction} 不是有限的数"
    side = "偏大" if prediction > actual else "偏小"
    return f"{side}：答案是一个整数，要完全一致；对照解答里的推理，看看哪一步想得不一样"


def _verdict(
    prediction: object, actual: object, exact: int | None, rel_tol: float | None
) -> str:
    if _is_number(actual) and _is_number(prediction):
        if exact is not None:
            return _integer_verdict(float(prediction), exact)
        tol = _DEFAULT_REL_TOL if rel_tol is None else rel_tol
        return _number_verdict(float(prediction), float(actual), tol)
    if isinstance(actual, str):
        same = _normalized(prediction) == _normalized(actual)
    else:
        same = prediction == actual
    return "✓ 一致" if same else "不一致：对照解答里的推理"


def compare_prediction(
    prediction: object, actual: object, *, what: str, rel_tol: float | None = None
) -> None:
    """Print the learner's ``prediction`` next to the computed ``actual`` value of
    ``what`` and whether they agree.

    Numbers agree within ``rel_tol`` (relative); without ``rel_tol``, an answer that
    is an exact integer (an int, or a float within 1e-6 of one) needs an exact match
    and any other number agrees within 10%. A bool answer needs a bool; strings agree
    when they differ only in whitespace, full- or half-width characters or the case of
    Latin letters; anything else must be equal. ``prediction=None`` means "not
    predicted yet"; a prediction of the wrong type (``"True"`` or ``1`` for a bool,
    ``"10.66"`` for a number) is named as such, without the answer."""
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if rel_tol is not None and (not _is_number(rel_tol) or not 0 <= rel_tol < 1):
        raise ValueError(f"rel_tol must be a number in [0, 1), got {rel_tol!r}")
    if prediction is None:  # the answer stays hidden until there is a prediction
        print(f"尚未预测：{what}。先在上面写下你的预测，再运行这一格看结果")
        return
    prediction, actual = _as_scalar(prediction), _as_scalar(actual)
    slip = _type_slip(prediction, actual)
    if slip is not None:  # the answer stays hidden so the slip can be fixed
        print(
            f"{what}：你的预测 {prediction!r} 是{slip}，这里要写"
            f"{_wanted_kind(actual)}{_NO_QUOTES if isinstance(prediction, str) else ''}"
            "。改好后重新运行这一格"
        )
        return
    exact = _integer_answer(actual) if rel_tol is None else None
    if exact is not None:
        shown = str(exact)
    else:
        shown = f"{actual:.4g}" if _is_number(actual) else repr(actual)
    verdict = _verdict(prediction, actual, exact, rel_tol)
    print(f"{what}：你的预测 {prediction!r}，实际 {shown}。{verdict}")
