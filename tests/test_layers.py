import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc


@pytest.mark.parametrize("activation", tc.ACTIVATIONS)
def test_feedforward_shapes_params_and_positionwise(activation):
    ffn = tc.FeedForward(8, 32, activation=activation)
    x = torch.randn(2, 5, 8)
    y = ffn(x)
    assert y.shape == x.shape
    perm = torch.randperm(5)
    torch.testing.assert_close(ffn(x[:, perm]), y[:, perm])
    gated = activation in ("swiglu", "geglu")
    assert tc.count_parameters(ffn) == (2 if gated else 1) * (8 * 32 + 32) + 32 * 8 + 8


def test_feedforward_formulas():
    x = torch.randn(3, 8)
    relu = tc.FeedForward(8, 16, "relu")
    torch.testing.assert_close(relu(x), relu.w2(torch.relu(relu.w1(x))))
    swiglu = tc.FeedForward(8, 16, "swiglu")
    torch.testing.assert_close(swiglu(x), swiglu.w2(F.silu(swiglu.w1(x)) * swiglu.w3(x)))
    geglu = tc.FeedForward(8, 16, "geglu")
    torch.testing.assert_close(geglu(x), geglu.w2(F.gelu(geglu.w1(x)) * geglu.w3(x)))
    gelu = tc.FeedForward(8, 16, "gelu").double()
    xd = x.double()
    h = gelu.w1(xd)
    exact = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # x·Φ(x)
    torch.testing.assert_close(gelu(xd), gelu.w2(exact))
    gelu_tanh = tc.FeedForward(8, 16, "gelu_tanh").double()
    h = gelu_tanh.w1(xd)
    approx = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # GPT-2's formula
    torch.testing.assert_close(gelu_tanh(xd), gelu_tanh.w2(approx))
    assert not torch.allclose(gelu_tanh.w2(approx), gelu_tanh.w2(0.5 * h * (1 + torch.erf(h / math.sqrt(2)))))
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        tc.FeedForward(8, 16, "tanh")


def _copy_encoder_layer(ours, theirs):
    tc.load_torch_mha(ours.self_attn, theirs.self_attn)
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())
    ours.norm1.load_state_dict(theirs.norm1.state_dict())
    ours.norm2.load_state_dict(theirs.norm2.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first):
    theirs = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = tc.TransformerBlock(16, 4, 32, norm_first=norm_first).eval()
    _copy_encoder_layer(ours, theirs)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    expected = theirs(x, src_key_padding_mask=~pad)
    got = ours(x, attn_mask=tc.padding_mask(pad.long(), 0), need_weights=True)
    # nn's fast path may zero padded rows' outputs; compare the real positions
    torch.testing.assert_close(got[pad], expected[pad])
    weights = ours.self_attn.attn_weights
    assert weights.shape == (2, 4, 6, 6)
    assert weights[1, :, :, 4:].eq(0).all()  # padded keys get no weight
    ours(x)
    assert ours.self_attn.attn_weights is None


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = tc.DecoderLayer(16, 4, 32, norm_first=norm_first).eval()
    tc.load_torch_mha(ours.self_attn, theirs.self_attn)
    tc.load_torch_mha(ours.cross_attn, theirs.multihead_attn)
    ours.ffn.w1.load_state_dict(theirs.linear1.state_dict())
    ours.ffn.w2.load_state_dict(theirs.linear2.state_dict())
    for i in (1, 2, 3):
        getattr(ours, f"norm{i}").load_state_dict(getattr(theirs, f"norm{i}").state_dict())
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    expected = theirs(x, mem, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True)
    got = ours(x, mem, need_weights=True)
    torch.testing.assert_close(got, expected)
    assert ours.cross_attn.attn_weights.shape == (2, 4, 5, 7)
    assert ours.self_attn.attn_weights[..., ~tc.causal_mask(5)].eq(0).all()


def test_residual_wiring_pre_and_post_ln():
    x = torch.randn(2, 4, 8)
    for norm_first in (False, True):
        blk = tc.TransformerBlock(8, 2, 16, norm_first=norm_first, causal=True).eval()
        a = blk.self_attn(blk.norm1(x) if norm_first else x, is_causal=True)[0]
        h = x + a if norm_first else blk.norm1(x + a)
        f = blk.ffn(blk.norm2(h) if norm_first else h)
        expected = h + f if norm_first else blk.norm2(h + f)
        torch.testing.assert_close(blk(x), expected)


def test_residual_jacobian_is_identity_plus_sublayer_jacobian():
    blk = tc.TransformerBlock(4, 2, 8, norm_first=True, causal=True).double().eval()
    x = torch.randn(1, 3, 4, dtype=torch.float64)

    def attn_branch(z):
        return blk.self_attn(blk.norm1(z), is_causal=True)[0]

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
