import hashlib
import math
import types

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import training


# ------------------------------------------------------------------------------- Noam schedule
def test_noam_closed_form_table():
    # d_model = 16, warmup = 4: 16^-0.5 = 1/4 and 4^-1.5 = 1/8, so the rate is s/32 while
    # warming up (s <= 4) and 1/(4 sqrt(s)) afterwards; factor scales it
    expected = [s / 32 for s in range(1, 5)] + [1 / (4 * math.sqrt(s)) for s in range(5, 10)]
    got = [tc.noam_lr(s, 16, 4) for s in range(1, 10)]
    assert got == pytest.approx(expected, rel=1e-12)
    assert [tc.noam_lr(s, 16, 4, factor=2.5) for s in range(1, 10)] == pytest.approx(
        [2.5 * e for e in expected], rel=1e-12
    )


def test_noam_peaks_at_warmup():
    lrs = [tc.noam_lr(s, 512, 4000) for s in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000
    assert math.isclose(lrs[3999], 512**-0.5 * 4000**-0.5)
    assert math.isclose(lrs[99] / lrs[49], 2.0)  # linear warmup
    assert math.isclose(lrs[15999] / lrs[3999], 0.5)  # 1/sqrt decay


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 64, 10), "step must be positive, got 0"),
        ((1, -2, 10), "d_model must be positive, got -2"),
        ((1, 64, 0), "warmup must be positive, got 0"),
        ((1.0, 64, 10), "step must be an int, got 1.0"),
        ((1, 64, 10, 0.0), "factor must be a finite positive number, got 0.0"),
        ((1, 64, 10, float("nan")), "factor must be a finite positive number, got nan"),
        ((1, 64, 10, "2"), "factor must be a real number, got '2'"),
    ],
)
def test_noam_rejects_bad_arguments_by_name(args, message):
    with pytest.raises((ValueError, TypeError), match=f"^{message}$"):
        tc.noam_lr(*args)


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_noam_scheduler_drives_optimizer(factor):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = tc.noam_scheduler(opt, d_model=16, warmup=4, factor=factor)
    seen = []
    for _ in range(9):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [s / 32 for s in range(1, 5)] + [1 / (4 * math.sqrt(s)) for s in range(5, 10)]
    assert seen == pytest.approx([factor * e for e in expected], rel=1e-12)


# ----------------------------------------------------------------------------- label smoothing
def test_smoothed_targets_definition():
    q = tc.smoothed_targets(torch.tensor([1]), num_classes=5, smoothing=0.1)
    torch.testing.assert_close(q, torch.tensor([[0.02, 0.92, 0.02, 0.02, 0.02]]))
    # any target shape: (2, 2) targets -> (2, 2, V); eps = 0 gives one-hot rows
    q = tc.smoothed_targets(torch.tensor([[0, 3], [2, 2]]), num_classes=4, smoothing=0.2)
    assert q.shape == (2, 2, 4)
    torch.testing.assert_close(q[0, 1], torch.tensor([0.05, 0.05, 0.05, 0.85]))
    torch.testing.assert_close(q[1, 0], torch.tensor([0.05, 0.05, 0.85, 0.05]))
    assert torch.equal(tc.smoothed_targets(torch.tensor([2]), 3, 0.0), torch.tensor([[0.0, 0.0, 1.0]]))


@pytest.mark.parametrize(
    ("targets", "num_classes", "smoothing", "message"),
    [
        (torch.tensor([5]), 5, 0.1, r"targets must lie in \[0, 5\), got values 5..5"),
        (torch.tensor([-1, 2]), 5, 0.1, r"targets must lie in \[0, 5\), got values -1..2"),
        (torch.tensor([1.0]), 5, 0.1, "targets must be an int64 .* got torch.float32"),
        (torch.tensor([1]), 0, 0.1, "num_classes must be positive, got 0"),
        (torch.tensor([1]), 5, 1.0, r"smoothing must be in \[0, 1\), got 1.0"),
        (torch.tensor([1]), 5, -0.1, "smoothing .* got -0.1"),
        (torch.tensor([1]), 5, float("nan"), "smoothing .* got nan"),
        (torch.tensor([1]), 5, "0.1", "smoothing .* got '0.1'"),
    ],
)
def test_smoothed_targets_rejects_bad_input_by_name(targets, num_classes, smoothing, message):
    with pytest.raises(TypeError if isinstance(smoothing, str) else ValueError, match=f"^{message}$"):
        tc.smoothed_targets(targets, num_classes, smoothing)


