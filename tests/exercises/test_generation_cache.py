"""Generation and the KV cache.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import functools

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import generation_cache

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection

# 11. generation
# ---------------------------------------------------------------------------


def make_generate(mistake=None):
    def fn(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
        start = idx
        for _ in range(max_new_tokens):
            crop = {"no_crop": idx, "first": idx[:, :context_length], "short": idx[:, -context_length + 1 :]}
            ctx = crop.get(mistake, idx[:, -context_length:])
            logits = model(ctx)
            if mistake == "unpack":
                logits, _ = logits  # as if model returned (logits, loss)
            if mistake == "reshape_rows":  # the last N rows of (N·L, V): row N-1's positions
                logits = logits.reshape(-1, logits.size(-1))[-idx.size(0) :]
            else:
                logits = logits[:, 0, :] if mistake == "pos0" else logits[:, -1, :]
            # learner test 20c: top_k given, no generator: sampled from the global RNG
            random = mistake == "always_sample" or mistake == "sample_if_top_k" and top_k is not None
            if generator is None and not random:
                if mistake == "top_k_then_argmax" and top_k is not None:  # correct too
                    logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[:, -1:], float("-inf"))
                nxt = logits.argmax(dim=-1, keepdim=True)
                if mistake == "greedy_row0":  # learner test 20c: row 0's argmax for every row
                    nxt = logits[0].argmax().expand(logits.size(0), 1)
                if mistake == "flat_argmax":  # argmax of the flattened batch, as a token id
                    nxt = (logits.argmax() % logits.size(-1)).expand(logits.size(0), 1)
                if mistake == "rows_reversed":
                    nxt = nxt.flip(0)
            elif mistake == "argmax_always":
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                if top_k is not None and mistake != "ignore_top_k":
                    v, _ = torch.topk(logits, top_k)
                    threshold = v[:, [-2]] if mistake == "k_minus_1" else v[:, [-1]]
                    if mistake == "k_plus_1":
                        threshold = torch.topk(logits, top_k + 1).values[:, [-1]]
                    if mistake == "no_keepdim":
                        threshold = v[:, -1]
                    fill = 0.0 if mistake == "fill_zero" else float("-inf")
                    logits = logits.masked_fill(logits < threshold, fill)
                probs = F.softmax(logits, dim=-1)
                if mistake == "softmax_dim0_apart":
                    probs = F.softmax(logits, dim=0)
                if mistake == "softmax_dim0_zeroed":  # learner test 31c: no NaN crash
                    probs = F.softmax(logits, dim=0).nan_to_num(0.0) + 1e-12
                if mistake == "softmax_dim0":
                    nxt = torch.multinomial(F.softmax(logits, 0), 1, generator=generator)
                    idx = torch.cat([idx, nxt], dim=1)
                    continue
                if mistake == "double_softmax":
                    probs = F.softmax(probs, dim=-1)
                if mistake == "sample_logits":
                    probs = logits
                gen = None if mistake == "no_generator" else generator
                if mistake == "sample_row0":  # one draw from row 0 for every row
                    probs = probs[:1]
                nxt = torch.multinomial(probs, num_samples=1, generator=gen)
                nxt = nxt.expand(logits.size(0), 1)
            idx = torch.cat([idx, nxt], dim=1)
        if mistake == "new_only":
            return idx[:, start.size(1) :]
        return idx

    return fn


def generate_topk_gather(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Sampling among torch.topk's values and mapping back: accepted too."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        elif top_k is None:
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        else:
            v, i = torch.topk(logits, top_k)
            nxt = i.gather(-1, torch.multinomial(F.softmax(v, dim=-1), 1, generator=generator))
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def generate_from_clamped_logits(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test: the logits (below the k-th set to 0, negatives cut to 0) used as
    sampling weights, no softmax."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                kth = torch.topk(logits, top_k).values[:, -1:]
                logits = logits.masked_fill(logits < kth, 0.0)
            nxt = torch.multinomial(logits.clamp(min=0), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def generate_keeping_smallest(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """top-k with largest=False: the k smallest logits kept."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                kth = torch.topk(logits, top_k, largest=False).values[:, -1:]
                logits = logits.masked_fill(logits > kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


@torch.no_grad()
def fixed_by_sorting_values(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test 24c (5.14): "fixed" by sorting the logits and masking by rank,
    the rank drawn still kept as the token."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            if top_k is not None:
                ranks = torch.arange(logits.shape[-1])
                logits = torch.sort(logits, descending=True).values.masked_fill(ranks >= top_k, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


@torch.no_grad()
def fixed_with_row0_indices(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test 24c (5.14): every row's place mapped back with row 0's indices."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            where = None
            if top_k is not None:
                logits, where = torch.topk(logits, top_k, dim=-1)
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            if where is not None:
                nxt = where[0, nxt[:, 0]][:, None]
        idx = torch.cat([idx, nxt], dim=1)
    return idx


@torch.no_grad()
def fixed_with_rank_offset(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test 27c (5.14): the sampled rank added to the best token's id."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        elif top_k is None:
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        else:
            vals, where = torch.topk(logits, top_k, dim=-1)
            nxt = where[:, :1] + torch.multinomial(torch.softmax(vals, -1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


@torch.no_grad()
def generate_by_inverse_cdf(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test 27c (5.13): the right distribution, drawn by inverse CDF with
    torch.rand rather than torch.multinomial."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1]
        if generator is None:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            if top_k is not None:
                v, _ = logits.topk(top_k)
                logits = logits.masked_fill(logits < v[:, [-1]], float("-inf"))
            u = torch.rand(logits.shape[0], 1, generator=generator)
            cdf = logits.softmax(-1).cumsum(-1)
            nxt = (cdf < u).sum(-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def test_inverse_cdf_hint_does_not_blame_the_distribution(capsys):
    message = rejection(ex.check_generate, generate_by_inverse_cdf)
    assert "可能的原因：用 torch.multinomial(probs, 1, generator=generator)" in message, message
    assert "分布不对" not in message, message


def generate_topk_positions(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Learner test (5.14): sampled among torch.topk's values, the place in that list
    (0..k-1) kept as the token, never mapped back through the indices."""
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_length:])[:, -1, :]
        if generator is None:
            nxt = logits.argmax(dim=-1, keepdim=True)
        elif top_k is None:
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
        else:
            v, _ = torch.topk(logits, top_k)
            nxt = torch.multinomial(F.softmax(v, dim=-1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def make_shared_threshold(shared):
    """top-k with one threshold for the whole batch instead of each row's k-th largest."""

    def fn(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(idx[:, -context_length:])[:, -1, :]
            if generator is None:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                if top_k is not None:
                    logits = logits.masked_fill(logits < shared(logits, top_k), float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    return fn


def make_sample_probs(mistake):
    """Learner tests (5.14): top-k by zeroing probabilities (multinomial normalises),
    with one mistake in the sampling step."""

    def fn(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(idx[:, -context_length:])[:, -1, :]
            if generator is None:
                nxt = logits.argmax(dim=-1, keepdim=True)
            elif mistake == "clamped_logits":  # no softmax, no top-k
                nxt = torch.multinomial(logits.clamp(min=0) + 1e-9, 1, generator=generator)
            else:
                hot = mistake in ("temperature", "temperature_no_top_k")
                probs = F.softmax(logits / (0.8 if hot else 1.0), dim=-1)
                if top_k is not None and mistake != "temperature_no_top_k":
                    k = top_k + (mistake == "k_plus_1")
                    kth = torch.topk(probs, k).values[:, -1:]
                    if mistake == "batch_dim":  # learner test 6b, 5.14: topk(…, dim=0)
                        kth = probs.topk(k, dim=0).values[-1:]
                    if mistake == "first_row_threshold":  # row 0's k-th value for all rows
                        kth = kth[:1]
                    probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
                    if mistake == "softmax_again":  # learner test 27c, 5.13: "renormalised" by softmax
                        probs = probs.softmax(-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    return fn


def generate_skeleton(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    pass


def test_generate(capsys):
    for fn in (make_generate(), make_generate("top_k_then_argmax"), generate_topk_gather, make_sample_probs(None)):
        assert_passes(ex.check_generate, fn, capsys)
    assert_skeleton(ex.check_generate, generate_skeleton, capsys)


GENERATE_REJECTS = [
    pytest.param(
        ex.check_generate,
        make_generate("no_crop"),
        "input_ids[:, -context_length:]",
        id="generate not cropping the context",
    ),
    pytest.param(ex.check_generate, make_generate("first"), "最前面", id="keeps the first tokens"),
    pytest.param(ex.check_generate, make_generate("pos0"), "最后一个位置", id="first position's logits"),
    pytest.param(ex.check_generate, make_generate("k_minus_1"), "k − 1", id="top-k keeping k-1"),
    pytest.param(ex.check_generate, make_generate("ignore_top_k"), "top_k 没有起作用", id="top-k ignored"),
    pytest.param(ex.check_generate, make_generate("no_generator"), "generator=generator", id="generator not passed"),
    pytest.param(ex.check_generate, make_generate("always_sample"), "argmax", id="samples when greedy"),
    pytest.param(ex.check_generate, make_generate("argmax_always"), "按概率抽样", id="greedy when sampling"),
    pytest.param(
        ex.check_generate,
        make_generate("sample_if_top_k"),
        "给了 top_k 也一样：top_k 只在抽样时起作用），你的函数却在抽样",
        id="samples from the global RNG when top_k is given without a generator",
    ),
    pytest.param(ex.check_generate, make_generate("greedy_row0"), "每一行生成的新词元完全相同", id="row 0's argmax"),
    pytest.param(ex.check_generate, make_generate("flat_argmax"), "不带 dim 的 argmax", id="argmax of the batch"),
    pytest.param(ex.check_generate, make_generate("rows_reversed"), "批里的行混在了一起", id="rows mixed"),
    pytest.param(ex.check_generate, make_generate("sample_row0"), "每一行抽到的新词元完全相同", id="row 0's draw"),
    pytest.param(ex.check_generate, make_generate("fill_zero"), "设成了 0，不是 -inf", id="top-k fills 0"),
    pytest.param(
        ex.check_generate, make_generate("new_only"), "只返回了新生成的词元", id="returns only the new tokens"
    ),
    pytest.param(ex.check_generate, make_generate("short"), "裁剪多了一个", id="crops one token too many"),
    pytest.param(ex.check_generate, make_generate("k_plus_1"), "k + 1", id="top-k keeping k+1"),
    pytest.param(ex.check_generate, make_generate("double_softmax"), "softmax 做了两次", id="softmax twice"),
    pytest.param(ex.check_generate, make_generate("no_keepdim"), "v[:, [-1]]", id="top-k threshold without keepdim"),
    pytest.param(ex.check_generate, make_generate("unpack"), "不是 (logits, loss) 元组", id="unpacks model(x)"),
    pytest.param(ex.check_generate, make_generate("sample_logits"), "非负", id="multinomial on logits"),
    pytest.param(ex.check_generate, make_generate("softmax_dim0"), "softmax 沿错了维度", id="softmax over the batch"),
    pytest.param(
        ex.check_generate,
        make_generate("softmax_dim0_zeroed"),
        "softmax 沿了批的维度",
        id="softmax over the batch, no NaN",
    ),
    pytest.param(
        ex.check_generate, make_generate("softmax_dim0_apart"), "dim=0 沿的是批", id="softmax over the batch, own line"
    ),
    pytest.param(ex.check_generate, make_sample_probs("k_plus_1"), "k + 1", id="top-(k+1) by zeroed probabilities"),
    pytest.param(
        ex.check_generate, make_sample_probs("clamped_logits"), "top_k 也没有用上", id="clamped logits, no top-k"
    ),
    pytest.param(ex.check_generate, make_sample_probs("temperature"), "除以温度", id="temperature 0.8"),
    pytest.param(
        ex.check_generate, make_sample_probs("temperature_no_top_k"), "不在 top-3 之内", id="temperature, no top-k"
    ),
    pytest.param(
        ex.check_generate, make_sample_probs("first_row_threshold"), "每一行各自", id="row 0's threshold for all"
    ),
    pytest.param(
        ex.check_generate, make_sample_probs("softmax_again"), "又做了一次 softmax", id="zeroed probabilities softmaxed"
    ),
    pytest.param(ex.check_generate, make_sample_probs("batch_dim"), "torch.topk(…, dim=0)", id="top-k over the batch"),
    pytest.param(ex.check_generate, generate_topk_positions, "映射回词表", id="top-k index not mapped back"),
    pytest.param(
        ex.check_generate, fixed_by_sorting_values, "在排好序的 logits 上抽样", id="sorted values, rank as id"
    ),
    pytest.param(ex.check_generate, fixed_with_row0_indices, "用第 0 行的下标", id="row 0's top-k indices for all"),
    pytest.param(
        ex.check_generate, generate_from_clamped_logits, "直接当成了抽样权重", id="multinomial on clamped logits"
    ),
    pytest.param(ex.check_generate, generate_keeping_smallest, "最小的 k 个", id="top-k keeping the smallest"),
    pytest.param(ex.check_generate, fixed_with_rank_offset, "idx[:, :1] + pos", id="rank added to the best id"),
    pytest.param(ex.check_generate, generate_by_inverse_cdf, "没有调用 torch.multinomial", id="inverse-CDF draw"),
    pytest.param(
        ex.check_generate,
        make_shared_threshold(lambda logits, k: torch.topk(logits.flatten(), k).values[-1]),
        "top-k 的阈值要逐行取：每一行自己的第 k 大",
        id="top-k threshold of the flattened batch",
    ),
    pytest.param(
        ex.check_generate,
        make_shared_threshold(lambda logits, k: torch.topk(logits, k).values[:, -1].min()),
        "各行第 k 大中最小",
        id="top-k threshold: the batch minimum of the rows'",
    ),
    pytest.param(
        ex.check_generate,
        make_shared_threshold(lambda logits, k: torch.topk(logits, k).values[:, -1].mean()),
        "top-k 的阈值要逐行取：每一行自己的第 k 大",
        id="top-k threshold: the batch mean of the rows'",
    ),
]


# ---------------------------------------------------------------------------
# 12. KV cache
# ---------------------------------------------------------------------------


def make_cache(mistake=None):
    class Cache:
        shared = []

        def __init__(self):
            self.k = self.v = None
            self.updates = 0

        def update(self, k, v):
            self.updates += 1
            if mistake == "values_twice":  # learner test 34a, 3.15: update(v, v)
                k = v
            if mistake == "shared":
                self.shared.append(k)
            dim = {"dim0": 0, "dim1": 1, "dim_last": -1}.get(mistake, -2)
            if mistake == "never_stores":  # learner test 38c: concatenated, returned only
                old_k, old_v = (k[..., :0, :], v[..., :0, :]) if self.k is None else (self.k, self.v)
                return torch.cat([old_k, k], dim), torch.cat([old_v, v], dim)
            if self.k is None or mistake == "new_only":
                self.k, self.v = k, v
            elif mistake == "transposed_new":
                self.k, self.v = torch.cat([self.k, k.mT], dim), torch.cat([self.v, v.mT], dim)
            elif mistake == "reversed":
                self.k, self.v = torch.cat([k, self.k], dim), torch.cat([v, self.v], dim)
            else:
                self.k, self.v = torch.cat([self.k, k], dim), torch.cat([self.v, v], dim)
            if mistake == "keys_twice":  # learner test 9a, 3.15: (K, K)
                return self.k, self.k
            return (self.v, self.k) if mistake == "swapped" else (self.k, self.v)

        def __len__(self):
            if mistake == "shared":
                return sum(t.size(-2) for t in self.shared)
            if mistake == "count_updates":
                return self.updates
            if mistake == "len_batch":  # learner test 9a, 3.15: the batch size
                return 0 if self.k is None else self.k.size(0)
            return 0 if self.k is None else self.k.size(-2)

    return Cache


class PreallocatedWholeBuffer:
    """Learner test 38c (5.16): a preallocated buffer, returned whole, not up to n."""

    def __init__(self):
        self.k = self.v = None
        self.n = 0

    def update(self, k, v):
        if self.k is None:
            shape = (*k.shape[:2], 64, k.shape[-1])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        T = k.size(-2)
        self.k[:, :, self.n : self.n + T], self.v[:, :, self.n : self.n + T] = k, v
        self.n += T
        return self.k, self.v

    def __len__(self):
        return self.n


class CacheSkeleton:
    def __init__(self):
        pass

    def update(self, k, v):
        pass

    def __len__(self):
        pass


KV_CACHE_REJECTS = [
    pytest.param(ex.check_kv_cache, make_cache("dim0"), "dim=0", id="cache concatenated on dim 0"),
    pytest.param(ex.check_kv_cache, make_cache("dim1"), "dim=1", id="cache concatenated on dim 1"),
    pytest.param(ex.check_kv_cache, make_cache("dim_last"), "最后一维", id="cache concatenated on the last dim"),
    pytest.param(ex.check_kv_cache, make_cache("new_only"), "只有这一步的长度", id="returns only the new k/v"),
    pytest.param(ex.check_kv_cache, make_cache("reversed"), "旧的位置在前", id="new before old"),
    pytest.param(ex.check_kv_cache, make_cache("swapped"), "K 和 V 顺序反了", id="(V, K)"),
    pytest.param(ex.check_kv_cache, make_cache("count_updates"), "调用次数", id="len counts updates"),
    pytest.param(ex.check_kv_cache, make_cache("shared"), "共享", id="class-level storage"),
    pytest.param(ex.check_kv_cache, make_cache("len_batch"), "批大小 N = 2", id="len is the batch size"),
    pytest.param(ex.check_kv_cache, PreallocatedWholeBuffer, "整块预分配的缓冲区", id="whole buffer returned"),
    pytest.param(ex.check_kv_cache, make_cache("never_stores"), "没有存回去", id="never stores"),
    pytest.param(ex.check_kv_cache, make_cache("keys_twice"), "值 V 没有返回", id="(K, K)"),
    pytest.param(ex.check_kv_cache, make_cache("values_twice"), "键存成了 v", id="(V, V)"),
    pytest.param(ex.check_kv_cache, make_cache("transposed_new"), "拼接的维度不对", id="cat of mismatched shapes"),
]


def generate_float(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    return make_generate()(model, idx, max_new_tokens, context_length, top_k, generator).float()


def generate_changed_prompt(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    out = make_generate()(model, idx, max_new_tokens, context_length, top_k, generator)
    out[:, 0] += 1
    return out


def generate_hot(model, idx, max_new_tokens, context_length, top_k=None, generator=None):
    """Samples at temperature 2 (logits / 2): told by the first wrong draw."""

    def hot_model(ctx):
        return model(ctx) / 2

    return make_generate()(hot_model, idx, max_new_tokens, context_length, top_k, generator)


class CacheWithoutUpdate:
    def __len__(self):
        return 0


def make_cache_returning(result):
    base = make_cache()

    class Cache(base):
        def update(self, k, v):
            return result(*super().update(k, v))

    return Cache


MORE_REJECTS = [
    pytest.param(ex.check_generate, generate_float, "torch.long", id="generate: float ids"),
    pytest.param(ex.check_generate, generate_changed_prompt, "原样是输入 input_ids", id="generate: prompt changed"),
    pytest.param(ex.check_generate, generate_hot, "除以温度", id="generate: temperature 2"),
    pytest.param(ex.check_kv_cache, CacheWithoutUpdate, "缺少方法 update", id="kv cache: no update"),
    pytest.param(
        ex.check_kv_cache, make_cache_returning(lambda k, v: (k, v, k)), "两个张量", id="kv cache: three values"
    ),
    pytest.param(
        ex.check_kv_cache,
        make_cache_returning(lambda k, v: (2 * k, 2 * v)),
        "逐次拼接的结果不一致",
        id="kv cache: wrong values",
    ),
]


def generate_slip(slip):
    """The contract's loop with one slip that crashes (learner tests 22c and 25)."""

    def fn(model, input_ids, max_new_tokens, context_length, top_k=None, generator=None):
        for _ in range(max_new_tokens):
            logits = model(input_ids[:, -context_length:])
            logits = logits if slip == "all_positions" else logits[:, -1]
            if generator is None:
                next_id = logits.argmax(-1) if slip == "no_keepdim" else logits.argmax(-1, keepdim=True)
            else:
                if top_k is not None or slip == "top_k_none":
                    if slip == "topk_tuple":
                        kth = torch.topk(logits, top_k)[:, -1:]
                    elif slip == "k_plus_1_le":  # the same as top-k (ties aside) until top_k = V
                        kth = logits.topk(top_k + 1).values[:, -1:]
                        logits = logits.masked_fill(logits <= kth, float("-inf"))
                    else:
                        kth = torch.topk(logits, top_k).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, -1)
                if slip == "no_num_samples":
                    next_id = torch.multinomial(probs, generator=generator)
                elif slip == "generator_by_position":
                    next_id = torch.multinomial(probs, 1, False, generator)
                else:
                    next_id = torch.multinomial(probs, 1, generator=generator)
            input_ids = torch.cat([input_ids, next_id], dim=0 if slip == "cat_batch" else 1)
        return input_ids

    fn.__name__ = f"generate_{slip}"
    return fn


SLIP_REJECTS = [
    pytest.param(ex.check_generate, generate_slip(slip), keyword, id=f"generate: {slip}")
    for slip, keyword in [
        ("all_positions", "只取最后一个位置 logits[:, -1, :]"),
        ("no_keepdim", "argmax 加 keepdim=True"),
        ("cat_batch", "新词元拼在了批的维度上"),
        ("topk_tuple", "阈值要从 values 里取"),
        ("top_k_none", "只在 top_k is not None 时才调用 torch.topk"),
        ("no_num_samples", "第二个参数是抽几个"),
        ("generator_by_position", "generator 要按关键字传"),
        ("k_plus_1_le", "top_k 可以等于词表大小 V"),  # learner test 22c: it passed
    ]
]


def test_top_k_equal_to_the_vocabulary_is_sampling_from_all(capsys):
    """The case that catches topk(top_k + 1): top_k = V keeps every token, and the
    reference itself does not crash there."""
    ex.check_generate(make_generate())
    out = capsys.readouterr().out
    assert out.startswith("✓") and "含 top_k 等于词表大小" in out, out


REJECTS = GENERATE_REJECTS + KV_CACHE_REJECTS + MORE_REJECTS + SLIP_REJECTS


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_generate_unknown_greedy_mistake_claims_no_cause():
    """A greedy mistake no detector names (learner test 20c: "不要抽样" was claimed
    for it): the hint says what the first wrong token is, not that it sampled."""
    message = rejection(ex.check_generate, make_generate("reshape_rows"))
    assert "以你生成的前文为上下文，最后一个位置的 logits 最大的是词元" in message, message
    assert "抽样" not in message.split("可能的原因：")[1], message


def test_every_hint_is_reached(capsys):
    tables = {
        "GENERATE_HINTS": generation_cache.GENERATE_HINTS,
        "GENERATE_CRASHES": generation_cache.GENERATE_CRASHES,
        "CACHE_CRASHES": generation_cache.CACHE_CRASHES,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)


def test_kv_cache(capsys):
    for cls in (tc.KVCache, make_cache(), make_cache_returning(lambda k, v: [k, v])):
        assert_passes(ex.check_kv_cache, cls, capsys)
    assert_skeleton(ex.check_kv_cache, CacheSkeleton, capsys)


@pytest.mark.parametrize(
    ("candidate", "keyword"),
    [(fixed_by_sorting_values, "名次，不是词元编号"), (fixed_with_row0_indices, "idx.gather(-1, pos)")],
)
def test_wrong_fixes_of_the_top_k_bug_are_named(candidate, keyword, capsys):
    """Learner test 24c: the two wrong fixes of 5.14 get their own hint on the page's call."""
    message = rejection(functools.partial(ex.check_generate, exercise="5.14"), candidate)
    assert keyword in message and "抽样用的分布不对" not in message, message
