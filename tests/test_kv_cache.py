"""The KV cache (``attention.KVCache``) and cached attention: every cached result is compared with a full
recomputation. Cached generation is tested in test_minigpt.py."""

import re

import pytest
import torch
from helpers import tiny_gpt

import transformer_course as tc


def _chunks(T: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, T)) for s in range(0, T, size)]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("num_kv_heads,use_rope", [(None, False), (2, False), (1, False), (None, True), (2, True)])
def test_mha_prefill_in_chunks_equals_full_pass(chunk, num_kv_heads, use_rope):
    E, H, T = 16, 4, 9
    torch.manual_seed(chunk)
    rope = tc.RotaryEmbedding(E // H, max_len=32) if use_rope else None
    mha = tc.MultiHeadAttention(E, H, num_kv_heads=num_kv_heads, rotary=rope).eval()
    x = torch.randn(2, T, E)
    full = mha(x, is_causal=True)
    cache = tc.KVCache()
    parts = [mha(x[:, a:b], is_causal=True, cache=cache) for a, b in _chunks(T, chunk)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    Hkv = num_kv_heads or H
    assert len(cache) == T and cache.offset == T
    assert cache.keys.shape == (2, Hkv, T, E // H)
    assert cache.nbytes() == 2 * 2 * Hkv * T * (E // H) * 4


@pytest.mark.parametrize("chunk", [1, 3, 4, 7])
def test_rolling_cache_equals_sliding_window_attention(chunk):
    """Past the window the cache keeps the last `window` positions: sliding-window attention."""
    E, H, T, W = 16, 4, 23, 6
    torch.manual_seed(0)
    mha = tc.MultiHeadAttention(E, H, num_kv_heads=2, rotary=tc.RotaryEmbedding(E // H, max_len=8)).eval()
    x = torch.randn(2, T, E)
    banded = torch.tensor([[i - W < j <= i for j in range(T)] for i in range(T)])  # written out
    full = mha(x, attn_mask=banded)
    cache = tc.KVCache(window=W)
    parts = [mha(x[:, a:b], is_causal=True, cache=cache) for a, b in _chunks(T, chunk)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.offset == T and len(cache) <= W - 1 + chunk


def test_cache_returns_keys_then_values_old_before_new():
    cache = tc.KVCache()
    k1, v1 = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    k2, v2 = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4)
    cache.update(k1, v1)
    keys, values = cache.update(k2, v2)
    torch.testing.assert_close(keys, torch.cat([k1, k2], dim=2))
    torch.testing.assert_close(values, torch.cat([v1, v2], dim=2))
    # a buffer that has to grow keeps the order
    small = tc.KVCache(capacity=1)
    for t in range(5):
        keys, values = small.update(k1[:, :, :1] + t, v1[:, :, :1] - t)
    torch.testing.assert_close(keys[0, 0, :, 0], k1[0, 0, 0, 0] + torch.arange(5.0))
    torch.testing.assert_close(values[0, 0, :, 0], v1[0, 0, 0, 0] - torch.arange(5.0))


def test_crop_rewinds_the_cache_to_an_earlier_state():
    model = tiny_gpt(positional="rope")
    x = torch.randint(0, 20, (1, 9), generator=torch.Generator().manual_seed(3))
    caches = model.new_caches()
    with torch.no_grad():
        model(x[:, :6], caches=caches)
        first, _ = model(x[:, 6:7], caches=caches)
        for cache in caches:
            cache.crop(6)
        assert caches[0].offset == 6 and len(caches[0]) == 6
        again, _ = model(x[:, 6:7], caches=caches)
    torch.testing.assert_close(again, first)
    with pytest.raises(ValueError, match=r"length must be <= 7, got 8"):
        caches[0].crop(8)


def test_crop_keeps_the_oldest_positions_held_and_rewinds_the_offset():
    cache = tc.KVCache(window=3)
    k = torch.randn(1, 2, 10, 4)
    for t in range(10):
        cache.update(k[:, :, t : t + 1], -k[:, :, t : t + 1])
    assert len(cache) == 3 and cache.offset == 10  # positions 7, 8, 9
    cache.crop(3)  # keeps everything
    assert len(cache) == 3 and cache.offset == 10
    cache.crop(1)
    assert len(cache) == 1 and cache.offset == 8
    torch.testing.assert_close(cache.keys, k[:, :, 7:8])
    torch.testing.assert_close(cache.values, -k[:, :, 7:8])
    for bad, error, message in ((2, ValueError, "must be <= 1"), (-1, ValueError, "must be >= 0"),
                                (True, TypeError, "must be an int"), (1.0, TypeError, "must be an int")):  # fmt: skip
        with pytest.raises(error, match=rf"^length {message}, got {bad!r}$"):
            cache.crop(bad)
    cache.crop(0)
    assert len(cache) == 0 and cache.offset == 7 and cache.nbytes() == 0
    keys, _ = cache.update(k[:, :, :2], k[:, :, :2])
    torch.testing.assert_close(keys, k[:, :, :2])


def test_kv_cache_defaults_before_the_first_update():
    cache = tc.KVCache()
    assert cache.capacity == 0 and cache.window is None
    assert cache.keys is None and cache.values is None
    assert len(cache) == 0 and cache.offset == 0 and cache.nbytes() == 0


@pytest.mark.parametrize("capacity", [-1, True, 1.5, "4"])
def test_kv_cache_rejects_a_bad_capacity(capacity):
    error, message = (ValueError, "must be >= 0") if capacity == -1 else (TypeError, "must be an int")
    with pytest.raises(error, match=rf"^capacity {message}, got {re.escape(repr(capacity))}$"):
        tc.KVCache(capacity=capacity)


@pytest.mark.parametrize("capacity,D", [(0, 3), (0, 4), (1, 3), (3, 2), (8, 4)])
def test_buffer_is_preallocated_and_doubles_when_full(capacity, D):
    """One-token updates: the buffer holds the smallest capacity * 2**k >= len positions, reallocated only to grow."""
    cache = tc.KVCache(capacity=capacity)
    size, ptr = max(capacity, 1), None
    for t in range(1, 30):
        cache.update(torch.randn(2, 3, 1, D), torch.randn(2, 3, 1, D))
        grown = t > size
        size = 2 * size if grown else size
        assert cache._k.size(2) == size and cache._v.size(2) == size  # internal: the buffers
        assert (cache._k.data_ptr() != ptr) == (t == 1 or grown)  # no reallocation while there is room
        ptr = cache._k.data_ptr()


def test_kv_cache_rejects_mismatched_updates():
    cache = tc.KVCache()
    cache.update(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    with pytest.raises(
        ValueError, match=r"^new keys \(2, 1, 1, 5\) do not match cached keys \(N, Hkv, D\) = \(2, 3, 5\)$"
    ):
        cache.update(torch.randn(2, 1, 1, 5), torch.randn(2, 1, 1, 5))
    with pytest.raises(
        ValueError, match=r"^k and v must be 4-D and equal in shape, got \(2, 3, 1, 5\), \(2, 3, 1, 6\)$"
    ):
        cache.update(torch.randn(2, 3, 1, 5), torch.randn(2, 3, 1, 6))
    advice = r"; use one dtype and device per cache \(or reset\(\) it\)$"
    with pytest.raises(ValueError, match=r"^the cache holds torch.float32 on cpu, got torch.float64 on cpu" + advice):
        cache.update(torch.randn(2, 3, 1, 5, dtype=torch.float64), torch.randn(2, 3, 1, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^the cache holds torch.float32 on cpu, got torch.float32 on meta" + advice):
        cache.update(torch.empty(2, 3, 1, 5, device="meta"), torch.empty(2, 3, 1, 5, device="meta"))
    cache.reset()
    assert len(cache) == 0 and cache.nbytes() == 0 and cache.offset == 0
    with pytest.raises(ValueError, match=r"^window must be positive, got 0$"):
        tc.KVCache(window=0)


@pytest.mark.parametrize("capacity,window", [(0, None), (6, None), (0, 4), (3, 4), (20, 4), (0, 1)])
def test_cache_holds_exactly_the_positions_appended_last(capacity, window):
    """Against a plain list of everything appended: without a window all of it; with one, what the next queries see."""
    g = torch.Generator().manual_seed(0)
    cache = tc.KVCache(capacity=capacity, window=window)
    ks, vs, held = [], [], 0
    for new in [1, 3, 1, 1, 2, 5, 1, 1, 1, 4, 2, 1, 1, 1, 1, 5, 1, 2, 1, 1, 3]:
        if window is not None and new > window + 1:
            continue
        k, v = torch.randn(2, 3, new, 5, generator=g), torch.randn(2, 3, new, 5, generator=g)
        ks.append(k)
        vs.append(v)
        held = (held if window is None else min(held, window - 1)) + new  # the last window - 1 and the new ones
        keys, values = cache.update(k, v)
        torch.testing.assert_close(keys, torch.cat(ks, 2)[:, :, -held:], rtol=0, atol=0)
        torch.testing.assert_close(values, torch.cat(vs, 2)[:, :, -held:], rtol=0, atol=0)
        assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
        assert len(cache) == held and cache.offset == sum(x.size(2) for x in ks)
        assert cache.nbytes() == 2 * held * 2 * 3 * 5 * 4
        if window is not None:  # a rolling buffer of 2 * window positions (or the capacity asked for), never grown
            assert cache._k.size(2) == max(capacity, 2 * window)


def test_float64_input_into_float32_cached_attention_is_refused():
    mha = tc.MultiHeadAttention(8, 2).eval()
    cache = tc.KVCache()
    mha(torch.randn(1, 3, 8), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="float64"):
        mha.double()(torch.randn(1, 1, 8, dtype=torch.float64), is_causal=True, cache=cache)
    cache = tc.KVCache()  # a new cache takes float64
    out = mha(torch.randn(1, 3, 8, dtype=torch.float64), is_causal=True, cache=cache)
    assert out.dtype == cache.keys.dtype == cache.values.dtype == torch.float64
    assert cache.nbytes() == 2 * 3 * 1 * 2 * 4 * 8  # 2 * len * N * Hkv * D * element_size
