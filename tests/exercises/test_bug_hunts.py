"""The find-the-bug exercises: each page prints a function with one bug and grades the
learner's fix with a build exercise's checker. Run on the page's bug unchanged, under the
bug hunt's number, the checker names the symptom and where to look, not the corrected
line; under any other number (a build exercise) it names the fix. Every ``_BUG_HUNT``
number is a find-the-bug exercise of the book that calls that checker."""

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import (
    attention,
    cached_generation,
    efficient,
    generation_cache,
    language_model,
    minigpt_extras,
    norms_ffn,
    online_softmax,
    seq2seq,
    translation_bugs,
)

from .support import rejection
from .test_cached_generation import make_forward
from .test_generation_cache import generate_topk_positions
from .test_online_softmax import merged as merged_online_softmax

BOOK = Path(__file__).resolve().parents[2] / "book"


# the pages' buggy code, as printed


def softmax_over_queries(Q, K, V, attn_mask=None):  # ch01
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ V, weights


def labels_not_shifted(tgt, pad_id):  # ch01
    dec_in = tgt[:, :-1]
    return dec_in, dec_in.masked_fill(dec_in == pad_id, -100)


def scaled_by_key_count(Q, K, V, attn_mask=None):  # ch02
    scores = Q @ K.transpose(-2, -1) / math.sqrt(K.shape[-2])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, weights


class CrossQueryFromInput(tc.DecoderLayer):  # ch02
    def forward(self, x, memory, memory_mask=None):
        b1 = self.norm1(x + self.self_attn(x, is_causal=True))
        b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
        return self.norm3(b2 + self.ffn(b2))


class NormOverBatch(nn.Module):  # ch03
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(0, keepdim=True)
        var = x.var(0, keepdim=True, unbiased=False)
        return self.weight * (x - mu) / torch.sqrt(var + self.eps) + self.bias


def split_by_view(t, H):  # ch03
    N, T, E = t.shape
    return t.view(N, H, T, E // H)


class InnerNormBlock(nn.Module):  # ch03
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.ffn = tc.FeedForward(d_model, 4 * d_model, "gelu")

    def forward(self, x):
        x = x + self.norm1(self.self_attn(x, is_causal=True))
        return x + self.norm2(self.ffn(x))


def support_without_one(z):  # ch04
    zs = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.size(-1) + 1, dtype=z.dtype)
    cs = zs.cumsum(-1)
    support = (k * zs > cs).sum(-1, keepdim=True).clamp(min=1)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return torch.clamp(z - tau, min=0)


def support_without_one_renormalised(z):  # learner test: the bug hidden by a division
    p = support_without_one(z)
    return p / p.sum(-1, keepdim=True)


lse_by_maximum = merged_online_softmax("the page's bug")  # exercise 4.4's bug


# (module, checker, bug hunt, its build exercise, the page's bug, a phrase of the soft
# hint, a phrase of the fix that the bug hunt must not print)
HUNTS = [
    (attention, ex.check_self_attention, "1.7", "1.1", softmax_over_queries, "看 softmax 沿的是哪一维", "dim=-1"),
    (translation_bugs, ex.check_decoder_batch, "1.9", None, labels_not_shifted, "看标签是从 tgt 的", "tgt[:, 1:]"),
    (attention, ex.check_self_attention, "2.1", "5.3", scaled_by_key_count, "分数除以的是什么量", "Q.size(-1)"),
    (seq2seq, ex.check_decoder_layer, "2.6", "1.3", CrossQueryFromInput, "看交叉注意力那一行", "cross_attn(B1"),
    (norms_ffn, ex.check_layer_norm, "3.8", "3.1", NormOverBatch, "看 mean 和 var 的维度参数", "dim=-1"),
    (language_model, ex.check_split_heads, "3.10", None, split_by_view, "哪种操作才真正交换两根轴", "transpose(1, 2)"),
    (minigpt_extras, ex.check_post_ln_block, "3.11", None, InnerNormBlock, "各该包住哪一部分", "LN(x + F(x))"),
    (online_softmax, ex.check_online_softmax, "4.4", None, lse_by_maximum, "那一行还没改", "logaddexp"),
    (efficient, ex.check_sparsemax, "4.7", None, support_without_one, "τ 那一行本身没有错", "1 + k·z_(k)"),
    (efficient, ex.check_sparsemax, "4.7", None, support_without_one_renormalised, "更前面的支撑集判据", "1 + k·z_(k)"),
    (generation_cache, ex.check_generate, "5.14", "5.13", generate_topk_positions, "torch.topk 返回的两样", "gather"),
    (
        cached_generation,
        ex.check_cached_forward,
        "5.23",
        "5.17",
        make_forward("positions_from_zero"),
        "新词元在整段里排第几",
        "arange(start, start + T)",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "checker", "hunt", "build", "bug", "soft", "fix"), HUNTS, ids=[f"{h[2]}-{h[4].__name__}" for h in HUNTS]
)
def test_the_pages_bug_gets_the_symptom_not_the_fix(module, checker, hunt, build, bug, soft, fix, capsys):
    message = rejection(lambda c: checker(c, exercise=hunt), bug)
    assert soft in message and fix not in message, message
    assert fix in rejection(lambda c: checker(c, exercise=build), bug)  # elsewhere: the fix
    assert capsys.readouterr().out == ""


