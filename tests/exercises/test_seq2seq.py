"""The encoder-decoder pieces of chapter 1: decoder layer, shifted loss, greedy decoding,
rectangular causal mask.

Each checker accepts correct implementations written in different styles with one "✓"
line, treats a skeleton as "尚未实现" (an error with solution=True), and rejects
hand-written wrong implementations with a Chinese hint that names the mistake."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex
from transformer_course import notebook as nb
from transformer_course.exercises import seq2seq

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton, rejection

# decoder layer
# ---------------------------------------------------------------------------


def make_decoder(mistake=None, causal_style="is_causal"):
    class Decoder(nn.Module):
        def __init__(self, d_model, num_heads, d_ff):
            super().__init__()
            self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
            self.cross_attn = tc.MultiHeadAttention(d_model, num_heads)
            self.ffn = tc.FeedForward(d_model, d_ff)
            self.norm1 = nn.LayerNorm(d_model)
            self.norm2 = nn.LayerNorm(d_model)
            self.norm3 = nn.LayerNorm(d_model)

        def sa(self, x):
            if mistake == "no_causal":
                return self.self_attn(x, x, x)
            if mistake == "diag_hidden":  # learner test 15 (1.3): only the keys j < i
                return self.self_attn(x, x, x, attn_mask=torch.ones(x.size(1), x.size(1)).tril(-1).bool())
            if mistake == "triu_mask":  # learner test 24a (1.3): the future, not the past
                return self.self_attn(x, x, x, attn_mask=torch.ones(x.size(1), x.size(1)).triu().bool())
            if mistake == "diag_hidden_but_first":  # the same, position 0 let see itself
                below = torch.ones(x.size(1), x.size(1)).tril(-1).bool()
                below[0, 0] = True
                return self.self_attn(x, x, x, attn_mask=below)
            if mistake == "memory_mask_to_self":  # learner test
                return self.self_attn(x, x, x, attn_mask=self.memory_mask)
            if causal_style == "mask":
                return self.self_attn(x, x, x, attn_mask=tc.causal_mask(x.size(1)))
            if causal_style == "additive":  # a float mask: 0 or -inf
                L = x.size(1)
                add = torch.full((L, L), float("-inf")).triu(1)
                return self.self_attn(x, x, x, attn_mask=add)
            return self.self_attn(x, is_causal=True)

        def forward(self, x, memory, memory_mask=None):
            self.memory_mask = memory_mask
            if mistake == "memory_as_query":
                x = self.norm1(x + self.sa(x))
                x = self.norm2(x + self.cross_attn(memory, x, x))
                return self.norm3(x + self.ffn(x))
            if mistake == "pre_ln":
                x = x + self.sa(self.norm1(x))
                x = x + self.cross_attn(self.norm2(x), memory, memory, memory_mask)
                return x + self.ffn(self.norm3(x))
            if mistake == "norm_on_sublayer":  # learner test: x + norm(sublayer(x))
                x = x + self.norm1(self.sa(x))
                x = x + self.norm2(self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                return x + self.norm3(self.ffn(x))
            if mistake == "cross_query_from_input":  # learner test: queries from the layer input Y
                b1 = self.norm1(x + self.sa(x))
                b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                return self.norm3(b2 + self.ffn(b2))
            if mistake == "cross_query_from_input_causal":  # learner test 20a, 2.6: is_causal added
                b1 = self.norm1(x + self.sa(x))
                b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask, is_causal=True))
                return self.norm3(b2 + self.ffn(b2))
            if mistake == "cross_residual_from_input":  # learner test 7a, 2.7: residual from Y
                b1 = self.norm1(x + self.sa(x))
                b2 = self.norm2(x + self.cross_attn(b1, memory, memory, attn_mask=memory_mask))
                return self.norm3(b2 + self.ffn(b2))
            if mistake in ("ffn_from_b1", "ffn_from_input"):  # learner test 8a, 2.7: ffn(b1); or ffn(Y)
                b1 = self.norm1(x + self.sa(x))
                b2 = self.norm2(b1 + self.cross_attn(b1, memory, memory, attn_mask=memory_mask))
                return self.norm3(b2 + self.ffn(b1 if mistake == "ffn_from_b1" else x))
            if mistake == "res_from_input":  # learner test 24a, 1.3: x0 = x added three times
                x0 = x
                x = self.norm1(x0 + self.sa(x))
                x = self.norm2(x0 + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                return self.norm3(x0 + self.ffn(x))
            if mistake == "ffn_before_cross":  # learner test 27a, 1.3: FFN second, norms in order
                h = self.norm1(x + self.sa(x))
                h = self.norm2(h + self.ffn(h))
                return self.norm3(h + self.cross_attn(h, memory, memory, attn_mask=memory_mask))
            if mistake == "no_causal_cross_query_from_input":  # learner test 27a, 2.6: two bugs
                b1 = self.norm1(x + self.self_attn(x))
                b2 = self.norm2(b1 + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                return self.norm3(b2 + self.ffn(b2))
            if mistake == "cross_first":  # cross-attention before the masked self-attention
                x = self.norm1(x + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                x = self.norm2(x + self.sa(x))
                return self.norm3(x + self.ffn(x))
            if mistake in ("norms_swapped", "norms12_swapped", "norms23_swapped"):  # 12: learner test 6a, 1.2
                first, second, third = {
                    "norms_swapped": (self.norm3, self.norm2, self.norm1),
                    "norms12_swapped": (self.norm2, self.norm1, self.norm3),
                    "norms23_swapped": (self.norm1, self.norm3, self.norm2),
                }[mistake]
                x = first(x + self.sa(x))
                x = second(x + self.cross_attn(x, memory, memory, attn_mask=memory_mask))
                return third(x + self.ffn(x))
            x = self.norm1(self.sa(x) if mistake == "no_res_self" else x + self.sa(x))
            if mistake == "norm2_on_residual_only":  # learner test: norm2(x) + cross
                x = self.norm2(x) + self.cross_attn(x, memory, memory, attn_mask=memory_mask)
                return self.norm3(x + self.ffn(x))
            if mistake == "cross_on_x":
                c = self.cross_attn(x, x, x)
            elif mistake == "causal_to_cross":
                c = self.cross_attn(x, memory, memory, attn_mask=tc.causal_mask(x.size(1)))
            elif mistake == "cross_causal":  # learner test 6a, 1.2: is_causal, no memory_mask
                c = self.cross_attn(x, memory, memory, is_causal=True)
            elif mistake == "cross_causal_masked":  # learner test 10a, 1.3: is_causal beside the mask
                c = self.cross_attn(x, memory, memory, attn_mask=memory_mask, is_causal=True)
            elif mistake == "no_mask":
                c = self.cross_attn(x, memory, memory)
            else:
                c = self.cross_attn(x, memory, memory, attn_mask=memory_mask)
            x = self.norm2(c if mistake == "no_res_cross" else x + c)
            if mistake == "norm3_on_residual_only":  # learner test 1.3: norm3(x) + ffn(x)
                return self.norm3(x) + self.ffn(x)
            if mistake == "norm2_for_ffn":
                return self.norm2(x + self.ffn(x))
            if mistake == "pre_ln_ffn":  # learner test 25a, 1.3: the FFN step alone Pre-LN
                return x + self.ffn(self.norm3(x))
            if mistake == "norm_on_ffn":  # learner test 25a, 1.3: residual after the norm
                return x + self.norm3(self.ffn(x))
            return self.norm3(self.ffn(x) if mistake == "no_res_ffn" else x + self.ffn(x))

    return Decoder


class EinsumDecoder(nn.Module):
    """Correct, written without calling the attention modules: einsum per head, the
    causal mask from arange, F.layer_norm with the module's parameters."""

    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.h = num_heads
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.cross_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.ffn = tc.FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def attend(self, m, q_in, kv_in, keep):
        N, L, E = q_in.shape
        S, D = kv_in.size(1), E // self.h
        q = m.q_proj(q_in).view(N, L, self.h, D)
        k = m.k_proj(kv_in).view(N, S, self.h, D)
        v = m.v_proj(kv_in).view(N, S, self.h, D)
        scores = torch.einsum("nlhd,nshd->nhls", q, k) / D**0.5
        scores = scores.masked_fill(~keep, float("-inf"))
        out = torch.einsum("nhls,nshd->nlhd", scores.softmax(-1), v)
        return m.out_proj(out.reshape(N, L, E))

    def forward(self, x, memory, memory_mask=None):
        L = x.size(1)
        causal = torch.arange(L)[None, :] <= torch.arange(L)[:, None]
        n = self.norm1
        x = F.layer_norm(x + self.attend(self.self_attn, x, x, causal), n.normalized_shape, n.weight, n.bias, n.eps)
        keep = torch.ones(1, dtype=torch.bool) if memory_mask is None else memory_mask
        x = self.norm2(x + self.attend(self.cross_attn, x, memory, keep))
        return self.norm3(x + self.ffn.w2(torch.relu(self.ffn.w1(x))))


