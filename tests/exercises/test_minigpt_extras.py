"""Chapter 3's own checkers: the Post-LN wiring bug and the learner's KV cache inside
``tc.MiniGPT``. Correct candidates pass, skeletons are "尚未实现", hand-written mutants
are rejected with the hint that names their mistake."""

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import minigpt_extras

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


def _ffn_from_input(block, x, attn):
    h = block.norm1(x + attn(x))
    return block.norm2(h + block.ffn(x))


def _norm_twice(block, x, attn):
    h = block.norm1(x + attn(block.norm1(x)))
    return block.norm2(h + block.ffn(block.norm2(h)))


def _norm_on_residual(block, x, attn):
    h = block.norm1(x) + attn(x)
    return block.norm2(h) + block.ffn(h)


def _norm1_twice(block, x, attn):
    h = block.norm1(x + attn(x))
    return block.norm1(h + block.ffn(h))


def _no_res_attn(block, x, attn):
    h = block.norm1(attn(x))
    return block.norm2(h + block.ffn(h))


def _no_res_ffn(block, x, attn):
    return block.norm2(block.ffn(block.norm1(x + attn(x))))


SUBLAYER_MISTAKES = {
    "ffn_from_input": _ffn_from_input,
    "norm_twice": _norm_twice,
    "norm_on_residual": _norm_on_residual,
    "norm1_twice": _norm1_twice,
    "no_res_attn": _no_res_attn,
    "no_res_ffn": _no_res_ffn,
}


