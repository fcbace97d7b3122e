"""The encoder-decoder Transformer: config checks, agreement with nn.Transformer, masks, weight sharing, decoding."""

import math

import pytest
import torch
from helpers import tiny_transformer
from torch import nn

import transformer_course as tc
from transformer_course import notebook as nb
from transformer_course.models import TiedLMHead


def test_transformer_config_defaults_are_the_base_model_of_the_paper():
    cfg = tc.TransformerConfig(src_vocab_size=100, tgt_vocab_size=100)
    base = (
        512,
        8,
        6,
        6,
        2048,
        0.1,
        "relu",
        False,
        "layernorm",
        "sinusoidal",
        True,
        0,
        None,
    )  # eps None: LayerNorm's 1e-5
    assert (
        cfg.d_model, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.d_ff, cfg.dropout,
        cfg.activation, cfg.norm_first, cfg.norm, cfg.positional, cfg.final_norm, cfg.pad_id, cfg.eps,
    ) == base  # fmt: skip
    assert not cfg.share_embeddings and not cfg.tie_weights and cfg.bias


@pytest.mark.parametrize(
    "field",
    ["src_vocab_size", "tgt_vocab_size", "num_encoder_layers", "num_decoder_layers", "d_model", "num_heads", "d_ff",
     "context_length"],
)  # fmt: skip
def test_transformer_config_names_the_non_positive_field(field):
    with pytest.raises(ValueError, match=rf"^{field} must be positive, got 0$"):
        tc.TransformerConfig(**{"src_vocab_size": 10, "tgt_vocab_size": 10, field: 0})


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=30, num_heads=4), r"^d_model=30 is not divisible by num_heads=4$"),
        (dict(activation="tanh"), r"^unknown activation 'tanh'"),
        (dict(norm="batch"), r"^unknown norm 'batch'"),
        (dict(positional="rope"), r"^unknown positional encoding 'rope'"),
        (dict(positional="none"), r"^unknown positional encoding 'none'"),
        (dict(d_model=15, num_heads=5), r"^sinusoidal positions need an even d_model, got 15$"),
        (dict(dropout=-0.1), r"^dropout must be in \[0, 1\), got -0.1$"),
        (dict(dropout=1.0), r"^dropout must be in \[0, 1\), got 1.0$"),
        (
            dict(tgt_vocab_size=13, share_embeddings=True),
            r"^share_embeddings needs equal vocabularies, got src_vocab_size=10, tgt_vocab_size=13$",
        ),
    ],
)
def test_transformer_config_rejects_bad_values(kwargs, match):
    args = dict(src_vocab_size=10, tgt_vocab_size=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tc.TransformerConfig(**args)


def test_transformer_config_accepts_the_boundaries():
    cfg = tc.TransformerConfig(src_vocab_size=1, tgt_vocab_size=1, d_model=15, num_heads=5, positional="learned",
                               dropout=0.0, share_embeddings=True)  # fmt: skip
    assert cfg.dropout == 0.0 and cfg.d_model == 15


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_equals_nn_transformer_with_copied_weights(norm_first, activation):
    """Source padding masked in the encoder and the cross-attention, causal target, embeddings
    scaled by sqrt(d_model) plus the sinusoidal table, norms with cfg.eps (not the default)."""
    eps = 1e-2
    ours = tiny_transformer(norm_first=norm_first, activation=activation, eps=eps)
    theirs = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, activation=activation, layer_norm_eps=eps,
                            batch_first=True, norm_first=norm_first)  # fmt: skip
    theirs.train()  # with dropout 0 train mode only turns off the fast path (nested tensors)
    with torch.no_grad():  # non-trivial norms and biases, so that a skipped one shows
        for name, p in theirs.named_parameters():
            if "norm" in name or "bias" in name:
                p.normal_(0.0, 0.5)
    tc.load_torch_transformer(ours, theirs)
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(1, 11, (3, 7), generator=g), torch.randint(1, 13, (3, 5), generator=g)
    src[0, 4:], src[1, 6:], tgt[2, 3:] = 0, 0, 0  # pad_id = 0
    src_x = ours.src_tok_emb.weight[src] * 4.0 + tc.sinusoidal_table(7, 16)  # sqrt(16) = 4
    tgt_x = ours.tgt_tok_emb.weight[tgt] * 4.0 + tc.sinusoidal_table(5, 16)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = masked, as nn.Transformer wants
    masks = dict(tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src == 0, memory_key_padding_mask=src == 0)
    with torch.no_grad():
        expected = ours.lm_head(theirs(src_x, tgt_x, **masks))
        torch.testing.assert_close(ours(src, tgt), expected, atol=1e-5, rtol=1e-5)
        # decode passes an explicit target mask (here target padding) to every layer
        memory = ours.encode(src, ours.src_mask(src))
        hidden = ours.decode(tgt, memory, ours.src_mask(src), tgt_mask=tc.padding_mask(tgt, 0))
        expected = ours.lm_head(theirs(src_x, tgt_x, tgt_key_padding_mask=tgt == 0, **masks))
        torch.testing.assert_close(ours.lm_head(hidden), expected, atol=1e-5, rtol=1e-5)


