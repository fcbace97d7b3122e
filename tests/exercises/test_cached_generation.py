"""The learner's KV cache wired into the learner's GPT: ``check_cached_forward``.

Correct cached forwards in different styles pass with one "✓" line; a skeleton is
"尚未实现"; hand-written wrong ones are rejected with a hint that names the mistake."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import cached_generation

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection


class ListCache:
    """A cache that keeps Python lists and concatenates on demand (another style)."""

    def __init__(self):
        self.k, self.v = [], []

    def update(self, k, v):
        self.k.append(k)
        self.v.append(v)
        return torch.cat(self.k, dim=2), torch.cat(self.v, dim=2)

    def __len__(self):
        return sum(t.shape[2] for t in self.k)


def make_forward(mistake=None):
    @torch.no_grad()
    def forward_with_cache(model, input_ids, caches, num_heads):
        N, T = input_ids.shape
        shift = {"positions_minus_1": -1, "positions_plus_1": 1}.get(mistake, 0)
        start = 0 if mistake == "positions_from_zero" else max(len(caches[0]) + shift, 0)
        if mistake == "positions_plus_1_cached" and start:  # learner test 27c, 5.17
            start += 1
        if mistake == "positions_plus_T_minus_1":  # learner test 38c, a 5.23 "fix"
            start = len(caches[0]) + T - 1
        x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(start, start + T))
        for i, block in enumerate(model.blocks):
            if mistake == "one_cache":
                i = 0
            attn = block.self_attn
            h = x if mistake == "no_norm1" else block.norm1(x)
            if mistake in ("heads_no_transpose", "split_no_transpose"):  # learner tests 6b, 19: (N, H, T, D)
                q, k, v = (p(h).reshape(N, num_heads, T, -1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            else:  # learner test 38c, 5.17: k and/or v projected from x, not norm1(x)
                inputs = {"k_from_x": (h, x, h), "v_from_x": (h, h, x), "kv_from_x": (h, x, x)}.get(mistake, (h, h, h))
                q, k, v = (
                    p(t).view(N, T, num_heads, -1).transpose(1, 2)
                    for p, t in zip((attn.q_proj, attn.k_proj, attn.v_proj), inputs, strict=True)
                )
                if mistake == "q_split_no_transpose":  # learner test 38c: q only
                    q = attn.q_proj(h).view(N, num_heads, T, -1)
            old = len(caches[i])
            K, V = caches[i].update(*((v, k) if mistake == "kv_swapped" else (k, v)))
            if mistake == "past_only" and old:  # learner test 24c: the new token skips itself
                K, V = K[:, :, :old], V[:, :, :old]
            if mistake == "cache_not_read":
                K, V = k, v
            D = q.shape[-1] if mistake != "scale_model" else x.shape[-1]
            scores = q @ K.transpose(-2, -1)
            if mistake != "no_scale":
                scores = scores / math.sqrt(D)
            if mistake == "top_left_padded":  # learner test: causal_mask(T), padded
                keep = torch.nn.functional.pad(tc.causal_mask(T), (0, K.shape[-2] - T), value=False)
                scores = scores.masked_fill(~keep, float("-inf"))
            elif mistake == "mask_triu":  # learner test 25c: a top-left mask "fixed" inverted
                S = K.shape[-2]
                keep = torch.ones(T, S, dtype=torch.bool).triu(S - T)
                scores = scores.masked_fill(~keep, float("-inf"))
            elif mistake in ("mask_no_diagonal", "mask_no_diagonal_key_0"):  # learner tests 25c, 27c
                S = K.shape[-2]
                keep = torch.ones(T, S, dtype=torch.bool).tril(S - T - 1)
                if mistake == "mask_no_diagonal_key_0":  # no row left empty
                    keep[:, 0] = True
                scores = scores.masked_fill(~keep, float("-inf"))
            elif mistake != "no_mask":
                scores = scores.masked_fill(~tc.causal_mask(T, K.shape[-2]), float("-inf"))
            o = scores.softmax(-1) @ V
            if mistake not in ("heads_no_transpose", "merge_no_transpose"):
                o = o.transpose(1, 2)
            # learner test 19, 5.17: the residual taken from h = norm1(x)
            x = (h if mistake in ("res_from_norm1", "res_from_norm") else x) + attn.out_proj(o.reshape(N, T, -1))
            if mistake == "no_res_attn":  # learner test 38c
                x = attn.out_proj(o.reshape(N, T, -1))
            if mistake == "res_from_norm":  # both sublayers: h2 + ffn(h2)
                h2 = block.norm2(x)
                x = h2 + block.ffn(h2)
                continue
            if mistake == "no_res_ffn":  # learner test 38c
                x = block.ffn(block.norm2(x))
                continue
            # learner test 9b, 5.17: norm2 skipped
            x = x + block.ffn(
                {"no_norm2": x, "ffn_from_h": h}.get(mistake)
                if mistake in ("no_norm2", "ffn_from_h")
                else block.norm2(x)
            )
        if mistake != "no_norm_f":
            x = model.norm_f(x)
        return model.lm_head(x)

    return forward_with_cache


@torch.no_grad()
def einsum_forward(model, input_ids, caches, num_heads):
    """Another style: einsum, F.scaled_dot_product_attention, offset mask by hand."""
    N, T = input_ids.shape
    S0 = len(caches[0])
    x = model.tok_emb(input_ids) + model.pos_emb(S0 + torch.arange(T))
    for block, cache in zip(model.blocks, caches, strict=True):
        a = block.self_attn
        h = block.norm1(x)
        split = lambda t: t.reshape(N, T, num_heads, -1).permute(0, 2, 1, 3)  # noqa: E731
        K, V = cache.update(split(a.k_proj(h)), split(a.v_proj(h)))
        keep = torch.arange(S0 + T)[None, :] <= (S0 + torch.arange(T))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(split(a.q_proj(h)), K, V, attn_mask=keep)
        x = x + a.out_proj(torch.einsum("nhtd->ntdh", o).transpose(-1, -2).flatten(2))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@torch.no_grad()
def prompt_causal_forward(model, input_ids, caches, num_heads):
    """Learner test 10b (5.17): is_causal=L > 1; right when one token follows a
    non-empty cache, wrong for several (learner test 31c: the top-left alignment)."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        q, k, v = (p(h).view(N, L, num_heads, -1).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        K, V = cache.update(k, v)
        o = F.scaled_dot_product_attention(q, K, V, is_causal=L > 1)
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_correct_cached_forwards_pass(capsys):
    for fn in (make_forward(), einsum_forward):
        assert_passes(ex.check_cached_forward, fn, capsys)


