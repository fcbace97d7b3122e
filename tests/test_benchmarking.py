"""Correctness of the measuring helpers (no assertion on how fast anything is)."""

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import benchmarking as tb


def test_time_interleaved_rotates_the_order_and_counts_calls():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = tb.time_interleaved(fns, repeats=3, warmup=1, number={"a": 2, "b": 1, "c": 1})
    assert list(samples) == ["a", "b", "c"]
    assert all(len(v) == 3 for v in samples.values())
    # warmup round (one call each) then rounds starting at b, c, a; "a" is called twice when timed
    assert calls == list("abc") + list("bcaa") + list("caab") + list("aabc")


def test_time_interleaved_rejects_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        tb.time_interleaved({})
    with pytest.raises(TypeError, match="not callable"):
        tb.time_interleaved({"a": 3})
    with pytest.raises(ValueError, match="repeats"):
        tb.time_interleaved({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        tb.time_interleaved({"a": lambda: None}, warmup=-1)


def test_medians_and_calibrate_number():
    assert tb.medians({"a": [3.0, 1.0, 2.0], "b": [1.0, 4.0]}) == {"a": 2.0, "b": 2.5}
    n = tb.calibrate_number(lambda: None, min_seconds=1e-4)
    assert n >= 1 and n & (n - 1) == 0  # a power of two
    with pytest.raises(ValueError, match="min_seconds"):
        tb.calibrate_number(lambda: None, min_seconds=0)


def test_peak_tensor_bytes_follows_allocations_and_frees():
    def fn():
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(1000)  # 8000 live
        del a
        c = torch.empty(500)  # back to 6000 live
        return b, c

    assert tb.peak_tensor_bytes(fn) == 8000
    assert tb.peak_tensor_bytes(lambda: torch.empty(10, dtype=torch.float64)[2:5]) == 80  # a view counts its storage


def test_saved_tensor_bytes_counts_distinct_storages_and_excludes_inputs():
    x = torch.randn(100, requires_grad=True)
    assert tb.saved_tensor_bytes(lambda: (x * x).sum()) == 400  # x saved twice, counted once
    assert tb.saved_tensor_bytes(lambda: (x * x).sum(), exclude=[x]) == 0
    assert tb.saved_tensor_bytes(lambda: torch.exp(x), exclude=[x]) == 400  # exp saves its result


def test_explicit_attention_keeps_more_for_backward_than_fused():
    # the explicit reference keeps the (L, S) weights, a fused kernel does not (needs only O(L))
    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))
    explicit = tb.saved_tensor_bytes(lambda: tc.scaled_dot_product_attention(q, k, v)[0], exclude=[q, k, v])
    assert explicit >= 2 * 128 * 128 * 4
    peak = tb.peak_tensor_bytes(lambda: tc.scaled_dot_product_attention(q, k, v)[0].sum().backward())
    assert peak >= 2 * 128 * 128 * 4


def test_dispatched_ops_names_aten_operators():
    x = torch.randn(3)
    ops = tb.dispatched_ops(lambda: torch.add(x, x).relu())
    assert ops == ["aten.add.Tensor", "aten.relu.default"]
    q = torch.randn(1, 1, 4, 8)
    assert any("scaled_dot_product" in op for op in tb.dispatched_ops(lambda: F.scaled_dot_product_attention(q, q, q)))


def test_fit_power_law_recovers_exponent_and_prefactor():
    x = [16, 32, 64, 128]
    b, a = tb.fit_power_law(x, [3.0 * v**2 for v in x])
    assert math.isclose(b, 2.0) and math.isclose(a, 3.0)
    with pytest.raises(ValueError, match="at least 2"):
        tb.fit_power_law([1], [1])
    with pytest.raises(ValueError, match="positive"):
        tb.fit_power_law([1, 2], [0, 1])
    with pytest.raises(ValueError, match="all be equal"):
        tb.fit_power_law([2, 2], [1, 3])


class _FakeClock:
    """perf_counter that advances by `step` seconds per reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_samples_are_seconds_per_call_from_the_clock(monkeypatch):
    monkeypatch.setattr(tb.time, "perf_counter", _FakeClock(0.5))  # every start/stop pair spans 0.5 s
    samples = tb.time_interleaved({"a": lambda: None, "b": lambda: None}, repeats=2, number={"a": 1, "b": 4})
    assert samples == {"a": [0.5, 0.5], "b": [0.125, 0.125]}
    assert tb.matmul_flops(n=32, repeats=3) == 2 * 32**3 / 0.5


def test_decode_latencies_matches_generate():
    tc.set_seed(0)
    cfg = tc.GPTConfig(vocab_size=20, context_length=16, d_model=16, num_heads=2, num_layers=2)
    model = tc.MiniGPT(cfg)
    prompt = torch.randint(0, 20, (2, 3))
    ids, cached, uncached = tb.decode_latencies(model, prompt, 8)
    assert len(cached) == len(uncached) == 8
    torch.testing.assert_close(ids, model.generate(prompt, 8, greedy=True))
    assert model.training  # mode restored
    with pytest.raises(ValueError, match="context_length"):
        tb.decode_latencies(model, prompt, 14)


def test_machine_info_describes_the_machine():
    info = tb.machine_info("cpu")
    for key in ("device", "cpu_model", "cpu_count", "torch_threads", "torch_version", "date"):
        assert key in info
    assert info["device"] == "cpu" and info["torch_version"] == torch.__version__


def test_synchronize_cpu_is_a_no_op():
    tb.synchronize("cpu")
    tb.synchronize(None)
