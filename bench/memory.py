"""Benchmark 2: memory of explicit vs fused attention as the sequence length L grows.

The attention core alone, forward + backward, on q, k, v of shape (N, H, L, D):
``tc.scaled_dot_product_attention`` (explicit: it materialises the (L, L) weights) vs
``F.scaled_dot_product_attention`` (fused kernel). Three measurements:

* ``saved``: bytes that autograd keeps for backward (``saved_tensors_hooks``), inputs excluded;
  deterministic, the memory that a deep network holds per layer between forward and backward;
* ``peak``: peak bytes of live tensors created during forward + backward, followed operator by
  operator with a ``TorchDispatchMode`` (works on the CPU, where PyTorch has no peak counter;
  scratch buffers inside a kernel are not seen);
* ``cuda_peak`` (CUDA only): ``torch.cuda.max_memory_allocated`` above the inputs.

The growth exponent b of ``bytes ~ a * L**b`` is fitted on log-log axes: about 2 for the explicit
path; about 1 for the fused kernel when the backend is memory-efficient (flash attention on CPU
and CUDA). Which kernel ran is recorded from the dispatched ATen operators.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course import benchmarking as tb

from .common import Context, log, save_figure, sig

LENGTHS = {
    "quick": [64, 128, 256, 512],
    "cpu": [128, 256, 512, 1024, 2048],
    "cuda": [512, 1024, 2048, 4096, 8192],
}
N, H, D = 1, 8, 64


def _paths(q, k, v):
    return {
        "explicit": lambda: tc.scaled_dot_product_attention(q, k, v)[0],
        "fused": lambda: F.scaled_dot_product_attention(q, k, v),
    }


def run(ctx: Context) -> dict:
    lengths = LENGTHS["quick"] if ctx.quick else LENGTHS["cuda" if ctx.cuda else "cpu"]
    methods = ["saved", "peak"] + (["cuda_peak"] if ctx.cuda else [])
    data = {path: {m: [] for m in methods} for path in ("explicit", "fused")}
    kernel = None
    for L in lengths:
        tc.set_seed(ctx.seed)
        q, k, v = (torch.randn(N, H, L, D, device=ctx.device, requires_grad=True) for _ in range(3))
        for path, fn in _paths(q, k, v).items():

            def fwd_bwd(fn=fn) -> None:
                fn().sum().backward()

            data[path]["saved"].append(tb.saved_tensor_bytes(fn, exclude=[q, k, v]))
            for t in (q, k, v):
                t.grad = None
            data[path]["peak"].append(tb.peak_tensor_bytes(fwd_bwd))
            if ctx.cuda:
                for t in (q, k, v):
                    t.grad = None
                data[path]["cuda_peak"].append(tb.cuda_peak_bytes(fwd_bwd, ctx.device))
            for t in (q, k, v):
                t.grad = None
        if kernel is None:
            ops = tb.dispatched_ops(_paths(q, k, v)["fused"])
            kernel = next((op for op in ops if "scaled_dot_product" in op), ops[-1] if ops else "?")
        log(f"  memory L={L}: saved explicit {data['explicit']['saved'][-1] / 2**20:.1f} MiB, "
            f"fused {data['fused']['saved'][-1] / 2**20:.2f} MiB")  # fmt: skip
    exponents = {path: {m: sig(tb.fit_power_law(lengths, data[path][m])[0], 3) for m in methods} for path in data}
    return {
        "what": "attention core fwd+bwd, float32, q/k/v (N, H, L, D); bytes",
        "N": N, "H": H, "D": D,
        "L": lengths,
        "bytes": data,
        "exponent": exponents,
        "fused_kernel": kernel,
        "ratio_explicit_vs_fused_saved_at_max_L": sig(data["explicit"]["saved"][-1] / data["fused"]["saved"][-1]),
    }  # fmt: skip


def plot(result: dict, ctx: Context) -> str:
    L = result["L"]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    styles = {"saved": "-o", "peak": "--s", "cuda_peak": ":^"}
    names = {"saved": "saved for backward", "peak": "peak live tensors", "cuda_peak": "CUDA peak"}
    for path, color in (("explicit", "C3"), ("fused", "C0")):
        for m, ys in result["bytes"][path].items():
            b = result["exponent"][path][m]
            ax.loglog(L, [y / 2**20 for y in ys], styles[m], color=color, base=2,
                      label=f"{path}, {names[m]}: $L^{{{b:.2f}}}$")  # fmt: skip
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("MiB")
    ax.set_title(f"Attention memory, N={result['N']} H={result['H']} D={result['D']} ({ctx.label})", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, ctx.figure_path("memory"))
