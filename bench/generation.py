"""Benchmark 3: MiniGPT decoding speed with and without the KV cache.

Targets (issue 12): cached greedy generation >= 12x uncached at 512 new tokens, and >= 4x when
generating 256 tokens with a 128-token context window (past the window: the rolling cache for
rotary positions, half-window re-encoding for learned positions).

Model: 4 layers, d_model 256, 4 heads, vocabulary 256, context 1088, batch 1, a 16-token prompt,
greedy decoding. Two measurements:

* **The target**: ``MiniGPT.generate`` itself, ``use_cache=True`` against ``use_cache=False`` at
  512 new tokens, runs of the two modes interleaved, median of ``repeats``.
* **The curve**: ``tb.decode_latencies`` times the cached step and the uncached step at every
  position back to back (alternating which goes first), on the same token sequence; so per-token
  latency against position comes out directly, and tokens/second for n new tokens is
  ``n / (time of the first n steps)``, for every n at once. Back to back, each uncached step
  evicts the cached step's weights from the processor's caches, so these ratios are lower than
  ``generate``'s (compare ``rows`` with ``generate`` in the results).
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import torch

import transformer_course as tc
from transformer_course import benchmarking as tb

from .common import Context, log, save_figure, sig

TARGET = 12.0  # cached / uncached tokens per second at 512 new tokens
WINDOW_TARGET = 4.0  # the same for 256 new tokens with a 128-token context window
WINDOW, WINDOW_NEW = 128, 256
PROMPT = 16


def config() -> tc.GPTConfig:
    return tc.GPTConfig(vocab_size=256, context_length=1088, d_model=256, num_heads=4, num_layers=4)


def _smooth(xs: list[float], window: int) -> list[float]:
    """Running median (robust against scheduler hiccups on a busy machine)."""
    half = window // 2
    return [statistics.median(xs[max(0, i - half) : i + half + 1]) for i in range(len(xs))]


def _profile_decode_step(model: tc.MiniGPT, ids: torch.Tensor, ctx: Context, steps: int = 20) -> dict:
    """Where a cached decoding step spends its time, with ``ids.size(1)`` positions cached."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    with torch.no_grad():  # as in generate()
        caches = model.new_caches()
        model(ids, caches=caches)
        last = ids[:, -1:]
        with profile(activities=activities) as prof:
            for _ in range(steps):  # the cache grows by `steps` positions: a few percent of its length
                model(last, caches=caches)
            tb.synchronize(ctx.device)
    rows = []
    for ev in prof.key_averages():
        self_us = ev.self_device_time_total if ctx.cuda else ev.self_cpu_time_total
        rows.append((ev.key, self_us / steps / 1e3, ev.count // steps))
    total = sum(r[1] for r in rows)
    rows.sort(key=lambda r: -r[1])
    return {
        "cached_positions": int(ids.size(1)),
        "ms_per_step": sig(total, 3),
        "top_ops": [[k, sig(ms, 3), c, sig(ms / total, 2)] for k, ms, c in rows[:6]],  # name, ms, calls, share
    }


def _past_the_window(ctx: Context, repeats: int) -> list[dict]:
    """generate() with and without the cache, 256 new tokens through a 128-token window, interleaved."""
    rows = []
    for positional in ("learned", "rope"):
        cfg = tc.GPTConfig(vocab_size=256, context_length=WINDOW, d_model=256, num_heads=4, num_layers=4,
                           positional=positional)  # fmt: skip
        tc.set_seed(ctx.seed)
        model = tc.MiniGPT(cfg).to(ctx.device).eval()
        g = torch.Generator().manual_seed(ctx.seed)
        prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(ctx.device)
        fns = {
            "cached": lambda m=model, p=prompt: m.generate(p, WINDOW_NEW, greedy=True, use_cache=True),
            "uncached": lambda m=model, p=prompt: m.generate(p, WINDOW_NEW, greedy=True, use_cache=False),
        }
        med = tb.medians(tb.time_interleaved(fns, repeats=repeats, warmup=1, device=ctx.device))
        speedup = med["uncached"] / med["cached"]
        log(f"  past the window ({positional}, window {WINDOW}, {WINDOW_NEW} new): speedup {speedup:.2f}")
        rows.append({
            "positional": positional,
            "mode": "rolling cache" if model.rolling_cache else f"re-encode the last {WINDOW // 2} tokens",
            "cached_tok_s": sig(WINDOW_NEW / med["cached"]),
            "uncached_tok_s": sig(WINDOW_NEW / med["uncached"]),
            "speedup": sig(speedup),
            "target_met": speedup >= WINDOW_TARGET,
        })  # fmt: skip
    return rows


def run(ctx: Context) -> dict:
    max_new = 256 if ctx.quick else 1024
    ns = [n for n in (64, 128, 256, 512, 1024) if n <= max_new]
    check_n, check_repeats = (64, 3) if ctx.quick else (512, 3)
    tc.set_seed(ctx.seed)
    cfg = config()
    model = tc.MiniGPT(cfg).to(ctx.device).eval()
    g = torch.Generator().manual_seed(ctx.seed)
    prompt = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=g).to(ctx.device)
    log(f"  generation: lockstep decoding of {max_new} tokens")
    ids, cached, uncached = tb.decode_latencies(model, prompt, max_new, device=ctx.device)
    rows = []
    for n in ns:
        c, u = n / sum(cached[:n]), n / sum(uncached[:n])
        rows.append({"new_tokens": n, "cached_tok_s": sig(c), "uncached_tok_s": sig(u), "speedup": sig(c / u)})
        log(f"  generation n={n}: cached {c:.1f} tok/s, uncached {u:.1f} tok/s, speedup {c / u:.2f}")

    # the target: the library's own loop, interleaved: generate(use_cache=True) vs generate(use_cache=False)
    log(f"  generation: generate() at {check_n} new tokens, {check_repeats} interleaved repeats")

    def gen(use_cache: bool, n: int = check_n):
        return lambda: model.generate(prompt, n, greedy=True, use_cache=use_cache)

    fns = {"cached": gen(True), "uncached": gen(False)}
    samples = tb.time_interleaved(fns, repeats=check_repeats, warmup=1, device=ctx.device)
    med = tb.medians(samples)
    same = torch.equal(gen(True, 32)(), gen(False, 32)())
    window_rows = _past_the_window(ctx, 3 if ctx.quick else 5)
    decode_profile = None if ctx.quick else _profile_decode_step(model, ids[:, : PROMPT + 512], ctx)
    speedup = med["uncached"] / med["cached"]
    log(f"  generate() n={check_n}: speedup {speedup:.2f}")
    speedup_512 = sig(speedup) if check_n == 512 else None
    return {
        "what": "greedy decoding, batch 1, 16-token prompt; generate() interleaved (target), lockstep steps (curve)",
        "config": {"num_layers": cfg.num_layers, "d_model": cfg.d_model, "num_heads": cfg.num_heads,
                   "vocab_size": cfg.vocab_size, "context_length": cfg.context_length},
        "parameters": tc.count_parameters(model),
        "rows": rows,
        "per_token_ms": {"cached": [sig(t * 1e3, 3) for t in cached], "uncached": [sig(t * 1e3, 3) for t in uncached]},
        "generate": {
            "new_tokens": check_n,
            "cached_tok_s": sig(check_n / med["cached"]),
            "uncached_tok_s": sig(check_n / med["uncached"]),
            "speedup": sig(speedup),
            "cached_s": [sig(t) for t in samples["cached"]],
            "uncached_s": [sig(t) for t in samples["uncached"]],
            "same_tokens_32": same,
            "repeats": check_repeats,
        },
        "decode_step_profile": decode_profile,
        "target_speedup_at_512": TARGET,
        "speedup_at_512": speedup_512,
        "target_met": None if speedup_512 is None else speedup_512 >= TARGET,
        "past_the_window": {"context_length": WINDOW, "new_tokens": WINDOW_NEW, "target_speedup": WINDOW_TARGET,
                            "rows": window_rows},
        "generated_tokens": int(ids.size(1) - PROMPT),
    }  # fmt: skip


def plot(result: dict, ctx: Context) -> str:
    rows = result["rows"]
    ns = [r["new_tokens"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax1.plot(ns, [r["cached_tok_s"] for r in rows], "-o", label="KV cache")
    ax1.plot(ns, [r["uncached_tok_s"] for r in rows], "-s", label="no cache")
    for r in rows:
        ax1.annotate(f"{r['speedup']:.1f}x", (r["new_tokens"], r["cached_tok_s"]), fontsize=7,
                     textcoords="offset points", xytext=(0, 5), ha="center")  # fmt: skip
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("new tokens n")
    ax1.set_ylabel("tokens / s")
    ax1.set_title("Decoding speed (speedup annotated)", fontsize=9)
    ax1.legend(fontsize=8)
    per = result["per_token_ms"]
    pos = [PROMPT + i for i in range(len(per["cached"]))]
    window = 9 if len(pos) > 100 else 3
    ax2.plot(pos, _smooth(per["cached"], window), label="KV cache")
    ax2.plot(pos, _smooth(per["uncached"], window), label="no cache")
    ax2.set_xlabel("position of the token (prompt + generated so far)")
    ax2.set_ylabel(f"ms per token (running median of {window})")
    ax2.set_title("Per-token latency", fontsize=9)
    ax2.legend(fontsize=8)
    cfg = result["config"]
    fig.suptitle(f"MiniGPT {cfg['num_layers']} layers, d_model {cfg['d_model']} ({ctx.label})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, ctx.figure_path("generation"))