def _bug_hunts_in_the_book():
    """{exercise number: checker name} of every find-the-bug exercise whose check cell
    calls a checker with its number."""
    found = {}
    for page in sorted(BOOK.glob("ch*.md")):
        text = page.read_text(encoding="utf-8")
        starts = [m.start() for m in re.finditer(r"```\{exercise-start\}", text)] + [len(text)]
        for begin, end in zip(starts, starts[1:], strict=False):
            block = text[begin:end]
            if "找 bug" not in block.splitlines()[0]:
                continue
            call = re.search(r"tc\.exercises\.(check_\w+)\(\w+, exercise=\"([\d.]+)\"\)", block)
            if call:
                found[call.group(2)] = call.group(1)
    return found


def test_every_bug_hunt_number_is_a_find_the_bug_exercise_of_that_checker():
    in_book = _bug_hunts_in_the_book()
    registered = {number: checker.__name__ for module, checker, *_ in HUNTS for number in module._BUG_HUNT}
    assert registered == in_book


# ch02: the page's bug unchanged is told as such; a changed line that is still wrong
# gets the precise hint, in the page's letters (n, m)


def scaled_by_d_k(Q, K, V, attn_mask=None):  # changed, still wrong: d_k, not √d_k
    scores = Q @ K.transpose(-2, -1) / Q.shape[-1]
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V


class CrossResidualFromInput(tc.DecoderLayer):  # query fixed, the residual still Y
    def forward(self, x, memory, memory_mask=None):
        b1 = self.norm1(x + self.self_attn(x, is_causal=True))
        b2 = self.norm2(x + self.cross_attn(b1, memory, memory, attn_mask=memory_mask))
        return self.norm3(b2 + self.ffn(b2))


class CrossQueryFromInputCausal(tc.DecoderLayer):  # learner test 20a, 2.6: is_causal added, query still Y
    def forward(self, x, memory, memory_mask=None):
        b1 = self.norm1(x + self.self_attn(x, is_causal=True))
        b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask, is_causal=True))
        return self.norm3(b2 + self.ffn(b2))


def test_ch02_is_causal_added_says_the_query_is_still_wrong():
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="2.6"), CrossQueryFromInputCausal)
    assert "还没有改到" not in message and "查询仍是层输入 Y" in message, message
    assert "去掉它" in message and "cross_attn(B1" not in message, message
    # elsewhere (no find-the-bug) the hint names the fix
    message = rejection(ex.check_decoder_layer, CrossQueryFromInputCausal)
    assert "查询却仍是层输入 Y" in message and "cross_attn(B1" in message, message


class CausalRemovedQueryStillY(tc.DecoderLayer):  # learner test 27a, 2.6: the wrong line "fixed"
    def forward(self, x, memory, memory_mask=None):
        b1 = self.norm1(x + self.self_attn(x))
        b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
        return self.norm3(b2 + self.ffn(b2))


