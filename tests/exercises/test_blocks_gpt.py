"""The Pre-LN block and the GPT model.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex

from .support import GeluFeedForward, assert_passes, assert_rejects, assert_skeleton

# 8. Transformer block and GPT
# ---------------------------------------------------------------------------


def make_block(mistake=None, ln_names=("norm1", "norm2")):
    class Block(nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()
            setattr(self, ln_names[0], nn.LayerNorm(d_model))
            setattr(self, ln_names[1], nn.LayerNorm(d_model))
            self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
            self.ffn = GeluFeedForward(d_model, 4 * d_model)

        def forward(self, x):
            L = x.size(1)
            attn_mask = {"no_causal": None, "inverted": ~tc.causal_mask(L)}.get(mistake, tc.causal_mask(L))
            ln1, ln2 = getattr(self, ln_names[0]), getattr(self, ln_names[1])

            def attn(h):
                return self.self_attn(h, h, h, attn_mask)

            if mistake == "post_ln":
                x = ln1(x + attn(x))
                return ln2(x + self.ffn(x))
            if mistake == "no_res_attn":
                x = attn(ln1(x))
                return x + self.ffn(ln2(x))
            if mistake == "no_res_ffn":
                return self.ffn(ln2(x + attn(ln1(x))))
            if mistake == "res_from_norm":
                h = ln1(x)
                x = h + attn(h)
                h = ln2(x)
                return h + self.ffn(h)
            if mistake == "parallel":
                return x + attn(ln1(x)) + self.ffn(ln2(x))
            if mistake == "norm1_twice":
                x = x + attn(ln1(x))
                return x + self.ffn(ln1(x))
            x = x + attn(ln1(x))
            return x + self.ffn(ln2(x))

    return Block


class BlockSkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError("写出 norm1, self_attn, norm2, ffn")


def test_transformer_block(capsys):
    assert_passes(ex.check_transformer_block, make_block(), capsys)
    assert_skeleton(ex.check_transformer_block, BlockSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="no_res_attn"), "少了注意力子层的残差连接", id="missing residual (attention)"),
        pytest.param(dict(mistake="no_res_ffn"), "少了 FFN 子层的残差连接", id="missing residual (FFN)"),
        pytest.param(dict(mistake="post_ln"), "Post-LN", id="post-LN instead of pre-LN"),
        pytest.param(dict(mistake="no_causal"), "因果掩码", id="no causal mask"),
        pytest.param(dict(mistake="inverted"), "方向", id="causal mask inverted"),
        pytest.param(dict(mistake="res_from_norm"), "归一化之前的 x", id="residual from the normalised x"),
        pytest.param(dict(mistake="parallel"), "串行", id="parallel sublayers"),
        pytest.param(dict(mistake="norm1_twice"), "norm2", id="norm1 used twice"),
        pytest.param(dict(ln_names=("ln1", "ln2")), "缺少属性 norm1", id="other names"),
    ],
)
def test_transformer_block_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_transformer_block, make_block(**kwargs), keyword, capsys)


def make_gpt(mistake=None, block=None, names=("norm_f",), tie=False):
    Block = block or make_block()

    class GPT(nn.Module):
        def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Embedding(context_length, d_model)
            self.blocks = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
            setattr(self, names[0], nn.LayerNorm(d_model))
            self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
            if tie:
                self.lm_head.weight = self.tok_emb.weight

        def forward(self, input_ids):
            N, L = input_ids.shape
            pos = input_ids if mistake == "pos_by_id" else torch.arange(L)
            x = self.tok_emb(input_ids) + (0 if mistake == "no_pos" else self.pos_emb(pos))
            h = x
            for blk in self.blocks:
                h = blk(x if mistake == "same_input" else h)
            if mistake != "no_norm_f":
                h = getattr(self, names[0])(h)
            logits = self.lm_head(h)
            if mistake == "softmax":
                return torch.softmax(logits, -1)
            if mistake == "last":
                return logits[:, -1]
            if mistake == "flat":
                return logits.view(N * L, -1)
            if mistake == "tuple":
                return logits, None
            return logits

    return GPT


class GPTSkeleton(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()

    def forward(self, input_ids):
        pass


class MiniGPTModules(nn.Module):
    """tc.MiniGPT's own modules under the exercise's contract: the same names, with the
    learned position table itself as pos_emb."""

    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()
        cfg = tc.GPTConfig(vocab_size=vocab_size, context_length=context_length, d_model=d_model,
                           num_heads=num_heads, num_layers=num_layers, dropout=0.0,
                           positional="learned", activation="gelu")  # fmt: skip
        gpt = tc.MiniGPT(cfg)
        self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb.embedding
        self.blocks, self.norm_f, self.lm_head = gpt.blocks, gpt.norm_f, gpt.lm_head
        self.gpt = [gpt]  # not a submodule: its parameters are the ones above

    def forward(self, input_ids):
        return self.gpt[0](input_ids)


def test_gpt(capsys):
    for cls in (make_gpt(), make_gpt(tie=True), make_gpt(mistake="tuple"), MiniGPTModules):
        assert_passes(ex.check_gpt, cls, capsys)
    assert_skeleton(ex.check_gpt, GPTSkeleton, capsys)


@pytest.mark.parametrize(
    "kwargs, keyword",
    [
        pytest.param(dict(mistake="no_pos"), "忘了加位置嵌入", id="no position embedding"),
        pytest.param(dict(mistake="pos_by_id"), "torch.arange(L)", id="positions looked up by token id"),
        pytest.param(dict(mistake="no_norm_f"), "norm_f", id="no final norm"),
        pytest.param(dict(mistake="softmax"), "未经 softmax", id="returns probabilities"),
        pytest.param(dict(mistake="same_input"), "上一个块的输出", id="every block gets the embeddings"),
        pytest.param(dict(mistake="last"), "只返回了最后一个位置", id="last position only"),
        pytest.param(dict(mistake="flat"), "展平", id="flattened logits"),
        pytest.param(dict(block=make_block("no_causal")), "因果掩码", id="block without causal mask"),
        pytest.param(dict(block=make_block("post_ln")), "check_transformer_block", id="post-LN block"),
        pytest.param(dict(names=("ln_final",)), "缺少属性 norm_f", id="other names"),
    ],
)
def test_gpt_rejects(kwargs, keyword, capsys):
    assert_rejects(ex.check_gpt, make_gpt(**kwargs), keyword, capsys)