def test_label_smoothing_loss_closed_forms():
    # uniform logits: log-softmax is -log V everywhere, so the loss is log V for every eps
    for eps in (0.0, 0.3):
        loss = tc.label_smoothing_loss(torch.zeros(3, 4), torch.tensor([0, 1, 3]), eps)
        assert loss.item() == pytest.approx(math.log(4), rel=1e-6)
    # V = 2, logits (0, ln 3): probabilities (1/4, 3/4); target 1 with eps = 0.2 -> q = (0.1, 0.9)
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    expected = -(0.1 * math.log(0.25) + 0.9 * math.log(0.75))
    # the second row is ignored (ignore_index), so the mean is over the first row only
    loss = tc.label_smoothing_loss(logits, torch.tensor([1, -100]), 0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss = tc.label_smoothing_loss(logits, torch.tensor([1, 7]), 0.2, ignore_index=7)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.filterwarnings("error")  # e.g. an implicit softmax dimension
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_loss_equals_torch(eps):
    logits = torch.randn(12, 7)
    targets = torch.randint(0, 7, (12,))
    targets[3] = -100
    expected = F.cross_entropy(logits, targets, label_smoothing=eps)
    torch.testing.assert_close(tc.label_smoothing_loss(logits, targets, eps), expected)


def test_label_smoothing_loss_rejects_bad_shapes_and_targets():
    with pytest.raises(
        ValueError, match=r"^expected logits \(M, V\) and targets \(M,\), got logits \(2, 3, 4\), targets \(2,\)$"
    ):
        tc.label_smoothing_loss(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), 0.1)
    with pytest.raises(
        ValueError, match=r"^expected logits \(M, V\) and targets \(M,\), got logits \(2, 4\), targets \(3,\)$"
    ):
        tc.label_smoothing_loss(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long), 0.1)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 4\), got values 1..4"):
        tc.label_smoothing_loss(torch.zeros(2, 4), torch.tensor([1, 4]), 0.1)
    with pytest.raises(ValueError, match=r"got values -3..-3"):
        tc.label_smoothing_loss(torch.zeros(2, 4), torch.tensor([-100, -3]), 0.1)


# ---------------------------------------------------------------------------------- train loop
def _fake_clock(monkeypatch, *readings):
    ticks = iter(readings)
    monkeypatch.setattr(training, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))


def test_train_loop_history_and_logging(capsys, monkeypatch):
    _fake_clock(monkeypatch, 100.0, 102.5)
    w = torch.nn.Parameter(torch.tensor(3.0))
    opt = torch.optim.SGD([w], lr=0.1)
    calls = []

    def loss_fn(step):
        calls.append(step)
        return w**2

    hist = tc.train_loop(loss_fn, opt, num_steps=20, log_every=10)
    assert calls == hist.steps == list(range(20))
    # plain gradient descent on w^2 with lr 0.1: w <- 0.8 w, so the loss is 9 * 0.64^step
    assert hist.losses == pytest.approx([9.0 * 0.64**s for s in range(20)], rel=1e-5)
    assert hist.lrs == [0.1] * 20
    assert hist.seconds == 2.5  # from the fake clock: end - start
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split()[1]) for line in lines] == [0, 10, 19]  # every 10 steps and the last


def test_train_loop_is_silent_by_default(capsys):
    w = torch.nn.Parameter(torch.tensor(1.0))
    tc.train_loop(lambda s: w**2, torch.optim.SGD([w], lr=0.1), num_steps=3)
    assert capsys.readouterr().out == ""


def test_train_loop_clips_the_gradient_norm():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    # the gradient of (w . (3, 4)) is (3, 4) with norm 5; clipped to norm 1 it is (0.6, 0.8)
    hist = tc.train_loop(lambda s: (w * torch.tensor([3.0, 4.0])).sum(), torch.optim.SGD([w], lr=1.0), 1, grad_clip=1.0)
    torch.testing.assert_close(w.detach(), torch.tensor([2.4, 3.2]))
    assert hist.losses == [25.0]


def test_train_loop_steps_the_scheduler_after_recording_the_rate():
    w = torch.nn.Parameter(torch.tensor(1.0))
    opt = torch.optim.SGD([w], lr=1.0)
    hist = tc.train_loop(lambda s: w**2, opt, 6, scheduler=tc.noam_scheduler(opt, d_model=16, warmup=4))
    assert hist.lrs == pytest.approx([1 / 32, 2 / 32, 3 / 32, 4 / 32, 1 / (4 * math.sqrt(5)), 1 / (4 * math.sqrt(6))])


def test_train_loop_sets_gradients_to_none_so_unused_parameters_stay_put():
    # `b` gets a gradient at step 0 only. With gradients set to None, SGD skips it afterwards;
    # with zeroed gradients, momentum would keep moving it.
    a = torch.nn.Parameter(torch.tensor(1.0))
    b = torch.nn.Parameter(torch.tensor(1.0))
    opt = torch.optim.SGD([a, b], lr=0.1, momentum=0.9)
    tc.train_loop(lambda s: a**2 + (b**2 if s == 0 else 0.0), opt, num_steps=3)
    assert b.item() == pytest.approx(1.0 - 0.1 * 2.0)
    assert b.grad is None