class DecoderSkeleton(nn.Module):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.self_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.cross_attn = tc.MultiHeadAttention(d_model, num_heads)
        self.ffn = tc.FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))

    def forward(self, x, memory, memory_mask=None):
        raise NotImplementedError


@pytest.mark.parametrize(
    "candidate",
    [make_decoder(), make_decoder(causal_style="mask"), make_decoder(causal_style="additive"), EinsumDecoder],
    ids=["is_causal", "bool mask", "additive mask", "einsum"],
)
def test_decoder_layer_accepts(candidate, capsys):
    assert_passes(ex.check_decoder_layer, candidate, capsys)


def test_decoder_layer_skeleton(capsys):
    assert_skeleton(ex.check_decoder_layer, DecoderSkeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        ("no_causal", "因果掩码"),
        ("diag_hidden", "因果掩码把对角线也遮住了"),
        ("diag_hidden_but_first", "因果掩码把对角线也遮住了"),
        ("triu_mask", "上三角（.triu()）让位置 i 看得见 i 及之后的位置"),
        ("cross_on_x", "键和值应来自编码器输出"),
        ("no_mask", "memory_mask"),
        ("pre_ln", "Post-LN"),
        ("no_res_cross", "交叉注意力的残差"),
        ("memory_as_query", "查询是解码器的 x"),
        ("norm2_for_ffn", "FFN 这一步用的是 norm2"),
        ("ffn_before_cross", "FFN 放在了交叉注意力之前"),
        ("no_causal_cross_query_from_input", "两处不对。一、掩码自注意力没有因果掩码"),
        ("norm2_on_residual_only", "norm2 只用在了残差上"),
        ("norm3_on_residual_only", "norm3 只用在了残差上"),
        ("norm_on_sublayer", "归一化只用在了子层的输出上"),
        ("cross_query_from_input", "交叉注意力的查询用了层输入 Y"),
        ("cross_residual_from_input", "交叉注意力的残差加的是层输入 Y"),
        ("res_from_input", "三个子层的残差都加的是层输入 Y"),
        ("cross_first", "顺序不对"),
        ("ffn_from_b1", "FFN 的输入用了第一个子层的输出 B1"),
        ("ffn_from_input", "FFN 的输入用了层输入 Y"),
        ("no_res_self", "少了掩码自注意力的残差连接"),
        ("no_res_ffn", "少了 FFN 的残差连接"),
        ("norms_swapped", "norm1 与 norm3 用反了"),
        ("norms12_swapped", "norm1 与 norm2 用反了"),
        ("norms23_swapped", "norm2 与 norm3 用反了"),
        ("cross_causal", "交叉注意力用了 is_causal=True"),
        ("cross_causal_masked", "交叉注意力不能是因果的"),
        ("cross_query_from_input_causal", "查询却仍是层输入 Y"),
        ("pre_ln_ffn", "FFN 这一步写成了 Pre-LN"),
        ("norm_on_ffn", "残差加在归一化之后"),
    ],
)
def test_decoder_layer_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_decoder_layer, make_decoder(mistake), keyword, capsys)


