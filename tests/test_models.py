"""What the two models of ``models.py`` share, tested once on both: dropout reaches every layer."""

import pytest
from helpers import tiny_gpt, tiny_transformer
from torch import nn

import transformer_course as tc


@pytest.mark.parametrize("make,attention_layers", [(tiny_gpt, 2), (tiny_transformer, 6)])
def test_dropout_reaches_every_layer(make, attention_layers):
    model = make(dropout=0.3)
    attention = [m for m in model.modules() if isinstance(m, tc.MultiHeadAttention)]
    assert {m.p for m in model.modules() if isinstance(m, nn.Dropout)} == {0.3}
    assert len(attention) == attention_layers and {m.dropout for m in attention} == {0.3}
