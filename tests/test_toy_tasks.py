"""tc.toy_tasks: chapter 4's synthetic tasks and trainers (shapes, determinism, bad
arguments, and one short run that beats chance)."""

import math

import pytest
import torch

import transformer_course as tc
from transformer_course import toy_tasks as tt


def test_lag_batch_shapes_and_answers():
    x, y = tt.lag_batch(3, torch.Generator().manual_seed(0))
    assert x.shape == (3, tt.LAG_LENGTH) and y.shape == (3, 5, len(tt.LAGS))
    for j, lag in enumerate(tt.LAGS):  # position 7 + t answers x[7 + t - lag]
        assert torch.equal(y[:, :, j], x[:, max(tt.LAGS) - lag : tt.LAG_LENGTH - lag])
    with pytest.raises(ValueError, match="n must be positive, got 0"):
        tt.lag_batch(0, torch.Generator())


def test_lag3_batch_targets_and_bad_length():
    x, y = tt.lag3_batch(4, 10, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (4, 10)
    assert (y[:, : tt.PE_LAG] == -100).all() and torch.equal(y[:, 3:], x[:, :-3])
    with pytest.raises(ValueError, match="length must be >= 4, got 3"):
        tt.lag3_batch(4, 3, torch.Generator())


def test_lag_loss_is_chance_for_uniform_logits():
    class Uniform(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, tt.LAG_VOCAB * len(tt.LAGS))

    x, y = tt.lag_batch(2, torch.Generator().manual_seed(0))
    assert math.isclose(tt.lag_loss(Uniform(), x, y).item(), math.log(tt.LAG_VOCAB), rel_tol=1e-6)
    with pytest.raises(ValueError):
        tt.lag_loss(Uniform(), x, y[:, :, :2])


def test_tiny_transformer_shapes_and_bad_layers():
    model = tt.TinyTransformer(8, 5, 12, num_layers=2, causal=True)
    assert model(torch.zeros(3, 12, dtype=torch.long)).shape == (3, 12, 5)
    with pytest.raises(ValueError, match="num_layers must be positive, got 0"):
        tt.TinyTransformer(8, 5, 12, num_layers=0)


def test_fit_tail_mean_and_bad_arguments():
    model = torch.nn.Linear(2, 1)
    hist = tt.fit(model, lambda step: model(torch.ones(1, 2)).pow(2).sum(), steps=30)
    assert len(hist.losses) == 30 and hist.losses[-1] < hist.losses[0]
    assert tt.tail_mean(hist, k=30) == pytest.approx(sum(hist.losses) / 30)
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        tt.fit(model, lambda step: model(torch.ones(1, 2)).sum(), steps=0)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        tt.fit(model, lambda step: model(torch.ones(1, 2)).sum(), steps=1, optimizer="adam")
    with pytest.raises(ValueError, match="k must be <= 30, got 31"):
        tt.tail_mean(hist, k=31)


def test_train_lag_model_same_seed_same_result_and_beats_chance():
    a = tt.train_lag_model(4, seed=3, steps=60)
    b = tt.train_lag_model(4, seed=3, steps=60)
    assert a[1].losses == b[1].losses and a[2] == b[2]
    assert a[2] > 2 / tt.LAG_VOCAB  # chance is 1/8
    with pytest.raises(ValueError, match="steps must be positive, got 0"):
        tt.train_lag_model(4, seed=3, steps=0)


def test_train_norm_variant_deterministic_and_bad_warmup():
    a = tt.train_norm_variant(True, 5, seed=2, steps=5)
    b = tt.train_norm_variant(True, 5, seed=2, steps=5)
    assert len(a.losses) == 5 and a.losses == b.losses
    with pytest.raises(ValueError, match="warmup must be >= 0, got -1"):
        tt.train_norm_variant(True, -1, seed=2)


def test_train_pe_shapes_determinism_and_bad_arguments():
    a = tt.train_pe("learned", seed=5, train_length=8, steps=3)
    b = tt.train_pe("learned", seed=5, train_length=8, steps=3)
    assert a["per_pos"].shape == (tt.PE_TEST_LENGTH,) and a["hist"].losses == b["hist"].losses
    assert a["pos_before"].shape == (tt.PE_TEST_LENGTH, 32) and isinstance(a["model"], tc.MiniGPT)
    with pytest.raises(ValueError, match="unknown positional encoding 'alibi'"):
        tt.train_pe("alibi", seed=5)
    with pytest.raises(ValueError, match="train_length must be <= 48, got 60"):
        tt.train_pe("rope", seed=5, train_length=60)


def test_attention_profile_ideal_patterns_and_bad_shape():
    L = 6
    prev = torch.zeros(L, L)
    prev[0, 0] = 1.0
    prev[torch.arange(1, L), torch.arange(L - 1)] = 1.0  # each query reads i - 1
    dist, eff = tt.attention_profile(prev[None, None])
    assert dist.item() == pytest.approx((L - 1) / L) and eff.item() == pytest.approx(1.0)
    _, eff_uniform = tt.attention_profile(torch.full((1, 2, L, L), 1 / L))
    assert torch.allclose(eff_uniform, torch.full((2,), float(L)))
    with pytest.raises(ValueError, match=r"got \(6, 6\)"):
        tt.attention_profile(prev)


def test_train_pattern_task_deterministic_extras_and_bad_arguments():
    def copy_batch(n, gen):  # position i outputs x[i]; also returns a third tensor
        x = torch.randint(0, 4, (n, 8), generator=gen)
        return x, x, x.sum(1)

    kw = dict(vocab=4, n_out=4, causal=True, num_layers=2, steps=40, length=8)
    a = tt.train_pattern_task(copy_batch, 3, **kw)
    b = tt.train_pattern_task(copy_batch, 3, **kw)
    assert a["acc"] == b["acc"] and a["acc"] > 0.5  # chance is 1/4
    assert len(a["weights"]) == 2 and a["weights"][0].shape == (256, 2, 8, 8)
    assert torch.equal(a["extra"][0], a["x"].sum(1))
    with pytest.raises(TypeError, match="batch_fn must be callable, got int"):
        tt.train_pattern_task(3, 3, **kw)
    with pytest.raises(ValueError, match="length must be positive, got 0"):
        tt.train_pattern_task(copy_batch, 3, **{**kw, "length": 0})


def test_lag_transformer_builds_the_model_of_both_lag_trainers(monkeypatch):
    model = tt.lag_transformer(4, num_layers=3)
    x, y = tt.lag_batch(2, torch.Generator().manual_seed(0))
    assert model.causal and len(model.layers) == 3
    assert model(x).shape == (2, tt.LAG_LENGTH, tt.LAG_VOCAB * len(tt.LAGS))
    assert math.isfinite(tt.lag_loss(model, x, y).item())
    built = []

    def spy(*args, **kwargs):
        built.append(real(*args, **kwargs))
        return built[-1]

    real = tt.lag_transformer
    monkeypatch.setattr(tt, "lag_transformer", spy)
    model, _, _ = tt.train_lag_model(2, seed=0, num_kv_heads=1, steps=1)
    tt.train_norm_variant(False, 0, seed=0, steps=1)
    assert built[0] is model and built[0].layers[0].self_attn.k_proj.out_features == 16
    assert len(built) == 2 and len(built[1].layers) == 3
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        tt.lag_transformer(0)
