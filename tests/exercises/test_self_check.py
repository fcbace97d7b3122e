"""The self-tests that close chapter 5 (the source's criteria 2-5)."""

import pytest
import torch

from transformer_course import exercises as ex
from transformer_course.exercises.self_check import QKV_QUESTIONS, _also_last, _first_sees_all, _LeakyGPT, _one_ahead
from transformer_course.models import GPTConfig

from .support import assert_passes, assert_rejects, assert_skeleton, rejection

RIGHT = {"a": "第 2 个值", "b": "不变", "c": "第 3 个键", "d": "更硬（更集中）"}


def test_qkv_right_answers(capsys):
    ex.check_qkv_answers(dict(RIGHT))
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✓")


def test_qkv_unanswered_is_not_an_error(capsys):
    ex.check_qkv_answers({**RIGHT, "c": None})
    assert capsys.readouterr().out.startswith("尚未实现")
    with pytest.raises(ex.ExerciseError):
        ex.check_qkv_answers({**RIGHT, "c": None}, solution=True)


@pytest.mark.parametrize("key", list("abcd"))
def test_qkv_each_wrong_answer_is_explained(key):
    wrong = next(o for o in QKV_QUESTIONS[key][1] if o != RIGHT[key])
    with pytest.raises(ex.ExerciseError, match=rf"\({key}\)"):
        ex.check_qkv_answers({**RIGHT, key: wrong})


def test_qkv_outcome_is_kept_for_progress(capsys):
    from transformer_course.exercises._protocol import FAILED, PASSED, RESULTS, SKELETON

    key = ("9.1", "检验标准 2：Q、K、V 各起什么作用")
    ex.check_qkv_answers({**RIGHT, "c": None}, exercise="9.1")
    assert RESULTS[key][0] == SKELETON
    with pytest.raises(ex.ExerciseError):
        ex.check_qkv_answers({**RIGHT, "a": "所有值的平均"}, exercise="9.1")
    assert RESULTS[key][0] == FAILED
    ex.check_qkv_answers(dict(RIGHT), exercise="9.1")
    assert RESULTS[key][0] == PASSED
    del RESULTS[key]


@pytest.mark.parametrize(
    "answers",
    [
        {**RIGHT, "d": "更硬"},  # learner test: the option without its parenthesis
        {**RIGHT, "d": "更集中"},
        {**RIGHT, "d": "更硬(更集中)"},
        {**RIGHT, "a": "第二个值", "c": " 第3个键 "},
    ],
)
def test_qkv_accepts_equivalent_spellings(answers, capsys):
    ex.check_qkv_answers(answers)
    assert capsys.readouterr().out.startswith("✓")


def test_qkv_equivalent_spelling_of_a_wrong_answer_is_wrong():
    with pytest.raises(ex.ExerciseError, match=r"\(d\)"):
        ex.check_qkv_answers({**RIGHT, "d": "更软"})


def test_qkv_rejects_unknown_option_and_non_dict():
    with pytest.raises(ex.ExerciseError, match="之一"):
        ex.check_qkv_answers({**RIGHT, "a": "第 4 个值"})
    with pytest.raises(ex.ExerciseError, match="之一"):
        ex.check_qkv_answers({**RIGHT, "d": "更"})
    with pytest.raises(ex.ExerciseError, match="dict"):
        ex.check_qkv_answers(["第 2 个值"])


def jacobian_outer(p):
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def jacobian_einsum(p):
    eye = torch.eye(p.shape[-1], dtype=p.dtype)
    return torch.einsum("...i,ij->...ij", p, eye) - torch.einsum("...i,...j->...ij", p, p)


def jacobian_flattened_outer(p):
    """Learner test: torch.outer on the flattened batch, the first block kept for every row."""
    n = p.size(-1)
    outer = torch.outer(p.reshape(-1), p.reshape(-1))[:n, :n]
    return torch.diag_embed(p) - outer.expand(*p.shape, n)


