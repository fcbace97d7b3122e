"""The Pre-LN block and the GPT model: correct variants (nanoGPT-style mask buffers,
SDPA, tying either way, (logits, loss) returns) pass; hand-written learner mistakes are
rejected with a hint that names them; every hint-table entry is reached."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import blocks_gpt

from .support import (
    GeluFeedForward,
    assert_every_hint_reached,
    assert_passes,
    assert_rejects,
    assert_skeleton,
    rejection,
)


class Block(nn.Module):
    """A learner's Pre-LN block with the package's attention and FFN inside."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.ffn = GeluFeedForward(d_model, 4 * d_model)

    def attn(self, h):
        return self.self_attn(h, h, h, attn_mask=tc.causal_mask(h.size(1)))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class BlockMaskBuffer(Block):
    """nanoGPT style: a persistent causal-mask buffer, SDPA with is_causal elsewhere."""

    def __init__(self, d_model, num_heads, context=16):
        super().__init__(d_model, num_heads)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril())

    def attn(self, h):
        L = h.size(1)
        return self.self_attn(h, h, h, attn_mask=self.mask[:L, :L])


class SequentialFeedForward(nn.Module):
    """Learner test 10a (3.2 → 3.5/3.6): w1 and w2 kept, and reused in a Sequential."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.net = nn.Sequential(self.w1, nn.GELU(), self.w2)

    def forward(self, x):
        return self.net(x)


class BlockSequentialFFN(Block):
    """The aliases ffn.net.0.* and ffn.net.2.* are w1's and w2's tensors, not extras."""

    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.ffn = SequentialFeedForward(d_model, 4 * d_model)


class BlockSkeleton(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError("写出 norm1, self_attn, norm2, ffn")


def test_transformer_block_accepts(capsys):
    for cls in (Block, BlockMaskBuffer, BlockSequentialFFN):
        assert_passes(ex.check_transformer_block, cls, capsys)
    assert_skeleton(ex.check_transformer_block, BlockSkeleton, capsys)


# ---------------------------------------------------------------------------
# block mistakes


class NoResidualAttention(Block):
    def forward(self, x):
        x = self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class NoResidualFFN(Block):
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return self.ffn(self.norm2(x))


class NoResidual(Block):
    def forward(self, x):
        return self.ffn(self.norm2(self.attn(self.norm1(x))))


class PostLN(Block):
    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class PostLNFFNOnly(Block):  # learner test 44c, 5.6: x + attn(norm1(x)), then norm2(x + ffn(x))
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return self.norm2(x + self.ffn(x))


class PostLNAttentionOnly(Block):
    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return x + self.ffn(self.norm2(x))


class NoCausalMask(Block):
    def attn(self, h):
        return self.self_attn(h, h, h)


class InvertedMask(Block):
    def attn(self, h):
        return self.self_attn(h, h, h, attn_mask=~tc.causal_mask(h.size(1)))


class TriuMask(Block):  # learner test 24a, 3.5: was blamed on the attention module
    def attn(self, h):
        L = h.size(1)
        return self.self_attn(h, h, h, attn_mask=torch.ones(L, L, dtype=torch.bool).triu())


class ResidualFromNorm(Block):
    def forward(self, x):
        h = self.norm1(x)
        x = h + self.attn(h)
        h = self.norm2(x)
        return h + self.ffn(h)


class ResidualFromNorm1Only(Block):  # learner test: the attention residual adds norm1(x)
    def forward(self, x):
        h = self.norm1(x)
        x = self.attn(h) + h
        return self.ffn(self.norm2(x)) + x


class ResidualFromNorm2Only(Block):  # learner test 27c: the FFN residual adds norm2(x)
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return h + self.ffn(h)


class SequentialFFN(Block):  # learner test 27c, 5.6: right maths, parameters ffn.0/ffn.2
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.ffn = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))


class Parallel(Block):
    def forward(self, x):
        return x + self.attn(self.norm1(x)) + self.ffn(self.norm2(x))


class FFNFromAttentionOnly(Block):
    """Learner test 34a, 3.5: the FFN fed norm2 of the attention output, no residual."""

    def forward(self, x):
        a = self.attn(self.norm1(x))
        x = x + a
        return x + self.ffn(self.norm2(a))


class FFNFromNormedInput(Block):
    """Learner test (5.7): the FFN fed norm2(h), h = norm1(x) from before the attention."""

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h)
        return x + self.ffn(self.norm2(h))


class FFNFromH(Block):  # learner test: the FFN fed h = norm1(x) itself
    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h)
        return x + self.ffn(h)


class KeysValuesFromX(Block):  # learner test 6a, 3.5: self_attn(norm1(x), x, x)
    def forward(self, x):
        x = x + self.self_attn(self.norm1(x), x, x, attn_mask=tc.causal_mask(x.size(1)))
        return x + self.ffn(self.norm2(x))


class Norm1Twice(Block):
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm1(x))


class NoNorm2(Block):
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(x)


class NoNorms(Block):
    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ffn(x)


class FloatTrilMask(Block):
    """A float 0/1 tril fed as a mask: with SDPA it would be added, not a mask."""

    def attn(self, h):
        L = h.size(1)
        mask = torch.ones(L, L).tril()
        q = k = v = h
        sa = self.self_attn
        split = lambda t: t.view(t.size(0), L, sa.num_heads, -1).transpose(1, 2)  # noqa: E731
        out = F.scaled_dot_product_attention(split(sa.q_proj(q)), split(sa.k_proj(k)), split(sa.v_proj(v)),
                                             attn_mask=mask)  # fmt: skip
        return sa.out_proj(out.transpose(1, 2).reshape(h.shape))


class OtherNames(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.ln1 = self.norm1
        del self.norm1

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.norm2(x))


class BiasFreeFFN(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.ffn = tc.FeedForward(d_model, 4 * d_model, activation="gelu", bias=False)


class BiasFreeAttention(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads, bias=False)


class SmallEps(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.norm1, self.norm2 = nn.LayerNorm(d_model, eps=1e-6), nn.LayerNorm(d_model, eps=1e-6)


class NoAffineNorm(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.norm1 = nn.LayerNorm(d_model, elementwise_affine=False)


class UnbiasedLayerNorm(nn.Module):  # learner test 36b: a hand-written LayerNorm with x.var(-1)
    def __init__(self, d_model):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class UnbiasedNorms(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.norm1, self.norm2 = UnbiasedLayerNorm(d_model), UnbiasedLayerNorm(d_model)


class WithDropout(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(super().forward(x))


class TanhGeluFFN(Block):
    """Learner test 7b (5.7): the block's FFN with GELU's tanh approximation."""

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = F.gelu(self.ffn.w1(self.norm2(x)), approximate="tanh")
        return x + self.ffn.w2(h)


class ReluFFN(Block):
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn.w2(F.relu(self.ffn.w1(self.norm2(x))))


class UnusedGate(Block):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.gate = nn.Linear(d_model, d_model)


class NormOnSublayer(Block):
    """Learner test 15 (3.5): the norms on the sublayers' outputs."""

    def forward(self, x):
        x = x + self.norm1(self.attn(x))
        return x + self.norm2(self.ffn(x))


