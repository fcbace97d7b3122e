import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import transformer_course as tc


def _small_transformer(**kw):
    args = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=16, num_heads=4, num_encoder_layers=2,
                num_decoder_layers=2, d_ff=32, dropout=0.0, context_length=32)  # fmt: skip
    args.update(kw)
    return tc.Transformer(tc.TransformerConfig(**args)).eval()


def test_transformer_equals_nn_transformer_with_mapped_weights():
    ours = _small_transformer(pad_id=None)
    theirs = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True).eval()
    tc.load_torch_transformer(ours, theirs)
    src, tgt = torch.randint(0, 11, (3, 7)), torch.randint(0, 13, (3, 5))
    scale = 16**0.5
    src_x = ours.src_pos(ours.src_embed(src) * scale)
    tgt_x = ours.tgt_pos(ours.tgt_embed(tgt) * scale)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = ours.lm_head(theirs(src_x, tgt_x, tgt_mask=causal, tgt_is_causal=True))
    torch.testing.assert_close(ours(src, tgt), expected, atol=1e-5, rtol=1e-5)


def test_transformer_source_padding_is_ignored():
    model = _small_transformer()
    src = torch.tensor([[5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 4, 5]])
    a = model(src, tgt)
    b = model(torch.tensor([[5, 6, 7, 0, 0, 0, 0]]), tgt)
    torch.testing.assert_close(a, b)
    assert a.shape == (1, 3, 13)


def test_transformer_decoder_is_causal():
    model = _small_transformer()
    src = torch.randint(3, 11, (2, 6))
    tgt = torch.randint(3, 13, (2, 5))
    tgt2 = tgt.clone()
    tgt2[:, 3:] = torch.randint(3, 13, (2, 2))
    torch.testing.assert_close(model(src, tgt)[:, :3], model(src, tgt2)[:, :3])


def test_greedy_decode_matches_argmax_recomputation():
    model = _small_transformer()
    src = torch.randint(3, 11, (2, 6))
    out = model.greedy_decode(src, bos_id=1, eos_id=2, max_len=8)
    assert out[:, 0].eq(1).all() and out.size(1) <= 8
    ys = torch.ones(2, 1, dtype=torch.long)
    for _ in range(out.size(1) - 1):  # no caching, full recomputation
        nxt = model(src, ys)[:, -1].argmax(-1, keepdim=True)
        ys = torch.cat([ys, nxt], 1)
    done = torch.zeros(2, dtype=torch.bool)
    for t in range(1, out.size(1)):  # positions after eos are padding
        keep = ~done
        assert torch.equal(out[keep, t], ys[keep, t])
        done |= ys[:, t] == 2


def test_weight_sharing_options():
    model = _small_transformer(src_vocab_size=13, share_embeddings=True, tie_weights=True)
    assert model.src_embed.weight is model.tgt_embed.weight is model.lm_head.weight
    assert tc.count_parameters(model) == tc.transformer_parameter_count(model.cfg)
    with pytest.raises(ValueError, match="src_vocab_size=11, tgt_vocab_size=13"):
        tc.TransformerConfig(src_vocab_size=11, tgt_vocab_size=13, share_embeddings=True)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=30, num_heads=4), "d_model=30 is not divisible by num_heads=4"),
        (dict(activation="tanh"), "unknown activation 'tanh'"),
        (dict(norm="batch"), "unknown norm 'batch'"),
        (dict(positional="rope"), "unknown positional encoding 'rope'"),
        (dict(dropout=-0.1), "dropout"),
    ],
)
def test_transformer_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tc.TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, **kwargs)