def test_transformer_source_padding_is_ignored():
    model = tiny_transformer()
    src = torch.tensor([[5, 6, 7, 0, 0]])
    assert torch.equal(model.src_mask(src), torch.tensor([True, True, True, False, False]).view(1, 1, 1, 5))
    assert tiny_transformer(pad_id=None).src_mask(src) is None
    tgt = torch.tensor([[1, 4, 5]])
    a = model(src, tgt)
    b = model(torch.tensor([[5, 6, 7, 0, 0, 0, 0]]), tgt)
    torch.testing.assert_close(a, b)
    assert a.shape == (1, 3, 13)


def test_transformer_decoder_is_causal():
    model = tiny_transformer()
    src = torch.randint(3, 11, (2, 6))
    tgt = torch.randint(3, 13, (2, 5))
    tgt2 = tgt.clone()
    tgt2[:, 3:] = torch.randint(3, 13, (2, 2))
    torch.testing.assert_close(model(src, tgt)[:, :3], model(src, tgt2)[:, :3])


def test_record_attention_reaches_every_attention_layer():
    model = tiny_transformer()
    src, tgt = torch.tensor([[5, 6, 7, 0], [4, 3, 2, 1]]), torch.tensor([[1, 4, 5], [1, 2, 3]])
    plain = model(src, tgt)
    with nb.record_attention(model) as maps:
        logits = model(src, tgt)
    enc = [layer.self_attn for layer in model.encoder_blocks]
    dec = [m for layer in model.decoder_blocks for m in (layer.self_attn, layer.cross_attn)]
    shapes = [(2, 4, 4, 4)] * 2 + [(2, 4, 3, 3), (2, 4, 3, 4)] * 2  # encoder self, decoder self and cross
    assert [tuple(maps[m].shape) for m in enc + dec] == shapes
    assert maps[model.decoder_blocks[1].cross_attn][0, ..., 3].eq(0).all()  # the padded source token
    torch.testing.assert_close(logits, plain)  # asking for weights does not change the output


def test_greedy_decode_matches_argmax_recomputation():
    model = tiny_transformer()
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


@pytest.mark.parametrize("layers", [1, 3])
def test_cached_decoding_equals_uncached_decoding(layers):
    """Feeding the target one token at a time through the caches (one per decoder layer; the positions
    continue from the caches' offset) gives the states of the full causal pass."""
    model = tiny_transformer(num_decoder_layers=layers)
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 13, (2, 5))
    src[1, 4:] = 0
    src_mask = model.src_mask(src)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        caches = [tc.KVCache() for _ in range(layers)]
        steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, caches=caches) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def _brute_force_greedy(model, src, bos_id, eos_id, max_len, fill):
    """Greedy decoding without a cache: the whole target is re-run through forward at every step."""
    ys = torch.full((src.size(0), 1), bos_id)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len - 1):
        nxt = model(src, ys)[:, -1].argmax(-1)
        nxt[done] = fill
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
        if done.all():
            break
    return ys