class FFNFirst(Block):
    """Learner test 15 (3.5): the FFN sublayer before the attention."""

    def forward(self, x):
        x = x + self.ffn(self.norm2(x))
        return x + self.attn(self.norm1(x))


class FFNFirstNorm1(Block):
    """The same, norm1 before the first sublayer (the FFN)."""

    def forward(self, x):
        x = x + self.ffn(self.norm1(x))
        return x + self.attn(self.norm2(x))


class ResidualInPlace(Block):  # learner test 34a, 1.3/2.5/3.5: x += sublayer(x)
    def forward(self, x):
        x += self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class FFNResidualInPlace(Block):  # learner test 38c, 5.6: x += ffn(norm2(x)) after x = x + ...
    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x += self.ffn(self.norm2(x))
        return x


def block_check(cls, keyword, id):
    return pytest.param(ex.check_transformer_block, cls, keyword, id=id)


BLOCK_REJECTS = [
    block_check(ResidualInPlace, "原地改动了传进来的第 1 个张量参数", "residual added in place"),
    block_check(FFNResidualInPlace, "反向传播却报错", "FFN residual added in place"),
    block_check(NoResidualAttention, "少了注意力子层的残差连接", "missing residual (attention)"),
    block_check(NoResidualFFN, "少了 FFN 子层的残差连接", "missing residual (FFN)"),
    block_check(NoResidual, "两个子层都少了残差连接", "no residual at all"),
    block_check(PostLN, "Post-LN", "post-LN instead of pre-LN"),
    block_check(PostLNFFNOnly, "FFN 子层写成了 Post-LN", "post-LN FFN sublayer"),
    block_check(PostLNAttentionOnly, "注意力子层写成了 Post-LN", "post-LN attention sublayer"),
    block_check(NoCausalMask, "因果掩码", "no causal mask"),
    block_check(InvertedMask, "方向", "causal mask inverted"),
    block_check(TriuMask, "块里建的掩码是上三角（.triu()）", "triu mask built in the block"),
    block_check(ResidualFromNorm, "归一化之前的 x", "residual from the normalised x"),
    block_check(ResidualFromNorm1Only, "注意力子层的残差加在了 norm1(x) 上", "residual adds norm1(x)"),
    block_check(ResidualFromNorm2Only, "FFN 子层的残差加在了 norm2(x) 上", "residual adds norm2(x)"),
    block_check(Parallel, "串行", "parallel sublayers"),
    block_check(FFNFromAttentionOnly, "FFN 的输入只有注意力的输出", "FFN fed the attention output alone"),
    block_check(SequentialFFN, "ffn 是 nn.Sequential", "ffn as an nn.Sequential"),
    block_check(FFNFromNormedInput, "FFN 的输入用了注意力之前的 h", "FFN fed norm2(h)"),
    block_check(FFNFromH, "FFN 的输入用了注意力之前的 h", "FFN fed h"),
    block_check(KeysValuesFromX, "键和值用的是原来的 x", "keys and values from x"),
    block_check(NormOnSublayer, "归一化用在了子层的输出上", "norms on the sublayer outputs"),
    block_check(FFNFirst, "两个子层的顺序反了", "FFN before attention"),
    block_check(FFNFirstNorm1, "两个子层的顺序反了", "FFN before attention, norm1 first"),
    block_check(Norm1Twice, "用了两次 norm1", "norm1 used twice"),
    block_check(NoNorm2, "忘了 norm2", "no norm2"),
    block_check(NoNorms, "没有用 norm1 和 norm2", "no norms"),
    block_check(FloatTrilMask, "因果", "float tril as the mask"),
    block_check(OtherNames, "缺少参数 norm1.weight", "other names"),
    block_check(BiasFreeFFN, "缺少偏置", "bias-free FFN"),
    block_check(BiasFreeAttention, "缺少偏置", "bias-free attention"),
    block_check(UnusedGate, "多了参数 gate.bias、gate.weight", "an extra Linear"),
    block_check(SmallEps, "eps", "LayerNorm(eps=1e-6)"),
    block_check(NoAffineNorm, "elementwise_affine=False", "LayerNorm without γ/β"),
    block_check(WithDropout, "dropout", "dropout"),
    block_check(UnbiasedNorms, "无偏方差", "LayerNorm with the unbiased variance"),
    block_check(TanhGeluFFN, "FFN 里用了 GELU 的 tanh 近似", "tanh-GELU FFN"),
    block_check(ReluFFN, "FFN 里激活函数用了 ReLU", "ReLU FFN"),
]


