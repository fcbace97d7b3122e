"""Predict-then-run exercises: the learner writes a prediction before a cell computes
the answer, and :func:`compare_prediction` prints both side by side.

A prediction is never an error (a wrong guess is what the exercise is for), so a page
still runs from top to bottom with any prediction, or none yet; without a prediction the
result is not printed, so the built book does not give the answer away.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np

__all__ = ["compare_prediction"]

_DEFAULT_REL_TOL = 0.1
_NEAR = 0.01  # a wrong number this close to a tightly graded answer is a rounding slip
_NO_QUOTES = "，不加引号"
# a float answer this close to an integer (a ratio of counts, d_model / 2 summed in
# float64) is an exact integer answer, not a measurement
_INTEGRAL_FLOAT_TOL = 1e-6


class Graded:
    """What :func:`compare_prediction` returns: true when the prediction was graded
    (the answer is now shown). A cell that ends with the call shows nothing extra:
    the printed comparison is its output."""

    __slots__ = ("graded",)

    def __init__(self, graded: bool) -> None:
        self.graded = graded

    def __bool__(self) -> bool:
        return self.graded

    def __repr__(self) -> str:
        return f"Graded({self.graded})"

    def _ipython_display_(self) -> None:
        """Jupyter displays nothing for the call's value."""


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


def _spellings(text: str) -> set[str]:
    """The forms of ``text`` that name the same option: full-width characters as
    half-width, no whitespace, Latin letters in one case, 二/三 as digits, without
    surrounding punctuation or a trailing 的 ("有限的。" is "有限"); an option with a
    parenthesis, "更硬（更集中）", also as "更硬" or "更集中"."""
    text = "".join(unicodedata.normalize("NFKC", text).split()).casefold()
    text = text.translate(str.maketrans("二三", "23"))
    head, _, rest = text.partition("(")
    return {_bare(t) for t in (text, head, rest.rpartition(")")[0] or rest)} - {""}


def _bare(text: str) -> str:
    """``text`` without the punctuation around it and a trailing 的."""
    punctuation = "".join(
        c for c in set(text) if unicodedata.category(c).startswith("P")
    )
    text = text.strip(punctuation)
    return text[:-1].strip(punctuation) if text.endswith("的") else text


def chosen_option(given: object, options: Sequence[str]) -> str | None:
    """The one option of ``options`` that ``given`` spells (see :func:`_spellings`),
    or None: not a str, no option, or more than one."""
    if not isinstance(given, str):
        return None
    spelled = _spellings(given)
    found = [o for o in options if spelled & _spellings(o)]
    return found[0] if len(found) == 1 else None


def _listed(options: Sequence[str]) -> str:
    """``"a"、"b" 或 "c"``: the options as the learner types them."""
    quoted = [f'"{o}"' for o in options]
    return "、".join(quoted[:-1]) + f" 或 {quoted[-1]}"


def _wanted_kind(actual: object, options: Sequence[str] | None) -> str:
    """What a prediction of ``actual`` is written as, for the learner."""
    if _is_bool(actual):
        return " True 或 False"
    if _is_number(actual):
        return "一个数（如 10.5）"
    if options is not None:
        return f"选项之一，加引号：{_listed(options)}"
    return f"一个 {type(actual).__name__}"


def _type_slip(prediction: object, actual: object) -> str | None:
    """The name of the prediction's type when it cannot be an answer of ``actual``'s
    kind (a type slip, not a wrong guess), else None."""
    if isinstance(prediction, str) and not isinstance(actual, str):
        return "字符串（str）"
    if (
        (_is_bool(actual) and not _is_bool(prediction))
        or (isinstance(actual, str) and not isinstance(prediction, str))
        or (_is_number(actual) and not _is_number(prediction))
    ):  # 1 == True in Python, but True is not a number and 1 not a yes-or-no answer
        return f"一个 {type(prediction).__name__}"
    if _is_number(actual) and not math.isfinite(prediction):  # type: ignore[arg-type]
        return "非有限的数（NaN 或 ±inf）"  # nan is neither larger nor smaller
    return None


def _gap(err: float, tol: float, agrees: bool) -> str:
    """``err`` as a percentage on the side of the printed ``tol`` that the verdict
    says: with more digits where the usual two would round it onto the tolerance."""
    shown, limit = _percent(err), _percent(tol)
    for digits in range(3, 8):
        value, bound = float(shown.rstrip("%")), float(limit.rstrip("%"))
        if (value <= bound) == agrees:
            break
        shown = f"{err * 100:.{digits}g}%"
        limit = f"{tol * 100:.{digits}g}%"
    return shown


