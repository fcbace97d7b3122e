"""FeedForward: shapes, parameter counts, position-wise action and the formulas of every activation."""

import math

import pytest
import torch
import torch.nn.functional as F

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
