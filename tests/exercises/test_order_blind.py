"""The no-positional-encoding checker of chapter 1's retraining exercise: a model without
positional encodings passes, one with them, a training-mode model, a (model, history) pair
and a skeleton are each told what is wrong."""

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course import exercises as ex

from .support import rejection

check = ex.check_order_blind_translator


class NoPositions(nn.Module):
    def forward(self, x, offset=0):
        return x


def _model(positional):
    torch.manual_seed(0)
    net = tc.Transformer(
        tc.TransformerConfig(
            12, 10, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32, context_length=8
        )
    )
    if not positional:
        for name, child in list(net.named_children()):
            if isinstance(child, tc.SinusoidalPositionalEncoding):
                setattr(net, name, NoPositions())
    return net.eval()


SRC = torch.tensor([[4, 5, 6, 7]])


def test_without_positions_passes(capsys):
    assert check(_model(False), SRC) is None
    assert capsys.readouterr().out.startswith("✓")


def test_skeleton(capsys):
    check(None, SRC)
    assert capsys.readouterr().out.startswith("尚未实现：net")


@pytest.mark.parametrize(
    ("net", "src", "keyword"),
    [
        (lambda: _model(True), SRC, "positional=False"),
        (lambda: _model(False).train(), SRC, "net.eval()"),
        (lambda: (_model(False), None), SRC, "[0]"),
        (lambda: "model", SRC, "train_translator"),
        (lambda: _model(False), torch.tensor([4, 5, 6]), "(1, S)"),
    ],
)
def test_rejects(net, src, keyword):
    message = rejection(lambda candidate: check(candidate, src), net())
    assert keyword in message, message


def test_bad_arity():
    with pytest.raises(TypeError, match="2 positional"):
        check(_model(False))
