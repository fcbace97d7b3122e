"""What a checker accepts works in the page's later cells: chapter 5 §5.6 starts the
learner's GPT from tc.MiniGPT's weights (tc.exercises.copy_parameters) and checks that
20 training steps give the same losses; §5.9 unpacks the KV cache's update. Run here
with learner-style variants the checkers accept (tied either way, nanoGPT mask buffers,
a list from update) and with those they must reject (untied head, bias-free layers)."""

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import exercises as ex

from .support import rejection
from .test_blocks_gpt import GPT, BiasFreeFFNGPT, GPTNanoStyle, GPTTiedOtherWay, UntiedHead
from .test_generation_cache import make_cache, make_cache_returning


def train_step(model, optimizer, x, y):  # the chapter's solution
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def twenty_steps(model, forward, data, T):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    gen = torch.Generator().manual_seed(101)
    return [train_step(forward, opt, *tc.lm_batch(data, 8, T, generator=gen)) for _ in range(20)]


def loss_gap(cls):
    """§5.6's hidden check: the learner's class and tc.MiniGPT from the same weights."""
    V, T = 17, 16
    torch.manual_seed(100)
    cfg = tc.GPTConfig(vocab_size=V, context_length=T, d_model=32, num_heads=4, num_layers=2)
    ref, mine = tc.MiniGPT(cfg), cls(V, T, 32, 4, 2)
    ex.copy_parameters(ref, mine)
    data = torch.randint(V, (400,), generator=torch.Generator().manual_seed(7))
    ours = twenty_steps(mine, mine, data, T)
    theirs = twenty_steps(ref, lambda z: ref(z)[0], data, T)
    return max(abs(a - b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("cls", [GPT, GPTTiedOtherWay, GPTNanoStyle])
def test_accepted_gpt_trains_like_minigpt(cls, capsys):
    ex.check_gpt(cls)
    assert capsys.readouterr().out.startswith("✓")
    assert loss_gap(cls) < 1e-3


@pytest.mark.parametrize("cls", [UntiedHead, BiasFreeFFNGPT])
def test_gpt_that_would_train_differently_is_rejected(cls, capsys):
    assert loss_gap(cls) > 1e-3  # what §5.6 would report
    rejection(ex.check_gpt, cls)


@pytest.mark.parametrize("cls", [make_cache(), make_cache_returning(lambda k, v: [k, v])])
def test_accepted_kv_cache_works_in_the_page(cls, capsys):
    ex.check_kv_cache(cls)
    assert capsys.readouterr().out.startswith("✓")
    layer, cache, x = tc.MultiHeadAttention(32, 4), cls(), torch.randn(1, 10, 32)

    def heads(t):
        return t.view(1, -1, 4, 8).transpose(1, 2)

    with torch.no_grad():
        for t in range(10):  # the chapter's loop
            x_t = x[:, t : t + 1]
            K_all, V_all = cache.update(heads(layer.k_proj(x_t)), heads(layer.v_proj(x_t)))
            o, _ = tc.scaled_dot_product_attention(heads(layer.q_proj(x_t)), K_all, V_all)
        full = layer(x, is_causal=True)
    torch.testing.assert_close(layer.out_proj(o.transpose(1, 2).reshape(1, 1, 32)), full[:, -1:])
    assert len(cache) == 10
