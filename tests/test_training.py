import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc


def test_noam_peaks_at_warmup():
    lrs = [tc.noam_lr(s, 512, 4000) for s in range(1, 20001)]
    assert max(range(len(lrs)), key=lrs.__getitem__) + 1 == 4000
    assert math.isclose(lrs[3999], 512**-0.5 * 4000**-0.5)
    assert math.isclose(lrs[99] / lrs[49], 2.0)  # linear warmup
    assert math.isclose(lrs[15999] / lrs[3999], 0.5)  # 1/sqrt decay


def test_noam_scheduler_drives_optimizer():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = tc.noam_scheduler(opt, d_model=64, warmup=10)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([tc.noam_lr(s, 64, 10) for s in range(1, 13)])
    with pytest.raises(ValueError, match="warmup must be positive"):
        tc.noam_lr(1, 64, 0)


def test_smoothed_targets_definition():
    q = tc.smoothed_targets(torch.tensor([1]), num_classes=5, smoothing=0.1)
    torch.testing.assert_close(q, torch.tensor([[0.02, 0.92, 0.02, 0.02, 0.02]]))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        tc.smoothed_targets(torch.tensor([5]), 5, 0.1)
    with pytest.raises(ValueError, match="smoothing"):
        tc.smoothed_targets(torch.tensor([1]), 5, 1.0)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_loss_equals_torch(eps):
    logits = torch.randn(12, 7)
    targets = torch.randint(0, 7, (12,))
    targets[3] = -100
    expected = F.cross_entropy(logits, targets, label_smoothing=eps)
    torch.testing.assert_close(tc.label_smoothing_loss(logits, targets, eps), expected)


def test_train_loop_history_and_logging(capsys):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.tensor([3.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    hist = tc.train_loop(lambda step: (w**2).sum(), opt, num_steps=20, log_every=10, grad_clip=10.0)
    assert hist.steps == list(range(20)) and len(hist.losses) == 20 and hist.lrs[0] == 0.1
    assert hist.losses[-1] < 0.01 * hist.losses[0]
    assert hist.seconds > 0
    out = capsys.readouterr().out
    assert out.count("step") == 3  # steps 0, 10, 19


def test_train_loop_rejects_non_finite_loss():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    with pytest.raises(FloatingPointError, match="step 0"):
        tc.train_loop(lambda s: w * float("nan"), torch.optim.SGD([w], lr=0.1), num_steps=3)


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
