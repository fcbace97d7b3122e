import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc


def test_layernorm_equals_torch_with_and_without_affine():
    x = torch.randn(4, 7, 12) * 3 + 2
    ours, theirs = tc.LayerNorm(12, eps=1e-5), nn.LayerNorm(12, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)
    torch.testing.assert_close(ours(x), theirs(x))
    bare = tc.LayerNorm(12, elementwise_affine=False)
    assert sum(p.numel() for p in bare.parameters()) == 0
    torch.testing.assert_close(bare(x), F.layer_norm(x, (12,)))
    y = bare(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 7), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 7), atol=1e-3, rtol=0)


def test_layernorm_gradcheck_float64():
    ln = tc.LayerNorm(5).double()
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ln, (x,))


def test_rmsnorm_equals_torch():
    x = torch.randn(3, 4, 10)
    ours, theirs = tc.RMSNorm(10, eps=1e-6), nn.RMSNorm(10, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
        ours.weight.copy_(theirs.weight)
    torch.testing.assert_close(ours(x), theirs(x))


def test_norm_errors():
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        tc.build_norm("batchnorm", 4)
    with pytest.raises(ValueError, match="eps must be positive, got 0"):
        tc.LayerNorm(4, eps=0)
    with pytest.raises(ValueError, match="last dim of x must be 4"):
        tc.RMSNorm(4)(torch.randn(2, 5))


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
    ours = tc.EncoderLayer(16, 4, 32, norm_first=norm_first).eval()
    _copy_encoder_layer(ours, theirs)
    x = torch.randn(2, 6, 16)
    pad = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    expected = theirs(x, src_key_padding_mask=~pad)
    got = ours(x, src_mask=tc.padding_mask(pad.long(), 0), need_weights=True)
    # nn's fast path may zero padded rows' outputs; compare the real positions
    torch.testing.assert_close(got[pad], expected[pad])
    assert ours.attn_weights["self"].shape == (2, 4, 6, 6)
    ours(x)
    assert ours.attn_weights is None


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
    assert ours.attn_weights["cross"].shape == (2, 4, 5, 7)


def test_residual_wiring_pre_and_post_ln():
    x = torch.randn(2, 4, 8)
    for norm_first in (False, True):
        blk = tc.GPTBlock(8, 2, 16, norm_first=norm_first).eval()
        a = blk.attn(blk.norm1(x) if norm_first else x, is_causal=True)[0]
        h = x + a if norm_first else blk.norm1(x + a)
        f = blk.ffn(blk.norm2(h) if norm_first else h)
        expected = h + f if norm_first else blk.norm2(h + f)
        torch.testing.assert_close(blk(x), expected)


def test_residual_jacobian_is_identity_plus_sublayer_jacobian():
    blk = tc.GPTBlock(4, 2, 8, norm_first=True).double().eval()
    x = torch.randn(1, 3, 4, dtype=torch.float64)

    def attn_branch(z):
        return blk.attn(blk.norm1(z), is_causal=True)[0]

    def first_residual(z):
        return z + attn_branch(z)

    J = torch.autograd.functional.jacobian(first_residual, x).reshape(12, 12)
    JF = torch.autograd.functional.jacobian(attn_branch, x).reshape(12, 12)
    torch.testing.assert_close(J, torch.eye(12, dtype=torch.float64) + JF)