def test_transformer_rejects_out_of_range_ids_and_long_inputs():
    model = _small_transformer()
    with pytest.raises(ValueError, match=r"src must lie in \[0, 11\), got 11"):
        model(torch.tensor([[0, 11]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="exceed"):
        model(torch.randint(0, 11, (1, 40)), torch.tensor([[1]]))


def _gpt(**kw):
    args = dict(vocab_size=20, context_length=16, d_model=16, num_heads=4, num_layers=2)
    args.update(kw)
    tc.set_seed(0)
    return tc.MiniGPT(tc.GPTConfig(**args)).eval()


def test_gpt2_small_has_gpt2_parameter_count():
    cfg = tc.GPTConfig(vocab_size=50257, context_length=1024, d_model=768, num_heads=12, num_layers=12)
    assert tc.gpt_parameter_count(cfg) == 124_439_808
    with torch.device("meta"):
        model = tc.MiniGPT(cfg)
    assert tc.count_parameters(model) == 124_439_808


def test_models_run_on_the_meta_device_for_shapes():
    with torch.device("meta"):
        gpt = tc.MiniGPT(tc.GPTConfig(vocab_size=20, context_length=16, d_model=16, num_heads=4, num_layers=2))
        logits, loss = gpt(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
        mha = tc.MultiHeadAttention(16, 4)
        out, _ = mha(torch.empty(2, 5, 16), attn_mask=torch.zeros(5, 5))
    assert logits.shape == (2, 5, 20) and loss.shape == () and out.shape == (2, 5, 16)


def test_gpt_init_statistics():
    model = _gpt(d_model=64, num_heads=4, num_layers=8, vocab_size=500)
    assert abs(model.tok_emb.weight.std().item() - 0.02) < 0.002
    expected = 0.02 / (2 * 8) ** 0.5
    assert abs(model.blocks[0].self_attn.out_proj.weight.std().item() - expected) < 0.1 * expected
    assert abs(model.blocks[0].ffn.w2.weight.std().item() - expected) < 0.1 * expected
    assert model.blocks[0].self_attn.q_proj.bias.abs().sum() == 0
    assert model.lm_head.weight is model.tok_emb.weight


def test_ignored_targets_are_skipped_by_the_loss():
    model = _gpt()
    x, y = torch.randint(0, 20, (2, 6)), torch.randint(0, 20, (2, 6))
    y[0, :3] = -100
    logits, loss = model(x, y)
    keep = y != -100
    log_probs = logits.log_softmax(-1)[keep]  # (kept, V)
    torch.testing.assert_close(loss, -log_probs.gather(1, y[keep][:, None]).mean())


def _plain_loop_forward(model: tc.MiniGPT, ids: torch.Tensor) -> torch.Tensor:
    """MiniGPT's forward pass for learned positions, Pre-LN, exact GELU, written with explicit loops
    over positions and heads (float64), independently of the package's modules."""
    cfg = model.cfg
    H, D = cfg.num_heads, cfg.d_model // cfg.num_heads
    sd = {k: v.double() for k, v in model.state_dict().items()}

    def ln(x, p):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + cfg.eps) * sd[p + ".weight"] + sd[p + ".bias"]

    def lin(x, p):
        return x @ sd[p + ".weight"].T + sd[p + ".bias"]

    T = ids.size(0)
    x = sd["tok_emb.weight"][ids] + sd["pos.embedding.weight"][:T]  # (T, E)
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        h = ln(x, p + "norm1")
        q, k, v = (lin(h, p + "self_attn." + n) for n in ("q_proj", "k_proj", "v_proj"))
        heads = []
        for head in range(H):
            cols = slice(head * D, (head + 1) * D)
            out = torch.zeros(T, D, dtype=torch.float64)
            for t in range(T):  # query t attends to keys 0..t
                scores = torch.stack([q[t, cols] @ k[s, cols] / D**0.5 for s in range(t + 1)])
                w = torch.exp(scores - scores.max())
                w = w / w.sum()
                out[t] = sum(w[s] * v[s, cols] for s in range(t + 1))
            heads.append(out)
        x = x + lin(torch.cat(heads, dim=1), p + "self_attn.out_proj")
        f = lin(ln(x, p + "norm2"), p + "ffn.w1")
        f = 0.5 * f * (1 + torch.erf(f / 2**0.5))
        x = x + lin(f, p + "ffn.w2")
    return ln(x, "norm_f") @ sd["tok_emb.weight"].T  # tied head


def test_minigpt_equals_a_plain_loop_reference():
    model = _gpt(num_layers=2, d_model=16, num_heads=4)
    with torch.no_grad():  # non-trivial norms and biases, so that a skipped one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    ids = torch.randint(0, 20, (7,), generator=torch.Generator().manual_seed(0))
    logits, _ = model.double()(ids[None])
    torch.testing.assert_close(logits[0], _plain_loop_forward(model, ids))


def test_gpt_forward_loss_equals_cross_entropy():
    model = _gpt()
    x, y = torch.randint(0, 20, (3, 10)), torch.randint(0, 20, (3, 10))
    logits, loss = model(x, y)
    assert logits.shape == (3, 10, 20)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(logits.reshape(-1, 20), y.reshape(-1)))
    assert model(x)[1] is None


@settings(max_examples=15, deadline=None)
@given(i=st.integers(0, 8), positional=st.sampled_from(tc.POSITIONAL_ENCODINGS), seed=st.integers(0, 999))
def test_property_position_i_ignores_later_tokens(i, positional, seed):
    model = _gpt(positional=positional)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 20, (1, 10), generator=g)
    x2 = x.clone()
    x2[0, i + 1 :] = torch.randint(0, 20, (9 - i,), generator=g)
    torch.testing.assert_close(model(x)[0][:, : i + 1], model(x2)[0][:, : i + 1])


def test_seeded_sampling_is_deterministic_and_filters_apply():
    model = _gpt()
    prompt = torch.zeros(2, 1, dtype=torch.long)
    runs = [
        model.generate(prompt, 12, temperature=0.8, top_k=5, top_p=0.9, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
    other = model.generate(prompt, 12, temperature=0.8, generator=torch.Generator().manual_seed(8))
    assert other.shape == runs[0].shape


def test_need_weights_exposes_causal_per_head_maps():
    model = _gpt()
    model(torch.randint(0, 20, (2, 7)), need_weights=True)
    w = model.blocks[1].self_attn.attn_weights
    assert w.shape == (2, 4, 7, 7)
    assert w[..., ~tc.causal_mask(7)].eq(0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 7))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_kv_heads=3), "num_heads=4 is not divisible by num_kv_heads=3"),
        (dict(positional="alibi"), "unknown positional encoding 'alibi'"),
        (dict(d_model=12, num_heads=4, positional="rope"), "even head_dim, got 3"),
        (dict(d_model=15, num_heads=5, positional="sinusoidal"), "even d_model, got 15"),
        (dict(vocab_size=0), "vocab_size must be positive"),
    ],
)
def test_gpt_config_rejects_bad_values(kwargs, match):
    args = dict(vocab_size=20)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tc.GPTConfig(**args)


def test_gpt_rejects_bad_inputs():
    model = _gpt()
    with pytest.raises(ValueError, match="exceeds context_length=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 20\), got 25"):
        model(torch.tensor([[0, 25]]))
    with pytest.raises(ValueError, match="LongTensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="targets shape"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    x = torch.zeros(1, 3, dtype=torch.long)
    for bad in (20, -1, -7):
        with pytest.raises(ValueError, match=rf"targets must lie in \[0, 20\) or -100, got {bad}"):
            model(x, torch.tensor([[1, bad, 2]]))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 2, temperature=0.0)
