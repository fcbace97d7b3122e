"""The checker of chapter 1's capstone, the whole translation model: the page's
``MyTransformer`` skeleton (its ``__init__`` given), correct ``forward``s written in
several styles, and hand-written mistakes, each with the hint that names it."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course.exercises import _protocol, translation_model

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton


class PageDecoderLayer(nn.Module):
    """The page's decoder layer (chapter 1's solution, as printed)."""

    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.cross_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.ffn = tc.FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def forward(self, x, memory, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, is_causal=True))
        x = self.norm2(x + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
        return self.norm3(x + self.ffn(x))


class WrongDecoderLayer(PageDecoderLayer):
    """A decoder layer without the cross-attention's residual."""

    def forward(self, x, memory, memory_mask=None):
        x = self.norm1(x + self.self_attn(x, is_causal=True))
        x = self.norm2(self.cross_attn(x, memory, memory, attn_mask=memory_mask))
        return self.norm3(x + self.ffn(x))


class MyTransformer(nn.Module):
    """The page's skeleton, as printed."""

    def __init__(self, cfg, decoder_layer=PageDecoderLayer):
        super().__init__()
        E, H, d_ff, ctx = cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.context_length
        self.src_tok_emb = nn.Embedding(cfg.src_vocab_size, E)
        self.tgt_tok_emb = nn.Embedding(cfg.tgt_vocab_size, E)
        self.src_pos_emb = tc.SinusoidalPositionalEncoding(E, max_len=ctx)
        self.tgt_pos_emb = tc.SinusoidalPositionalEncoding(E, max_len=ctx)
        self.encoder_blocks = nn.ModuleList(tc.TransformerBlock(E, H, d_ff) for _ in range(cfg.num_encoder_layers))
        self.decoder_blocks = nn.ModuleList(decoder_layer(E, H, d_ff) for _ in range(cfg.num_decoder_layers))
        self.encoder_norm_f, self.decoder_norm_f = nn.LayerNorm(E), nn.LayerNorm(E)
        self.lm_head = nn.Linear(E, cfg.tgt_vocab_size)
        self.pad_id = cfg.pad_id

    def forward(self, src, tgt):
        # 在这里写你的代码：编码、解码、输出层
        raise NotImplementedError


class SolutionTransformer(MyTransformer):
    """The page's solution."""

    def forward(self, src, tgt):
        src_mask = (src != self.pad_id)[:, None, None, :]
        scale = math.sqrt(self.src_tok_emb.embedding_dim)
        x = self.src_pos_emb(self.src_tok_emb(src) * scale)
        for block in self.encoder_blocks:
            x = block(x, attn_mask=src_mask)
        memory = self.encoder_norm_f(x)
        y = self.tgt_pos_emb(self.tgt_tok_emb(tgt) * scale)
        for block in self.decoder_blocks:
            y = block(y, memory, memory_mask=src_mask)
        return self.lm_head(self.decoder_norm_f(y))


class AdditiveMaskTransformer(MyTransformer):
    """Correct: an additive float mask (0 / −inf), ``** 0.5``, encode/decode helpers."""

    def encode(self, src, mask):
        E = self.src_tok_emb.weight.size(1)
        x = self.src_pos_emb(self.src_tok_emb(src) * E**0.5)
        for block in self.encoder_blocks:
            x = block(x, attn_mask=mask)
        return self.encoder_norm_f(x)

    def forward(self, src, tgt):
        mask = torch.zeros(src.shape, dtype=torch.float32).masked_fill(src == self.pad_id, float("-inf"))
        mask = mask[:, None, None, :]
        memory = self.encode(src, mask)
        y = self.tgt_pos_emb(self.tgt_tok_emb(tgt) * self.tgt_tok_emb.embedding_dim**0.5)
        for block in self.decoder_blocks:
            y = block(y, memory, mask)  # memory_mask by position
        return self.lm_head(self.decoder_norm_f(y))


class EinsumTransformer(MyTransformer):
    """Correct: tables indexed by hand, tc.padding_mask, index loops, lm_head by einsum."""

    def forward(self, src, tgt):
        mask = tc.padding_mask(src, self.pad_id)
        E = self.lm_head.in_features
        x = self.src_pos_emb(self.src_tok_emb.weight[src] * math.sqrt(E))
        for i in range(len(self.encoder_blocks)):
            x = self.encoder_blocks[i](x, mask)
        memory = self.encoder_norm_f(x)
        y = self.tgt_tok_emb.weight[tgt] * math.sqrt(E)
        y = y + self.tgt_pos_emb.pe[: tgt.size(1)]
        for layer in self.decoder_blocks:
            y = layer(y, memory, memory_mask=mask)
        h = F.layer_norm(y, (E,), self.decoder_norm_f.weight, self.decoder_norm_f.bias)
        return torch.einsum("nle,ve->nlv", h, self.lm_head.weight) + self.lm_head.bias