@torch.no_grad()
def top_left_unless_one(model, input_ids, caches, num_heads):
    """Learner test 31c (5.23): the page's top-left mask kept, dropped for one token."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        q, k, v = (p(h).view(N, L, num_heads, -1).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        K, V = cache.update(k, v)
        keep = None if L == 1 else torch.tril(torch.ones(L, K.shape[-2], dtype=torch.bool))
        o, _ = tc.scaled_dot_product_attention(q, K, V, attn_mask=keep)
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@torch.no_grad()
def tril_sign_flipped(model, input_ids, caches, num_heads):
    """Learner test 31c (5.23): tril(diagonal=L - S) for tril(diagonal=S - L)."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        q, k, v = (p(h).view(N, L, num_heads, -1).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        K, V = cache.update(k, v)
        S = K.shape[-2]
        o, _ = tc.scaled_dot_product_attention(q, K, V, attn_mask=torch.ones(L, S, dtype=torch.bool).tril(L - S))
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@torch.no_grad()
def query_from_x(model, input_ids, caches, num_heads):
    """Learner test 31c (5.17): q_proj(x) where q_proj(norm1(x)) is meant."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        split = lambda t: t.view(N, L, num_heads, -1).transpose(1, 2)  # noqa: E731
        K, V = cache.update(split(a.k_proj(h)), split(a.v_proj(h)))
        o, _ = tc.scaled_dot_product_attention(split(a.q_proj(x)), K, V, attn_mask=tc.causal_mask(L, K.shape[-2]))
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@pytest.mark.parametrize("exercise", ["5.17", "5.23"])
@pytest.mark.parametrize(
    ("fn", "keyword"),
    [
        (prompt_causal_forward, "对齐到缓存的末尾"),
        (top_left_unless_one, "对齐到缓存的末尾"),
        (tril_sign_flipped, "偏移符号反了"),
        (query_from_x, "不是 q_proj(x)"),
    ],
)
def test_learner_31c_mistakes_are_named(fn, keyword, exercise, capsys):
    # learner test 31c: the first two passed (only one token after a non-empty cache
    # was tested); the last two got the generic checklist
    message = rejection(lambda f: ex.check_cached_forward(f, exercise=exercise), fn)
    assert keyword in message and "逐层对照" not in message, message


def test_solution_flag(capsys):
    assert_passes(ex.check_cached_forward, make_forward(), capsys, solution=True)


def test_skeleton(capsys):
    def skeleton(model, input_ids, caches, num_heads):
        pass

    assert_skeleton(ex.check_cached_forward, skeleton, capsys)


NAMED_MISTAKES = [
    ("positions_from_zero", "位置编号从 0 开始"),
    ("positions_minus_1", "新词元的位置少算了 1"),  # learner test 10b
    ("positions_plus_1", "新词元的位置多算了 1"),
    ("positions_plus_1_cached", "缓存不空时新词元的位置多算了 1"),
    ("positions_plus_T_minus_1", "新词元的位置多加了 T − 1"),
    ("no_mask", "因果掩码"),
    ("no_scale", "√D"),
    ("no_norm_f", "norm_f"),
    ("no_norm2", "FFN 之前漏了 norm2"),
    ("no_norm1", "注意力之前漏了 norm1"),
    ("cache_not_read", "cache.update"),
    ("past_only", "只需计算自己的 Q"),
    ("one_cache", "共用了一个缓存"),
    ("top_left_padded", "对齐到了左上角"),
    ("heads_no_transpose", "分头和合并时都少了 transpose"),
    ("merge_no_transpose", "合并多头时少了 transpose"),
    ("split_no_transpose", "分头时直接 view 成了 (N, H, T, D)"),  # learner test 19
    ("res_from_norm1", "注意力子层的残差加在了 norm1(x) 上"),  # learner test 19
    ("res_from_norm", "注意力子层的残差加在了 norm1(x) 上"),  # with default norms: alike
    ("ffn_from_h", "FFN 的输入用了注意力之前的 h"),
    ("scale_model", "缩放用了 √d_model"),
    ("kv_swapped", "键和值弄反了"),
    ("mask_triu", "掩码方向反了"),
    ("mask_no_diagonal", "掩码把对角线也遮住了"),
    ("mask_no_diagonal_key_0", "每一行都看得见第 0 个键"),
    # learner test 38c: with nearly uniform attention these got another mistake's hint
    ("k_from_x", "不是 k_proj(x)"),
    ("v_from_x", "不是 v_proj(x)"),
    ("kv_from_x", "k 和 v 是从没有归一化的 x 投影的"),
    ("no_res_attn", "注意力子层少了残差"),
    ("no_res_ffn", "FFN 子层少了残差"),
    ("q_split_no_transpose", "q 分头时直接 view 成了 (N, H, T, D)"),
]


@pytest.mark.parametrize(("mistake", "keyword"), NAMED_MISTAKES)
def test_mistakes_are_named(mistake, keyword, capsys):
    assert_rejects(ex.check_cached_forward, make_forward(mistake), keyword, capsys)


@torch.no_grad()
def positions_after_first_update(model, input_ids, caches, num_heads):
    # learner test 18c, 5.17: the first block caches k, v of the bare token embeddings,
    # the positions are added just after its cache.update (so only q carries them there)
    N, T = input_ids.shape
    start = len(caches[0])
    x = model.tok_emb(input_ids)
    for i, (block, cache) in enumerate(zip(model.blocks, caches, strict=True)):
        attn = block.self_attn
        split = lambda t: t.view(N, T, num_heads, -1).transpose(1, 2)  # noqa: E731
        K, V = cache.update(split(attn.k_proj(block.norm1(x))), split(attn.v_proj(block.norm1(x))))
        if i == 0:
            x = x + model.pos_emb(torch.arange(start, start + T))
        q = split(attn.q_proj(block.norm1(x)))
        o = F.scaled_dot_product_attention(q, K, V, attn_mask=tc.causal_mask(T, K.shape[-2]))
        x = x + attn.out_proj(o.transpose(1, 2).reshape(N, T, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_keys_and_values_without_positions_are_named(capsys):
    assert_rejects(ex.check_cached_forward, positions_after_first_update, "加位置嵌入之前算的", capsys)


@torch.no_grad()
def negative_first_position(model, input_ids, caches, num_heads):
    start = len(caches[0]) - 1  # position -1 at the first call
    return make_forward()(model, input_ids, caches, num_heads) + model.pos_emb(torch.arange(start, start + 1)).sum()


def test_negative_position_crash_is_explained(capsys):
    assert_rejects(ex.check_cached_forward, negative_first_position, "嵌入表的下标越界", capsys)


def test_crash_names_the_learners_line(capsys):
    def crashes(model, input_ids, caches, num_heads):
        return model.blocks[0].self_attn.qkv(input_ids)

    assert_rejects(ex.check_cached_forward, crashes, "出错的位置", capsys)


def test_list_cache_style_works_with_the_solution():
    """The page runs the learner's cache class inside the forward: any cache with the
    KV-cache exercise's contract gives the logits of one full forward."""
    cfg = tc.GPTConfig(vocab_size=9, context_length=12, d_model=16, num_heads=2, num_layers=2)
    from transformer_course.exercises.cached_generation import _ExerciseGPT

    model = _ExerciseGPT(cfg)
    ids = torch.randint(0, 9, (1, 8))
    caches = [ListCache() for _ in model.blocks]
    first = make_forward()(model, ids[:, :5], caches, 2)
    rest = [make_forward()(model, ids[:, t : t + 1], caches, 2) for t in range(5, 8)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), model(ids))


