"""The Transformer layers of ``blocks.py``: TransformerBlock (encoder layer / GPT block) and DecoderLayer, against
PyTorch's own layers, with caches, dropout, norms and residual wiring."""

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import notebook as nb


def _copy_encoder_layer(ours, theirs):
    tc.load_torch_mha(ours.self_attn, theirs.self_attn)
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())
    ours.norm1.load_state_dict(theirs.norm1.state_dict())
    ours.norm2.load_state_dict(theirs.norm2.state_dict())


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first, causal, activation):
    kw = {"dropout": 0.0, "activation": activation, "norm_first": norm_first}
    theirs = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, layer_norm_eps=0.1, **kw).eval()
    ours = tc.TransformerBlock(16, 4, 32, eps=0.1, causal=causal, **kw).eval()  # eps: not the default 1e-5
    _copy_encoder_layer(ours, theirs)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    src_mask = tc.to_torch_mask(tc.causal_mask(6)) if causal else None
    expected = theirs(x, src_mask=src_mask, src_key_padding_mask=~pad, is_causal=causal)
    with nb.record_attention(ours) as maps:
        got = ours(x, attn_mask=tc.padding_mask(pad.long(), 0))
    # nn's fast path may zero padded rows' outputs; compare the real positions
    torch.testing.assert_close(got[pad], expected[pad])
    weights = maps[ours.self_attn]
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert weights[1, :, :, 4:].eq(0).all()  # padded keys get no weight
    assert weights[..., ~tc.causal_mask(6)].eq(0).all() == causal  # causal: nothing above the diagonal
    assert not torch.allclose(got[1], ours(x)[1])  # the padding mask matters
    assert not weights.requires_grad  # recorded detached


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first, activation):
    kw = {"dropout": 0.0, "activation": activation, "norm_first": norm_first}
    theirs = nn.TransformerDecoderLayer(16, 4, 32, batch_first=True, layer_norm_eps=0.1, **kw).eval()
    ours = tc.DecoderLayer(16, 4, 32, eps=0.1, **kw).eval()
    tc.load_torch_mha(ours.self_attn, theirs.self_attn)
    tc.load_torch_mha(ours.cross_attn, theirs.multihead_attn)
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())
    for i in (1, 2, 3):
        getattr(ours, f"norm{i}").load_state_dict(getattr(theirs, f"norm{i}").state_dict())
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    tgt_keep = torch.ones(5, 5, dtype=torch.bool)
    tgt_keep[2:, 1] = False  # on top of the causal mask: target 1 is hidden from the later targets
    mem_pad = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    self_keep = tgt_keep & tc.causal_mask(5)
    expected = theirs(x, mem, tgt_mask=tc.to_torch_mask(self_keep), memory_key_padding_mask=~mem_pad)
    with nb.record_attention(ours) as maps:
        got = ours(x, mem, attn_mask=tgt_keep, memory_mask=tc.padding_mask(mem_pad.long(), 0))
    torch.testing.assert_close(got, expected)
    self_w, cross_w = maps[ours.self_attn], maps[ours.cross_attn]
    assert self_w.shape == (2, 4, 5, 5) and cross_w.shape == (2, 4, 5, 7)
    torch.testing.assert_close(self_w.sum(-1), torch.ones(2, 4, 5))
    torch.testing.assert_close(cross_w.sum(-1), torch.ones(2, 4, 5))
    assert self_w[..., ~self_keep].eq(0).all() and self_w[..., self_keep].gt(0).all()
    assert cross_w[1, ..., 5:].eq(0).all()
    # each mask matters on its own
    assert not torch.allclose(got, ours(x, mem, memory_mask=tc.padding_mask(mem_pad.long(), 0)))
    assert not torch.allclose(got[1], ours(x, mem, attn_mask=tgt_keep)[1])


@pytest.mark.parametrize("decoder", [False, True])
def test_dropout_reaches_every_sublayer_and_acts_only_in_training(decoder):
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    layer = (tc.DecoderLayer if decoder else tc.TransformerBlock)(16, 4, 32, dropout=0.5)
    args = (x, mem) if decoder else (x,)
    attns = [layer.self_attn, layer.cross_attn] if decoder else [layer.self_attn]
    assert [a.dropout for a in attns] == [0.5] * len(attns)
    assert layer.ffn.drop.p == 0.5 and layer.drop.p == 0.5
    assert not torch.allclose(layer(*args), layer(*args))
    layer.eval()
    torch.testing.assert_close(layer(*args), layer(*args))