def post_ln_block(mistake=None):
    class PostLN(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
            self.ffn = tc.FeedForward(d_model, 4 * d_model, "gelu")

        def forward(self, x):
            def attn(z):
                return self.self_attn(z, is_causal=mistake != "no_mask")

            if mistake == "inner_norm":  # the bug the exercise shows
                x = x + self.norm1(attn(x))
                return x + self.norm2(self.ffn(x))
            if mistake == "pre_ln":
                x = x + attn(self.norm1(x))
                return x + self.ffn(self.norm2(x))
            if mistake == "no_residual":
                return self.norm2(self.ffn(self.norm1(attn(x))))
            if mistake == "ffn_unfixed":  # learner test: only the first sublayer fixed
                h = self.norm1(x + attn(x))
                return h + self.norm2(self.ffn(h))
            if mistake == "attn_unfixed":
                h = x + self.norm1(attn(x))
                return self.norm2(h + self.ffn(h))
            if mistake == "ffn_residual_from_input":  # learner test 7a, 3.11
                h = self.norm1(x + attn(x))
                return self.norm2(x + self.ffn(h))
            if mistake == "norm1_before_ffn":  # learner test 34a, 3.11: only the last LN kept
                x = x + attn(x)
                return self.norm2(x + self.ffn(self.norm1(x)))
            if mistake == "norms_swapped":  # learner test 9a, 3.11
                h = self.norm2(x + attn(x))
                return self.norm1(h + self.ffn(h))
            if mistake in SUBLAYER_MISTAKES:  # learner test 15 (3.11)
                return SUBLAYER_MISTAKES[mistake](self, x, attn)
            if mistake == "no_norm2":  # learner test 27a, 3.11: the last LayerNorm left out
                h = self.norm1(x + attn(x))
                return h + self.ffn(h)
            if mistake == "no_norm1":
                h = x + attn(x)
                return self.norm2(h + self.ffn(h))
            if mistake == "beta_twice":  # no hint for this one: the generic message
                h = self.norm1(x + attn(x)) + self.norm1.bias
                return self.norm2(h + self.ffn(h))
            h = self.norm1(x + attn(x))
            return self.norm2(h + self.ffn(h))

    return PostLN


class ConcatCache:
    def __init__(self, offset_mistake=False):
        self.k = self.v = None
        self.window = None
        self.offset_mistake = offset_mistake

    def update(self, k, v):
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = torch.cat([self.k, k], -2), torch.cat([self.v, v], -2)
        return self.k, self.v

    def __len__(self):
        return 0 if self.k is None else self.k.size(-2)

    @property
    def offset(self):
        return 0 if self.offset_mistake else len(self)


class ListCache:
    """Another style: lists, concatenated on demand; offset a plain counter."""

    def __init__(self):
        self.ks, self.vs, self.offset, self.window = [], [], 0, None

    def update(self, k, v):
        self.ks.append(k)
        self.vs.append(v)
        self.offset += k.size(2)
        return torch.cat(self.ks, 2), torch.cat(self.vs, 2)

    def __len__(self):
        return sum(k.size(2) for k in self.ks)


class NewestFirst(ConcatCache):
    def update(self, k, v):
        if self.k is not None:
            k, v = torch.cat([k, self.k], -2), torch.cat([v, self.v], -2)
        self.k, self.v = k, v
        return k, v


class Overwrites(ConcatCache):  # learner test 6a, 3.15: the old positions dropped
    def update(self, k, v):
        self.k, self.v = k, v
        return k, v


class OffsetStays0(ConcatCache):
    def __init__(self):
        super().__init__(offset_mistake=True)


class LenIsBatch(ConcatCache):  # learner test 9a, 3.15
    def __len__(self):
        return 0 if self.k is None else self.k.size(0)


class LenCountsUpdates(ConcatCache):
    def __init__(self):
        super().__init__()
        self.updates = 0

    def update(self, k, v):
        self.updates += 1
        return super().update(k, v)

    def __len__(self):
        return self.updates


class NoWindow(ConcatCache):
    def __init__(self):
        super().__init__()
        del self.window


class NoOffset:
    def __init__(self):
        self.window = None

    def update(self, k, v):
        return k, v

    def __len__(self):
        return 0


class SkeletonCache:
    def __init__(self):
        pass

    def update(self, k, v):
        raise NotImplementedError

    @property
    def offset(self):
        raise NotImplementedError


class SkeletonOffset(ConcatCache):
    """update and len written, the offset property still the skeleton's."""

    @property
    def offset(self):
        raise NotImplementedError


class SkeletonBlock(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()

    def forward(self, x):
        raise NotImplementedError


def test_correct_post_ln_block_passes(capsys):
    assert_passes(ex.check_post_ln_block, post_ln_block(), capsys)


def test_the_package_block_passes(capsys):
    class package_block(tc.TransformerBlock):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads, 4 * d_model, causal=True, norm_first=False, activation="gelu")

    assert_passes(ex.check_post_ln_block, package_block, capsys)


def test_correct_caches_pass(capsys):
    for cache in (ConcatCache, ListCache):
        assert_passes(ex.check_kv_cache_in_model, cache, capsys)
        assert_passes(ex.check_kv_cache, cache, capsys)  # the page's unit check reads offset too


def test_skeletons(capsys):
    assert_skeleton(ex.check_post_ln_block, SkeletonBlock, capsys)
    assert_skeleton(ex.check_kv_cache_in_model, SkeletonCache, capsys)
    assert_skeleton(ex.check_kv_cache_in_model, SkeletonOffset, capsys)


BLOCK_REJECTS = [
    pytest.param(ex.check_post_ln_block, post_ln_block(m), k, id=m)
    for m, k in [
        ("inner_norm", "x + LN(F(x))"),
        ("pre_ln", "前归一化"),
        ("no_residual", "少了残差"),
        ("no_mask", "因果掩码"),
        ("ffn_unfixed", "只改好了注意力这一层"),
        ("attn_unfixed", "只改好了 FFN 这一层"),
        ("ffn_residual_from_input", "FFN 这一层的残差加的是块的输入 x"),
        ("norms_swapped", "两个 LayerNorm 却用反了"),
        ("norm1_before_ffn", "norm1 挪到了 FFN 的输入上"),
        ("ffn_from_input", "FFN 读的是块的输入 x"),
        ("norm_twice", "子层的输入也先归一化了"),
        ("norm_on_residual", "LayerNorm 只包住了残差一支"),
        ("norm1_twice", "两个子层都用了 norm1"),
        ("no_res_attn", "注意力这一层少了残差"),
        ("no_res_ffn", "FFN 这一层少了残差"),
        ("no_norm2", "FFN 这一层少了 LayerNorm"),
        ("no_norm1", "注意力这一层少了 LayerNorm"),
        ("beta_twice", "对照第 3.3.1 节"),
    ]
]
CACHE_REJECTS = [
    pytest.param(ex.check_kv_cache_in_model, NoOffset, "缺少 offset", id="no-offset"),
    pytest.param(ex.check_kv_cache_in_model, NoWindow, "self.window = None", id="no-window"),
    pytest.param(ex.check_kv_cache_in_model, OffsetStays0, "offset 应为 9，得到 0", id="offset-stays-0"),
    pytest.param(ex.check_kv_cache, OffsetStays0, "offset 应为 1，得到 0", id="unit-check-offset-stays-0"),
    pytest.param(ex.check_kv_cache_in_model, LenIsBatch, "__len__ 应返回缓存的位置数", id="len-is-batch"),
    pytest.param(ex.check_kv_cache_in_model, LenCountsUpdates, "不是 update 的调用次数", id="len-counts-updates"),
    pytest.param(ex.check_kv_cache_in_model, NewestFirst, "旧位置在前", id="newest-first"),
    pytest.param(ex.check_kv_cache_in_model, Overwrites, "update 每次都覆盖了旧的键和值", id="overwrites"),
]


@pytest.mark.parametrize("checker, candidate, keyword", BLOCK_REJECTS + CACHE_REJECTS)
def test_mistakes_are_named(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    assert_every_hint_reached({"POST_LN_HINTS": minigpt_extras.POST_LN_HINTS}, BLOCK_REJECTS, capsys)


def test_an_instance_instead_of_the_class_is_refused():
    with pytest.raises(ex.ExerciseError, match="类本身"):
        ex.check_kv_cache_in_model(ConcatCache())