def test_softmax_jacobian(capsys):
    assert_passes(ex.check_softmax_jacobian, jacobian_outer, capsys)
    assert_passes(ex.check_softmax_jacobian, jacobian_einsum, capsys)
    assert_skeleton(ex.check_softmax_jacobian, lambda p: None, capsys)


@pytest.mark.parametrize(
    ("wrong", "keyword"),
    [
        (lambda p: torch.diag_embed(p), "漏了 −p pᵀ"),
        (lambda p: torch.diag_embed(p - p * p), "只减了对角线"),
        (lambda p: p.unsqueeze(-1) * p.unsqueeze(-2) - torch.diag_embed(p), "符号反了"),
        # learner test 9b, 5.20: the elementwise square p², not the outer product
        (lambda p: torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-1), "不是外积 p pᵀ"),
        (lambda p: torch.diag_embed(p) - p.unsqueeze(-2) * p.unsqueeze(-2), "不是外积 p pᵀ"),
        (lambda p: torch.diag_embed(p) - 0.5 * p.unsqueeze(-1) * p.unsqueeze(-2), "δ_ij"),
        (jacobian_flattened_outer, "一维的 p 对了，批量的错了"),
        # learner test 27c, 5.20: -p pᵀ alone, δ_ij − p_j without p_i, + p pᵀ
        (lambda p: -p.unsqueeze(-1) * p.unsqueeze(-2), "漏了 diag(p)"),
        (lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-2), "漏了前面的因子 p_i"),
        (lambda p: torch.eye(p.shape[-1], dtype=p.dtype) - p.unsqueeze(-1), "漏了前面的因子 p_i"),
        (lambda p: torch.diag_embed(p) + p.unsqueeze(-1) * p.unsqueeze(-2), "写成了 +p pᵀ"),
        # learner test 31c, 5.20: p itself subtracted, not p_i p_j
        (lambda p: torch.diag_embed(p) - p.unsqueeze(-1), "减去的是 p 本身"),
        (lambda p: torch.diag_embed(p) - p.unsqueeze(-2), "减去的是 p 本身"),
    ],
)
def test_softmax_jacobian_mistakes(wrong, keyword, capsys):
    assert_rejects(ex.check_softmax_jacobian, wrong, keyword, capsys)


def jacobian_1d_only(p):
    """Learner test: right for one row, torch.outer refuses a batch."""
    return torch.diag(p) - torch.outer(p, p)


def jacobian_1d_broadcast(p):
    """Learner test: the outer product by indexing a 1-D p; a batch does not broadcast."""
    return torch.diag(p) - p[:, None] * p[None, :]


@pytest.mark.parametrize("wrong", [jacobian_1d_only, jacobian_1d_broadcast])
def test_softmax_jacobian_1d_only_crash_is_explained(wrong, capsys):
    assert_rejects(ex.check_softmax_jacobian, wrong, "前导（批量）维", capsys)


def probe_allclose(model, ids, t):
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % 17
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def probe_max_diff(model, ids, t):
    changed = torch.cat([ids[:, :t], torch.flip(ids[:, t:], [1]) * 0 + 3], dim=1)
    diff = (model(ids)[0][:, :t] - model(changed)[0][:, :t]).abs().max()
    return bool(diff < 1e-4)


