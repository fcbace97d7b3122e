"""Multi-head attention.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import math

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex

from .support import assert_passes, assert_rejects, assert_skeleton

# 3. multi-head attention
# ---------------------------------------------------------------------------


def make_mha(split="ok", merge="ok", scale="head", dim=-1, masking="ok", out_proj=True, source="ok",
             heads=None, bias=True, names=("q_proj", "k_proj", "v_proj", "out_proj")):  # fmt: skip
    class Candidate(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.h = num_heads if heads is None else heads
            for n in names:
                setattr(self, n, nn.Linear(d_model, d_model, bias=bias))
            self.lin = [getattr(self, n) for n in names]

        def forward(self, Q, K, V, attn_mask=None):
            N, L, E = Q.shape
            H, D = self.h, E // self.h
            if source == "q":
                K = V = Q
            q, k, v = (lin(x) for lin, x in zip(self.lin[:3], (Q, K, V), strict=True))

            def split_heads(x):
                if split == "view":
                    return x.reshape(N, H, x.size(1), D)
                return x.view(N, x.size(1), H, D).transpose(1, 2)

            q, k, v = split_heads(q), split_heads(k), split_heads(v)
            scores = q @ k.transpose(-2, -1)
            if scale == "head":
                scores = scores / math.sqrt(D)
            elif scale == "model":
                scores = scores / math.sqrt(E)
            if attn_mask is not None and masking != "ignored":
                scores = scores.masked_fill(~attn_mask if masking == "ok" else attn_mask, float("-inf"))
            out = torch.softmax(scores, dim=dim) @ v
            out = out.reshape(N, L, E) if merge == "view" else out.transpose(1, 2).reshape(N, L, E)
            return self.lin[3](out) if out_proj else out

    return Candidate


class MHASkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()

    def forward(self, Q, K, V, attn_mask=None):
        pass


class MHAInitNotImplemented(nn.Module):
    def __init__(self, d_model, num_heads):
        raise NotImplementedError


class MHANoSuper(nn.Module):
    def __init__(self, d_model, num_heads):
        pass

    def forward(self, Q, K, V, attn_mask=None):
        pass


def test_multi_head_attention_accepts(capsys):
    # the package's own class under the same names
    for cls in (tc.MultiHeadAttention, make_mha(), make_mha(bias=False)):
        assert_passes(ex.check_multi_head_attention, cls, capsys)


@pytest.mark.parametrize("skeleton", [MHASkeleton, MHAInitNotImplemented, MHANoSuper])
def test_multi_head_attention_skeleton(skeleton, capsys):
    assert_skeleton(ex.check_multi_head_attention, skeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(merge="view"), "合并多头时没有先转置", id="heads merged without transposing"),
        pytest.param(dict(split="view"), "拆分多头时直接 view", id="heads split without transposing"),
        pytest.param(dict(split="view", merge="view"), "都少了转置", id="split and merge without transposing"),
        pytest.param(dict(scale="none"), "没有除以 √d_k", id="missing scale"),
        pytest.param(dict(scale="model"), "√d_model", id="scale by sqrt(d_model)"),
        pytest.param(dict(dim=-2), "softmax 的 dim", id="softmax on the wrong axis"),
        pytest.param(dict(out_proj=False), "out_proj", id="no output projection"),
        pytest.param(dict(source="q"), "都用 Q 算了", id="K and V projected from Q"),
        pytest.param(dict(masking="inverted"), "掩码方向可能反了", id="mask inverted"),
        pytest.param(dict(masking="ignored"), "掩码没有起作用", id="mask ignored"),
        pytest.param(dict(heads=1), "没有拆分多头", id="a single head"),
        pytest.param(dict(names=("W_q", "W_k", "W_v", "W_o")), "缺少属性 q_proj", id="other names"),
    ],
)
def test_multi_head_attention_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_multi_head_attention, make_mha(**kwargs), keyword, capsys)
