"""``tc.exercises.progress()``: which build exercises the learner's own code has passed
in this kernel.

A chapter declares an exercise's number on its checker call:
``tc.exercises.check_gpt(MyGPT, exercise="5.7")``. Every such call (not the solutions',
``solution=True``) keeps its latest outcome; a chapter's last cell calls
``tc.exercises.progress()``.
"""

from __future__ import annotations

import re

from ._protocol import FAILED, PASSED, RESULTS, SKELETON

_MARKS = {PASSED: "✓", SKELETON: "…", FAILED: "✗"}
_SEVERITY = {PASSED: 0, SKELETON: 1, FAILED: 2}


def _number_key(exercise: str) -> tuple:
    """ "5.10" after "5.9"; text parts (``"5.6a"``) sort as text."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|\D+", exercise)
    )


def progress(chapter: int | str | None = None) -> None:
    """Print, in Chinese and by exercise number, which build exercises checked in this
    kernel passed (✓), are still skeletons (…) or failed (✗). ``chapter`` (e.g. ``5``)
    keeps only the numbers ``5.…``."""
    prefix = None if chapter is None else f"{chapter}."
    rows = sorted(
        (
            (exercise, title, status, name)
            for (exercise, title), (status, name) in RESULTS.items()
            if prefix is None or exercise.startswith(prefix)
        ),
        key=lambda row: (_number_key(row[0]), row[1]),
    )
    if not rows:
        print("还没有运行过带练习编号的检查单元格（exercise=…）。")
        return
    # an exercise graded by several checkers counts once, with its worst outcome
    worst: dict[str, str] = {}
    for exercise, _, status, _ in rows:
        if exercise not in worst or _SEVERITY[status] > _SEVERITY[worst[exercise]]:
            worst[exercise] = status
    counts = {status: sum(s == status for s in worst.values()) for status in _MARKS}
    # rows of one exercise checked twice: the total says so, so the list adds up
    checkers = "" if len(rows) == len(worst) else f"，{len(rows)} 项检查"
    print(
        f"练习：{counts[PASSED]} 道通过，{counts[SKELETON]} 道尚未实现，"
        f"{counts[FAILED]} 道未通过（共 {len(worst)} 道{checkers}）"
    )
    # exercises still skeletons fit on one line; the others get a line each
    todo = [exercise for exercise, status in worst.items() if status == SKELETON]
    for exercise, title, status, name in rows:
        if worst[exercise] != SKELETON:
            print(f"  {_MARKS[status]} 练习 {exercise}  {title}（{name}）：{status}")
    if todo:
        print(f"  {_MARKS[SKELETON]} {SKELETON}：练习 " + "、".join(todo))
