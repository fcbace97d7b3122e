"""Chapter 1's capstone: the whole translation model's ``forward(src, tgt)`` assembled
from its parts (embeddings scaled by √E, positions, the encoder stack with the source
padding mask, ``encoder_norm_f``, the decoder stack with ``memory_mask``,
``decoder_norm_f``, ``lm_head``), named as in :class:`transformer_course.Transformer`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from ..masks import causal_mask
from ..models import Transformer, TransformerConfig
from ._protocol import checker, construct, fail, name_of, run_module, seeded_generator
from ._report import (
    as_tensor,
    check_finite,
    check_float,
    check_shape,
    close,
    first_reproduced,
    where_differs,
)
from .blocks_gpt import _load_into_reference

_STEPS = (
    "x = src_pos_emb(src_tok_emb(src) * √E)，逐个过 encoder_blocks"
    "（attn_mask=src_mask），memory = encoder_norm_f(x)；"
    "y = tgt_pos_emb(tgt_tok_emb(tgt) * √E)，逐个过 decoder_blocks"
    "（memory_mask=src_mask），最后 lm_head(decoder_norm_f(y))。"
)

# (hint, mistake), tried in this order; {pad} is the batch's pad id
TRANSFORMER_HINTS = [
    (
        "词嵌入没有乘 √E：两边都是 tok_emb(ids) * math.sqrt(E)"
        "（E = d_model），再加位置编码。",
        "no_scale",
    ),
    (
        "源句的词嵌入没有乘 √E（目标句乘了）：src_tok_emb(src) * math.sqrt(E)。",
        "no_scale_src",
    ),
    (
        "目标句的词嵌入没有乘 √E（源句乘了）：tgt_tok_emb(tgt) * math.sqrt(E)。",
        "no_scale_tgt",
    ),
    (
        "词嵌入乘了两次 √E（相当于乘 E）：只乘一次，tok_emb(ids) * math.sqrt(E)。",
        "scale_twice",
    ),
    (
        "√E 乘在了加位置编码之后：(嵌入 + 位置编码)·√E 把位置编码也放大了。"
        "先缩放再加：src_pos_emb(src_tok_emb(src) * math.sqrt(E))。",
        "scale_after_pos",
    ),
    (
        "源句的 √E 乘在了加位置编码之后（目标句是先乘再加）：(嵌入 + 位置编码)·√E "
        "把位置编码也放大了。x = src_pos_emb(src_tok_emb(src) * math.sqrt(E))。",
        "scale_after_pos_src",
    ),
    (
        "目标句的 √E 乘在了加位置编码之后（源句是先乘再加）：(嵌入 + 位置编码)·√E "
        "把位置编码也放大了。y = tgt_pos_emb(tgt_tok_emb(tgt) * math.sqrt(E))。",
        "scale_after_pos_tgt",
    ),
    (
        "没有加位置编码：嵌入乘 √E 之后，源句过 src_pos_emb，目标句过 tgt_pos_emb"
        "（它们返回 x + PE）。",
        "no_pos",
    ),
    (
        "源句没有加位置编码（目标句加了）：x = src_pos_emb(src_tok_emb(src) * √E)。",
        "no_pos_src",
    ),
    (
        "目标句没有加位置编码（源句加了）：y = tgt_pos_emb(tgt_tok_emb(tgt) * √E)。",
        "no_pos_tgt",
    ),
    (
        "源句的填充掩码一处也没用：src_mask = (src != self.pad_id)[:, None, None, :]，"
        "编码器层 block(x, attn_mask=src_mask)，"
        "解码器层 block(y, memory, memory_mask=src_mask)。",
        "no_src_mask",
    ),
    (
        "编码器层没有用源句的填充掩码（解码器层用了）："
        "block(x, attn_mask=src_mask)，否则真实词元会注意到填充。",
        "no_encoder_mask",
    ),
    (
        "解码器层没有收到 memory_mask（编码器层用了掩码）：交叉注意力也要屏蔽源句的"
        "填充，block(y, memory, memory_mask=src_mask)。",
        "no_memory_mask",
    ),
    (
        "填充掩码反了：本书的掩码 True 表示可以看，应为 src != self.pad_id；"
        "你的掩码让每个位置只看填充、看不到真实词元。",
        "mask_inverted",
    ),
    (
        "填充编号写死成了 0：这一批的 pad_id 是 {pad}，掩码要用 self.pad_id，"
        "(src != self.pad_id)[:, None, None, :]。",
        "pad_zero",
    ),
    (
        "编码器用了因果掩码：编码器是双向的，每个源位置都可以看整句源句，"
        "只屏蔽填充，block(x, attn_mask=src_mask)；因果掩码只属于解码器的自注意力"
        "（解码器层自己加）。",
        "encoder_causal",
    ),
    *(
        (
            f"{side}层没有串起来：每一层都读了嵌入 {x}，只有最后一层的输出留了下来。"
            f"每一层读上一层的输出：for block in self.{blocks}: {x} = block({x}, …)。",
            f"{mistake}_not_chained",
        )
        for side, x, blocks, mistake in (
            ("编码器", "x", "encoder_blocks", "encoder"),
            ("解码器", "y", "decoder_blocks", "decoder"),
        )
    ),
    (
        "两个最后的归一化都漏了：编码器层全部过完后 memory = self.encoder_norm_f(x)，"
        "解码器层全部过完后 self.lm_head(self.decoder_norm_f(y))。",
        "no_final_norms",
    ),
    (
        "memory 取在了 encoder_norm_f 之前：编码器层全部过完后还要 "
        "memory = self.encoder_norm_f(x)，解码器拿到的是归一化之后的它。",
        "memory_before_norm",
    ),
    (
        "encoder_norm_f 与 decoder_norm_f 用反了：memory = encoder_norm_f(x)，"
        "lm_head(decoder_norm_f(y))。",
        "final_norms_swapped",
    ),
    (
        "lm_head 之前少了 decoder_norm_f："
        "return self.lm_head(self.decoder_norm_f(y))。",
        "no_decoder_norm",
    ),
    (
        "最后的归一化放进了循环、每一层之后都做了一次：encoder_norm_f 和 "
        "decoder_norm_f 各只在所有层之后用一次（Pre-LN 的层内已各有自己的 LN）："
        "循环结束后 memory = self.encoder_norm_f(x)，"
        "最后 self.lm_head(self.decoder_norm_f(y))。",
        "norm_each_layer",
    ),
    (
        "forward 应返回 logits（未经 softmax）：损失函数和贪心解码都从 logits 出发。",
        "softmax",
    ),
]

# a crash in the learner's forward: (pattern in "Type: message\nline", hint)
TRANSFORMER_CRASHES = [
    (
        r"normalized_shape=\[\d+\], expected input with shape \[\*, \d+\], "
        r"but got input of size",
        "decoder_norm_f 作用在了 lm_head 的输出（N, L, V）上：先归一化解码器的输出 "
        "(N, L, E)，再出 logits，self.lm_head(self.decoder_norm_f(y))。",
    ),
    (
        r"mask of shape \(\d+, 1, 1, (\d+)\) does not broadcast to \(\d+, \d+, \1, "
        r"(?!\1\))\d+\)",
        "交叉注意力收到的掩码有 L 列（目标句的长度），键却是 memory 的 S 个位置："
        "memory_mask 要用源句的填充掩码 (src != self.pad_id)[:, None, None, :]，"
        "不是目标句的。",
    ),
    (
        r"mask of shape \((\d+), \1\) does not broadcast",
        "因果掩码 (L, L) 传给了交叉注意力：解码器层自己给自注意力加因果掩码，"
        "memory_mask 只是源句的填充掩码 (src != self.pad_id)[:, None, None, :]。",
    ),
    (
        r"mask of shape \(\d+, \d+\) does not broadcast",
        "填充掩码是二维的 (N, S)，它会被当成 (L, S) 的掩码去广播：要有形状 "
        "(N, 1, 1, S)，src_mask = (src != self.pad_id)[:, None, None, :]"
        "（两个 1 对应头和查询）。",
    ),
    (
        r"mask of shape \(\d+, 1, \d+\) does not broadcast",
        "填充掩码是三维的 (N, 1, S)：注意力分数是四维的 (N, H, L, S)，从右往左对齐时"
        "批的维度 N 对到了头的维度 H 上。要有形状 (N, 1, 1, S)："
        "src_mask = (src != self.pad_id)[:, None, None, :]（两个 1 对应头和查询）。",
    ),
    (
        r"index out of range[^\n]*\n.*src_tok_emb\(\s*tgt",
        "目标句查了源句的词表 src_tok_emb：目标句的词元编号属于目标词表，"
        "用 tgt_tok_emb(tgt)。",
    ),
    (
        r"last dim of x must be d_model=\d+, got \(\d+, \d+\)",
        "位置编码收到的是二维的词元编号 (N, S)：它加在嵌入向量 (N, S, E) 上，"
        "不是词元编号上，src_pos_emb(src_tok_emb(src) * math.sqrt(E))。",
    ),
]


def _transformer_variant(
    ref: Transformer, src: Tensor, tgt: Tensor, mistake: str = ""
) -> Tensor:
    """``ref``'s logits, or what one typical mistake in ``forward`` computes."""
    E, pad = ref.cfg.d_model, ref.cfg.pad_id
    mask = (src != (0 if mistake == "pad_zero" else pad))[:, None, None, :]
    if mistake == "mask_inverted":
        mask = ~mask
    enc_mask = None if mistake in ("no_src_mask", "no_encoder_mask") else mask
    mem_mask = None if mistake in ("no_src_mask", "no_memory_mask") else mask
    if mistake == "encoder_causal":
        enc_mask = mask & causal_mask(src.size(1))
    scale = {"no_scale": 1.0, "scale_twice": float(E)}.get(mistake, math.sqrt(E))

    def embed(table, pos, ids, side: str) -> Tensor:
        s = 1.0 if mistake == f"no_scale_{side}" else scale
        if mistake in ("scale_after_pos", f"scale_after_pos_{side}"):
            return pos(table(ids)) * s
        if mistake in ("no_pos", f"no_pos_{side}"):
            return table(ids) * s
        return pos(table(ids) * s)

    x = embed(ref.src_tok_emb, ref.src_pos_emb, src, "src")
    enc_norm, dec_norm = ref.encoder_norm_f, ref.decoder_norm_f
    if mistake == "final_norms_swapped":
        enc_norm, dec_norm = dec_norm, enc_norm
    each = mistake == "norm_each_layer"  # the final norm after every block, not once
    x0 = x  # "*_not_chained": every block reads the embeddings, the last one counts
    for block in ref.encoder_blocks:
        x = block(x0 if mistake == "encoder_not_chained" else x, attn_mask=enc_mask)
        x = enc_norm(x) if each else x
    no_enc_norm = mistake in ("memory_before_norm", "no_final_norms") or each
    no_dec_norm = mistake in ("no_decoder_norm", "no_final_norms") or each
    memory = x if no_enc_norm else enc_norm(x)
    y = y0 = embed(ref.tgt_tok_emb, ref.tgt_pos_emb, tgt, "tgt")
    for block in ref.decoder_blocks:
        y_in = y0 if mistake == "decoder_not_chained" else y
        y = block(y_in, memory, memory_mask=mem_mask)
        y = dec_norm(y) if each else y
    logits = ref.lm_head(y if no_dec_norm else dec_norm(y))
    return logits.softmax(-1) if mistake == "softmax" else logits