def test_decoder_hints_use_the_pages_names(capsys):
    """Chapter 2 names the sublayer outputs b1, b2 and keeps x as the layer input Y:
    its hints must not prescribe cross_attn(x, …), the bug of its exercise 2.6."""
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="2.6"), make_decoder("no_mask"))
    assert "cross_attn(b1, memory, memory, attn_mask=memory_mask)" in message, message
    assert "cross_attn(x," not in message, message
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="2.6"), make_decoder("no_res_cross"))
    assert "b2 = norm2(b1 + cross_attn(b1," in message, message
    # learner test 25a F3: "cross_attn(x, …)" read as the layer input, the bug of 2.6
    message = rejection(lambda c: ex.check_decoder_layer(c, exercise="1.3"), make_decoder("no_mask"))
    assert "cross_attn(B1, memory, memory, attn_mask=memory_mask)" in message, message
    assert "cross_attn(x," not in message and "不是层输入" in message, message


def test_decoder_hints_are_all_reached(capsys):
    mistakes = [
        "no_causal", "diag_hidden", "triu_mask", "res_from_input", "cross_on_x", "no_mask", "pre_ln", "no_res_cross",
        "norm2_on_residual_only",
        "norm3_on_residual_only",
        "norm_on_sublayer", "cross_query_from_input", "cross_residual_from_input", "cross_first",
        "no_res_self", "no_res_ffn", "ffn_from_b1", "ffn_from_input",
        "norms_swapped", "norms12_swapped", "norms23_swapped", "cross_causal", "cross_causal_masked",
        "cross_query_from_input_causal", "pre_ln_ffn", "norm_on_ffn", "ffn_before_cross", "norm2_for_ffn",
        "no_causal_cross_query_from_input",
    ]  # fmt: skip
    rejects = [pytest.param(ex.check_decoder_layer, make_decoder(m), "") for m in mistakes]
    assert_every_hint_reached({"_DECODER_HINTS": seq2seq._DECODER_HINTS}, rejects, capsys)