# ---------------------------------------------------------------------------
# GPT


class GPT(nn.Module):
    """A learner's GPT: tied head, learned positions."""

    block = Block

    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.blocks = nn.ModuleList(self.block(d_model, num_heads) for _ in range(num_layers))
        self.norm_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight

    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb(torch.arange(input_ids.size(1)))

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


class GPTTiedOtherWay(GPT):
    def __init__(self, *args):
        super().__init__(*args)
        self.lm_head = nn.Linear(self.tok_emb.embedding_dim, self.tok_emb.num_embeddings, bias=False)
        self.tok_emb.weight = self.lm_head.weight


class GPTSequentialFFN(GPT):
    block = BlockSequentialFFN


class GPTNanoStyle(GPT):
    """Mask buffers in the blocks, forward(idx, targets=None): the loss only when
    targets are given."""

    block = BlockMaskBuffer

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class GPTListReturn(GPT):
    def forward(self, input_ids):
        return [super().forward(input_ids), None]


class GPTLogitsAndLoss(GPT):
    def forward(self, input_ids):
        return super().forward(input_ids), None


class MiniGPTModules(nn.Module):
    """tc.MiniGPT's own modules under the exercise's contract."""

    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()
        cfg = tc.GPTConfig(vocab_size, context_length=context_length, d_model=d_model, num_heads=num_heads,
                           num_layers=num_layers)  # fmt: skip
        gpt = tc.MiniGPT(cfg)
        self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb.embedding
        self.blocks, self.norm_f, self.lm_head = gpt.blocks, gpt.norm_f, gpt.lm_head
        self.gpt = [gpt]  # not a submodule: its parameters are the ones above

    def forward(self, input_ids):
        return self.gpt[0](input_ids)[0]


