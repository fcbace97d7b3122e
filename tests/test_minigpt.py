"""MiniGPT and GPTConfig: config checks, a plain-loop reference forward pass, init, caches and generation
(cached and uncached)."""

import math

import pytest
import torch
from helpers import tiny_gpt
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import transformer_course as tc
from transformer_course import notebook as nb


def _scrambled(model: tc.MiniGPT, std: float = 0.5) -> tc.MiniGPT:
    """Every parameter ~ N(0, std²): peaked logits and attention, so that the context changes the tokens."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def _ids(*shape, seed=0):
    return torch.randint(0, 20, shape, generator=torch.Generator().manual_seed(seed))


def test_gpt_config_defaults():
    cfg = tc.GPTConfig(vocab_size=10, d_model=24, num_heads=4)
    assert cfg.d_ff == 4 * 24 and cfg.head_dim == 6 and cfg.num_kv_heads is None
    assert (cfg.positional, cfg.norm_first, cfg.activation, cfg.tie_weights, cfg.dropout) == (
        "learned", True, "gelu", True, 0.0
    )  # fmt: skip
    assert tc.GPTConfig(vocab_size=10, d_ff=7).d_ff == 7


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(vocab_size=0), r"^vocab_size must be positive, got 0$"),
        (dict(num_layers=0), r"^num_layers must be positive, got 0$"),
        (dict(num_kv_heads=0), r"^num_kv_heads must be positive, got 0$"),
        (dict(num_kv_heads=3), r"^num_heads=4 is not divisible by num_kv_heads=3$"),
        (dict(positional="alibi"), r"^unknown positional encoding 'alibi'"),
        (dict(d_model=12, num_heads=4, positional="rope"), r"^rope needs an even head_dim, got 3$"),
        (
            dict(d_model=15, num_heads=5, positional="sinusoidal"),
            r"^sinusoidal positions need an even d_model, got 15$",
        ),
        (dict(dropout=1.0), r"^dropout must be in \[0, 1\), got 1.0$"),
    ],
)
def test_gpt_config_rejects_bad_values(kwargs, match):
    args = dict(vocab_size=20)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tc.GPTConfig(**args)


@pytest.mark.parametrize("positional", tc.POSITIONAL_ENCODINGS)
def test_gpt_config_accepts_every_positional_encoding_and_the_boundaries(positional):
    cfg = tc.GPTConfig(vocab_size=1, d_model=8, num_heads=4, num_kv_heads=1, positional=positional, dropout=0.0)
    assert cfg.head_dim == 2 and tc.MiniGPT(cfg).cfg is cfg


def test_gpt2_small_has_gpt2_parameter_count():
    cfg = tc.GPTConfig(vocab_size=50257, context_length=1024, d_model=768, num_heads=12, num_layers=12)
    assert tc.gpt_parameter_count(cfg) == 124_439_808
    with torch.device("meta"):
        model = tc.MiniGPT(cfg)
    assert tc.count_parameters(model) == 124_439_808


@pytest.mark.parametrize("norm_first", [True, False])
def test_bias_false_removes_every_bias(norm_first):
    model = tiny_gpt(bias=False, norm_first=norm_first, tie_weights=False)
    assert [name for name, _ in model.named_parameters() if "bias" in name] == []
    assert tc.count_parameters(model) == tc.gpt_parameter_count(model.cfg)


@pytest.mark.parametrize("activation", tc.ACTIVATIONS)
def test_activation_reaches_every_block(activation):
    model = tiny_gpt(activation=activation)
    assert [block.ffn.activation for block in model.blocks] == [activation] * 2
    assert tc.count_parameters(model) == tc.gpt_parameter_count(model.cfg)  # the gated ones add w3


def test_models_run_on_the_meta_device_for_shapes():
    with torch.device("meta"):
        gpt = tc.MiniGPT(tc.GPTConfig(vocab_size=20, context_length=16, d_model=16, num_heads=4, num_layers=2))
        logits, loss = gpt(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
        mha = tc.MultiHeadAttention(16, 4)
        out = mha(torch.empty(2, 5, 16), attn_mask=torch.zeros(5, 5))
    assert logits.shape == (2, 5, 20) and loss.shape == () and out.shape == (2, 5, 16)


def test_gpt2_initialisation():
    """N(0, 0.02²) everywhere, N(0, (0.02 / sqrt(2 · num_layers))²) for the residual projections, zero biases;
    the tolerance (10% of the std) is many standard errors wide for these sample sizes."""
    model = tiny_gpt(vocab_size=500, context_length=64, d_model=64, num_layers=8, tie_weights=False)
    residual = 0.02 / math.sqrt(2 * 8)

    def check(weights, std):
        w = torch.cat([p.flatten() for p in weights])
        assert abs(w.mean().item()) < 0.1 * std and abs(w.std().item() - std) < 0.1 * std

    blocks = model.blocks
    check([model.tok_emb.weight], 0.02)
    check([model.pos_emb.embedding.weight], 0.02)
    check([model.lm_head.weight], 0.02)
    check([getattr(b.self_attn, n).weight for b in blocks for n in ("q_proj", "k_proj", "v_proj")], 0.02)
    check([b.ffn.w1.weight for b in blocks], 0.02)
    check([b.self_attn.out_proj.weight for b in blocks], residual)
    check([b.ffn.w2.weight for b in blocks], residual)
    biases = [m.bias for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None]
    assert len(biases) == 8 * 6 and all(b.eq(0).all() for b in biases)  # q, k, v, out, w1, w2 per block
    assert model.lm_head.bias is None and model.lm_head.weight is not model.tok_emb.weight
    tied = tiny_gpt()
    assert tied.lm_head.weight is tied.tok_emb.weight


def test_ignored_targets_are_skipped_by_the_loss():
    model = tiny_gpt()
    x, y = torch.randint(0, 20, (2, 6)), torch.randint(0, 20, (2, 6))
    y[0, :3] = -100
    logits, loss = model(x, y)
    keep = y != -100
    log_probs = logits.log_softmax(-1)[keep]  # (kept, V)
    torch.testing.assert_close(loss, -log_probs.gather(1, y[keep][:, None]).mean())


def test_gpt_forward_loss_equals_cross_entropy():
    model = tiny_gpt()
    x, y = torch.randint(0, 20, (3, 10)), torch.randint(0, 20, (3, 10))
    logits, loss = model(x, y)
    assert logits.shape == (3, 10, 20)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(logits.reshape(-1, 20), y.reshape(-1)))
    assert model(x)[1] is None


def _plain_loop_forward(model: tc.MiniGPT, ids: torch.Tensor) -> torch.Tensor:
    """MiniGPT's forward pass written from the config and the state dict alone, with explicit loops over
    positions and heads (float64): Pre-LN or Post-LN, LayerNorm or RMSNorm, exact GELU, learned,
    sinusoidal, rotary (interleaved pairs) or no positions, grouped key/value heads, tied head."""
    cfg = model.cfg
    E, H, D, T = cfg.d_model, cfg.num_heads, cfg.d_model // cfg.num_heads, ids.size(0)
    group = H // (cfg.num_kv_heads or H)  # query heads per key/value head
    sd = {k: v.double() for k, v in model.state_dict().items()}

    def norm(x, p):
        if cfg.norm == "rmsnorm":
            return x / torch.sqrt((x**2).mean(-1, keepdim=True) + cfg.eps) * sd[p + ".weight"]
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + cfg.eps) * sd[p + ".weight"] + sd[p + ".bias"]

    def lin(x, p):
        return x @ sd[p + ".weight"].T + sd[p + ".bias"]

    def rotate(v, t):  # feature pair (2i, 2i+1) of a head vector at position t turns by t · base^(-2i/D)
        out = v.clone()
        for i in range(D // 2):
            a = t * cfg.rope_base ** (-2 * i / D)
            out[2 * i] = v[2 * i] * math.cos(a) - v[2 * i + 1] * math.sin(a)
            out[2 * i + 1] = v[2 * i] * math.sin(a) + v[2 * i + 1] * math.cos(a)
        return out

    def attention(h, p):
        q, k, v = (lin(h, p + "self_attn." + n) for n in ("q_proj", "k_proj", "v_proj"))
        heads = []
        for head in range(H):
            qc, kc = slice(head * D, (head + 1) * D), slice(head // group * D, (head // group + 1) * D)
            qs, ks = [q[t, qc] for t in range(T)], [k[t, kc] for t in range(T)]
            if cfg.positional == "rope":
                qs, ks = [rotate(x, t) for t, x in enumerate(qs)], [rotate(x, t) for t, x in enumerate(ks)]
            out = torch.zeros(T, D, dtype=torch.float64)
            for t in range(T):  # query t attends to keys 0..t
                scores = torch.stack([qs[t] @ ks[s] / D**0.5 for s in range(t + 1)])
                w = torch.exp(scores - scores.max())
                w = w / w.sum()
                out[t] = sum(w[s] * v[s, kc] for s in range(t + 1))
            heads.append(out)
        return lin(torch.cat(heads, dim=1), p + "self_attn.out_proj")

    def ffn(h, p):
        f = lin(h, p + "ffn.w1")
        return lin(0.5 * f * (1 + torch.erf(f / 2**0.5)), p + "ffn.w2")

    x = sd["tok_emb.weight"][ids]  # (T, E)
    if cfg.positional == "learned":
        x = x + sd["pos_emb.embedding.weight"][:T]
    elif cfg.positional == "sinusoidal":
        for t in range(T):
            for i in range(E // 2):  # PE[t, 2i] = sin(t / 10000^(2i/E)), PE[t, 2i+1] = cos(t / 10000^(2i/E))
                x[t, 2 * i] += math.sin(t / 10000 ** (2 * i / E))
                x[t, 2 * i + 1] += math.cos(t / 10000 ** (2 * i / E))
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        if cfg.norm_first:
            x = x + attention(norm(x, p + "norm1"), p)
            x = x + ffn(norm(x, p + "norm2"), p)
        else:
            x = norm(x + attention(x, p), p + "norm1")
            x = norm(x + ffn(x, p), p + "norm2")
    if cfg.norm_first:
        x = norm(x, "norm_f")
    return x @ sd["tok_emb.weight"].T  # tied head


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(positional="learned"),
        dict(positional="sinusoidal", norm_first=False),
        dict(positional="rope", rope_base=100.0, num_kv_heads=2, norm="rmsnorm"),
        dict(positional="none", num_kv_heads=1),
    ],
)
def test_minigpt_equals_a_plain_loop_reference(kwargs):
    model = tiny_gpt(eps=1e-3, **kwargs)  # eps is not the norms' default: a lost eps shows
    with torch.no_grad():  # non-trivial norms and biases, so that a skipped one shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0.0, 0.5)
    ids = _ids(7)
    logits, _ = model.double()(ids[None])
    torch.testing.assert_close(logits[0], _plain_loop_forward(model, ids))


@settings(max_examples=15, deadline=None)
@given(i=st.integers(0, 8), positional=st.sampled_from(tc.POSITIONAL_ENCODINGS), seed=st.integers(0, 999))
def test_property_position_i_ignores_later_tokens(i, positional, seed):
    model = tiny_gpt(positional=positional)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 20, (1, 10), generator=g)
    x2 = x.clone()
    x2[0, i + 1 :] = torch.randint(0, 20, (9 - i,), generator=g)
    torch.testing.assert_close(model(x)[0][:, : i + 1], model(x2)[0][:, : i + 1])


def test_record_attention_gives_detached_causal_per_head_maps_of_every_block():
    model = tiny_gpt()
    ids = torch.randint(0, 20, (2, 7))
    plain, _ = model(ids)
    with nb.record_attention(model) as maps:
        logits, _ = model(ids)
    assert list(maps) == [block.self_attn for block in model.blocks]
    w = maps[model.blocks[1].self_attn]
    assert w.shape == (2, 4, 7, 7) and not w.requires_grad
    assert w[..., ~tc.causal_mask(7)].eq(0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 7))
    torch.testing.assert_close(logits, plain)  # asking for weights does not change the output
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    model(ids)  # outside the block nothing is recorded
    assert maps[model.blocks[1].self_attn] is w


def test_record_attention_rejects_a_model_without_attention():
    with pytest.raises(ValueError, match="Linear has no MultiHeadAttention"):
        with nb.record_attention(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(TypeError, match="got int"):
        with nb.record_attention(3):
            pass


@pytest.mark.parametrize("positional,window", [("learned", None), ("sinusoidal", None), ("rope", 16), ("none", 16)])
def test_new_caches_hold_the_context_and_roll_without_absolute_positions(positional, window):
    model = tiny_gpt(positional=positional, num_layers=3)
    caches = model.new_caches()
    assert [(c.capacity, c.window, len(c), c.offset) for c in caches] == [(16, window, 0, 0)] * 3
    assert len({id(c) for c in caches}) == 3 and model.rolling_cache == (window is not None)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_forward_checks_the_context_length_and_the_caches(positional):
    model = tiny_gpt(positional=positional, num_layers=1)  # one block: a cache list of one
    x = _ids(1, 17)
    assert model(x[:, :16])[0].shape == (1, 16, 20)  # exactly context_length
    with pytest.raises(
        ValueError, match=r"^sequence of 17 positions \(cached 0 \+ new 17\) exceeds context_length=16$"
    ):
        model(x)
    caches = model.new_caches()
    full, _ = model(x[:, :16])
    parts = [model(x[:, a:b], caches=caches)[0] for a, b in [(0, 5), (5, 6), (6, 16)]]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(
        ValueError, match=r"^sequence of 17 positions \(cached 16 \+ new 1\) exceeds context_length=16$"
    ):
        model(x[:, 16:], caches=caches)
    with pytest.raises(ValueError, match=r"^expected 1 caches, got 2$"):
        model(x[:, :1], caches=[tc.KVCache(), tc.KVCache()])


@pytest.mark.parametrize("positional", ["rope", "none"])
def test_rolling_caches_go_past_the_context_length(positional):
    """Chunks of up to context_length new tokens, after any number of cached ones: sliding-window attention."""
    model = _scrambled(tiny_gpt(positional=positional, num_layers=1), std=0.3)
    x = _ids(1, 50)
    caches = model.new_caches()
    with torch.no_grad():
        parts = [model(x[:, a:b], caches=caches)[0] for a, b in [(0, 16), (16, 17), (17, 33)]]  # 16 new at 17
        with pytest.raises(ValueError, match=r"^sequence of 50 positions \(cached 33 \+ new 17\) exceeds"):
            model(x[:, 33:], caches=caches)
        banded = torch.tensor([[i - 16 < j <= i for j in range(33)] for i in range(33)])
        expected = model.lm_head(model.norm_f(model.blocks[0](model.tok_emb(x[:, :33]), attn_mask=banded)))
    torch.testing.assert_close(torch.cat(parts, 1), expected, atol=1e-5, rtol=1e-5)


def test_gpt_forward_checks_shapes_and_generate_checks_the_ids_range():
    model = tiny_gpt()
    for bad in (25, -100):  # the ignore index is for targets only
        with pytest.raises(ValueError, match=rf"^input_ids must lie in \[0, 20\), got {bad} \(1 bad\)$"):
            model.generate(torch.tensor([[0, bad]]), 1)
    with pytest.raises(ValueError, match=r"^input_ids must be a 2-D LongTensor \(N, T\), got torch.float32 \(1, 3\)$"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"^input_ids must be a 2-D LongTensor \(N, T\), got torch.int64 \(3,\)$"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^input_ids must be a 2-D LongTensor \(N, T\), got list$"):
        model([[0, 1]])
    with pytest.raises(ValueError, match=r"^targets must be a 2-D LongTensor \(N, T\), got torch.float32 \(1, 3\)$"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"^targets shape \(1, 4\) != input_ids shape \(1, 3\)$"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 2, temperature=0.0)


def test_gpt_forward_is_one_graph_without_host_sync():
    """torch.compile sees one graph and no break, forward and backward: no value check (no
    device-to-host synchronisation) runs inside forward."""
    torch._dynamo.reset()
    for positional in ("learned", "rope"):
        model = tiny_gpt(positional=positional)
        ids = torch.randint(0, 20, (2, 9))
        explained = torch._dynamo.explain(model)(ids, ids)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        compiled = torch.compile(model, backend="aot_eager")
        _, loss = compiled(ids, ids)
        loss.backward()  # the backward of the one graph
        _, expected = model(ids, ids)
        torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("vocab_size", [12, 50, 2000, 50257])
@pytest.mark.parametrize("d_model,num_layers", [(32, 1), (128, 4), (512, 2)])
def test_untrained_gpt_loss_is_within_ten_percent_of_ln_vocab(vocab_size, d_model, num_layers):
    """Cross-entropy of an untrained model on random tokens, over three seeds."""
    cfg = tc.GPTConfig(vocab_size, context_length=32, d_model=d_model, num_heads=4, num_layers=num_layers)
    for seed in range(3):
        torch.manual_seed(seed)
        model = tc.MiniGPT(cfg).eval()
        ids = torch.randint(0, vocab_size, (8, 33))
        with torch.no_grad():
            _, loss = model(ids[:, :-1], ids[:, 1:])
        assert abs(loss.item() / math.log(vocab_size) - 1) < 0.1, (seed, loss.item(), math.log(vocab_size))


@pytest.mark.parametrize("bad", [-1, True, 2.0, "3", None])
def test_generate_rejects_bad_max_new_tokens(bad):
    error, message = (ValueError, "must be >= 0") if bad == -1 else (TypeError, "must be an int")
    with pytest.raises(error, match=rf"^max_new_tokens {message}, got {bad!r}$"):
        tiny_gpt().generate(torch.zeros(1, 1, dtype=torch.long), bad)


def test_generate_takes_sampling_options_as_keywords_only():
    with pytest.raises(TypeError, match="positional"):
        tiny_gpt().generate(torch.zeros(1, 1, dtype=torch.long), 2, 0.8)


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_zero_new_tokens_returns_the_prompt(use_cache):
    prompt = _ids(2, 3)
    out = tiny_gpt().generate(prompt, 0, use_cache=use_cache)
    assert torch.equal(out, prompt) and out is not prompt


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(temperature=2.0, top_k=3), dict(top_p=0.5), dict(temperature=2.0, greedy=True)]
)
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_samples_like_sample_next_token_step_by_step(kwargs, use_cache):
    """Within the window, with a seeded generator: the tokens of a hand-written loop of full forward passes."""
    model = _scrambled(tiny_gpt())
    prompt = _ids(3, 2)
    out = model.generate(prompt, 12, use_cache=use_cache, generator=torch.Generator().manual_seed(5), **kwargs)
    sampling = dict(temperature=1.0, top_k=None, top_p=None, greedy=False) | kwargs  # generate's defaults
    g = torch.Generator().manual_seed(5)
    ys = prompt
    with torch.no_grad():
        for _ in range(12):
            ys = torch.cat([ys, tc.sample_next_token(model(ys)[0][:, -1], **sampling, generator=g)], 1)
    assert torch.equal(out, ys)


@pytest.mark.parametrize("positional,C", [("learned", 3), ("sinusoidal", 6), ("learned", 1)])
def test_generate_past_the_window_re_encodes_the_last_half_window(positional, C):
    """With absolute positions a full cache restarts from the last max(1, C // 2) tokens: brute force."""
    model = _scrambled(tiny_gpt(positional=positional, context_length=C))
    prompt = _ids(2, min(C, 2))
    T0 = prompt.size(1)
    out = model.generate(prompt, 10, greedy=True)
    ys, start = prompt, 0  # the model sees ys[:, start:]
    with torch.no_grad():
        for n in range(T0, T0 + 10):
            if n - start > C:
                start = n - max(1, C // 2)
            ys = torch.cat([ys, model(ys[:, start:])[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ys)


# --- cached generation (moved from test_kv_cache.py) ---


def _chunks(T: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, T)) for s in range(0, T, size)]


@pytest.mark.parametrize("chunk", [1, 2, 5, 16])
@pytest.mark.parametrize("positional,kv", [("learned", None), ("sinusoidal", 2), ("rope", 1), ("none", 2)])
def test_minigpt_prefill_in_chunks_equals_full_forward(chunk, positional, kv):
    model = tiny_gpt(positional=positional, num_kv_heads=kv)
    x = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(chunk))
    full, _ = model(x)
    caches = model.new_caches()
    parts = [model(x[:, a:b], caches=caches)[0] for a, b in _chunks(16, chunk)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", tc.POSITIONAL_ENCODINGS)
@pytest.mark.parametrize("prompt_len", [1, 4])
def test_cached_generation_equals_uncached_within_the_window(positional, prompt_len):
    model = tiny_gpt(positional=positional, num_kv_heads=2)
    prompt = torch.randint(0, 20, (2, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    new = 16 - prompt_len
    a = model.generate(prompt, new, greedy=True, use_cache=True)
    b = model.generate(prompt, new, greedy=True, use_cache=False)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :prompt_len], prompt)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_absolute_positions_past_the_window_re_encode_half_a_window(positional):
    """Each token equals the argmax of a full forward over the window the docstring promises."""
    model = tiny_gpt(positional=positional)
    C, keep = 16, 8
    prompt = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(prompt, 40, greedy=True)
    start = 0  # the window: out[start:n]; grows to C tokens, then restarts with the last `keep`
    for n in range(5, 45):
        if n - start > C:
            start = n - keep
        logits, _ = model(out[:, start:n])
        assert out[0, n] == logits[0, -1].argmax(), f"token {n} (window {start}..{n})"


@pytest.mark.parametrize("positional", ["rope", "none"])
def test_rope_and_no_positions_past_the_window_roll_the_cache(positional):
    """Cached generation past the window equals sliding-window attention over the whole sequence."""
    model = tiny_gpt(positional=positional, num_kv_heads=2)
    C = 16
    prompt = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, 40, greedy=True)
    T = out.size(1) - 1
    window = torch.tensor([[i - C < j <= i for j in range(T)] for i in range(T)])
    with torch.no_grad():
        x = model.tok_emb(out[:, :T])
        for block in model.blocks:
            x = block(x, attn_mask=window)
        logits = model.lm_head(model.norm_f(x))
    assert torch.equal(out[0, 5:], logits[0, 4:].argmax(-1))


def test_generate_restores_the_mode_it_found_also_on_error():
    model = tiny_gpt().train()
    model.generate(torch.zeros(1, 1, dtype=torch.long), 2)
    assert model.training
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 2, temperature=0.0)
    assert model.training
    model.eval()
    model.generate(torch.zeros(1, 1, dtype=torch.long), 2)
    assert not model.training


def test_generated_ids_can_feed_a_training_step():
    model = tiny_gpt().train()
    ids = model.generate(torch.zeros(2, 1, dtype=torch.long), 6)
    assert not ids.is_inference()
    _, loss = model(ids[:, :-1], targets=ids[:, 1:])
    loss.backward()  # the embedding saves the ids for backward
    assert model.tok_emb.weight.grad is not None


def test_generate_rejects_an_empty_prompt_and_bad_ids():
    model = tiny_gpt()
    with pytest.raises(ValueError, match=r"^prompt tokens per row must be >= 1, got 0$"):
        model.generate(torch.zeros(2, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 20\), got 20"):
        model.generate(torch.tensor([[3, 20]]), 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), -1)


def test_generate_checks_the_sampling_options_before_the_first_step():
    """Bad options are refused even when no token is generated; greedy decoding ignores the temperature."""
    model, prompt = tiny_gpt(), torch.zeros(1, 1, dtype=torch.long)
    for bad in (dict(top_k=0), dict(top_p=0.0), dict(temperature=0.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            model.generate(prompt, 0, **bad)
    assert torch.equal(model.generate(prompt, 0, greedy=True, temperature=0.0), prompt)