@torch.no_grad()
def skeleton_attribute_forward(model, input_ids, caches, num_heads):
    """Uses the source skeleton's attributes (self_attn.num_heads, self_attn.d_k)."""
    N, T = input_ids.shape
    start = len(caches[0])
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(T) + start)
    for block, cache in zip(model.blocks, caches, strict=True):
        a = block.self_attn
        h = block.norm1(x)
        q, k, v = (p(h).view(N, T, a.num_heads, a.d_k).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
        K, V = cache.update(k, v)
        o, _ = tc.scaled_dot_product_attention(q, K, V, attn_mask=tc.causal_mask(T, K.shape[2]))
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, T, a.num_heads * a.d_k))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_skeleton_attributes_are_available(capsys):
    assert_passes(ex.check_cached_forward, skeleton_attribute_forward, capsys)


@torch.no_grad()
def cache_heads_last(model, input_ids, caches, num_heads):
    """Learner test 38c (5.17): the cache handed (N, T, H, D), transposed back after."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        K, V = cache.update(a.k_proj(h).view(N, L, num_heads, -1), a.v_proj(h).view(N, L, num_heads, -1))
        q = a.q_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        K, V = K.transpose(1, 2), V.transpose(1, 2)
        o, _ = tc.scaled_dot_product_attention(q, K, V, attn_mask=tc.causal_mask(L, K.shape[-2]))
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_cache_layout_is_named(capsys):
    # learner test 38c: "every layer must write its cache", though every layer did
    assert_rejects(ex.check_cached_forward, cache_heads_last, "(N, H, T, D)", capsys)


@torch.no_grad()
def square_mask(model, input_ids, caches, num_heads):
    """Learner test 38c (5.17): tc.causal_mask(L), a crash once the cache is not empty."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        split = lambda t: t.view(N, L, num_heads, -1).transpose(1, 2)  # noqa: E731
        K, V = cache.update(split(a.k_proj(h)), split(a.v_proj(h)))
        o, _ = tc.scaled_dot_product_attention(split(a.q_proj(h)), K, V, attn_mask=tc.causal_mask(L))
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@torch.no_grad()
def square_mask_filled(model, input_ids, caches, num_heads):
    """Learner test 44c (5.17): tc.causal_mask(L, L) in the learner's own masked_fill."""
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(len(caches[0]), len(caches[0]) + L))
    for block, cache in zip(model.blocks, caches, strict=True):
        a, h = block.self_attn, block.norm1(x)
        split = lambda t: t.view(N, L, num_heads, -1).transpose(1, 2)  # noqa: E731
        q = split(a.q_proj(h))
        K, V = cache.update(split(a.k_proj(h)), split(a.v_proj(h)))
        s = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~tc.causal_mask(L, L), float("-inf"))
        o = s.softmax(-1) @ V
        x = x + a.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@pytest.mark.parametrize("fn", [square_mask, square_mask_filled])