@pytest.mark.parametrize("chunk", [1, 2, 4])
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_chunks_equal_full_forward(norm_first, chunk):
    x, mem = torch.randn(2, 7, 16), torch.randn(2, 3, 16)
    rotary = tc.RotaryEmbedding(4)
    blk = tc.TransformerBlock(16, 4, 32, norm_first=norm_first, causal=True, rotary=rotary).eval()
    dec = tc.DecoderLayer(16, 4, 32, norm_first=norm_first).eval()
    for layer, args in ((blk, ()), (dec, (mem,))):
        cache = tc.KVCache()
        out = torch.cat([layer(x[:, i : i + chunk], *args, cache=cache) for i in range(0, 7, chunk)], dim=1)
        torch.testing.assert_close(out, layer(x, *args))
        assert len(cache) == 7


@pytest.mark.parametrize("decoder", [False, True])
def test_norm_bias_and_eps_reach_every_sublayer(decoder):
    cls = tc.DecoderLayer if decoder else tc.TransformerBlock
    no_bias = cls(16, 4, 32, bias=False)  # no bias in any projection, FFN layer or LayerNorm
    assert [name for name, _ in no_bias.named_parameters() if name.endswith("bias")] == []
    rms = cls(16, 4, 32, norm="rmsnorm", eps=0.1)
    norms = [m for m in rms.modules() if isinstance(m, (tc.LayerNorm, tc.RMSNorm))]
    assert [(type(m), m.eps) for m in norms] == [(tc.RMSNorm, 0.1)] * (3 if decoder else 2)


def test_rotary_makes_the_block_position_aware():
    rotary = tc.RotaryEmbedding(4)
    blk = tc.TransformerBlock(16, 4, 32, rotary=rotary).eval()
    assert blk.self_attn.rotary is rotary
    plain = tc.TransformerBlock(16, 4, 32).eval()
    plain.load_state_dict(blk.state_dict())  # same weights (the rotary tables are not in the state_dict)
    x, perm = torch.randn(1, 6, 16), torch.tensor([5, 0, 3, 1, 4, 2])
    torch.testing.assert_close(plain(x[:, perm]), plain(x)[:, perm])  # without positions: permutation-equivariant
    assert not torch.allclose(blk(x[:, perm]), blk(x)[:, perm])


def test_residual_wiring_pre_and_post_ln():
    x = torch.randn(2, 4, 8)
    for norm_first in (False, True):
        blk = tc.TransformerBlock(8, 2, 16, norm_first=norm_first, causal=True).eval()
        a = blk.self_attn(blk.norm1(x) if norm_first else x, is_causal=True)
        h = x + a if norm_first else blk.norm1(x + a)
        f = blk.ffn(blk.norm2(h) if norm_first else h)
        expected = h + f if norm_first else blk.norm2(h + f)
        torch.testing.assert_close(blk(x), expected)


def test_residual_jacobian_is_identity_plus_sublayer_jacobian():
    blk = tc.TransformerBlock(4, 2, 8, norm_first=True, causal=True).double().eval()
    x = torch.randn(1, 3, 4, dtype=torch.float64)

    def attn_branch(z):
        return blk.self_attn(blk.norm1(z), is_causal=True)

    def first_residual(z):
        return z + attn_branch(z)

    J = torch.autograd.functional.jacobian(first_residual, x).reshape(12, 12)
    JF = torch.autograd.functional.jacobian(attn_branch, x).reshape(12, 12)
    torch.testing.assert_close(J, torch.eye(12, dtype=torch.float64) + JF)


def test_gpt_constructor_defaults_and_overrides():
    blk = tc.TransformerBlock.gpt(8, 2, 16)
    assert blk.causal and blk.norm_first and blk.ffn.activation == "gelu"
    post = tc.TransformerBlock.gpt(8, 2, 16, norm_first=False, activation="relu", num_kv_heads=1)
    assert post.causal and not post.norm_first and post.ffn.activation == "relu"
    assert post.self_attn.num_kv_heads == 1
    enc = tc.TransformerBlock(8, 2, 16)
    assert not enc.causal and not enc.norm_first and enc.ffn.activation == "relu"
    dec = tc.DecoderLayer(8, 2, 16)  # Post-LN like nn.TransformerDecoderLayer, but causal
    assert dec.causal and not dec.norm_first and dec.ffn.activation == "relu"
    # default eps as nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (layer_norm_eps)
    enc_eps = nn.TransformerEncoderLayer(8, 2, 16).norm1.eps
    dec_eps = nn.TransformerDecoderLayer(8, 2, 16).norm1.eps
    assert [enc.norm1.eps, enc.norm2.eps] == [enc_eps] * 2
    assert [dec.norm1.eps, dec.norm2.eps, dec.norm3.eps] == [dec_eps] * 3