DECODER_CRASH_REJECTS = [
    pytest.param(ex.check_decoder_layer, make_decoder("memory_mask_to_self"), "传给了掩码自注意力", id="mask to self"),
    pytest.param(ex.check_decoder_layer, make_decoder("causal_to_cross"), "传给了交叉注意力", id="causal to cross"),
    pytest.param(ex.check_decoder_layer, make_decoder("memory_as_query"), "查询是解码器的 x", id="memory as query"),
]


@pytest.mark.parametrize("checker, candidate, keyword", DECODER_CRASH_REJECTS)
def test_decoder_layer_crashes(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_decoder_crashes_are_all_reached(capsys):
    assert_every_hint_reached({"DECODER_CRASHES": seq2seq.DECODER_CRASHES}, DECODER_CRASH_REJECTS, capsys)


def test_decoder_layer_needs_the_package_names(capsys):
    class Renamed(make_decoder()):
        def __init__(self, d_model, num_heads, d_ff):
            super().__init__(d_model, num_heads, d_ff)
            self.enc_attn = self.cross_attn
            del self.cross_attn

    assert_rejects(ex.check_decoder_layer, Renamed, "cross_attn", capsys)


def test_decoder_layer_wants_the_class(capsys):
    assert_rejects(ex.check_decoder_layer, make_decoder()(8, 2, 16), "类本身", capsys)


# shifted decoder input and masked loss
# ---------------------------------------------------------------------------


def loss_right(model, src, tgt, pad_id):
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    labels = labels.masked_fill(labels == pad_id, -100)
    logits = model(src, dec_in)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def loss_by_hand(model, src, tgt, pad_id):
    """Correct: log_softmax, gather and a boolean mean, no ignore_index."""
    logp = model(src, tgt[:, :-1]).log_softmax(-1)
    labels = tgt[:, 1:]
    nll = -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return nll[labels != pad_id].mean()


def loss_ignore_index(model, src, tgt, pad_id):
    """Correct: ignore_index=pad_id instead of -100, the classes on dim 1."""
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=pad_id)


def loss_skeleton(model, src, tgt, pad_id):
    pass