class GPTSkeleton(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__()

    def forward(self, input_ids):
        pass


def test_gpt_accepts(capsys):
    for cls in (GPT, GPTTiedOtherWay, GPTNanoStyle, MiniGPTModules, GPTSequentialFFN):
        assert_passes(ex.check_gpt, cls, capsys)
    assert_skeleton(ex.check_gpt, GPTSkeleton, capsys)


class GPTResidualInPlace(GPT):  # learner test 34a, 3.6: blocks with x += sublayer(x)
    block = ResidualInPlace


class NoPositions(GPT):
    def embed(self, input_ids):
        return self.tok_emb(input_ids)


class PositionsById(GPT):
    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb(input_ids)


class PositionsFrom1(GPT):
    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb.weight[1 : input_ids.size(1) + 1]


class PositionsFrom1LargerTable(GPT):  # learner test 9a, 3.6: a table of C + 1 rows for 1..L
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        self.pos_emb = nn.Embedding(context_length + 1, d_model)

    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb(torch.arange(1, input_ids.size(1) + 1))


class LastPositions(GPT):
    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb.weight[-input_ids.size(1) :]


class ScaledTokenEmbeddings(GPT):
    """Learner test: token embeddings × √d_model, as in the original Transformer."""

    def embed(self, input_ids):
        scale = self.tok_emb.embedding_dim**0.5
        return self.tok_emb(input_ids) * scale + self.pos_emb(torch.arange(input_ids.size(1)))


class ScaledEmbeddingSum(GPT):
    """Learner test 18a, 3.6: tokens plus positions, the sum × √d_model."""

    def embed(self, input_ids):
        x = self.tok_emb(input_ids) + self.pos_emb(torch.arange(input_ids.size(1)))
        return x * self.tok_emb.embedding_dim**0.5


class PositionsAfterBlocks(GPT):
    def forward(self, input_ids):
        x = self.tok_emb(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x + self.pos_emb(torch.arange(input_ids.size(1)))))


class FinalNormFirst(GPT):
    def forward(self, input_ids):
        x = self.norm_f(self.embed(input_ids))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


class FinalNormAfterEveryBlock(GPT):  # learner test 27c (5.8)
    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = self.norm_f(block(x))
        return self.lm_head(x)


class BlocksReversed(GPT):
    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in reversed(self.blocks):
            x = block(x)
        return self.lm_head(self.norm_f(x))


class FirstBlockOnly(GPT):  # learner test 7a, 3.6
    def forward(self, input_ids):
        return self.lm_head(self.norm_f(self.blocks[0](self.embed(input_ids))))


class NoFinalNorm(GPT):
    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


class Probabilities(GPT):
    def forward(self, input_ids):
        return super().forward(input_ids).softmax(-1)


class SameInput(GPT):
    def forward(self, input_ids):
        x = self.embed(input_ids)
        h = x
        for block in self.blocks:
            h = block(x)
        return self.lm_head(self.norm_f(h))


class LastOnly(GPT):
    def forward(self, input_ids):
        return super().forward(input_ids)[:, -1]


class Flattened(GPT):
    def forward(self, input_ids):
        return super().forward(input_ids).flatten(0, 1)


class WithoutCausal(GPT):
    block = NoCausalMask


class WithUnbiasedNorms(GPT):
    block = UnbiasedNorms


class WithPostLN(GPT):
    block = PostLN