def _percent(x: float) -> str:
    """A relative error as a percentage with two significant digits below 10%, so a
    tolerance of 0.05% or a gap of 0.1% never prints as "0%"."""
    return f"{x:.0%}" if x >= 0.095 else f"{x * 100:.2g}%"


def _digits(rel_tol: float) -> int:
    """Significant digits that show a number to within ``rel_tol`` (at least 4): a
    prediction judged wrong never equals the value as printed."""
    return max(4, math.ceil(-math.log10(rel_tol)) + 1) if rel_tol > 0 else 17


def _agrees(prediction: object, answer: object, exact: int | None, tol: float) -> bool:
    """Whether ``prediction`` is ``answer`` (a number within ``tol``, or the exact
    integer ``exact``; a list or tuple, equal element by element; anything else, an
    option included, equal)."""
    if isinstance(prediction, (list, tuple)) and isinstance(answer, (list, tuple)):
        return list(prediction) == list(answer)
    if not (_is_number(answer) and _is_number(prediction)):
        return bool(prediction == answer)
    if exact is not None:
        return float(prediction) == exact  # type: ignore[arg-type]
    err = abs(float(prediction) - answer) / max(abs(answer), 1e-12)  # type: ignore
    return err <= tol * (1 + 1e-9)  # 0.55 against 0.5 is within 10%, rounding aside


def _exact_like(wrong: object, exact: int | None) -> int | None:
    """A typical wrong answer to an exact integer answer is matched exactly too."""
    return None if exact is None else _integer_answer(wrong)


def _verdict(
    prediction: object,
    actual: object,
    exact: int | None,
    tol: float,
    mistakes: Sequence[tuple[object, str]],
) -> str:
    if _agrees(prediction, actual, exact, tol):
        if exact is not None or not _is_number(actual):
            return "✓ 一致"
        err = abs(float(prediction) - actual) / max(abs(actual), 1e-12)  # type: ignore
        same = "与实际相同，舍入误差除外"
        gap = f"相差 {_gap(err, tol, True)}" if err >= 1e-6 else same
        return f"✓ 在 {_percent(tol)} 以内（{gap}）"
    why = next(
        (
            why
            for wrong, why in mistakes
            if _agrees(prediction, wrong, _exact_like(wrong, exact), tol)
        ),
        None,
    )
    if not _is_number(actual):
        return f"不一致：{why or '对照解答里的推理'}"
    side = "偏大" if prediction > actual else "偏小"  # type: ignore[operator]
    if why is None and exact is None and _rounded_from(prediction, actual):
        why = "实际值舍入到你写的位数正是你的预测：推理多半对了，只是位数不够，多写几位"
    err = abs(float(prediction) - actual) / max(abs(actual), 1e-12)  # type: ignore
    if why is None and exact is None and tol < _NEAR and err <= _NEAR:
        why = (
            f"很接近（相差不到 {_NEAR:.0%}）：推导多半对了，是截断、舍入或算术出了错；"
            "四舍五入到要求的位数，或直接填算式让 Python 去算"
        )
    why = why or "对照解答里的推理，看看哪一步想得不一样"
    if exact is not None:
        return f"{side}：答案是一个整数，要完全一致；{why}"
    note = _fraction_note(prediction, actual)  # type: ignore[arg-type]
    return f"相差 {_gap(err, tol, False)}，{side}：{why}{note}"


def _rounded_from(prediction: float, actual: float) -> bool:
    """Whether ``prediction`` is ``actual`` rounded to the significant digits the
    prediction is written with (10.7 for 10.656)."""
    digits = next(
        (n for n in range(1, 16) if float(f"{prediction:.{n}g}") == prediction), None
    )
    return digits is not None and float(f"{actual:.{digits}g}") == prediction


def _fraction_note(prediction: float, actual: float) -> str:
    """A note for a prediction outside [0, 1] when the answer is a fraction in [0, 1]
    (a share, a probability, an accuracy): most often a percentage (64 for 0.64)."""
    if not 0 <= actual <= 1 or 0 <= prediction <= 1:
        return ""
    note = "（这里的答案是 0 到 1 之间的小数"
    if 1 < prediction <= 100:
        note += f"；若 {prediction:g} 是百分数，写成 {prediction / 100:g}"
    return note + "）"