def test_transformer_accepts(capsys):
    for cls in (SolutionTransformer, AdditiveMaskTransformer, EinsumTransformer):
        assert_passes(ex.check_transformer, cls, capsys)
    assert_passes(ex.check_transformer, SolutionTransformer, capsys, solution=True)
    assert_skeleton(ex.check_transformer, MyTransformer, capsys)


def test_transformer_accepts_a_bound_decoder_layer(capsys):
    # learner test 25a, 1.18: the learner's decoder layer swapped in by functools.partial
    bound = functools.partial(SolutionTransformer, decoder_layer=PageDecoderLayer)
    assert_passes(ex.check_transformer, bound, capsys)
    ex.check_transformer(bound)
    assert "SolutionTransformer" in capsys.readouterr().out
    with pytest.raises(ex.ExerciseError, match="实例"):  # an instance is still no class
        ex.check_transformer(functools.partial(len, []))


def test_the_passed_weights_match_a_trained_model():
    """What the page does after the check: a trained tc.Transformer's weights copied
    into the learner's model give the same logits."""
    cfg = tc.TransformerConfig(10, 12, d_model=16, num_heads=2, num_encoder_layers=1,
                               num_decoder_layers=1, d_ff=32, dropout=0.1, context_length=8)  # fmt: skip
    model = tc.Transformer(cfg).eval()
    mine = SolutionTransformer(cfg).eval()
    ex.copy_parameters(model, mine)
    src, tgt = torch.tensor([[4, 5, 6, 0], [7, 8, 0, 0]]), torch.tensor([[1, 9, 3], [1, 11, 0]])
    with torch.no_grad():
        assert torch.allclose(mine(src, tgt), model(src, tgt), atol=1e-5)


def test_transformer_progress(capsys):
    key = ("1.18", "拼出整个翻译模型")
    ex.check_transformer(MyTransformer, exercise="1.18")
    assert _protocol.RESULTS[key] == (_protocol.SKELETON, "MyTransformer")
    ex.check_transformer(SolutionTransformer, exercise="1.18")
    assert _protocol.RESULTS[key] == (_protocol.PASSED, "SolutionTransformer")
    capsys.readouterr()
    ex.progress(1)
    assert "✓ 练习 1.18  拼出整个翻译模型（SolutionTransformer）：通过" in capsys.readouterr().out
    del _protocol.RESULTS[key]


def make_transformer(mistake):
    """The solution with one hand-written mistake."""

    class Wrong(MyTransformer):
        def embed(self, table, pos, ids, side):
            E = table.embedding_dim
            scale = {"no_scale": 1, f"no_scale_{side}": 1, "scale_twice": E}.get(mistake, E**0.5)
            if mistake in ("scale_after_pos", f"scale_after_pos_{side}"):
                return pos(table(ids)) * scale
            if mistake == "pos_on_ids":
                return pos(ids) + table(ids) * scale
            if mistake in ("no_pos", f"no_pos_{side}"):
                return table(ids) * scale
            return pos(table(ids) * scale)

        def forward(self, src, tgt):
            if mistake == "shift_inside":
                tgt = tgt[:, :-1]
            pad = 0 if mistake == "pad_zero" else self.pad_id
            src_mask = (src == pad if mistake == "mask_inverted" else src != pad)[:, None, None, :]
            if mistake == "mask_2d":
                src_mask = src != pad
            if mistake == "mask_3d":  # learner test 22a: (N, 1, S)
                src_mask = (src != pad)[:, None, :]
            enc_mask = None if mistake in ("no_src_mask", "no_encoder_mask") else src_mask
            if mistake == "encoder_causal":
                enc_mask = src_mask & tc.causal_mask(src.size(1))
            mem_mask = None if mistake in ("no_src_mask", "no_memory_mask") else src_mask
            if mistake == "tgt_mask_as_memory":
                mem_mask = (tgt != self.pad_id)[:, None, None, :]
            if mistake == "causal_as_memory_mask":
                mem_mask = tc.causal_mask(tgt.size(1))
            x = x0 = self.embed(self.src_tok_emb, self.src_pos_emb, src, "src")
            for block in self.encoder_blocks:  # learner test 24a: every block fed x0
                x = block(x0 if mistake == "encoder_not_chained" else x, attn_mask=enc_mask)
                if mistake == "norm_each_layer":  # learner test 34a, 1.18
                    x = self.encoder_norm_f(x)
            enc_norm, dec_norm = self.encoder_norm_f, self.decoder_norm_f
            if mistake == "final_norms_swapped":
                enc_norm, dec_norm = dec_norm, enc_norm
            if mistake == "norm_each_layer":
                enc_norm = dec_norm = nn.Identity()
            memory = x if mistake in ("memory_before_norm", "no_final_norms") else enc_norm(x)
            if mistake == "src_table_for_tgt":
                y = self.tgt_pos_emb(self.src_tok_emb(tgt) * math.sqrt(self.lm_head.in_features))
            else:
                y = self.embed(self.tgt_tok_emb, self.tgt_pos_emb, tgt, "tgt")
            y0 = y
            for block in self.decoder_blocks:
                y = block(y0 if mistake == "decoder_not_chained" else y, memory, memory_mask=mem_mask)
                if mistake == "norm_each_layer":
                    y = self.decoder_norm_f(y)
            if mistake == "lm_head_before_norm":
                return self.decoder_norm_f(self.lm_head(y))
            if mistake == "no_lm_head":
                return dec_norm(y)
            logits = self.lm_head(y if mistake in ("no_decoder_norm", "no_final_norms") else dec_norm(y))
            return logits.softmax(-1) if mistake == "softmax" else logits

    Wrong.__name__ = f"Transformer_{mistake}"
    return Wrong


