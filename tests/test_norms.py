"""LayerNorm and RMSNorm: the modules, the reference formulas, ``build_norm`` and their defaults."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc

D = 8
# mean square ~1e-6: eps = 1e-6, 1e-5 and 0.1 all give clearly different outputs
SMALL = 1e-3 * torch.randn(4, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


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


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_module_equals_reference_formula_forward_and_backward(affine):
    x = (torch.randn(3, 5, 16, dtype=torch.float64) * 4 + 1).requires_grad_()
    ln = tc.LayerNorm(16, elementwise_affine=affine).double()
    if affine:
        with torch.no_grad():
            ln.weight.normal_()
            ln.bias.normal_()
    g = torch.randn(3, 5, 16, dtype=torch.float64)
    fast = ln(x)
    ref = tc.layer_norm_reference(x, ln.weight, ln.bias, ln.eps)
    torch.testing.assert_close(fast, ref)
    (gx_fast,) = torch.autograd.grad(fast, x, g)
    (gx_ref,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(gx_fast, gx_ref)


def test_rms_norm_module_equals_reference_formula():
    x = torch.randn(4, 7, 10, dtype=torch.float64) * 3
    rms = tc.RMSNorm(10, eps=1e-6).double()
    with torch.no_grad():
        rms.weight.normal_()
    torch.testing.assert_close(rms(x), tc.rms_norm_reference(x, rms.weight, 1e-6))
    manual = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * rms.weight  # the definition, spelled out
    torch.testing.assert_close(tc.rms_norm_reference(x, rms.weight, 1e-6), manual)


def test_layer_norm_reference_is_the_definition():
    x = torch.randn(6, 9, dtype=torch.float64)
    w, b = torch.randn(9, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
    mu = x.sum(-1, keepdim=True) / 9
    sigma2 = ((x - mu) ** 2).sum(-1, keepdim=True) / 9  # biased variance
    torch.testing.assert_close(tc.layer_norm_reference(x, w, b, 1e-5), (x - mu) / torch.sqrt(sigma2 + 1e-5) * w + b)


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


@pytest.mark.parametrize("eps", [None, 0.1])
@pytest.mark.parametrize(
    "ours, theirs, default_eps", [(tc.LayerNorm, nn.LayerNorm, 1e-5), (tc.RMSNorm, nn.RMSNorm, 1e-6)]
)
def test_norm_modules_default_and_explicit_eps_match_torch(ours, theirs, default_eps, eps):
    module = (ours(D) if eps is None else ours(D, eps=eps)).double()
    expected_eps = default_eps if eps is None else eps
    assert module.eps == expected_eps
    torch.testing.assert_close(module(SMALL), theirs(D, eps=expected_eps, dtype=torch.float64)(SMALL))


@pytest.mark.parametrize("eps", [None, 0.1])
@pytest.mark.parametrize(
    "name, theirs, default_eps", [("layernorm", nn.LayerNorm, 1e-5), ("rmsnorm", nn.RMSNorm, 1e-6)]
)
def test_build_norm_keeps_each_norms_default_eps_or_passes_eps_on(name, theirs, default_eps, eps):
    norm = tc.build_norm(name, D, eps=eps).double()
    expected_eps = default_eps if eps is None else eps
    assert norm.eps == expected_eps
    torch.testing.assert_close(norm(SMALL), theirs(D, eps=expected_eps, dtype=torch.float64)(SMALL))


def test_build_norm_layernorm_bias_is_on_by_default_and_can_be_dropped():
    assert tc.build_norm("layernorm", D).bias.shape == (D,)
    assert tc.build_norm("layernorm", D, bias=False).bias is None


def test_reference_functions_default_eps_and_no_affine_match_torch():
    plain_ln = nn.LayerNorm(D, eps=1e-5, elementwise_affine=False)
    plain_rms = nn.RMSNorm(D, eps=1e-6, elementwise_affine=False)
    torch.testing.assert_close(tc.layer_norm_reference(SMALL, None, None), plain_ln(SMALL))
    torch.testing.assert_close(tc.rms_norm_reference(SMALL, None), plain_rms(SMALL))


@pytest.mark.parametrize("cls", [tc.LayerNorm, tc.RMSNorm])
def test_norm_errors_name_the_bad_values(cls):
    with pytest.raises(ValueError, match=r"^dim must be positive, got 0$"):
        cls(0)
    with pytest.raises(ValueError, match=r"^eps must be positive, got 0$"):
        cls(4, eps=0)
    with pytest.raises(ValueError, match=r"^last dim of x must be 4, got \(2, 5\)$"):
        cls(4)(torch.randn(2, 5))


def test_build_norm_rejects_unknown_names():
    message = "unknown norm 'batchnorm'; expected one of ('layernorm', 'rmsnorm')"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        tc.build_norm("batchnorm", 4)


def test_build_norm_keeps_each_norms_eps_default_and_refuses_a_bias_for_rmsnorm():
    assert tc.build_norm("layernorm", 4).eps == 1e-5 and tc.build_norm("rmsnorm", 4).eps == 1e-6
    assert tc.build_norm("rmsnorm", 4, eps=0.1).eps == 0.1 and tc.build_norm("layernorm", 4, bias=False).bias is None
    assert isinstance(tc.build_norm("rmsnorm", 4, bias=False), tc.RMSNorm)
    with pytest.raises(ValueError, match=r"^rmsnorm has no bias, got bias=True$"):
        tc.build_norm("rmsnorm", 4, bias=True)
    # models built from a config: the config's eps reaches every norm, None keeps the default
    gpt = tc.MiniGPT(tc.GPTConfig(10, context_length=4, d_model=8, num_heads=2, num_layers=1, norm="rmsnorm"))
    assert {m.eps for m in gpt.modules() if isinstance(m, tc.RMSNorm)} == {1e-6}
    cfg = tc.TransformerConfig(10, 10, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, eps=0.01)
    assert {m.eps for m in tc.Transformer(cfg).modules() if isinstance(m, tc.LayerNorm)} == {0.01}
