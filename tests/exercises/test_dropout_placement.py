"""The dropout-placement checker (chapter 2, exercise 2.5): correct placements written
in other styles pass, each wrong placement is caught with its own hint."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course import exercises as ex
from transformer_course.exercises import dropout_placement

from .support import assert_every_hint_reached, assert_passes, assert_rejects, assert_skeleton

check = ex.check_encoder_dropout


def keyword_mask(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.drop(layer.self_attn(X, X, X, attn_mask=attn_mask)))
    return layer.norm2(A + layer.drop(layer.ffn(A)))


def functional_dropout(layer, X, attn_mask=None):
    # F.dropout with the layer's p and mode instead of the module; sum order swapped
    p, train = layer.drop.p, layer.training
    A = layer.norm1(F.dropout(layer.self_attn(X, attn_mask=attn_mask), p, train) + X)
    return layer.norm2(F.dropout(layer.ffn(A), p, train) + A)


def sublayer_loop(layer, X, attn_mask=None):
    for f, norm in (
        (lambda x: layer.self_attn(x, x, x, attn_mask), layer.norm1),
        (layer.ffn, layer.norm2),
    ):
        X = norm(X + layer.drop(f(X)))
    return X


def skeleton(layer, X, attn_mask=None):
    pass


def test_dropout_placement_accepts(capsys):
    for fn in (keyword_mask, functional_dropout, sublayer_loop):
        assert_passes(check, fn, capsys)
    assert_skeleton(check, skeleton, capsys)


def no_dropout(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(A))


def dropout_after_norm(layer, X, attn_mask=None):
    A = layer.drop(layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask)))
    return layer.drop(layer.norm2(A + layer.ffn(A)))


def dropout_on_sum(layer, X, attn_mask=None):
    A = layer.norm1(layer.drop(layer.self_attn(X, attn_mask=attn_mask) + X))
    return layer.norm2(layer.drop(layer.ffn(A) + A))


def attention_dropout_only(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.drop(layer.self_attn(X, attn_mask=attn_mask)))
    return layer.norm2(A + layer.ffn(A))


def ffn_dropout_only(layer, X, attn_mask=None):
    A = layer.norm1(X + layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + layer.drop(layer.ffn(A)))


def dropout_on_inputs(layer, X, attn_mask=None):
    # each sublayer reads its dropped input; the residual keeps the undropped one
    for f, norm in (
        (lambda x: layer.self_attn(x, x, x, attn_mask), layer.norm1),
        (layer.ffn, layer.norm2),
    ):
        X = norm(X + f(layer.drop(X)))
    return X


def dropout_on_each_input(layer, X, attn_mask=None):
    # learner test 27a, 2.5: query, key and value each dropped on its own, then the FFN's input
    d = layer.drop
    A = layer.norm1(X + layer.self_attn(d(X), d(X), d(X), attn_mask=attn_mask))
    return layer.norm2(A + layer.ffn(d(A)))


def one_mask_for_both(layer, X, attn_mask=None):
    # the mask is drawn once, before either sublayer, and multiplied into both outputs
    scale = F.dropout(X.new_ones(X.shape), layer.drop.p, layer.training)
    A = layer.norm1(X + scale * layer.self_attn(X, attn_mask=attn_mask))
    return layer.norm2(A + scale * layer.ffn(A))


def one_mask_after_attention(layer, X, attn_mask=None):
    attended = layer.self_attn(X, attn_mask=attn_mask)
    keep = layer.drop(torch.ones_like(attended))
    A = layer.norm1(X + attended * keep)
    return layer.norm2(A + layer.ffn(A) * keep)


def dropout_twice(layer, X, attn_mask=None):
    # dropout on the sublayer output and again on the residual branch: not a listed mistake
    A = layer.norm1(X + layer.drop(layer.drop(layer.self_attn(X, attn_mask=attn_mask))))
    return layer.norm2(A + layer.drop(layer.ffn(A)))


def calls_layer(layer, X, attn_mask=None):
    return layer(X, attn_mask=attn_mask)


def wrong_shape(layer, X, attn_mask=None):
    return keyword_mask(layer, X, attn_mask)[:, :-1]


REJECTS = [
    pytest.param(check, no_dropout, "没有用 layer.drop", id="no_dropout"),
    pytest.param(check, dropout_after_norm, "放在了 LayerNorm 之后", id="after_norm"),
    pytest.param(check, dropout_on_sum, "残差相加之后的和上", id="on_sum"),
    pytest.param(check, attention_dropout_only, "只有自注意力子层", id="attention_only"),
    pytest.param(check, ffn_dropout_only, "只有前馈子层", id="ffn_only"),
    pytest.param(check, dropout_on_inputs, "作用在了子层的输入上", id="on_input"),
    pytest.param(check, dropout_on_each_input, "作用在了子层的输入上", id="on_each_input"),
    pytest.param(check, one_mask_for_both, "同一个 dropout 掩码", id="shared_mask_first"),
    pytest.param(check, one_mask_after_attention, "同一个 dropout 掩码", id="shared_mask"),
]


@pytest.mark.parametrize("checker, fn, keyword", REJECTS)
def test_dropout_placement_rejects_with_its_hint(checker, fn, keyword, capsys):
    assert_rejects(checker, fn, keyword, capsys)


@pytest.mark.parametrize(
    "fn, keyword",
    [
        (dropout_twice, "layer.drop 调用了 3 次"),
        (calls_layer, "不要直接调用 layer(X)"),
        (wrong_shape, "形状"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_dropout_placement_rejects_other_mistakes(fn, keyword, capsys):
    assert_rejects(check, fn, keyword, capsys)


def test_every_dropout_hint_reached(capsys):
    assert_every_hint_reached({"_DROPOUT_MISTAKES": dropout_placement._DROPOUT_MISTAKES}, REJECTS, capsys)


def test_dropout_variant_refuses_unknown_mistake():
    with pytest.raises(ValueError, match="unknown dropout mistake 'sideways'"):
        dropout_placement._dropout_variant(None, None, None, "sideways")
