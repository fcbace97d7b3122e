"""Benchmark: MiniGPT against transformers' ``GPT2LMHeadModel`` at an identical configuration.

Both models get the same architecture (GPT-2: learned positions, Pre-LN, LayerNorm eps 1e-5,
tanh GELU, biases, tied output layer, no dropout) and equal parameter counts; the weights are
random (nothing is downloaded). Measured interleaved in one process, one CPU thread by default:

* a training step (forward, cross-entropy, backward, AdamW update) -> tokens per second;
* an eval forward (``torch.no_grad``) -> seconds.

The loss is computed the same way for both (``F.cross_entropy`` over all positions of the
logits), so both do the same work. ``GPT2LMHeadModel`` runs with its default attention
implementation (recorded in the results; ``sdpa`` in transformers 5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import benchmarking as tb

from .common import Context, log, sig

TRAIN_TARGET = 1.05  # MiniGPT tokens/s over GPT2LMHeadModel's, at least
EVAL_TARGET = 0.95  # MiniGPT eval forward time over GPT2LMHeadModel's, at most

# (name, GPTConfig arguments, batch): the two configurations (character-level vocabulary 65)
CONFIGS = [
    ("small", dict(vocab_size=65, context_length=128, d_model=128, num_heads=4, num_layers=4), 8),
    ("6x384", dict(vocab_size=65, context_length=256, d_model=384, num_heads=6, num_layers=6), 4),
]


def gpt2_twin(cfg: tc.GPTConfig):
    """A ``GPT2LMHeadModel`` with the architecture of ``cfg`` (which must be GPT-2's)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its config warns that GPT-2's bos/eos ids lie outside a small vocabulary
    eps = 1e-5 if cfg.eps is None else cfg.eps  # None: LayerNorm's own default, as GPT-2's
    hf_cfg = GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.d_model, n_layer=cfg.num_layers,
        n_head=cfg.num_heads, n_inner=cfg.d_ff, activation_function="gelu_new", layer_norm_epsilon=eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
    )  # fmt: skip
    return GPT2LMHeadModel(hf_cfg)


def _compare(name: str, kwargs: dict, batch: int, ctx: Context) -> dict:
    cfg = tc.GPTConfig(**kwargs, activation="gelu_tanh", positional="learned", norm_first=True, tie_weights=True)
    tc.set_seed(ctx.seed)
    ours = tc.MiniGPT(cfg).to(ctx.device)
    theirs = gpt2_twin(cfg).to(ctx.device)
    n_ours, n_theirs = tc.count_parameters(ours), sum(p.numel() for p in theirs.parameters())
    if n_ours != n_theirs:
        raise AssertionError(f"parameter counts differ: {n_ours} vs {n_theirs}")
    g = torch.Generator().manual_seed(ctx.seed)
    data = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1), generator=g).to(ctx.device)
    x, y = data[:, :-1], data[:, 1:]
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=3e-4)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=3e-4)

    def train_ours() -> None:
        opt_ours.zero_grad(set_to_none=True)
        _, loss = ours(x, targets=y)
        loss.backward()
        opt_ours.step()

    def train_theirs() -> None:
        opt_theirs.zero_grad(set_to_none=True)
        logits = theirs(input_ids=x).logits
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt_theirs.step()

    @torch.no_grad()
    def eval_ours() -> None:
        ours(x)

    @torch.no_grad()
    def eval_theirs() -> None:
        theirs(input_ids=x)

    repeats = 3 if ctx.quick else 9
    ours.train(), theirs.train()
    train = tb.medians(tb.time_interleaved({"MiniGPT": train_ours, "GPT2LMHeadModel": train_theirs},
                                           repeats=repeats, warmup=2, device=ctx.device))  # fmt: skip
    ours.eval(), theirs.eval()
    number = tb.calibrate_number(eval_ours, 0.05, ctx.device)
    evals = tb.medians(tb.time_interleaved({"MiniGPT": eval_ours, "GPT2LMHeadModel": eval_theirs},
                                           repeats=repeats, warmup=2, number=number, device=ctx.device))  # fmt: skip
    tokens = batch * cfg.context_length
    train_ratio = train["GPT2LMHeadModel"] / train["MiniGPT"]  # tokens/s ours over theirs
    eval_ratio = evals["MiniGPT"] / evals["GPT2LMHeadModel"]  # time ours over theirs
    log(f"  {name}: training tokens/s MiniGPT / GPT2LMHeadModel = {train_ratio:.3f} (target >= {TRAIN_TARGET}); "
        f"eval forward time = {eval_ratio:.3f} (target <= {EVAL_TARGET})")  # fmt: skip
    return {
        "name": name,
        "config": {**kwargs, "batch": batch, "activation": "gelu_tanh"},
        "parameters": n_ours,
        "hf_attn_implementation": theirs.config._attn_implementation,
        "train_tokens_per_s": {"MiniGPT": sig(tokens / train["MiniGPT"]),
                               "GPT2LMHeadModel": sig(tokens / train["GPT2LMHeadModel"])},
        "eval_forward_ms": {"MiniGPT": sig(evals["MiniGPT"] * 1e3),
                            "GPT2LMHeadModel": sig(evals["GPT2LMHeadModel"] * 1e3)},
        "train_tokens_per_s_ratio": sig(train_ratio, 3),
        "eval_time_ratio": sig(eval_ratio, 3),
        "train_target_met": train_ratio >= TRAIN_TARGET,
        "eval_target_met": eval_ratio <= EVAL_TARGET,
        "repeats": repeats,
    }  # fmt: skip


def run(ctx: Context) -> dict:
    import transformers

    configs = CONFIGS[:1] if ctx.quick else CONFIGS
    rows = [_compare(name, kwargs, batch, ctx) for name, kwargs, batch in configs]
    return {
        "what": "MiniGPT vs transformers.GPT2LMHeadModel, identical GPT-2 architecture, random weights",
        "transformers_version": transformers.__version__,
        "train_target": TRAIN_TARGET,
        "eval_target": EVAL_TARGET,
        "rows": rows,
    }