def make_loss(mistake):
    def loss(model, src, tgt, pad_id):
        dec_in, labels = tgt[:, :-1], tgt[:, 1:]
        if mistake == "no_shift":
            dec_in, labels = tgt, tgt
        if mistake == "labels_not_shifted":
            labels = tgt[:, :-1]
        if mistake == "input_shifted_too":  # both start after BOS
            dec_in = tgt[:, 1:]
        if mistake == "reversed":  # learner test 7a, 1.4: input and labels swapped
            dec_in, labels = tgt[:, 1:], tgt[:, :-1]
        if mistake == "labels_edited_in_place":  # learner test 6a, 1.4: lab is a view of tgt
            labels[labels == pad_id] = -100
        if mistake == "labels_edited_in_place_late":  # the model already ran: tgt still changes
            logits = model(src, dec_in)
            labels[labels == pad_id] = -100
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        if mistake == "pad_zero":  # learner test 8a, 1.4: ignore_index=0, not pad_id
            logits = model(src, dec_in)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=0)
        if mistake == "mask_from_input":  # learner test 34a, 1.5: pads of the decoder input
            labels = labels.masked_fill(dec_in == pad_id, -100)
            return F.cross_entropy(model(src, dec_in).flatten(0, 1), labels.flatten())
        if mistake == "no_pad_mask":
            logits = model(src, dec_in)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        labels = labels.masked_fill(labels == pad_id, -100)
        logits = model(src, dec_in)
        if mistake == "softmax":
            logits = logits.softmax(-1)
        if mistake == "sum":
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        if mistake == "item":
            return torch.tensor(F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item())
        if mistake == "per_token":
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        if mistake == "mean_per_sentence":  # learner test
            per_token = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            real = (labels != -100).float()
            return ((per_token * real).sum(1) / real.sum(1)).mean()
        if mistake == "sum_over_batch":  # learner test: sum of sentence losses / N
            total = F.cross_entropy(logits.transpose(1, 2), labels, reduction="sum")
            return total / tgt.size(0)
        if mistake == "labels_transposed":  # learner test 6a, 1.4: labels flattened T-major
            return F.cross_entropy(logits.flatten(0, 1), labels.transpose(0, 1).reshape(-1))
        if mistake == "logits_scrambled":  # learner test 21a, 1.5: (N, V, T) read as (N, T, V)
            flat = logits.transpose(1, 2).reshape(-1, logits.size(-1))
            return F.cross_entropy(flat, labels.reshape(-1))
        if mistake == "logits_transposed":  # learner test 34a, 1.5: logits flattened T-major
            flat = logits.transpose(0, 1).reshape(-1, logits.size(-1))
            return F.cross_entropy(flat, labels.reshape(-1))
        if mistake == "not_flattened":  # learner test: logits (N, T, V) as they are
            return F.cross_entropy(logits, labels)
        if mistake == "label_smoothing":  # learner test
            return F.cross_entropy(logits.transpose(1, 2), labels, label_smoothing=0.1)
        if mistake == "nll_raw":  # learner test 27a, 1.5: nll_loss on logits, no log_softmax
            return F.nll_loss(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        if mistake == "nll_probs":  # nll_loss on probabilities
            return F.nll_loss(logits.softmax(-1).transpose(1, 2), labels)
        if mistake == "mean_over_all":  # padding counted in the denominator
            total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
            return total / labels.numel()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    return loss


@pytest.mark.parametrize("candidate", [loss_right, loss_by_hand, loss_ignore_index])
def test_seq2seq_loss_accepts(candidate, capsys):
    assert_passes(ex.check_seq2seq_loss, candidate, capsys)


def test_seq2seq_loss_skeleton(capsys):
    assert_skeleton(ex.check_seq2seq_loss, loss_skeleton, capsys)


LOSS_REJECTS = [
    pytest.param(ex.check_seq2seq_loss, make_loss(mistake), keyword, id=mistake)
    for mistake, keyword in [
        ("no_shift", "照抄"),
        ("labels_not_shifted", "标签没有右移"),
        ("reversed", "右移的方向反了"),
        ("input_shifted_too", "解码器输入也右移了"),
        ("no_pad_mask", "-100"),
        ("pad_zero", "填充的编号写死成了 0"),
        ("labels_edited_in_place", "原地修改了传进来的 tgt"),
        ("labels_edited_in_place_late", "原地修改了传进来的 tgt"),
        ("softmax", "softmax"),
        ("sum", "不是总和"),
        ("item", "没有梯度"),
        ("per_token", "标量"),
        ("mean_per_sentence", "先对每句求平均"),
        ("label_smoothing", "加了标签平滑"),
        ("sum_over_batch", "总和除以了批大小 N"),
        ("not_flattened", "类别在第 1 维"),
        ("labels_transposed", "标签展平的顺序与 logits 不同"),
        ("logits_scrambled", "logits 展平时行被打乱了：logits.transpose(1, 2).reshape"),
        ("nll_raw", "F.nll_loss 直接用了 logits"),
        ("nll_probs", "F.nll_loss 拿到的是 softmax 的概率"),
        ("mean_over_all", "填充位置也算进了分母"),
        ("logits_transposed", "logits 展平的顺序与标签不同"),
        ("mask_from_input", "按解码器输入里的填充去换标签"),
    ]
]


@pytest.mark.parametrize("checker, candidate, keyword", LOSS_REJECTS)
def test_seq2seq_loss_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_seq2seq_loss_hints_are_all_reached(capsys):
    from transformer_course.exercises import seq2seq

    assert_every_hint_reached({"_LOSS_HINTS": seq2seq._LOSS_HINTS}, LOSS_REJECTS, capsys)


# greedy decoding
# ---------------------------------------------------------------------------


def decode_right(model, src, bos_id, eos_id, max_len):
    memory = model.encode(src, model.src_mask(src))
    ys = torch.tensor([[bos_id]])
    for _ in range(max_len - 1):
        hidden = model.decode(ys, memory, model.src_mask(src))
        next_id = model.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)
        ys = torch.cat([ys, next_id], dim=1)
        if next_id.item() == eos_id:
            break
    return ys