@pytest.mark.parametrize("pad_id", [0, None])
def test_greedy_decode_pads_after_eos_and_restores_the_mode(pad_id):
    model = tiny_transformer(pad_id=pad_id)
    with torch.no_grad():  # large embeddings: the rows of the batch decode differently
        model.src_tok_emb.weight.normal_(generator=torch.Generator().manual_seed(2))
        model.tgt_tok_emb.weight.normal_(generator=torch.Generator().manual_seed(3))
    src = torch.randint(1, 11, (3, 6), generator=torch.Generator().manual_seed(1))
    src[1, 4:] = 0
    with torch.no_grad():
        eos_id = int(_brute_force_greedy(model, src, 1, -1, 5, 0)[0, 3])  # what row 0 emits third
        fill = eos_id if pad_id is None else pad_id
        expected = _brute_force_greedy(model, src, 1, eos_id, 12, fill)
    out = model.train().greedy_decode(src, bos_id=1, eos_id=eos_id, max_len=12)
    assert model.training and torch.equal(out, expected)
    assert eos_id not in out[0, :3] and out[0, 3] == eos_id and out[0, 4:].eq(fill).all()
    assert out[1, 4:].ne(fill).any()  # another row goes on after row 0 is done


def test_weight_sharing_options():
    model = tiny_transformer(src_vocab_size=13, share_embeddings=True, tie_weights=True)
    assert model.src_tok_emb.weight is model.tgt_tok_emb.weight is model.lm_head.weight
    h = torch.randn(2, 3, 16)  # the tied head scales the decoder state by d_model^-0.5 (T5's rule)
    expected = h @ model.tgt_tok_emb.weight.T / 4 + model.lm_head.bias
    torch.testing.assert_close(model.lm_head(h), expected)
    assert tc.count_parameters(model) == tc.transformer_parameter_count(model.cfg)
    plain = tiny_transformer(final_norm=False, bias=False)
    assert isinstance(plain.encoder_norm_f, nn.Identity) and isinstance(plain.decoder_norm_f, nn.Identity)
    assert plain.lm_head.bias is None and plain.src_tok_emb is not plain.tgt_tok_emb
    assert tc.count_parameters(plain) == tc.transformer_parameter_count(plain.cfg)


def test_tied_lm_head_has_a_bias_by_default_and_none_with_bias_false():
    emb = nn.Embedding(13, 16)
    assert TiedLMHead(emb).bias.shape == (13,) and TiedLMHead(emb, bias=False).bias is None
    tied = tiny_transformer(tie_weights=True, bias=False)  # the config's bias reaches the tied head
    assert tied.lm_head.weight is tied.tgt_tok_emb.weight and tied.lm_head.bias is None
    assert tc.count_parameters(tied) == tc.transformer_parameter_count(tied.cfg)


def test_bias_false_removes_the_beta_of_every_norm_final_norms_included():
    model = tiny_transformer(bias=False)  # final_norm=True (default)
    norms = [m for m in model.modules() if isinstance(m, tc.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 * 3 + 2 and all(norm.bias is None for norm in norms)
    assert model.encoder_norm_f in norms and model.decoder_norm_f in norms


def test_rmsnorm_reaches_every_layer_and_the_final_norms():
    model = tiny_transformer(norm="rmsnorm")  # bias=True: the linear layers' flag; RMSNorm has no beta
    norms = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1].startswith("norm")]
    assert len(norms) == 2 * 2 + 2 * 3 and all(isinstance(norm, tc.RMSNorm) for norm in norms)
    assert isinstance(model.encoder_norm_f, tc.RMSNorm) and isinstance(model.decoder_norm_f, tc.RMSNorm)
    assert not any(isinstance(m, tc.LayerNorm) for m in model.modules())