class WrongLayerTransformer(SolutionTransformer):
    """Right forward, a wrong decoder layer swapped in."""

    def __init__(self, cfg):
        super().__init__(cfg, decoder_layer=WrongDecoderLayer)


MISTAKES = [
    ("no_scale", "词嵌入没有乘 √E"),
    ("no_scale_src", "源句的词嵌入没有乘 √E"),
    ("no_scale_tgt", "目标句的词嵌入没有乘 √E"),
    ("scale_twice", "乘了两次 √E"),
    ("scale_after_pos", "√E 乘在了加位置编码之后"),
    ("scale_after_pos_src", "源句的 √E 乘在了加位置编码之后"),  # learner test 22a
    ("scale_after_pos_tgt", "目标句的 √E 乘在了加位置编码之后"),
    ("no_pos", "没有加位置编码"),
    ("no_pos_src", "源句没有加位置编码"),
    ("no_pos_tgt", "目标句没有加位置编码"),
    ("pos_on_ids", "它加在嵌入向量 (N, S, E) 上"),
    ("src_table_for_tgt", "目标句查了源句的词表 src_tok_emb"),
    ("no_src_mask", "源句的填充掩码一处也没用"),
    ("no_encoder_mask", "编码器层没有用源句的填充掩码"),
    ("no_memory_mask", "解码器层没有收到 memory_mask"),
    ("mask_inverted", "填充掩码反了"),
    ("mask_2d", "要有形状 (N, 1, 1, S)"),
    ("mask_3d", "填充掩码是三维的 (N, 1, S)"),
    ("pad_zero", "填充编号写死成了 0：这一批的 pad_id 是 3"),
    ("tgt_mask_as_memory", "memory_mask 要用源句的填充掩码"),
    ("causal_as_memory_mask", "因果掩码 (L, L) 传给了交叉注意力"),
    ("encoder_causal", "编码器用了因果掩码"),
    ("memory_before_norm", "memory 取在了 encoder_norm_f 之前"),
    ("final_norms_swapped", "encoder_norm_f 与 decoder_norm_f 用反了"),
    ("no_decoder_norm", "lm_head 之前少了 decoder_norm_f"),
    ("no_final_norms", "两个最后的归一化都漏了"),  # learner test 10a, 1.18
    ("encoder_not_chained", "编码器层没有串起来"),  # learner test 24a, 1.18
    ("decoder_not_chained", "解码器层没有串起来"),
    ("lm_head_before_norm", "decoder_norm_f 作用在了 lm_head 的输出"),
    ("no_lm_head", "少了最后的 lm_head"),
    ("softmax", "未经 softmax"),
    ("shift_inside", "forward 里又把 tgt 移了一位"),
    ("norm_each_layer", "每一层之后都做了一次"),
]
REJECTS = [pytest.param(ex.check_transformer, make_transformer(m), k, id=m) for m, k in MISTAKES]


@pytest.mark.parametrize(("checker", "wrong", "keyword"), REJECTS)
def test_transformer_mistakes(checker, wrong, keyword, capsys):
    assert_rejects(checker, wrong, keyword, capsys)


def test_a_wrong_decoder_layer_is_named(capsys):
    assert_rejects(ex.check_transformer, WrongLayerTransformer, "decoder_blocks[0] 与 tc.DecoderLayer 不一致", capsys)


def test_every_transformer_hint_is_reached(capsys):
    tables = {
        "TRANSFORMER_HINTS": translation_model.TRANSFORMER_HINTS,
        "TRANSFORMER_CRASHES": translation_model.TRANSFORMER_CRASHES,
    }
    assert_every_hint_reached(tables, REJECTS, capsys)