def decode_list(model, src, bos_id, eos_id, max_len):
    """Correct: the whole model call each step, a Python list, a while loop."""
    ids = [bos_id]
    with torch.no_grad():
        while len(ids) < max_len and (len(ids) == 1 or ids[-1] != eos_id):
            logits = model(src, torch.tensor([ids]))
            ids.append(int(logits[0, -1].softmax(-1).argmax()))
    return torch.tensor([ids])


def decode_without_src_mask(model, src, bos_id, eos_id, max_len):
    """Learner test 8a, 1.5: encode(src, None), decode(..., None): the padding is seen."""
    memory = model.encode(src, None)
    ys = torch.tensor([[bos_id]])
    for _ in range(max_len - 1):
        next_id = model.lm_head(model.decode(ys, memory, None)[:, -1]).argmax(-1, keepdim=True)
        ys = torch.cat([ys, next_id], dim=1)
        if next_id.item() == eos_id:
            break
    return ys


def test_greedy_decode_rejects_no_source_mask(capsys):
    assert_rejects(ex.check_greedy_decode, decode_without_src_mask, "源句的填充没有屏蔽", capsys)


def make_decode(mistake):
    def decode(model, src, bos_id, eos_id, max_len):
        ids = [] if mistake == "no_bos" else [bos_id]
        steps = max_len if mistake == "one_too_many" else max_len - 1
        for _ in range(steps):
            dec_in = torch.tensor([ids if ids else [bos_id]])
            logits = model(src, dec_in)[0]
            if mistake in ("sample", "seeded_sample"):
                g = torch.Generator().manual_seed(len(ids)) if mistake == "seeded_sample" else None
                nxt = int(torch.multinomial(logits[-1].softmax(-1), 1, generator=g))
            elif mistake == "argmax_over_positions":  # learner test 34a, 1.6
                nxt = int(logits.argmax(0)[-1])
            else:
                nxt = int(logits[0 if mistake == "first_position" else -1].argmax())
            if mistake == "eos_dropped" and nxt == eos_id:
                break
            ids.append(nxt)
            if nxt == eos_id and mistake != "no_stop":
                break
            if mistake == "stops_on_bos" and nxt == bos_id:  # learner test 27a, 1.6
                break
        return torch.tensor([ids])

    return decode


def decode_skeleton(model, src, bos_id, eos_id, max_len):
    raise NotImplementedError


def decode_int32(model, src, bos_id, eos_id, max_len):
    """Learner test 25a (1.6): right ids as int32 ("词元编号" names no dtype)."""
    return make_decode(None)(model, src, bos_id, eos_id, max_len).int()


def decode_float(model, src, bos_id, eos_id, max_len):
    return make_decode(None)(model, src, bos_id, eos_id, max_len).float()


@pytest.mark.parametrize("candidate", [decode_right, decode_list, decode_int32])
def test_greedy_decode_accepts(candidate, capsys):
    assert_passes(ex.check_greedy_decode, candidate, capsys)