def _batch(
    g: torch.Generator, cfg: TransformerConfig, src_lengths, tgt_lengths, S, L
) -> tuple[Tensor, Tensor]:
    """Source and target ids right-padded with ``cfg.pad_id`` after the given
    lengths; the words are any other id (0 included where it is not the pad)."""

    def ids(vocab: int, lengths, T: int) -> Tensor:
        words = [i for i in range(vocab) if i != cfg.pad_id]
        t = torch.tensor(words)[
            torch.randint(len(words), (len(lengths), T), generator=g)
        ]
        for row, n in enumerate(lengths):
            t[row, n:] = cfg.pad_id
        return t

    src = ids(cfg.src_vocab_size, src_lengths, S)
    tgt = ids(cfg.tgt_vocab_size, tgt_lengths, L)
    tgt[0, 1] = cfg.tgt_vocab_size - 1  # an id the source table does not have
    return src, tgt


def _decoder_layer_hint(module, ref: Transformer, src: Tensor, what: str) -> str | None:
    """The first of the learner's decoder layers that differs from the reference's
    (given the reference's input), or ``None``."""
    g = seeded_generator(61)
    N, S, E = src.size(0), src.size(1), ref.cfg.d_model
    memory, mask = torch.randn(N, S, E, generator=g), ref.src_mask(src)
    y = torch.randn(N, 3, E, generator=g)
    for i, block in enumerate(ref.decoder_blocks):
        try:
            got = module.decoder_blocks[i](y, memory, memory_mask=mask)
        except Exception:  # another signature: nothing to say about the layer
            return None
        expected = block(y, memory, memory_mask=mask)
        if not (isinstance(got, Tensor) and close(got, expected)):
            return (
                f"{what}.decoder_blocks[{i}] 与 tc.DecoderLayer 不一致：先用 "
                "tc.exercises.check_decoder_layer 检查你的解码器层，"
                "或换回参考解答的解码器层。"
            )
        y = expected
    return None