def test_square_mask_crash_is_explained(fn, capsys):
    assert_rejects(ex.check_cached_forward, fn, "掩码是方的 (T, T)", capsys)


def test_every_hint_is_reached(capsys):
    mutants = [make_forward(m) for m, _ in NAMED_MISTAKES] + [positions_after_first_update, negative_first_position]
    mutants.append(square_mask)
    mutants += [top_left_unless_one, tril_sign_flipped, query_from_x]
    rejects = [pytest.param(ex.check_cached_forward, fn, None) for fn in mutants]
    tables = {"_MISTAKES": cached_generation._MISTAKES, "_CRASHES": cached_generation._CRASHES}
    assert_every_hint_reached(tables, rejects, capsys)


@pytest.mark.parametrize(("mistake", "keyword"), [("mask_triu", "掩码方向反了"), ("mask_no_diagonal", "对角线")])
def test_wrong_mask_fixes_of_the_bug_hunt_are_named(mistake, keyword, capsys):
    # learner test 25c: "fixes" of a top-left mask got the generic checklist
    assert_rejects(lambda fn: ex.check_cached_forward(fn, exercise="5.17"), make_forward(mistake), keyword, capsys)


@torch.no_grad()
def positions_fixed_mask_left(model, input_ids, caches, num_heads):
    """Learner test 27c: positions moved back by one and a top-left mask: two mistakes
    at once."""
    N, T = input_ids.shape
    start = max(0, len(caches[0]) - 1)
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(start, start + T))
    for block, cache in zip(model.blocks, caches, strict=True):
        attn = block.self_attn
        h = block.norm1(x)
        q, k, v = (p(h).view(N, T, num_heads, -1).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        K, V = cache.update(k, v)
        keep = torch.ones(T, K.shape[-2], dtype=torch.bool).tril()
        o, _ = tc.scaled_dot_product_attention(q, K, V, attn_mask=keep)
        x = x + attn.out_proj(o.transpose(1, 2).reshape(N, T, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_two_mistakes_at_once_are_both_named(capsys):
    message = rejection(lambda fn: ex.check_cached_forward(fn, exercise="5.17"), positions_fixed_mask_left)
    assert "有两处错" in message and "位置少算了 1" in message and "对齐到了左上角" in message, message
    assert "逐层对照" not in message, message


def test_bug_hunt_fix_off_by_the_chunk_length_is_named(capsys):
    # learner test 38c, 5.23: the page's bug "fixed" with + len(caches[0]) + L - 1,
    # right one token at a time; it got the generic checklist
    message = rejection(lambda f: ex.check_cached_forward(f, exercise="5.23"), make_forward("positions_plus_T_minus_1"))
    assert "多加了 T − 1" in message and "逐层对照" not in message, message