def _checked_options(
    options: object, actual: object, mistakes: Sequence[tuple[object, str]]
) -> tuple[str, ...] | None:
    """``options`` as a tuple, after checking that it is a list of at least two
    distinct str options (no two spelled alike) that names ``actual`` and every
    ``mistakes`` value; None when ``actual`` is a number or a bool."""
    if options is None:
        if isinstance(actual, str):
            raise TypeError(
                f"a str answer ({actual!r}) needs options=[...], the choices the "
                "prompt offers"
            )
        return None
    if not isinstance(actual, str):
        raise TypeError(f"options= is for str answers, got actual={actual!r}")
    if (
        isinstance(options, str)
        or not isinstance(options, Sequence)
        or len(options) < 2
        or not all(isinstance(o, str) for o in options)
    ):
        raise TypeError(f"options must be a list of at least two str, got {options!r}")
    options = tuple(options)
    alike = [o for o in options if chosen_option(o, options) != o]
    if alike:
        raise ValueError(f"options {options!r}: {alike!r} spelled like another option")
    for value in (actual, *(wrong for wrong, _ in mistakes)):
        if chosen_option(value, options) is None:
            raise ValueError(f"{value!r} is not one of options {options!r}")
    return options


def compare_prediction(
    prediction: object,
    actual: object,
    *,
    what: str,
    rel_tol: float | None = None,
    options: Sequence[str] | None = None,
    mistakes: Sequence[tuple[object, str]] = (),
) -> Graded:
    """Print the learner's ``prediction`` next to the computed ``actual`` value of
    ``what`` and whether they agree. The result is true when the prediction was
    graded (the answer is now shown), false when it is missing or not gradable, so
    a cell can show its measurements only after a real prediction.

    Numbers agree within ``rel_tol`` (relative); without ``rel_tol``, an answer that
    is an exact integer (an int, or a float within 1e-6 of one) needs an exact match
    and any other number agrees within 10%; the value is printed with enough digits
    to tell a prediction inside the tolerance from one outside. A bool answer needs a
    bool. A str answer is one of ``options`` (required then: the choices the prompt
    offers); a prediction names an option when it differs only in whitespace, full-
    or half-width characters, the case of Latin letters, punctuation around it or a
    trailing 的, or is the part before or inside an option's parenthesis; one that
    names no option is told so, with the options and without the answer.
    ``mistakes``: ``[(wrong answer, why), ...]``, a typical wrong prediction (a
    number, or an option) and what it gets wrong, printed instead of the general
    advice. ``prediction=None`` means "not predicted yet"; a prediction of the wrong
    type (``"True"`` or ``1`` for a bool, ``"10.66"``, ``True`` or NaN for a number) is
    named as such, without the answer."""
    if not isinstance(what, str) or not what:
        raise TypeError(f"what must be a non-empty str, got {what!r}")
    if rel_tol is not None and (not _is_number(rel_tol) or not 0 <= rel_tol < 1):
        raise ValueError(f"rel_tol must be a number in [0, 1), got {rel_tol!r}")
    actual = _as_scalar(actual)
    mistakes = [(_as_scalar(wrong), why) for wrong, why in mistakes]
    if any(_type_slip(w, actual) or not isinstance(y, str) for w, y in mistakes):
        raise TypeError(
            f"mistakes must be [(wrong answer, why: str), ...] of the answer's kind "
            f"({type(actual).__name__}), got {mistakes!r}"
        )
    options = _checked_options(options, actual, mistakes)
    if prediction is None:  # the answer stays hidden until there is a prediction
        print(f"尚未预测：{what}。先在上面写下你的预测，再运行这一格看结果")
        return Graded(False)
    prediction = _as_scalar(prediction)
    slip = _type_slip(prediction, actual)
    if slip is not None:  # the answer stays hidden so the slip can be fixed
        print(
            f"{what}：你的预测 {prediction!r} 是{slip}，这里要写"
            f"{_wanted_kind(actual, options)}"
            f"{_NO_QUOTES if isinstance(prediction, str) else ''}"
            "。改好后重新运行这一格"
        )
        return Graded(False)
    if options is not None:
        chosen = chosen_option(prediction, options)
        if chosen is None:  # neither right nor wrong: the answer stays hidden
            print(
                f"{what}：你的预测 {prediction!r} 不是选项之一。从 {_listed(options)} "
                "里选一个照抄（加引号），再运行这一格"
            )
            return Graded(False)
        answer = chosen_option(actual, options)
        mistakes = [(chosen_option(w, options), why) for w, why in mistakes]
        verdict = _verdict(chosen, answer, None, 0.0, mistakes)
        print(f"{what}：你的预测 {prediction!r}，实际 {answer!r}。{verdict}")
        return Graded(True)
    exact = _integer_answer(actual) if rel_tol is None else None
    tol = _DEFAULT_REL_TOL if rel_tol is None else rel_tol
    if exact is not None:
        shown = str(exact)
    elif _is_number(actual):
        shown = f"{actual:.{_digits(tol)}g}"
    else:
        shown = repr(actual)
    verdict = _verdict(prediction, actual, exact, tol, mistakes)
    print(f"{what}：你的预测 {prediction!r}，实际 {shown}。{verdict}")
    return Graded(True)
