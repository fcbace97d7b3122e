from dataclasses import replace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_course as tc


@settings(max_examples=30, deadline=None)
@given(
    heads_kv=st.sampled_from([(1, None), (2, 1), (4, 2), (4, None), (4, 4)]),
    head_dim=st.sampled_from([2, 4]), layers=st.integers(1, 3), vocab=st.integers(5, 40),
    ctx=st.integers(4, 20), positional=st.sampled_from(tc.POSITIONAL_ENCODINGS),
    norm=st.sampled_from(tc.NORMS), norm_first=st.booleans(),
    activation=st.sampled_from(tc.ACTIVATIONS), tie=st.booleans(), bias=st.booleans(),
    d_ff=st.integers(1, 24),
)  # fmt: skip
def test_gpt_formula_equals_count(heads_kv, head_dim, layers, vocab, ctx, positional, norm, norm_first,
                                  activation, tie, bias, d_ff):  # fmt: skip
    H, kv = heads_kv
    cfg = tc.GPTConfig(
        vocab_size=vocab, context_length=ctx, d_model=H * head_dim, num_heads=H, num_layers=layers,
        d_ff=d_ff, num_kv_heads=kv, positional=positional, norm=norm, norm_first=norm_first,
        activation=activation, tie_weights=tie, bias=bias,
    )  # fmt: skip
    assert tc.count_parameters(tc.MiniGPT(cfg)) == tc.gpt_parameter_count(cfg)


@settings(max_examples=25, deadline=None)
@given(
    d_model=st.sampled_from([4, 8]), heads=st.sampled_from([1, 2, 4]), enc=st.integers(1, 2),
    dec=st.integers(1, 2), vocab=st.tuples(st.integers(5, 30), st.integers(5, 30)),
    positional=st.sampled_from(["sinusoidal", "learned"]), share=st.booleans(), tie=st.booleans(),
    final_norm=st.booleans(), bias=st.booleans(), activation=st.sampled_from(tc.ACTIVATIONS),
    norm=st.sampled_from(tc.NORMS),
)  # fmt: skip
def test_transformer_formula_equals_count(d_model, heads, enc, dec, vocab, positional, share, tie,
                                          final_norm, bias, activation, norm):  # fmt: skip
    src_v, tgt_v = (vocab[0], vocab[0]) if share else vocab
    cfg = tc.TransformerConfig(
        src_vocab_size=src_v, tgt_vocab_size=tgt_v, d_model=d_model, num_heads=heads,
        num_encoder_layers=enc, num_decoder_layers=dec, d_ff=3 * d_model, context_length=10,
        positional=positional, share_embeddings=share, tie_weights=tie, final_norm=final_norm,
        bias=bias, activation=activation, norm=norm,
    )  # fmt: skip
    assert tc.count_parameters(tc.Transformer(cfg)) == tc.transformer_parameter_count(cfg)


def test_paper_base_model_is_about_63_million():
    cfg = tc.TransformerConfig(src_vocab_size=37000, tgt_vocab_size=37000, share_embeddings=True, tie_weights=True)
    n = tc.transformer_parameter_count(cfg)
    with torch.device("meta"):
        assert tc.count_parameters(tc.Transformer(cfg)) == n
    assert 60e6 < n < 66e6


def test_count_parameters_trainable_only():
    model = tc.FeedForward(4, 8)
    model.w1.weight.requires_grad_(False)
    assert tc.count_parameters(model, trainable_only=True) == tc.count_parameters(model) - 32


def test_flops_per_token_follows_6n_rule():
    cfg = tc.GPTConfig(vocab_size=100, context_length=64, d_model=64, num_heads=4, num_layers=2)
    bd = tc.gpt_parameter_breakdown(cfg)
    n_matmul = bd["blocks"] + 100 * 64
    assert tc.gpt_flops_per_token(cfg, seq_len=64) == 6 * n_matmul + 12 * 2 * 64 * 64
    assert tc.gpt_flops_per_token(cfg, training=False) * 3 == tc.gpt_flops_per_token(cfg)
    longer = replace(cfg, context_length=128)
    assert tc.gpt_flops_per_token(longer) > tc.gpt_flops_per_token(cfg)