class UntiedHead(GPT):
    def __init__(self, *args):
        super().__init__(*args)
        self.lm_head = nn.Linear(self.tok_emb.embedding_dim, self.tok_emb.num_embeddings, bias=False)


class RepeatedBlock(GPT):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        self.blocks = nn.ModuleList([Block(d_model, num_heads)] * num_layers)


class BiasFreeFFNGPT(GPT):
    block = BiasFreeFFN


class FinalNormNamedLnF(GPT):
    def __init__(self, *args):
        super().__init__(*args)
        self.ln_f = self.norm_f
        del self.norm_f

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class SwappedSizes(GPT):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(context_length, vocab_size, d_model, num_heads, num_layers)


class PositionsByClampedId(GPT):
    """Learner test: pos_emb(input_ids), clamped so that it runs."""

    def embed(self, input_ids):
        positions = input_ids.clamp(max=self.pos_emb.num_embeddings - 1)
        return self.tok_emb(input_ids) + self.pos_emb(positions)


class PositionsReversed(GPT):
    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb(torch.arange(input_ids.size(1)).flip(0))


class PositionsByBatchIndex(GPT):
    """Learner test 34a, 3.6: pos_emb(arange(N)), one row per sequence."""

    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb(torch.arange(input_ids.size(0)))[:, None]


class PlainListOfBlocks(GPT):
    """Learner test: the blocks in a Python list (not registered)."""

    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        del self.blocks
        self.blocks = [Block(d_model, num_heads) for _ in range(num_layers)]