def test_greedy_decode_rejects_float_ids(capsys):
    assert_rejects(ex.check_greedy_decode, decode_float, "应返回整数的词元编号", capsys)


def test_greedy_decode_skeleton(capsys):
    assert_skeleton(ex.check_greedy_decode, decode_skeleton, capsys)


@pytest.mark.parametrize(
    "mistake, keyword",
    [
        ("no_stop", "立即停止"),
        ("eos_dropped", "EOS 本身"),
        ("first_position", "每一步取的是第一个位置的 logits（logits[:, 0]）"),
        ("stops_on_bos", "生成 BOS（bos_id）后就停了"),
        ("sample", "结果是确定的"),
        # learner test 15 (1.6): sampling with a fixed seed gives the same result twice
        ("seeded_sample", "不是（前面的词元送进模型后）最后一个位置 logits 的最大者"),
        ("no_bos", "BOS"),
        ("one_too_many", "max_len"),
        ("argmax_over_positions", "新词元是一个位置的编号"),
    ],
)
def test_greedy_decode_rejects(mistake, keyword, capsys):
    assert_rejects(ex.check_greedy_decode, make_decode(mistake), keyword, capsys)


def test_greedy_decode_rejects_training_mode(capsys):
    # learner test 6a, 1.5: with the page's dropout 0.1 this decode is random
    def in_train_mode(model, src, bos_id, eos_id, max_len):
        model.train()
        return decode_right(model, src, bos_id, eos_id, max_len)

    def train_then_eval(model, src, bos_id, eos_id, max_len):
        model.train()
        ys = decode_right(model, src, bos_id, eos_id, max_len)
        model.eval()
        return ys

    assert_rejects(ex.check_greedy_decode, in_train_mode, "model.train()", capsys)
    assert_rejects(ex.check_greedy_decode, train_then_eval, "训练模式", capsys)


def test_greedy_decode_wants_a_batch_of_one(capsys):
    def flat(model, src, bos_id, eos_id, max_len):
        return decode_right(model, src, bos_id, eos_id, max_len)[0]

    assert_rejects(ex.check_greedy_decode, flat, "(1, T)", capsys)


# rectangular causal mask
# ---------------------------------------------------------------------------


def rect_arange(L, S):
    return torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)


def rect_tril(L, S):
    return torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)


def rect_slice(L, S):
    """Correct: the last L rows of the square S x S mask."""
    return torch.ones(S, S).tril().bool()[S - L :]


def rect_skeleton(L, S):
    pass


@pytest.mark.parametrize("candidate", [rect_arange, rect_tril, rect_slice])
def test_rectangular_mask_accepts(candidate, capsys):
    assert_passes(ex.check_rectangular_causal_mask, candidate, capsys)


def test_rectangular_mask_skeleton(capsys):
    assert_skeleton(ex.check_rectangular_causal_mask, rect_skeleton, capsys)


@pytest.mark.parametrize(
    "candidate, keyword",
    [
        (lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(), "左上角"),
        (lambda L, S: torch.ones(L, S).tril(diagonal=S - L), "torch.bool"),
        (lambda L, S: torch.zeros(L, S).masked_fill(~rect_arange(L, S), float("-inf")), "这是加性掩码"),
        (lambda L, S: torch.arange(S)[None, :] < torch.arange(L)[:, None] + (S - L), "<="),
        (lambda L, S: ~rect_arange(L, S), "不能看"),
        (lambda L, S: torch.ones(S, S, dtype=torch.bool).tril()[:L], "左上角"),
        (lambda L, S: torch.ones(L, L, dtype=torch.bool).tril(), "形状不对"),
        (lambda L, S: torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (L - S), "偏移的符号反了"),
    ],
    ids=["top-left", "float", "additive", "strict", "inverted", "first rows", "square", "offset L - S (learner test)"],
)
def test_rectangular_mask_rejects(candidate, keyword, capsys):
    assert_rejects(ex.check_rectangular_causal_mask, candidate, keyword, capsys)


# the alignment read from the cross-attention
# ---------------------------------------------------------------------------


