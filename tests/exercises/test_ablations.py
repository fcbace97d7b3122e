"""The checker of ex 4.13 (a paired, multi-seed ablation with a threshold)."""

import numpy as np
import pytest
import torch

from transformer_course import exercises as ex
from transformer_course.exercises.ablations import ABLATION_HINTS

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


def loops(run, arms, seeds, margin):
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"need at least 2 distinct seeds, got {seeds!r}")
    losses = {arm: [run(arm, s) for s in seeds] for arm in arms}
    a, b = arms
    holds = all(y > (1 + margin) * x for x, y in zip(losses[a], losses[b], strict=True))
    return losses, holds


def seed_major(run, arms, seeds, margin):
    # seeds in the outer loop, an explicit flag instead of all(...)
    if len(set(seeds)) < 2 or len(set(seeds)) < len(seeds):
        raise ValueError(f"seeds {seeds}")
    losses = {arm: [] for arm in arms}
    for s in seeds:
        for arm in arms:
            losses[arm].append(float(run(arm, s)))
    holds = True
    for x, y in zip(*losses.values(), strict=True):
        if not y - x > margin * x:
            holds = False
    return losses, holds


def as_list(run, arms, seeds, margin):  # learner test 59: a list was refused
    return list(loops(run, arms, seeds, margin))


def skeleton(run, arms, seeds, margin):
    pass


def mutant(**change):
    def fn(run, arms, seeds, margin):
        if change.get("no_raise") is None:
            if len(seeds) < 2 or len(set(seeds)) != len(seeds):
                raise change.get("error", ValueError)(f"seeds {seeds!r}")
        a, b = arms
        losses = {a: [run(a, s) for s in seeds], b: [run(b, s + change.get("offset", 0)) for s in seeds]}
        if change.get("twice"):
            run(a, seeds[0])
        if change.get("sorted"):
            losses = {k: sorted(v) for k, v in losses.items()}
        x, y = losses[a], losses[b]
        if change.get("swap"):
            x, y = y, x
        factor = 1.0 if change.get("no_margin") else 1 + margin
        if change.get("mean"):
            holds = sum(y) / len(y) > factor * sum(x) / len(x)
        elif change.get("last"):  # learner test 66: holds overwritten in the loop
            for p, q in zip(x, y, strict=True):
                holds = q > factor * p
        else:
            holds = all(q > factor * p for p, q in zip(x, y, strict=True))
        if change.get("as_int"):
            holds = int(holds)
        return losses, holds

    fn.__name__ = "my_ablation"
    return fn


def _paired(run, arms, seeds):
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds!r}")
    return {arm: [run(arm, s) for s in seeds] for arm in arms}


def additive_margin(run, arms, seeds, margin):  # learner test: an absolute margin
    losses = _paired(run, arms, seeds)
    return losses, all(y > x + margin for x, y in zip(*losses.values(), strict=True))


def at_least(run, arms, seeds, margin):  # learner test: >= where the claim says "more than"
    losses = _paired(run, arms, seeds)
    return losses, all(y >= (1 + margin) * x for x, y in zip(*losses.values(), strict=True))


def any_seed(run, arms, seeds, margin):
    losses = _paired(run, arms, seeds)
    return losses, any(y > (1 + margin) * x for x, y in zip(*losses.values(), strict=True))


def without_one(run, arms, seeds, margin):  # learner test 30b: margin * loss_0, the 1 + left out
    losses = _paired(run, arms, seeds)
    return losses, all(y > margin * x for x, y in zip(*losses.values(), strict=True))


def pairs_list(run, arms, seeds, margin):  # learner test 25b: a list of (loss_0, loss_1) pairs
    losses = _paired(run, arms, seeds)
    pairs = [list(p) for p in zip(*losses.values(), strict=True)]
    return pairs, all(y > (1 + margin) * x for x, y in pairs)


def keyed_by_seed(run, arms, seeds, margin):  # one entry per seed, not per arm
    losses = _paired(run, arms, seeds)
    by_seed = {s: (x, y) for s, x, y in zip(seeds, *losses.values(), strict=True)}
    return by_seed, all(y > (1 + margin) * x for x, y in by_seed.values())


def swapped_arguments(run, arms, seeds, margin):  # learner test 36b, 4.12: run(seed, arm)
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {seeds!r}")
    losses = {a: [run(s, a) for s in seeds] for a in arms}
    return losses, all(y > (1 + margin) * x for x, y in zip(*losses.values(), strict=True))


def of_worse(run, arms, seeds, margin):  # learner test 44b: (y - x) / y, relative to the worse arm
    losses = _paired(run, arms, seeds)
    return losses, all((y - x) / y > margin for x, y in zip(*losses.values(), strict=True))


def of_mean(run, arms, seeds, margin):  # learner test 44b: relative to the mean of the two losses
    losses = _paired(run, arms, seeds)
    return losses, all((y - x) / ((x + y) / 2) > margin for x, y in zip(*losses.values(), strict=True))