def test_token_embeddings_start_with_std_d_model_to_the_minus_half():
    """N(0, 1/d_model), so that sqrt(d_model) times a row has unit variance; with 24 000 samples per
    table the sample std has a relative standard error of 0.5%: the 3% band is six of them."""
    model = tiny_transformer(src_vocab_size=375, tgt_vocab_size=375, d_model=64)
    for emb in (model.src_tok_emb, model.tgt_tok_emb):
        assert abs(emb.weight.std().item() * 64**0.5 - 1) < 0.03


def test_transformer_rejects_bad_ids_naming_the_argument_and_value():
    model = tiny_transformer()
    with pytest.raises(ValueError, match=r"^src must lie in \[0, 11\), got 11 \(1 bad\)$"):
        model.greedy_decode(torch.tensor([[0, 11]]), bos_id=1, eos_id=2, max_len=3)
    with pytest.raises(TypeError, match=r"^src must be a 2-D LongTensor \(N, T\), got list$"):
        model.encode([[0, 1]])
    with pytest.raises(ValueError, match=r"^tgt must be a 2-D LongTensor \(N, T\), got torch.float32 \(1, 2\)$"):
        model(torch.tensor([[0, 1]]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"^tgt must be a 2-D LongTensor \(N, T\), got torch.int64 \(2,\)$"):
        model(torch.tensor([[0, 1]]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="exceed"):
        model(torch.randint(0, 11, (1, 40)), torch.tensor([[1]]))


def test_transformer_forward_is_one_graph_without_host_sync():
    """torch.compile sees one graph and no break, forward and backward: no value check (no
    device-to-host synchronisation) runs inside forward."""
    torch._dynamo.reset()
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 13, (2, 5))
    for tied in (False, True):  # tied: the TiedLMHead
        model = tiny_transformer(tie_weights=tied)
        explained = torch._dynamo.explain(model)(src, tgt)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        compiled = torch.compile(model, backend="aot_eager")
        compiled(src, tgt).sum().backward()  # the backward of the one graph
        torch.testing.assert_close(compiled(src, tgt), model(src, tgt))


# (norm_first, final_norm): Post-LN with and without the extra final norm (the paper's base
# model has none), Pre-LN with it. Pre-LN without a final norm sends the raw residual stream to
# an untied lm_head, whose logits then start wider than the 10% band allows at small V.
LAYOUTS = {"post-ln": (False, True), "post-ln, no final norm": (False, False), "pre-ln": (True, True)}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("vocab", [50, 2000])
@pytest.mark.parametrize("d_model,layers", [(32, 1), (128, 2), (512, 6)])
def test_untrained_transformer_loss_is_within_ten_percent_of_ln_vocab(d_model, layers, vocab, layout, tied):
    """Cross-entropy of an untrained model on random tokens, over three seeds. Tied, the input
    token's own logit would grow like sqrt(d_model) (loss up to 1.9 ln V) without the
    d_model^-0.5 of TiedLMHead."""
    norm_first, final_norm = LAYOUTS[layout]
    cfg = tc.TransformerConfig(vocab, vocab, d_model=d_model, num_heads=4, num_encoder_layers=layers,
                               num_decoder_layers=layers, d_ff=2 * d_model, share_embeddings=tied,
                               tie_weights=tied, norm_first=norm_first, final_norm=final_norm,
                               dropout=0.0)  # fmt: skip
    for seed in range(3):
        torch.manual_seed(seed)
        model = tc.Transformer(cfg).eval()
        src, tgt = torch.randint(1, vocab, (8, 16)), torch.randint(1, vocab, (8, 17))
        with torch.no_grad():
            logits = model(src, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
        assert abs(loss.item() / math.log(vocab) - 1) < 0.1, (seed, loss.item(), math.log(vocab))