def _cross_maps(model, src, decoder_in):
    """Head-averaged weights (L, S) of every decoder layer's cross-attention."""
    layers = [m for m in model.modules() if isinstance(m, tc.DecoderLayer)]
    with torch.no_grad(), nb.record_attention(model) as maps:
        model(src, decoder_in)
    return [maps[layer.cross_attn][0] for layer in layers]


def align_right(model, src, ys):
    return _cross_maps(model, src, ys[:, :-1])[-1].mean(0).argmax(-1)


def align_list(model, src, ys):
    """Correct, another style: named modules, a Python list of ints."""
    cross = [m for name, m in model.named_modules() if name.endswith("cross_attn")]
    with torch.no_grad(), nb.record_attention(model) as maps:
        model(src, ys[:, :-1])
    rows = maps[cross[-1]][0].sum(0)  # a sum over heads has the same argmax
    return [int(row.argmax()) for row in rows]


def align_skeleton(model, src, ys): ...


def make_align(mistake):
    def align(model, src, ys):
        decoder_in = ys if mistake in ("full_ys", "full_ys_drop_first") else ys[:, :-1]
        layers = [m for m in model.modules() if isinstance(m, tc.DecoderLayer)]
        module = layers[0].cross_attn if mistake == "first" else layers[-1].cross_attn
        if mistake == "self":
            module = layers[-1].self_attn
        with torch.no_grad(), nb.record_attention(model) as maps:
            model(src, decoder_in)
        w = maps[module][0]  # (H, L, S)
        w = w[0] if mistake == "one_head" else w.mean(0)
        if mistake == "max_heads":  # learner test 7a, 1.10
            w = maps[module][0].amax(0)
        if mistake == "max_values":
            return w.max(-1).values
        if mistake == "mean_layers":  # learner test 9a, 1.10: every layer averaged
            w = torch.stack([maps[layer.cross_attn][0] for layer in layers]).mean((0, 1))
        if mistake == "full_ys_drop_first":  # learner test 7a, 1.10: an off-by-one
            return w.argmax(-1)[1:]
        if mistake == "batch_dim":  # learner test 27a, 1.10: (1, T-1), the batch kept
            return maps[module].mean(1).argmax(-1)
        return w.argmax(0 if mistake == "over_queries" else -1)

    return align


@pytest.mark.parametrize("candidate", [align_right, align_list])
def test_alignment_accepts(candidate, capsys):
    assert_passes(ex.check_cross_attention_alignment, candidate, capsys)


def test_alignment_skeleton(capsys):
    assert_skeleton(ex.check_cross_attention_alignment, align_skeleton, capsys)


ALIGN_REJECTS = [
    pytest.param(ex.check_cross_attention_alignment, make_align("first"), "最后一层", id="first layer"),
    pytest.param(ex.check_cross_attention_alignment, make_align("self"), "自注意力", id="self-attention"),
    pytest.param(ex.check_cross_attention_alignment, make_align("one_head"), "对头取平均", id="one head"),
    pytest.param(ex.check_cross_attention_alignment, make_align("full_ys"), "ys[:, :-1]", id="full ys"),
    pytest.param(ex.check_cross_attention_alignment, make_align("over_queries"), "dim=-1", id="over queries"),
    pytest.param(ex.check_cross_attention_alignment, make_align("max_heads"), "对头取的是最大值", id="max heads"),
    pytest.param(ex.check_cross_attention_alignment, make_align("full_ys_drop_first"), "错开了一位", id="off by one"),
    pytest.param(ex.check_cross_attention_alignment, make_align("max_values"), "整数位置", id="max values"),
    pytest.param(ex.check_cross_attention_alignment, make_align("batch_dim"), "多了长度为 1 的维", id="batch dim"),
    pytest.param(
        ex.check_cross_attention_alignment, make_align("mean_layers"), "对所有层的交叉注意力取了平均", id="all layers"
    ),
]


@pytest.mark.parametrize("checker, candidate, keyword", ALIGN_REJECTS)
def test_alignment_rejects(checker, candidate, keyword, capsys):
    assert_rejects(checker, candidate, keyword, capsys)


def test_alignment_hints_are_all_reached(capsys):
    from transformer_course.exercises import seq2seq

    assert_every_hint_reached({"_ALIGNMENT_HINTS": seq2seq._ALIGNMENT_HINTS}, ALIGN_REJECTS, capsys)
