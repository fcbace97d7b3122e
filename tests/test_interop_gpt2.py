"""load_hf_gpt2 against transformers' GPT2LMHeadModel (random weights, nothing downloaded)."""

import pytest
import torch

import transformer_course as tc

transformers = pytest.importorskip("transformers")


def _hf_model(**kw):
    args = dict(vocab_size=37, n_positions=24, n_embd=32, n_layer=2, n_head=4)
    args.update(kw)
    torch.manual_seed(0)
    config = transformers.GPT2Config(**args)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2 initialises norms to 1/0 and biases to 0: make every tensor matter
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.normal_(0.0, 0.3)
    return model, config


@pytest.mark.parametrize("n_inner", [None, 40])
def test_logits_equal_gpt2lmheadmodel(n_inner):
    hf, config = _hf_model(n_inner=n_inner)
    ours = tc.load_hf_gpt2(hf.state_dict(), config.to_dict()).eval()
    assert tc.count_parameters(ours) == sum(p.numel() for p in hf.parameters())
    ids = torch.randint(0, 37, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
    torch.testing.assert_close(ours(ids)[0], expected, atol=1e-5, rtol=1e-5)


def test_safetensors_naming_without_prefix_and_greedy_generation():
    hf, config = _hf_model()
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    ours = tc.load_hf_gpt2(
        sd, {k: config.to_dict()[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")}
    )
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 8, greedy=True), expected)


def test_bad_configs_and_state_dicts_are_rejected():
    hf, config = _hf_model()
    cfg = config.to_dict()
    with pytest.raises(ValueError, match=r"config lacks \['n_positions'\]"):
        tc.load_hf_gpt2(hf.state_dict(), {k: v for k, v in cfg.items() if k != "n_positions"})
    sd = dict(hf.state_dict())
    del sd["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"lacks 'h.1.mlp.c_fc.bias'"):
        tc.load_hf_gpt2(sd, cfg)
    with pytest.raises(ValueError, match=r"'wpe.weight' has shape \(24, 32\), expected \(48, 32\)"):
        tc.load_hf_gpt2(hf.state_dict(), {**cfg, "n_positions": 48})
    with pytest.raises(ValueError, match="does not have"):
        tc.load_hf_gpt2({**hf.state_dict(), "transformer.h.7.ln_1.weight": torch.ones(32)}, cfg)