def probe_keyword_ids(model, ids, t):
    """Correct, the ids passed by keyword (the checker watches the model's inputs)."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 5) % 17
    before, after = model(input_ids=ids)[0], model(input_ids=changed)[0]
    return torch.allclose(before[:, :t], after[:, :t], atol=1e-5)


def test_causality_probe(capsys):
    assert_passes(ex.check_causality_probe, probe_allclose, capsys)
    assert_passes(ex.check_causality_probe, probe_max_diff, capsys)
    assert_passes(ex.check_causality_probe, probe_keyword_ids, capsys)


@pytest.mark.parametrize(
    ("wrong", "keyword"),
    [
        (lambda m, ids, t: True, "探针没有调用模型"),
        (lambda m, ids, t: torch.equal(m(ids)[0], m(ids)[0]), "一个词元也没有改"),  # never changes ids
        (
            lambda m, ids, t: torch.allclose(m(ids)[0], m(torch.cat([ids[:, :t], (ids[:, t:] + 1) % 17], 1))[0]),
            "只取 [:, :t]",
        ),  # compares every position
    ],
)
def test_causality_probe_mistakes(wrong, keyword, capsys):
    assert_rejects(ex.check_causality_probe, wrong, keyword, capsys)


def probe_position_0_only(model, ids, t):
    """Learner test: the tokens from t on changed, but only position 0 compared."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % 17
    return torch.allclose(model(ids)[0][:, 0], model(changed)[0][:, 0], atol=1e-5)


def test_causality_probe_catches_a_bounded_leak(capsys):
    message = rejection(ex.check_causality_probe, probe_position_0_only)
    assert "只比较位置 0" in message, message
    assert "t = 3" in message, message


def test_bounded_leak_reaches_back_two_positions_only():
    """The one-ahead model: a change at t moves the logits at t - 2 and t - 1 (two
    layers), not those before; what the hint says."""
    cfg = GPTConfig(vocab_size=17, context_length=16, d_model=16, num_heads=2, num_layers=2)
    model = _LeakyGPT(cfg, _one_ahead).eval()
    ids = torch.randint(0, 17, (2, 12))
    for t in (3, 7, 11):
        changed = ids.clone()
        changed[:, t:] = (changed[:, t:] + 1) % 17
        with torch.no_grad():
            moved = (model(ids)[0] - model(changed)[0]).abs().amax((0, 2)) > 1e-5
        assert moved[:t].nonzero().flatten().tolist() == [t - 2, t - 1]


def moved_before(model, ids, t, changed):
    """The positions < t whose logits move when ``ids`` becomes ``changed``."""
    with torch.no_grad():
        moved = (model(ids)[0] - model(changed)[0]).abs().amax((0, 2)) > 1e-5
    return moved[:t].nonzero().flatten().tolist()


def test_the_two_narrow_leaks_are_what_the_hints_say():
    """Learner test 10b (5.21): the first-layer leak from the last token is seen only
    by changing the tokens after t too; the last-layer leak into position 0 only by
    comparing position 0."""
    cfg = GPTConfig(vocab_size=17, context_length=16, d_model=16, num_heads=2, num_layers=2)
    also_last = _LeakyGPT(cfg, _also_last, leaky=(0,)).eval()
    first_sees_all = _LeakyGPT(cfg, _first_sees_all, leaky=(1,)).eval()
    ids = torch.randint(0, 17, (2, 12))
    for t in (3, 7):
        only_t, from_t = ids.clone(), ids.clone()
        only_t[:, t] = (only_t[:, t] + 1) % 17
        from_t[:, t:] = (from_t[:, t:] + 1) % 17
        assert moved_before(also_last, ids, t, only_t) == []
        assert moved_before(also_last, ids, t, from_t) == list(range(t))
        assert moved_before(first_sees_all, ids, t, from_t) == [0]