def _check_logits_shape(out: Tensor, N: int, L: int, V: int, E: int, what, case):
    """Logits ``(N, L, V)``; a length of ``L ± 1`` or a last dimension ``E`` says
    what went wrong."""
    shape = tuple(out.shape)
    if out.dim() == 3 and shape[0] == N and shape[2] == V and abs(shape[1] - L) == 1:
        fail(
            f"{what} 的输出有 {shape[1]} 个位置，应为 L = {L}（{case}）：forward 里又"
            "把 tgt 移了一位（如 tgt[:, :-1]）。右移是调用者做的：传进来的 tgt "
            "已经是解码器输入，forward 直接用它，每个位置都输出 logits。"
        )
    if shape == (N, L, E) and E != V:
        fail(
            f"{what} 的输出是解码器状态 {shape}（{case}）：少了最后的 lm_head，"
            "return self.lm_head(self.decoder_norm_f(y))。"
        )
    check_shape(out, (N, L, V), what, case, " forward 返回每个目标位置的 logits。")


# (config, source lengths, target lengths, S, L): every source sentence ends in
# padding; L != S and V_tgt != d_model, so the target's padding mask as memory_mask
# and decoder_norm_f after lm_head crash (TRANSFORMER_CRASHES says why); the second
# batch pads with 3 (0 is a word there)
_CASES = [
    (
        TransformerConfig(11, 13, d_model=16, num_heads=2, num_encoder_layers=2,
                          num_decoder_layers=2, d_ff=32, dropout=0.0,
                          context_length=16, pad_id=0),
        [5, 3, 6], [5, 4, 2], 7, 5,
    ),
    (
        TransformerConfig(9, 14, d_model=12, num_heads=3, num_encoder_layers=1,
                          num_decoder_layers=2, d_ff=24, dropout=0.0,
                          context_length=8, pad_id=3),
        [4, 2], [4, 3], 6, 4,
    ),
]  # fmt: skip


