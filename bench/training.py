"""Benchmark 4: training throughput and model FLOP utilisation (MFU) of a small MiniGPT.

One training step = forward + backward + AdamW update on a batch of random token ids (the
speed does not depend on the data). Model FLOPs per token come from ``tc.gpt_flops_per_token``
(6 x matmul weights + attention, the nanoGPT/PaLM convention); the peak is **measured**: a large
float32 matmul on the same device, timed interleaved with the training steps
(``step, matmul, step, matmul, ...``), so that both see the same machine load.

MFU = (FLOPs per token x tokens per second) / (matmul FLOPs per second).
"""

from __future__ import annotations

import torch

import transformer_course as tc
from transformer_course import benchmarking as tb

from .common import Context, log, sig


def _setup(ctx: Context):
    if ctx.quick:
        cfg = tc.GPTConfig(vocab_size=256, context_length=64, d_model=128, num_heads=4, num_layers=2)
        batch, n = 4, 1024
    elif ctx.cuda:
        cfg = tc.GPTConfig(vocab_size=256, context_length=512, d_model=512, num_heads=8, num_layers=8)
        batch, n = 32, 8192
    else:
        cfg = tc.GPTConfig(vocab_size=256, context_length=256, d_model=256, num_heads=4, num_layers=4)
        batch, n = 8, 2048
    return cfg, batch, n


def run(ctx: Context) -> dict:
    cfg, batch, n = _setup(ctx)
    tc.set_seed(ctx.seed)
    model = tc.MiniGPT(cfg).to(ctx.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(ctx.seed)
    data = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length + 1), generator=g).to(ctx.device)
    x, y = data[:, :-1], data[:, 1:]
    a = torch.randn(n, n, device=ctx.device)
    b = torch.randn(n, n, device=ctx.device)
    losses = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, targets=y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())

    def matmul() -> None:
        torch.mm(a, b)

    repeats = 3 if ctx.quick else 8
    numbers = {"step": 1, "matmul": tb.calibrate_number(matmul, 0.05, ctx.device)}
    samples = tb.time_interleaved({"step": step, "matmul": matmul}, repeats=repeats, warmup=2, number=numbers,
                                  device=ctx.device)  # fmt: skip
    med = tb.medians(samples)
    tokens = batch * cfg.context_length
    tok_s = tokens / med["step"]
    fpt = tc.gpt_flops_per_token(cfg, seq_len=cfg.context_length, training=True)
    peak = 2 * n**3 / med["matmul"]
    mfu = fpt * tok_s / peak
    if not all(torch.isfinite(v).item() for v in losses):
        raise AssertionError("non-finite training loss")
    log(f"  training: {tok_s:.0f} tok/s, model {fpt * tok_s / 1e9:.2f} GFLOP/s, "
        f"matmul peak {peak / 1e9:.1f} GFLOP/s, MFU {mfu:.3f}")  # fmt: skip
    return {
        "what": "MiniGPT training step (fwd+bwd+AdamW), float32, random tokens",
        "config": {"num_layers": cfg.num_layers, "d_model": cfg.d_model, "num_heads": cfg.num_heads,
                   "vocab_size": cfg.vocab_size, "context_length": cfg.context_length, "batch": batch},
        "parameters": tc.count_parameters(model),
        "flops_per_token": fpt,
        "step_ms": sig(med["step"] * 1e3),
        "tokens_per_s": sig(tok_s),
        "model_gflop_s": sig(fpt * tok_s / 1e9),
        "matmul_n": n,
        "matmul_peak_gflop_s": sig(peak / 1e9),
        "mfu": sig(mfu, 3),
        "repeats": repeats,
    }  # fmt: skip