def test_train_loop_rejects_non_finite_loss():
    w = torch.nn.Parameter(torch.tensor(1.0))
    with pytest.raises(FloatingPointError, match="loss is nan at step 0"):
        tc.train_loop(lambda s: w * float("nan"), torch.optim.SGD([w], lr=0.1), num_steps=3)
    with pytest.raises(FloatingPointError, match="loss is inf at step 2"):
        tc.train_loop(lambda s: w * (float("inf") if s == 2 else 1.0), torch.optim.SGD([w], lr=0.1), num_steps=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_steps": 0}, "num_steps must be positive, got 0"),
        ({"num_steps": 2, "log_every": -1}, "log_every must be >= 0, got -1"),
        ({"num_steps": 2, "log_every": 1.5}, "log_every must be an int, got 1.5"),
        ({"num_steps": 2, "grad_clip": 0.0}, "grad_clip must be a finite positive number, got 0.0"),
        ({"num_steps": 2, "grad_clip": float("inf")}, "grad_clip must be a finite positive number, got inf"),
    ],
)
def test_train_loop_rejects_bad_arguments_by_name(kwargs, message):
    w = torch.nn.Parameter(torch.tensor(1.0))
    with pytest.raises((ValueError, TypeError), match=f"^{message}$"):
        tc.train_loop(lambda s: w**2, torch.optim.SGD([w], lr=0.1), **kwargs)
    assert w.item() == 1.0  # rejected before any step


def test_train_loop_rejects_a_non_scalar_loss():
    w = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"scalar tensor, got torch.float32 \(3,\) at step 0"):
        tc.train_loop(lambda s: w * 2, torch.optim.SGD([w], lr=0.1), num_steps=1)
    with pytest.raises(ValueError, match="scalar tensor, got float at step 0"):
        tc.train_loop(lambda s: 1.0, torch.optim.SGD([w], lr=0.1), num_steps=1)


def test_tiny_transformer_learns_the_copy_task():
    tc.set_seed(0)
    src, tgt = tc.copy_task(512, seq_len=5, vocab_size=8, seed=0)
    cfg = tc.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=32, num_heads=4,
                               num_encoder_layers=1, num_decoder_layers=1, d_ff=64, dropout=0.0,
                               context_length=16, norm_first=True)  # fmt: skip
    model = tc.Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(0)

    def loss_fn(step):
        idx = torch.randint(0, 512, (64,), generator=g)
        logits = model(src[idx], tgt[idx, :-1])
        return F.cross_entropy(logits.reshape(-1, 8), tgt[idx, 1:].reshape(-1))

    hist = tc.train_loop(loss_fn, opt, num_steps=400)
    assert hist.losses[-1] < 0.1
    test_src, test_tgt = tc.copy_task(64, seq_len=5, vocab_size=8, seed=123)
    out = model.greedy_decode(test_src, bos_id=1, eos_id=2, max_len=7)
    accuracy = (out == test_tgt).all(1).float().mean().item()  # whole sequence right
    assert accuracy > 0.85


def test_cosine_lr_warms_up_then_decays_to_min_lr():
    lr = dict(lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=110)
    assert tc.cosine_lr(0, **lr) == pytest.approx(1e-4)
    assert tc.cosine_lr(9, **lr) == pytest.approx(1e-3)
    assert tc.cosine_lr(10, **lr) == pytest.approx(1e-3)
    assert tc.cosine_lr(60, **lr) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert tc.cosine_lr(110, **lr) == pytest.approx(1e-4)
    assert tc.cosine_lr(500, **lr) == pytest.approx(1e-4)
    values = [tc.cosine_lr(s, **lr) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values[:-1], values[1:], strict=True))


def test_decay_param_groups_decay_matrices_only():
    model = tc.MiniGPT(tc.GPTConfig(20, context_length=8, d_model=8, num_heads=2, num_layers=1))
    decay, no_decay = tc.decay_param_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    ids = {id(p) for g in (decay, no_decay) for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()}  # tied weights once, nothing left out
    model.norm_f.weight.requires_grad_(False)
    assert all(p is not model.norm_f.weight for p in tc.decay_param_groups(model, 0.1)[1]["params"])


def test_derived_seed_follows_its_documented_rule():
    # a checkpoint resumed by a later version must draw the same batches: the rule is fixed
    for parts in [(1, 0, 5), (7, "validation"), (3, 1, 2, "dropout")]:
        key = "/".join(str(p) for p in parts).encode()
        assert tc.derived_seed(*parts) == int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def test_derived_seed_depends_on_every_part_only():
    assert tc.derived_seed(1, 0, 5) == tc.derived_seed(1, 0, 5)
    seeds = {tc.derived_seed(*parts) for parts in [(1, 0, 5), (2, 0, 5), (1, 1, 5), (1, 0, 6), (1, 0, 5, "x")]}
    assert len(seeds) == 5 and all(0 <= s < 2**64 for s in seeds)
