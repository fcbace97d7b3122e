"""tc.analysis: attention statistics, the residual stream, curvature by power iteration."""

import math

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import analysis


def _causal_uniform(N=2, H=3, T=6):
    return tc.causal_mask(T).float().div(torch.arange(1, T + 1)[:, None]).expand(N, H, T, T)


def test_normalized_entropy_is_one_for_uniform_rows_and_zero_for_one_hot():
    assert analysis.normalized_entropy(_causal_uniform()) == pytest.approx(1.0, abs=1e-6)
    one_hot = torch.zeros(1, 2, 5, 5)
    one_hot[..., 0] = 1.0
    assert analysis.normalized_entropy(one_hot) == pytest.approx(0.0, abs=1e-6)


def test_mean_distance_counts_query_offset():
    T = 10
    A = torch.zeros(1, 2, T - 4, T)
    for r in range(T - 4):  # query i = r + 4: head 0 looks at itself, head 1 at key 0
        A[0, 0, r, r + 4] = 1.0
        A[0, 1, r, 0] = 1.0
    d = analysis.mean_distance(A, first_query=4)
    torch.testing.assert_close(d, torch.tensor([0.0, sum(range(4, T)) / (T - 4)]))


def test_mean_pairwise_tv_is_zero_for_equal_heads_and_one_for_disjoint():
    assert analysis.mean_pairwise_tv(_causal_uniform()) == pytest.approx(0.0)
    A = torch.zeros(1, 2, 3, 4)
    A[0, 0, :, 0] = 1.0
    A[0, 1, :, 1] = 1.0
    assert analysis.mean_pairwise_tv(A) == pytest.approx(1.0)


def test_head_stats_matches_the_parts_on_a_minigpt():
    tc.set_seed(0)
    m = tc.MiniGPT(tc.GPTConfig(vocab_size=11, context_length=12, d_model=16, num_heads=2, num_layers=2))
    idx = torch.randint(0, 11, (3, 12))
    stats = analysis.head_stats(m, idx, first_query=4)
    assert len(stats) == 2
    for distance, tv in stats:
        assert distance.shape == (2,) and 0 <= tv <= 1
        assert (distance > 0).all() and (distance < 11).all()


def test_no_residual_drops_both_skips():
    tc.set_seed(0)
    block = tc.TransformerBlock.gpt(8, 2, 32, norm_first=True)
    x = torch.randn(2, 5, 8)
    out = analysis.NoResidual(block)(x)
    expected = block.ffn(block.norm2(block.self_attn(block.norm1(x), is_causal=True)))
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out + x, block(x))


def test_token_spread_zero_for_identical_positions():
    h = torch.randn(2, 1, 4).expand(2, 7, 4)
    assert analysis.token_spread(h) == pytest.approx(0.0, abs=1e-6)
    assert analysis.token_spread(torch.randn(2, 7, 4)) > 0.5


def test_residual_stds_and_flat_init():
    tc.set_seed(0)
    m = tc.MiniGPT(tc.GPTConfig(vocab_size=11, context_length=8, d_model=16, num_heads=2, num_layers=3))
    idx = torch.randint(0, 11, (2, 8))
    stds = analysis.residual_stds(m, idx)
    assert stds.shape == (4,)
    assert stds[0] == pytest.approx(m.pos_emb(m.tok_emb(idx)).std().item())
    before = m.blocks[0].ffn.w2.weight.std().item()
    assert analysis.flat_residual_init(m, std=0.02) is m
    assert m.blocks[0].ffn.w2.weight.std().item() > 2 * before  # 1/sqrt(6) undone
    assert m.blocks[2].self_attn.out_proj.weight.std().item() == pytest.approx(0.02, rel=0.2)


def test_curvature_power_iteration_finds_the_top_eigenvalue_of_a_quadratic():
    eig = torch.tensor([5.0, 1.0, 0.5, 0.1])

    class Quadratic(nn.Module):  # loss 0.5 * sum(eig * w^2): Hessian diag(eig)
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x, y):
            return None, 0.5 * (eig * self.w**2).sum()

    g = torch.Generator().manual_seed(0)
    kappa, top = analysis.curvature(Quadratic(), None, None, g, iters=60, n_random=200)
    assert top == pytest.approx(5.0, rel=1e-3)
    rms = math.sqrt((eig**2).mean().item())  # E||Hu||^2 = ||H||_F^2 / P
    assert kappa == pytest.approx(rms, rel=0.25)
    assert kappa < top


def test_landscape_run_is_reproducible_and_residual_is_smoother_at_init():
    data = torch.randint(0, 9, (2000,))
    a = analysis.landscape_run(data, 9, seed=3, residual=True, steps=2)
    b = analysis.landscape_run(data, 9, seed=3, residual=True, steps=2)
    c = analysis.landscape_run(data, 9, seed=3, residual=False, steps=2)
    assert a == b and len(a.losses) == 2
    assert c.at_init[1] > a.at_init[1]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: analysis.normalized_entropy(torch.ones(2, 3, 4)), r"\(2, 3, 4\)"),
        (lambda: analysis.normalized_entropy(torch.ones(1, 1, 3, 4)), r"\(1, 1, 3, 4\)"),
        (lambda: analysis.mean_pairwise_tv(torch.ones(1, 1, 3, 3)), r"\(1, 1, 3, 3\)"),
        (lambda: analysis.mean_distance(torch.ones(1, 2, 3, 3), first_query=-1), "-1"),
        (lambda: analysis.token_spread(torch.ones(2, 3, 4, 5)), r"\(2, 3, 4, 5\)"),
        (lambda: analysis.flat_residual_init(nn.Module(), std=-0.1), "-0.1"),
        (lambda: analysis.curvature(nn.Linear(2, 2), None, None, torch.Generator(), iters=0), "0"),
        (lambda: analysis.landscape_run(torch.zeros(100, dtype=torch.long), 5, seed=-2), "-2"),
    ],
)
def test_bad_values_raise_value_error_naming_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_types_raise_type_error():
    with pytest.raises(TypeError, match="Linear"):
        analysis.NoResidual(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="list"):
        analysis.token_spread([[1.0]])
    with pytest.raises(TypeError, match="residual"):
        analysis.landscape_run(torch.zeros(100, dtype=torch.long), 5, seed=0, residual=1)


def test_lazy_submodule():
    assert tc.analysis is analysis