def test_ch02_causal_mask_removed_is_named_and_the_bug_still_there():
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="2.6"), CausalRemovedQueryStillY)
    assert "因果掩码被去掉了" in message and "bug 还在" in message, message
    assert "cross_attn(B1" not in message and "还没有改到" not in message, message
    # elsewhere (no find-the-bug) both mistakes are named with their fixes
    message = rejection(ex.check_decoder_layer, CausalRemovedQueryStillY)
    assert "两处不对" in message and "is_causal=True" in message and "cross_attn(B1" in message, message


@pytest.mark.parametrize(
    ("checker", "hunt", "bug"),
    [(ex.check_self_attention, "2.1", scaled_by_key_count), (ex.check_decoder_layer, "2.6", CrossQueryFromInput)],
)
def test_ch02_bug_unchanged_is_named_as_unchanged_in_n_and_m(checker, hunt, bug):
    message = rejection(lambda c: checker(c, exercise=hunt), bug)
    assert "还没有改到 bug" in message and "n=" in message and "m=" in message, message
    assert "L=" not in message and "S=" not in message, message


def scaled_by_batch(Q, K, V, attn_mask=None):  # learner test 21a, 2.1: "fixed" to K.shape[0]
    scores = Q @ K.transpose(-2, -1) / math.sqrt(K.shape[0])
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ V, weights


def test_ch02_changed_but_wrong_gets_the_precise_hint():
    message = rejection(lambda c: ex.check_self_attention(c, exercise="2.1"), scaled_by_batch)
    assert "还没有改到" not in message and "K.shape[0]" in message and "批大小" in message, message
    message = rejection(lambda c: ex.check_self_attention(c, exercise="2.1"), scaled_by_d_k)
    assert "还没有改到" not in message and "应除以 √d_k" in message, message
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="2.6"), CrossResidualFromInput)
    assert "还没有改到" not in message and "残差" in message and "B1" in message, message


# ch05 (5.14): the page's buggy_generate copied unchanged gets the symptom only; where to
# look (torch.topk's two outputs) comes once something was changed


@torch.no_grad()
def buggy_generate(model, input_ids, max_new_tokens, context_length, top_k=None, generator=None):  # as printed
    for _ in range(max_new_tokens):
        logits = model(input_ids[:, -context_length:])[:, -1]  # (N, V)
        if generator is None:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                logits, _ = torch.topk(logits, top_k, dim=-1)  # 只留最大的 k 个
            probs = torch.softmax(logits, dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)
        input_ids = torch.cat([input_ids, next_id], dim=1)
    return input_ids


@torch.no_grad()
def copied_generate(model, input_ids, max_new_tokens, context_length, top_k=None, generator=None):
    # the learner's copy, comments changed, nothing else
    for _ in range(max_new_tokens):
        logits = model(input_ids[:, -context_length:])[:, -1]
        if generator is None:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                logits, _ = torch.topk(logits, top_k, dim=-1)  # 看这里？
            probs = torch.softmax(logits, dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)
        input_ids = torch.cat([input_ids, next_id], dim=1)
    return input_ids


@torch.no_grad()
def changed_generate(model, input_ids, max_new_tokens, context_length, top_k=None, generator=None):
    # changed (the probabilities taken from the top-k values), the bug still there
    for _ in range(max_new_tokens):
        logits = model(input_ids[:, -context_length:])[:, -1]
        if generator is None:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                logits = torch.topk(logits, top_k, dim=-1).values
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        input_ids = torch.cat([input_ids, next_id], dim=1)
    return input_ids


def test_ch05_bug_unchanged_gets_the_symptom_and_a_change_gets_where_to_look():
    for unchanged in (buggy_generate, copied_generate):
        message = rejection(lambda c: ex.check_generate(c, exercise="5.14"), unchanged)
        assert "还没有改到 bug" in message and "0..k−1" in message, message
        assert "torch.topk 返回的两样" not in message and "gather" not in message, message
    message = rejection(lambda c: ex.check_generate(c, exercise="5.14"), changed_generate)
    assert "torch.topk 返回的两样" in message and "还没有改到" not in message, message
    # under 5.13 (a build exercise) the same code gets the fix
    assert "gather" in rejection(lambda c: ex.check_generate(c, exercise="5.13"), copied_generate)