@checker("拼出整个翻译模型", wants_class=True)
def check_transformer(cls: type) -> str:
    """Grade ``cls(cfg)``, a :class:`~transformer_course.TransformerConfig` in, with
    ``forward(src (N, S), tgt (N, L))`` -> logits ``(N, L, V_tgt)``.

    Parameters named as in :class:`transformer_course.Transformer` (``src_tok_emb``,
    ``tgt_tok_emb``, ``encoder_blocks``, ``decoder_blocks``, ``encoder_norm_f``,
    ``decoder_norm_f``, ``lm_head``; sinusoidal ``src_pos_emb``/``tgt_pos_emb``), the
    decoder layers called ``block(y, memory, memory_mask=src_mask)``. The learner's
    weights (norms given random γ/β) are copied into ``tc.Transformer`` and the logits
    compared, on batches whose every source sentence ends in padding, with pad ids 0
    and 3.
    """
    name = name_of(cls)
    g = seeded_generator(60)
    for i, (cfg, src_lengths, tgt_lengths, S, L) in enumerate(_CASES):
        N, V, E = len(src_lengths), cfg.tgt_vocab_size, cfg.d_model
        case = f"N={N}, S={S}, L={L}, d_model={E}, pad_id={cfg.pad_id}"
        src, tgt = _batch(g, cfg, src_lengths, tgt_lengths, S, L)
        module = construct(cls, cfg, what=name).eval()
        ref = Transformer(cfg).eval()
        _load_into_reference(module, ref, name, g)
        with torch.no_grad():
            out = run_module(
                module, src, tgt, what=name, case=case, first=i == 0,
                causes=TRANSFORMER_CRASHES,
            )  # fmt: skip
            out = as_tensor(out, f"{name}.forward", case)
            _check_logits_shape(out, N, L, V, E, f"{name}.forward", case)
            check_float(out, f"{name}.forward")
            check_finite(out, f"{name}.forward", case)
            expected = ref(src, tgt)
            if close(out, expected):
                continue
            hint = _decoder_layer_hint(module, ref, src, name) or first_reproduced(
                out,
                TRANSFORMER_HINTS,
                functools.partial(_transformer_variant, ref, src, tgt),
                pad=cfg.pad_id,
            )
        fail(
            f"{name}.forward 的 logits 与参考（同样权重的 tc.Transformer）不一致"
            f"（{case}；{where_differs(out, expected)}）。\n可能的原因："
            + (hint or "逐步对照：" + _STEPS)
        )
    return "2 组配置，源句都带填充，pad_id = 0 和 3，逐元素对照 tc.Transformer"