def margin_in_percent(run, arms, seeds, margin):  # learner test 58, 4.13: margin / 100
    losses = _paired(run, arms, seeds)
    return losses, all(y > (1 + margin / 100) * x for x, y in zip(*losses.values(), strict=True))


def two_seeds_refused(run, arms, seeds, margin):  # learner test 45d: len(seeds) <= 2
    if len(seeds) <= 2 or len(set(seeds)) != len(seeds):
        raise ValueError("bad")
    losses = {a: [run(a, s) for s in seeds] for a in arms}
    return losses, all(y > (1 + margin) * x for x, y in zip(*losses.values(), strict=True))


REJECTS = [
    pytest.param(ex.check_paired_ablation, two_seeds_refused, "2 个种子是允许的", id="two_seeds"),
    pytest.param(ex.check_paired_ablation, of_worse, "除以了第二个方案的损失", id="of_worse"),
    pytest.param(ex.check_paired_ablation, of_mean, "除以了两个损失的平均", id="of_mean"),
    pytest.param(ex.check_paired_ablation, swapped_arguments, "run(seed, arm)", id="swapped"),
    pytest.param(ex.check_paired_ablation, pairs_list, "你返回的是 list", id="pairs_list"),
    pytest.param(ex.check_paired_ablation, keyed_by_seed, "你的键是 [7, 3, 11]", id="keyed_by_seed"),
    pytest.param(ex.check_paired_ablation, additive_margin, "不是绝对的差", id="absolute"),
    pytest.param(ex.check_paired_ablation, margin_in_percent, "不要再除以 100", id="percent"),
    pytest.param(ex.check_paired_ablation, at_least, "你用的是 >=", id="ge"),
    pytest.param(ex.check_paired_ablation, any_seed, "用了 any", id="any"),
    pytest.param(ex.check_paired_ablation, without_one, "阈值少了 1 +", id="no_one"),
    pytest.param(ex.check_paired_ablation, mutant(twice=True), "不多不少", id="twice"),
    pytest.param(ex.check_paired_ablation, mutant(offset=100), "同一组种子", id="unpaired"),
    pytest.param(ex.check_paired_ablation, mutant(sorted=True), "不要排序", id="sorted"),
    pytest.param(ex.check_paired_ablation, mutant(mean=True), "逐个种子", id="mean"),
    pytest.param(ex.check_paired_ablation, mutant(last=True), "只剩最后一个种子", id="last"),
    pytest.param(ex.check_paired_ablation, mutant(no_margin=True), "相对", id="margin"),
    pytest.param(ex.check_paired_ablation, mutant(swap=True), "方向", id="direction"),
    pytest.param(ex.check_paired_ablation, mutant(as_int=True), "True 或 False", id="bool"),
    pytest.param(ex.check_paired_ablation, mutant(no_raise=True), "没有报错", id="no_raise"),
    pytest.param(ex.check_paired_ablation, mutant(error=TypeError), "应是 ValueError", id="type"),
]


def numpy_verdict(run, arms, seeds, margin):  # learner test 6b, 4.12: np.all gives np.True_
    losses = {a: np.array(v) for a, v in _paired(run, arms, seeds).items()}
    return {a: list(v) for a, v in losses.items()}, np.all(losses[arms[1]] > (1 + margin) * losses[arms[0]])


def tensor_verdict(run, arms, seeds, margin):  # a 0-dim bool tensor
    losses = {a: torch.tensor(v, dtype=torch.float64) for a, v in _paired(run, arms, seeds).items()}
    return {a: v.tolist() for a, v in losses.items()}, (losses[arms[1]] > (1 + margin) * losses[arms[0]]).all()


def test_accepts_numpy_and_tensor_truth_values(capsys):
    for fn in (numpy_verdict, tensor_verdict):
        assert_passes(ex.check_paired_ablation, fn, capsys)


def test_accepts_correct_versions(capsys):
    for fn in (loops, seed_major, as_list):
        assert_passes(ex.check_paired_ablation, fn, capsys)
    assert_skeleton(ex.check_paired_ablation, skeleton, capsys)


@pytest.mark.parametrize(("checker", "candidate", "keyword"), REJECTS)
def test_rejects_mistakes(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    assert_every_hint_reached({"ABLATION_HINTS": ABLATION_HINTS}, REJECTS, capsys)


def test_rejects_a_value_that_is_not_a_function():
    with pytest.raises(ex.ExerciseError, match="函数或类"):
        ex.check_paired_ablation(loops(lambda a, s: 1.0, ("A", "B"), [1, 2], 0.1))


def test_the_cases_tell_every_wrong_verdict_apart():
    from transformer_course.exercises import ablations

    vectors = {
        mistake: tuple(ablations._verdict(c[4], c[5], c[3], mistake) for c in ablations._CASES)
        for mistake in (None, *ablations._VERDICT_MISTAKES)
    }
    assert len(set(vectors.values())) == len(vectors), vectors
