"""The tiny models the unit tests share (one definition each; pytest puts ``tests/`` on ``sys.path``)."""

import transformer_course as tc


def tiny_gpt(**overrides) -> tc.MiniGPT:
    """A 2-layer MiniGPT (V=20, C=16, E=16, H=4) in eval mode, the same weights on every call."""
    args = dict(vocab_size=20, context_length=16, d_model=16, num_heads=4, num_layers=2)
    args.update(overrides)
    tc.set_seed(0)
    return tc.MiniGPT(tc.GPTConfig(**args)).eval()


def tiny_transformer(**overrides) -> tc.Transformer:
    """A 2+2-layer encoder-decoder (V=11/13, E=16, H=4) in eval mode, the same weights on every call."""
    args = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=16, num_heads=4, num_encoder_layers=2,
                num_decoder_layers=2, d_ff=32, dropout=0.0, context_length=32)  # fmt: skip
    args.update(overrides)
    tc.set_seed(0)
    return tc.Transformer(tc.TransformerConfig(**args)).eval()