def test_every_unchanged_bug_hint_is_reached():
    """Every entry of every ``_BUG_UNCHANGED`` table is what its page's bug gets."""
    bugs = {"5.14": (ex.check_generate, buggy_generate)}
    assert set(generation_cache._BUG_UNCHANGED) == set(bugs)
    for number, (page_name, table) in generation_cache._BUG_UNCHANGED.items():
        checker, bug = bugs[number]
        assert bug.__name__ == page_name
        message = rejection(lambda c, n=number, f=checker: f(c, exercise=n), bug)
        for hint in table.values():
            assert hint in message, message


# ch05 (5.23): the page's buggy_forward_with_cache (positions counted from 0 on every
# call) copied unchanged gets the symptom and which call goes wrong, not the line


@torch.no_grad()
def buggy_forward_with_cache(model, input_ids, caches, num_heads):  # as printed
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(L))  # (N, L, E)
    for block, cache in zip(model.blocks, caches, strict=True):
        attn = block.self_attn
        h = block.norm1(x)
        q = attn.q_proj(h).view(N, L, num_heads, -1).transpose(1, 2)  # (N, H, L, D)
        k = attn.k_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        v = attn.v_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        K_all, V_all = cache.update(k, v)  # 已缓存的加上新的
        o, _ = tc.scaled_dot_product_attention(q, K_all, V_all, attn_mask=tc.causal_mask(L, K_all.shape[-2]))
        x = x + attn.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))  # (N, L, V)


@torch.no_grad()
def copied_forward_with_cache(model, input_ids, caches, num_heads):
    # the learner's copy under another name, comments changed, nothing else
    N, L = input_ids.shape
    x = model.tok_emb(input_ids) + model.pos_emb(torch.arange(L))
    for block, cache in zip(model.blocks, caches, strict=True):
        attn = block.self_attn
        h = block.norm1(x)
        q = attn.q_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        k = attn.k_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        v = attn.v_proj(h).view(N, L, num_heads, -1).transpose(1, 2)
        K_all, V_all = cache.update(k, v)  # 看这里？
        o, _ = tc.scaled_dot_product_attention(q, K_all, V_all, attn_mask=tc.causal_mask(L, K_all.shape[-2]))
        x = x + attn.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


@torch.no_grad()
def changed_forward_with_cache(model, input_ids, caches, num_heads):
    # changed (the positions written out), the bug still there
    N, L = input_ids.shape
    positions = torch.arange(0, L)
    x = model.tok_emb(input_ids) + model.pos_emb(positions)
    for block, cache in zip(model.blocks, caches, strict=True):
        attn = block.self_attn
        h = block.norm1(x)
        q, k, v = (p(h).view(N, L, num_heads, -1).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        K_all, V_all = cache.update(k, v)
        o, _ = tc.scaled_dot_product_attention(q, K_all, V_all, attn_mask=tc.causal_mask(L, K_all.shape[-2]))
        x = x + attn.out_proj(o.transpose(1, 2).reshape(N, L, -1))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x))


def test_ch05_cached_bug_unchanged_gets_the_symptom_only():
    check = ex.check_cached_forward
    for unchanged in (buggy_forward_with_cache, copied_forward_with_cache):
        message = rejection(lambda c: check(c, exercise="5.23"), unchanged)
        assert "还没有改到 bug" in message and "第一次调用（缓存为空）与整段前向相同" in message, message
        assert "排第几" not in message and "arange(start" not in message and "位置编号" not in message, message
        for hint in cached_generation._BUG_UNCHANGED["5.23"][1].values():
            assert hint in message, message
    assert cached_generation._BUG_UNCHANGED["5.23"][0] == buggy_forward_with_cache.__name__
    message = rejection(lambda c: check(c, exercise="5.23"), changed_forward_with_cache)
    assert "新词元在整段里排第几" in message and "还没有改到" not in message, message
    assert "arange(start" not in message, message
    # under 5.17 (the build exercise) the same code gets the fix
    assert "arange(start, start + T)" in rejection(lambda c: check(c, exercise="5.17"), buggy_forward_with_cache)
