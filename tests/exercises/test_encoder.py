"""The encoder-layer checker: correct variants pass, hand-written mutants are caught
with a hint naming the mistake."""

import pytest

from transformer_course import exercises as ex

from .support import assert_passes, assert_rejects, assert_skeleton


def encoder_keyword_mask(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, X, X, attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(A))


def encoder_positional_self(layer, X, attn_mask=None):
    # self-attention with key/value left to default, mask passed positionally
    sub1 = layer.self_attn(X, X, X, attn_mask)
    A = layer.norm1(sub1 + X)
    return layer.norm2(layer.ffn(A) + A)


def encoder_loop(layer, X, attn_mask=None):
    # one sublayer at a time, in a loop over (sublayer, norm)
    sublayers = [
        (lambda x: layer.self_attn(x, attn_mask=attn_mask), layer.norm1),
        (layer.ffn, layer.norm2),
    ]
    for f, norm in sublayers:
        X = norm(X + f(X))
    return X


def skeleton(layer, X, attn_mask=None):
    pass


def test_encoder_layer_accepts(capsys):
    for fn in (encoder_keyword_mask, encoder_positional_self, encoder_loop):
        assert_passes(ex.check_encoder_layer, fn, capsys)
    assert_skeleton(ex.check_encoder_layer, skeleton, capsys)


def dropout_after_the_norm(layer, X, attn_mask=None):  # learner test 20a, 2.5
    A = layer.drop(layer.norm1(X + layer.self_attn(X, X, X, attn_mask=attn_mask)))
    return layer.drop(layer.norm2(A + layer.ffn(A)))


def test_the_pass_line_says_dropout_is_graded_by_the_next_checker(capsys):
    """Evaluation mode cannot see where dropout sits: the ✓ line must say so."""
    assert_passes(ex.check_encoder_layer, dropout_after_the_norm, capsys)
    ex.check_encoder_layer(dropout_after_the_norm)
    assert "由下一行 check_encoder_dropout" in capsys.readouterr().out
    with pytest.raises(ex.ExerciseError):
        ex.check_encoder_dropout(dropout_after_the_norm)


def pre_ln(layer, X, attn_mask=None):
    A = X + layer.self_attn(layer.norm1(X), attn_mask=attn_mask)
    return A + layer.ffn(layer.norm2(A))


def no_residual_attn(layer, X, attn_mask=None):
    A = layer.norm1(layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(A))


def no_residual_ffn(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(layer.ffn(A))


def norm_in_branch(layer, X, attn_mask=None):
    A = X + layer.norm1(layer.self_attn(X, attn_mask=attn_mask))
    return A + layer.norm2(layer.ffn(A))


def swapped_norms(layer, X, attn_mask=None):
    A = layer.norm2(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm1(A + layer.ffn(A))


def ffn_on_input(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(X))


def ffn_residual_from_input(layer, X, attn_mask=None):
    """Learner test: the FFN's residual taken from the layer input X."""
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(X + layer.ffn(A))


def norm1_twice(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm1(A + layer.ffn(A))


def mask_dropped(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X))
    return layer.norm2(A + layer.ffn(A))


def mask_inverted(layer, X, attn_mask=None):
    mask = None if attn_mask is None else ~attn_mask
    A = layer.norm1(X + layer.self_attn(X, attn_mask=mask))
    return layer.norm2(A + layer.ffn(A))


def causal_without_padding(layer, X, attn_mask=None):
    """Learner test 10a (2.5): a causal mask in the encoder when no padding mask."""
    A = layer.norm1(X + layer.self_attn(X, X, X, attn_mask=attn_mask, is_causal=attn_mask is None))
    return layer.norm2(A + layer.ffn(A))


def calls_layer(layer, X, attn_mask=None):
    return layer(X, attn_mask=attn_mask)


def one_norm_only(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return A + layer.ffn(A)


def returns_tuple(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(A)), A


@pytest.mark.parametrize(
    "fn, keyword",
    [
        (pre_ln, "前归一化"),
        (no_residual_attn, "自注意力子层少了残差"),
        (no_residual_ffn, "前馈子层少了残差"),
        (norm_in_branch, "残差加在了归一化之后"),
        (swapped_norms, "两个归一化用反了"),
        (ffn_on_input, "第二个子层的输入"),
        (ffn_residual_from_input, "前馈子层的残差加的是层输入 X"),
        (norm1_twice, "两个子层都用了 norm1"),
        (mask_dropped, "掩码没有传给自注意力"),
        (mask_inverted, "掩码取反了"),
        (causal_without_padding, "编码器不是因果的"),
        (calls_layer, "不要直接调用 layer(X)"),
        (one_norm_only, "逐行对照公式"),
        (returns_tuple, "应是 torch.Tensor"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_encoder_layer_rejects(fn, keyword, capsys):
    assert_rejects(ex.check_encoder_layer, fn, keyword, capsys)