class BlocksReassignedToList(GPT):
    """Learner test: a registered ModuleList replaced by a list (nn.Module raises)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.blocks = list(self.blocks)


class HeadWithBias(GPT):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        self.lm_head = nn.Linear(d_model, vocab_size)
        self.lm_head.weight = self.tok_emb.weight


class AffineFreeFinalNorm(GPT):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        self.norm_f = nn.LayerNorm(d_model, elementwise_affine=False)


class PositionsAsParameter(GPT):  # learner test 31c (5.8): minGPT's pos_emb Parameter
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers):
        super().__init__(vocab_size, context_length, d_model, num_heads, num_layers)
        self.pos_emb = nn.Parameter(torch.zeros(1, context_length, d_model))

    def embed(self, input_ids):
        return self.tok_emb(input_ids) + self.pos_emb[:, : input_ids.size(1)]


class TorchAttentionBlock(Block):  # learner test 31c (5.6b): nn.MultiheadAttention
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.self_attn = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def attn(self, h):
        return self.self_attn(h, h, h, attn_mask=~tc.causal_mask(h.size(1)), need_weights=False)[0]


def test_learner_31c_named_modules(capsys):
    assert_rejects(ex.check_gpt, PositionsAsParameter, "nn.Embedding(context_length, d_model)", capsys)
    assert_rejects(ex.check_transformer_block, TorchAttentionBlock, "in_proj_weight", capsys)


def gpt_check(cls, keyword, id):
    return pytest.param(ex.check_gpt, cls, keyword, id=id)


GPT_REJECTS = [
    gpt_check(GPTResidualInPlace, "反向传播却报错", "residual added in place inside the blocks"),
    gpt_check(NoPositions, "忘了加位置嵌入", "no position embedding"),
    gpt_check(PositionsById, "不是按 token id", "positions looked up by token id (crashes)"),
    gpt_check(PositionsFrom1, "位置应从 0 开始", "positions 1..L"),
    gpt_check(PositionsFrom1LargerTable, "让位置从 1 编号", "positions 1..L, table of C + 1 rows"),
    gpt_check(LastPositions, "最后 L 行", "the table's last L rows"),
    gpt_check(ScaledTokenEmbeddings, "乘了 √d_model", "token embeddings scaled by sqrt(d)"),
    gpt_check(ScaledEmbeddingSum, "嵌入之和）乘了 √d_model", "tokens plus positions scaled by sqrt(d)"),
    gpt_check(NoFinalNorm, "norm_f", "no final norm"),
    gpt_check(PositionsAfterBlocks, "位置嵌入加晚了", "positions added after the blocks"),
    gpt_check(FinalNormFirst, "norm_f 用在了进入块之前", "final norm before the blocks"),
    gpt_check(FinalNormAfterEveryBlock, "norm_f 用在了每个块之后", "final norm after every block"),
    gpt_check(BlocksReversed, "块的顺序反了", "blocks in reverse order"),
    gpt_check(FirstBlockOnly, "只用了第一个块", "blocks[0] only"),
    gpt_check(Probabilities, "未经 softmax", "returns probabilities"),
    gpt_check(SameInput, "上一个块的输出", "every block gets the embeddings"),
    gpt_check(LastOnly, "只返回了最后一个位置", "last position only"),
    gpt_check(Flattened, "展平", "flattened logits"),
    gpt_check(WithoutCausal, "因果掩码", "blocks without causal mask"),
    gpt_check(WithPostLN, "的输出与参考块不一致：这是 Post-LN", "post-LN blocks"),
    gpt_check(WithUnbiasedNorms, "块里的 LayerNorm 用了无偏方差", "blocks' LayerNorm unbiased"),
    gpt_check(UntiedHead, "共享", "untied lm_head"),
    gpt_check(RepeatedBlock, "同一个块对象", "one block object repeated"),
    gpt_check(BiasFreeFFNGPT, "缺少偏置", "bias-free FFN inside"),
    gpt_check(FinalNormNamedLnF, "缺少参数 norm_f.weight", "other names"),
    gpt_check(SwappedSizes, "下标越界", "vocab_size and context_length swapped"),
    gpt_check(GPTLogitsAndLoss, "应只返回 logits", "(logits, loss) returned"),
    gpt_check(GPTListReturn, "应只返回 logits", "[logits, None] returned"),
    gpt_check(PositionsByClampedId, "按 token id 查的", "positions looked up by clamped token id"),
    gpt_check(PositionsReversed, "位置嵌入的顺序反了", "positions reversed"),
    gpt_check(PositionsByBatchIndex, "位置嵌入按批里的序号查了", "positions looked up by batch index"),
    gpt_check(PlainListOfBlocks, "nn.ModuleList", "blocks in a Python list"),
    gpt_check(BlocksReassignedToList, "nn.ModuleList", "ModuleList reassigned to a list (crashes)"),
    gpt_check(HeadWithBias, "lm_head 不应带偏置", "lm_head with a bias"),
    gpt_check(AffineFreeFinalNorm, "elementwise_affine=False", "norm_f without weights"),
]

REJECTS = BLOCK_REJECTS + GPT_REJECTS


class HandAttention(nn.Module):
    """A learner's causal multi-head self-attention written out by hand; ``slip`` names
    the one line written wrong."""

    def __init__(self, d_model, num_heads, slip=""):
        super().__init__()
        self.H, self.slip = num_heads, slip
        self.q_proj, self.k_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.v_proj, self.out_proj = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        N, L, E = x.shape
        H = 1 if self.slip == "one head" else self.H
        D, slip = E // H, self.slip
        k_layer = self.q_proj if slip in ("k from q_proj", "all from q_proj") else self.k_proj
        v_layer = {"v from q_proj": self.q_proj, "all from q_proj": self.q_proj, "v from k_proj": self.k_proj}.get(
            slip, self.v_proj
        )
        if slip == "k and v layers swapped":
            k_layer, v_layer = self.v_proj, self.k_proj

        def split(t):
            if slip in ("split by view", "split and merge by view"):
                return t.view(N, H, L, D)
            return t.view(N, L, H, D).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(k_layer(x)), split(v_layer(x))
        scale = {"no scale": 1.0, "scale by d_model": E**0.5}.get(slip, D**0.5)
        scores = torch.einsum("nhld,nhsd->nhls", q, k) / scale
        mask = tc.causal_mask(L)
        mask = mask.T if slip == "mask transposed" else mask
        fill = -1e9 if slip == "softmax over heads" else float("-inf")
        scores = scores.masked_fill(~mask, fill)
        dim = {"softmax over queries": -2, "softmax over heads": 1}.get(slip, -1)
        o = torch.softmax(scores, dim=dim) @ v
        if slip in ("merge by view", "split and merge by view"):
            o = o.reshape(N, L, E)
        else:
            o = o.transpose(1, 2).reshape(N, L, E)
        return o if slip == "no out_proj" else self.out_proj(o)


def hand_block(slip):
    class HandBlock(Block):
        def __init__(self, d_model, num_heads):
            super().__init__(d_model, num_heads)
            self.self_attn = HandAttention(d_model, num_heads, slip)

        def attn(self, h):
            return self.self_attn(h)

    HandBlock.__name__ = f"Block_{slip.replace(' ', '_')}"
    return HandBlock


def hand_gpt(slip):
    return type(f"GPT_{slip.replace(' ', '_')}", (GPT,), {"block": hand_block(slip)})


# (slip, a phrase of its hint): the attention inside the block written wrong
ATTENTION_SLIPS = [
    ("no scale", "分数没有除以 √d_k"),
    ("scale by d_model", "缩放用了 √d_model"),
    ("split by view", "拆分多头时直接 view"),
    ("merge by view", "合并多头时没有先转置"),
    ("split and merge by view", "拆分和合并多头时都少了转置"),
    ("one head", "没有拆分多头"),
    ("softmax over queries", "softmax 的 dim"),
    ("softmax over heads", "softmax 在头的维度上"),
    ("no out_proj", "忘了最后的输出投影"),
    ("mask transposed", "掩码转置了"),
    ("all from q_proj", "K 和 V 也用 q_proj 投影了"),
    ("k and v layers swapped", "k_proj 和 v_proj 用反了"),
    ("k from q_proj", "键用 q_proj 投影了"),
    ("v from q_proj", "值用 q_proj 投影了"),
    ("v from k_proj", "值用 k_proj 投影了"),
]


REJECTS += [block_check(hand_block(slip), phrase, f"attention: {slip}") for slip, phrase in ATTENTION_SLIPS]


def test_hand_written_attention_passes(capsys):
    assert_passes(ex.check_transformer_block, hand_block(""), capsys, exercise="3.5")
    assert_passes(ex.check_gpt, hand_gpt(""), capsys, exercise="3.6")


@pytest.mark.parametrize(("slip", "phrase"), ATTENTION_SLIPS, ids=[s for s, _ in ATTENTION_SLIPS])
def test_a_slip_inside_the_blocks_attention_is_named(slip, phrase, capsys):
    message = rejection(ex.check_transformer_block, hand_block(slip))
    assert "错在块里的多头注意力" in message and phrase in message, message
    if slip in ("no scale", "split by view", "merge by view"):  # and through the model (3.6)
        message = rejection(ex.check_gpt, hand_gpt(slip))
        assert "blocks[0]" in message and phrase in message, message
    capsys.readouterr()


@pytest.mark.parametrize("checker, candidate, keyword", REJECTS)
def test_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_every_hint_is_reached(capsys):
    tables = {
        "BLOCK_HINTS": blocks_gpt.BLOCK_HINTS,
        "GPT_HINTS": blocks_gpt.GPT_HINTS,
        "GPT_CRASHES": blocks_gpt.GPT_CRASHES,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)


def test_copy_parameters_both_ways():
    ref = blocks_gpt._gpt_reference(11, 6, 12, 3, 2)
    mine = GPTNanoStyle(11, 6, 12, 3, 2)  # with mask buffers
    ex.copy_parameters(ref, mine)
    ids = torch.randint(11, (2, 6))
    torch.testing.assert_close(mine.eval()(ids), ref(ids)[0])
    aliased = GPTSequentialFFN(11, 6, 12, 3, 2)  # ffn.net.0.* copied as ffn.w1.*
    ex.copy_parameters(ref, aliased)
    torch.testing.assert_close(aliased.eval()(ids), ref(ids)[0])
    with pytest.raises(ValueError, match="ln_f"):
        ex.copy_parameters(ref, FinalNormNamedLnF(11, 6, 12, 3, 2))


def test_a_triu_mask_built_in_the_block_is_named_not_blamed_on_the_attention(capsys):
    """Learner test 24a: the output equals an attention that transposes its mask; the
    learner's own attention takes the causal mask right, so the block's mask is named."""
    message = rejection(ex.check_transformer_block, TriuMask)
    assert ".tril()" in message and "错在块里的多头注意力" not in message, message
    message = rejection(ex.check_gpt, type("GPTTriuMask", (GPT,), {"block": TriuMask}))
    assert "blocks[0]" in message and ".tril()" in message, message