def probe_token_t_only(model, ids, t):
    """Learner test 10b (5.21): only token t changed, not the ones after it."""
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % 17
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def probe_position_t_minus_1_only(model, ids, t):
    """Learner test 10b (5.21): the tokens from t on changed, only position t - 1
    compared."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % 17
    return torch.allclose(model(ids)[0][:, t - 1], model(changed)[0][:, t - 1], atol=1e-5)


def test_causality_probe_catches_the_narrow_leaks(capsys):
    message = rejection(ex.check_causality_probe, probe_token_t_only)
    assert "第一层里每个位置还看得见最后一个词元的模型，t = 3" in message, message
    assert "只改位置 t 一个词元" in message, message
    message = rejection(ex.check_causality_probe, probe_position_t_minus_1_only)
    assert "最后一层里位置 0 看得见全部位置的模型，t = 3" in message, message
    assert "只比较位置 t − 1" in message, message
    assert capsys.readouterr().out == ""


def probe_in_place(model, input_ids, t):
    """Learner test: right answer, but the caller's input_ids edited in place (no
    clone)."""
    before = model(input_ids)[0]
    ids = input_ids
    ids[:, t:] = (ids[:, t:] + 1) % 17
    return torch.allclose(before[:, :t], model(ids)[0][:, :t], atol=1e-5)


def probe_fill_zero(model, ids, t):
    """Learner test 24c (5.21): every token from t on set to 0, also where it was 0."""
    changed = ids.clone()
    changed[:, t:] = 0
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def test_causality_probe_names_a_fill_that_leaves_position_t(capsys):
    message = rejection(ex.check_causality_probe, probe_fill_zero)
    assert "原来就是 0" in message and "t = 7" in message, message


def test_causality_probe_in_place_edit(capsys):
    assert_rejects(ex.check_causality_probe, probe_in_place, "原地改动", capsys)


def probe_changes_from_t_minus_1(model, ids, t):
    """Learner test: the tokens changed from t - 1 on (off by one)."""
    changed = ids.clone()
    changed[:, t - 1 :] = (changed[:, t - 1 :] + 1) % 17
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def test_causality_probe_names_a_change_before_t(capsys):
    message = rejection(ex.check_causality_probe, probe_changes_from_t_minus_1)
    assert "只改位置 t 及以后" in message, message
    assert "位置 2 的词元" in message, message  # t = 3: position t - 1


def probe_last_token_only(model, ids, t):
    """Learner test (the page's 5.2 demo does this): only the last token changed, the
    positions before t compared; enough for a model without a mask, not for a leak
    that reaches back two positions."""
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 17
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def probe_from_t_plus_1(model, ids, t):
    """Learner test: the tokens changed from t + 1 on (a leak reaching back one
    position still shows); at t = 11 nothing is left to change."""
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % 17
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def test_causality_probe_names_the_unchanged_position_t(capsys):
    message = rejection(ex.check_causality_probe, probe_last_token_only)
    assert "你没有改位置 t = 3 的词元，只改了位置 11" in message, message
    assert "只比较位置 0" not in message, message
    message = rejection(ex.check_causality_probe, probe_from_t_plus_1)
    assert "只在最后一层多看一个未来位置的模型，t = 3）：你没有改位置 t = 3" in message, message


def probe_before_t_minus_1(model, ids, t):
    """Learner test 15 (5.20): the tokens from t on changed, but only [:, :t-1]
    compared (off by one: position t - 1 never checked)."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % model.cfg.vocab_size
    return torch.allclose(model(ids)[0][:, : t - 1], model(changed)[0][:, : t - 1], atol=1e-5)


def test_leak_into_t_minus_1_only():
    """The one-ahead leak in the last block alone moves position t - 1 and no other."""
    cfg = GPTConfig(vocab_size=17, context_length=16, d_model=16, num_heads=2, num_layers=2)
    model = _LeakyGPT(cfg, _one_ahead, leaky=(1,)).eval()
    ids = torch.randint(0, 17, (2, 12))
    for t in (3, 7, 11):
        changed = ids.clone()
        changed[:, t:] = (changed[:, t:] + 1) % 17
        assert moved_before(model, ids, t, changed) == [t - 1]


def test_causality_probe_catches_the_off_by_one_comparison(capsys):
    message = rejection(ex.check_causality_probe, probe_before_t_minus_1)
    assert "只在最后一层多看一个未来位置的模型，t = 3" in message, message
    assert "漏了位置 t − 1" in message, message
    assert "要改动位置 t" not in message, message


def probe_comparing(same):
    """A probe that changes the tokens from t on (right) and compares the logits
    before t with ``same``."""

    def probe(model, ids, t):
        changed = ids.clone()
        changed[:, t:] = (changed[:, t:] + 1) % model.cfg.vocab_size
        return same(model(ids)[0][:, :t], model(changed)[0][:, :t])

    return probe


def probe_row_0_only(model, ids, t):
    """Learner test 27c (5.21): the tokens from t on changed in every row, but only
    batch row 0 compared."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % model.cfg.vocab_size
    return torch.allclose(model(ids)[0][0, :t], model(changed)[0][0, :t], atol=1e-5)


def probe_changes_row_0_only(model, ids, t):
    """The tokens from t on changed in batch row 0 alone; every row compared."""
    changed = ids.clone()
    changed[0, t:] = (changed[0, t:] + 1) % model.cfg.vocab_size
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


def probe_replacing_with_the_same(model, ids, t):
    """Learner test 38c (5.21): replacements drawn at random that, in batch row 1,
    equal the original tokens (here: row 1 written back unchanged)."""
    changed = ids.clone()
    changed[:, t:] = (changed[:, t:] + 1) % model.cfg.vocab_size
    changed[1, t:] = ids[1, t:]
    return torch.allclose(model(ids)[0][:, :t], model(changed)[0][:, :t], atol=1e-5)


@pytest.mark.parametrize(
    ("probe", "keyword"),
    [
        (probe_row_0_only, "只比较了第 0 行"),
        (probe_changes_row_0_only, "只改了第 0 行"),
        (probe_replacing_with_the_same, "换上的恰好与原来相同"),
    ],
)
def test_causality_probe_catches_a_leak_in_one_batch_row(probe, keyword, capsys):
    message = rejection(ex.check_causality_probe, probe)
    assert "只在批里第 1 行" in message and keyword in message, message
    assert capsys.readouterr().out == ""


# learner test 15 (5.20): compared with atol=1.0, or only the argmax compared
probe_loose_tolerance = probe_comparing(lambda a, b: torch.allclose(a, b, atol=1.0))
probe_argmax_only = probe_comparing(lambda a, b: torch.equal(a.argmax(-1), b.argmax(-1)))


@pytest.mark.parametrize(
    ("probe", "keyword"),
    [(probe_loose_tolerance, "容差太大"), (probe_argmax_only, "只比较了 argmax")],
)
def test_causality_probe_names_the_comparison_fault(probe, keyword, capsys):
    """The tokens are changed right: the hint names the comparison, not the change."""
    message = rejection(ex.check_causality_probe, probe)
    assert keyword in message, message
    assert "要改动位置 t" not in message, message
    assert "logits 最多变了" in message, message
    assert capsys.readouterr().out == ""


def prefilled(model, ids, chunk):
    """Caches holding the prompt, fed ``chunk`` tokens at a time, and the last logits."""
    caches = model.new_caches()
    for piece in ids.split(chunk, dim=1):
        logits, _ = model(piece, caches=caches)
    return caches, logits


@torch.no_grad()
def greedy_cached(model, ids, n_new, chunk=4):
    caches, logits = prefilled(model, ids, chunk)
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if step + 1 < n_new:  # the last new token is not fed back
            logits, _ = model(nxt, caches=caches)
    return ids


@torch.no_grad()
def greedy_cached_list(model, ids, n_new, chunk=4):
    """Another style: index-arithmetic chunks, new tokens collected in a list."""
    caches = model.new_caches()
    for start in range(0, ids.shape[1], chunk):
        logits, _ = model(ids[:, start : start + chunk], caches=caches)
    new = [logits[:, -1].argmax(-1, keepdim=True)]
    while len(new) < n_new:
        logits, _ = model(new[-1], caches=caches)
        new.append(logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([ids, *new], dim=1)


def test_greedy_with_cache(capsys):
    assert_passes(ex.check_greedy_with_cache, greedy_cached, capsys)
    assert_passes(ex.check_greedy_with_cache, greedy_cached_list, capsys)


@torch.no_grad()
def greedy_refeeds_everything(model, ids, n_new, chunk=4):
    for _ in range(n_new):
        logits, _ = model(ids, caches=None)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.no_grad()
def greedy_first_position(model, ids, n_new, chunk=4):
    caches, logits = prefilled(model, ids, chunk)
    for _ in range(n_new):
        nxt = logits[:, 0].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        logits, _ = model(nxt, caches=caches)
    return ids


@torch.no_grad()
def greedy_one_forward_too_many(model, ids, n_new, chunk=4):
    """Learner test 25c: the last new token fed back, its logits unused."""
    caches, logits = prefilled(model, ids, chunk)
    for _ in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        logits, _ = model(nxt, caches=caches)
    return ids


@torch.no_grad()
def greedy_two_forwards_too_many(model, ids, n_new, chunk=4):
    ids = greedy_one_forward_too_many(model, ids, n_new, chunk)
    model(ids[:, -1:], caches=model.new_caches())
    return ids


@torch.no_grad()
def greedy_chunk_ignored(model, ids, n_new, chunk=4):
    """Learner test 25c: the whole prompt prefilled at once, ``chunk`` unused."""
    return greedy_cached(model, ids, n_new, chunk=ids.shape[1])


@torch.no_grad()
def greedy_tokenwise_prefill(model, ids, n_new, chunk=4):
    """The prompt prefilled one token at a time, ``chunk`` unused."""
    return greedy_cached(model, ids, n_new, chunk=1)


@torch.no_grad()
def greedy_chunk_fixed_at_4(model, ids, n_new, chunk=4):
    """Pieces of 4 whatever ``chunk`` says: right for the default only."""
    return greedy_cached(model, ids, n_new, chunk=4)


@torch.no_grad()
def greedy_first_chunk_logits(model, ids, n_new, chunk=4):
    """Learner test 25c: the first prefill chunk's logits, not the last one's."""
    caches = model.new_caches()
    pieces = [model(piece, caches=caches)[0] for piece in ids.split(chunk, dim=1)]
    logits = pieces[0]
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if step + 1 < n_new:
            logits, _ = model(nxt, caches=caches)
    return ids


@torch.no_grad()
def greedy_one_argmax_for_the_batch(model, ids, n_new, chunk=4):
    """Learner test 38c (5.22b): argmax without dim, over the whole batch."""
    caches, logits = prefilled(model, ids, chunk)
    for step in range(n_new):
        nxt = (logits[:, -1].argmax() % logits.size(-1)).view(1, 1).expand(ids.size(0), 1)
        ids = torch.cat([ids, nxt], dim=1)
        if step + 1 < n_new:
            logits, _ = model(nxt, caches=caches)
    return ids


def test_greedy_with_cache_one_argmax_for_the_batch_is_named(capsys):
    # learner test 38c: it got the generic "differs from greedy", as did logits[:, 0]
    # (greedy_first_position, test_greedy_with_cache_mistakes)
    assert_rejects(ex.check_greedy_with_cache, greedy_one_argmax_for_the_batch, "argmax 没有写 dim=-1", capsys)


def test_feeding_the_last_token_back_fails_and_counts_as_not_passed(capsys):
    # the text forbids it: "最后选出的词元不要再送进模型"
    from transformer_course.exercises import _protocol

    message = rejection(ex.check_greedy_with_cache, greedy_one_forward_too_many)
    assert "最后选出的词元又送进了模型" in message, message
    _protocol.RESULTS.clear()
    with pytest.raises(ex.ExerciseError):
        ex.check_greedy_with_cache(greedy_one_forward_too_many, exercise="5.22")
    capsys.readouterr()
    ex.progress(5)
    out = capsys.readouterr().out
    assert "0 道通过" in out and "✗ 练习 5.22" in out, out
    _protocol.RESULTS.clear()


def test_greedy_with_cache_tests_chunk(capsys):
    assert_rejects(ex.check_greedy_with_cache, greedy_chunk_ignored, "没有用 chunk 分块", capsys)
    message = rejection(ex.check_greedy_with_cache, greedy_tokenwise_prefill)
    assert "每次 chunk 个词元" in message and "[4, 2]" in message, message
    message = rejection(ex.check_greedy_with_cache, greedy_chunk_fixed_at_4)
    assert "每次 chunk 个词元" in message and "[2, 2, 1]" in message, message
    message = rejection(ex.check_greedy_with_cache, greedy_first_chunk_logits)
    assert "第一块提示的 logits" in message, message


@torch.no_grad()
def greedy_fresh_caches(model, ids, n_new, chunk=4):
    """Learner test: new caches every step, so the cache is never read."""
    inp = ids
    for _ in range(n_new):
        logits, _ = model(inp, caches=model.new_caches())
        inp = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, inp], dim=1)
    return ids


@torch.no_grad()
def greedy_full_ids_into_cache(model, ids, n_new, chunk=4):
    """Learner test: the whole sequence fed into the same caches every step."""
    caches = model.new_caches()
    for _ in range(n_new):
        logits, _ = model(ids, caches=caches)
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def test_greedy_with_cache_learner_mistakes(capsys):
    assert_rejects(ex.check_greedy_with_cache, greedy_fresh_caches, "换了一组空缓存", capsys)
    message = rejection(ex.check_greedy_with_cache, greedy_full_ids_into_cache)
    assert "整段 ids 又送进了同一组缓存" in message, message
    assert "greedy_full_ids_into_cache" in message  # the learner's exception and line


@torch.no_grad()
def greedy_new_tokens_only(model, ids, n_new, chunk=4):
    """Learner test 15 (5.21): right tokens, but the prompt left out of the result."""
    return greedy_cached(model, ids, n_new, chunk)[:, ids.shape[1] :]


def test_greedy_with_cache_names_a_missing_prompt(capsys):
    message = rejection(ex.check_greedy_with_cache, greedy_new_tokens_only)
    assert "少了提示" in message, message
    assert "(2, 12)" in message and "(2, 18)" in message, message


@torch.no_grad()
def greedy_drops_prompt_tail(model, ids, n_new, chunk=4):
    """Learner test 31c (F4): the prefill loop stops before the prompt's last piece."""
    caches = model.new_caches()
    for start in range(0, ids.shape[1] - chunk + 1, chunk):
        logits, _ = model(ids[:, start : start + chunk], caches=caches)
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if step + 1 < n_new:
            logits, _ = model(nxt, caches=caches)
    return ids


@torch.no_grad()
def greedy_prefill_without_caches(model, ids, n_new, chunk=4):
    """Learner test 31c: the prompt's pieces fed without caches, decoding with them."""
    caches = model.new_caches()
    for piece in ids.split(chunk, dim=1):
        logits, _ = model(piece)
    for step in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        if step + 1 < n_new:
            logits, _ = model(nxt, caches=caches)
    return ids


def test_greedy_with_cache_learner_31c_mistakes(capsys):
    message = rejection(ex.check_greedy_with_cache, greedy_drops_prompt_tail)
    assert "[4]" in message and "[4, 2]" in message and "循环的上界" in message, message
    assert "第一块提示" not in message, message
    assert_rejects(ex.check_greedy_with_cache, greedy_prefill_without_caches, "没有传 caches=caches", capsys)


def test_greedy_with_cache_mistakes(capsys):
    assert_rejects(ex.check_greedy_with_cache, greedy_two_forwards_too_many, "不必再送", capsys)
    assert_rejects(ex.check_greedy_with_cache, greedy_refeeds_everything, "只送新词元", capsys)
    assert_rejects(ex.check_greedy_with_cache, greedy_first_position, "最后一块提示的第一个位置", capsys)
