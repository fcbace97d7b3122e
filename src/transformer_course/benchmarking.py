"""Small, tested helpers for measuring time and memory (used by ``bench/`` and the
appendix).

Timing follows three rules that make numbers from a busy laptop comparable:

* competitors are measured **side by side in one process**, interleaved
  ``A B C, B C A, ...`` (the starting competitor rotates every round, so none is always
  first after a pause);
* each sample is the mean of ``number`` calls, and the accelerator is synchronised
  before the clock is read;
* results are reported as **medians and ratios**, never as absolute claims from
  separate runs.

Memory is measured without the operating system: :func:`peak_tensor_bytes` follows
every tensor storage that the dispatcher creates while a function runs (any device),
:func:`saved_tensor_bytes` adds up the tensors that autograd keeps for the backward
pass, and :func:`cuda_peak_bytes` reads the CUDA caching allocator's own peak counter.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._validate import check_int, check_positive_int, check_token_ids

__all__ = [
    "synchronize",
    "time_interleaved",
    "medians",
    "calibrate_number",
    "peak_tensor_bytes",
    "saved_tensor_bytes",
    "cuda_peak_bytes",
    "dispatched_ops",
    "fit_power_law",
    "matmul_flops",
    "decode_latencies",
    "machine_info",
]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued kernels on ``device`` (CUDA/MPS); a no-op on the CPU."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def _check_fns(fns: Mapping[str, Callable[[], object]]) -> None:
    if not isinstance(fns, Mapping) or not fns:
        raise ValueError(
            f"fns must be a non-empty mapping name -> callable, got {fns!r}"
        )
    for name, fn in fns.items():
        if not callable(fn):
            raise TypeError(f"fns[{name!r}] is not callable: {fn!r}")


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    repeats: int = 5,
    warmup: int = 1,
    number: int | Mapping[str, int] = 1,
    device: torch.device | str | None = None,
) -> dict[str, list[float]]:
    """Time several zero-argument functions side by side; return seconds per call.

    Each of ``warmup`` untimed rounds and ``repeats`` timed rounds calls every function
    once (``number`` times when timed), in the order ``A B C`` for round 0, ``B C A``
    for round 1, and so on. A sample is the mean time of one call over ``number``
    calls, measured with :func:`time.perf_counter` after :func:`synchronize`;
    ``number`` may differ per function.

    Returns ``{name: [repeats samples in seconds]}`` in the order of ``fns``.
    """
    _check_fns(fns)
    check_positive_int("repeats", repeats)
    check_int("warmup", warmup, 0)
    names = list(fns)
    counts = {n: number for n in names} if isinstance(number, int) else dict(number)
    for n in names:
        check_positive_int(f"number[{n!r}]", counts.get(n))
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            calls = counts[n] if r >= warmup else 1
            synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                fns[n]()
            synchronize(device)
            if r >= warmup:
                samples[n].append((time.perf_counter() - start) / calls)
    return samples


def medians(samples: Mapping[str, Iterable[float]]) -> dict[str, float]:
    """The median of each list of samples (as returned by :func:`time_interleaved`)."""
    return {n: statistics.median(list(v)) for n, v in samples.items()}


def calibrate_number(
    fn: Callable[[], object],
    min_seconds: float = 0.02,
    device: torch.device | str | None = None,
) -> int:
    """How many calls of ``fn`` last at least ``min_seconds`` (a power of two, at
    least 1).

    Tiny functions are called several times per sample so that timer resolution and the
    Python overhead of the timing loop do not dominate.
    """
    if not min_seconds > 0:
        raise ValueError(f"min_seconds must be positive, got {min_seconds}")
    number = 1
    while True:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(device)
        if time.perf_counter() - start >= min_seconds or number >= 2**20:
            return number
        number *= 2


class _LiveTensorTracker(TorchDispatchMode):
    """Counts the bytes of tensor storages created by dispatched operators while they
    live."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[StorageWeakRef, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # storages freed since the last op
        for ref in [r for r in self.live if r.expired()]:
            self.current -= self.live.pop(ref)
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref not in self.live:
                    self.live[ref] = storage.nbytes()
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes of tensors created while ``fn()`` runs (including its backward, if it
    calls one).

    Every operator goes through PyTorch's dispatcher; a :class:`TorchDispatchMode`
    records the storage of each new output tensor and notices when it has been freed.
    The peak of the live total is the memory the computation needed beyond its inputs,
    on any device. Scratch buffers that a kernel allocates internally (below the
    dispatcher) are not seen.
    """
    tracker = _LiveTensorTracker()
    with tracker:
        fn()
    return tracker.peak


def saved_tensor_bytes(fn: Callable[[], object], exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the distinct storages that autograd saves for backward while ``fn()``
    runs.

    Uses :func:`torch.autograd.graph.saved_tensors_hooks`. Storages shared by several
    saved tensors (views) count once; storages of the tensors in ``exclude`` (typically
    the inputs, which exist anyway) do not count.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(saved.values())


def cuda_peak_bytes(
    fn: Callable[[], object], device: torch.device | str = "cuda"
) -> int:
    """Peak CUDA memory allocated while ``fn()`` runs, above what was allocated before
    it."""
    if not torch.cuda.is_available():
        raise ValueError("cuda_peak_bytes needs CUDA, which is not available")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


class _OpRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn: Callable[[], object]) -> list[str]:
    """Names of the ATen operators that ``fn()`` dispatches, in call order (e.g.
    ``aten.mm.default``).

    Shows, for instance, which kernel ``F.scaled_dot_product_attention`` chose on this
    machine.
    """
    recorder = _OpRecorder()
    with recorder:
        fn()
    return recorder.ops


def fit_power_law(x: Iterable[float], y: Iterable[float]) -> tuple[float, float]:
    """Least-squares fit of ``y = a · x**b`` on log-log axes; returns ``(b, a)``.

    ``b`` is the growth exponent: about 1 for memory linear in L, about 2 for quadratic.
    """
    xs, ys = [float(v) for v in x], [float(v) for v in y]
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(
            f"need at least 2 (x, y) pairs of equal length, got {len(xs)} and {len(ys)}"
        )
    if min(xs) <= 0 or min(ys) <= 0:
        raise ValueError(
            f"x and y must be positive for a log-log fit, got x={xs}, y={ys}"
        )
    lx, ly = [math.log(v) for v in xs], [math.log(v) for v in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    if sxx == 0:
        raise ValueError(f"x values must not all be equal, got {xs}")
    b = sum((a - mx) * (c - my) for a, c in zip(lx, ly, strict=True)) / sxx
    return b, math.exp(my - b * mx)


def matmul_flops(
    n: int = 2048,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
) -> float:
    """Measured FLOP/s of an ``n × n`` by ``n × n`` matmul (``2 n³`` FLOPs), median of
    ``repeats``.

    The denominator of model FLOP utilisation (MFU) on machines without a datasheet
    peak.
    """
    check_positive_int("n", n)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    samples = time_interleaved(
        {"mm": lambda: torch.mm(a, b)}, repeats=repeats, warmup=1, device=device
    )
    return 2 * n**3 / statistics.median(samples["mm"])


@torch.inference_mode()
def decode_latencies(
    model: torch.nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    device: torch.device | str | None = None,
) -> tuple[Tensor, list[float], list[float]]:
    """Greedy decoding with and without the KV cache, timed step by step in lockstep.

    ``model`` is a :class:`~transformer_course.MiniGPT`. At every step the cached step
    (the newest token only; the whole prompt at step 0) and the uncached step (the whole
    sequence so far) are timed back to back, alternating which goes first. Each is the
    step of ``model.generate``: inference mode, ``lm_head`` on the last position only,
    the choice of the next token. Both continue with the cached path's token, so they
    see the same sequence; it equals
    ``model.generate(prompt, max_new_tokens, greedy=True)``.

    Running the two back to back costs the cached step some speed: the uncached step
    before it evicts the weights and the cache from the processor's caches. ``generate``
    itself does not alternate, so its cached steps are faster than these per-step times
    say, and the ratio of the two modes higher.

    Returns ``(ids (N, T + max_new_tokens), cached_seconds, uncached_seconds)``, one
    time per step. ``n / sum(seconds[:n])`` is the decoding speed for ``n`` new tokens.
    """
    check_positive_int("max_new_tokens", max_new_tokens)
    C = model.cfg.context_length
    if prompt.size(1) + max_new_tokens > C:
        raise ValueError(
            f"prompt length {prompt.size(1)} + max_new_tokens {max_new_tokens} "
            f"exceeds context_length={C}; lockstep timing needs the whole sequence in "
            "one window"
        )
    check_token_ids("prompt", prompt, model.cfg.vocab_size)
    was_training = model.training
    model.eval()
    try:
        ids, cached_s, uncached_s = _lockstep(model, prompt, max_new_tokens, device)
    finally:
        model.train(was_training)
    # clone: a normal tensor, not an inference-mode one
    return ids.clone(), cached_s, uncached_s


def _lockstep(
    model: torch.nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    device: torch.device | str | None,
) -> tuple[Tensor, list[float], list[float]]:
    caches = model.new_caches()
    ids = prompt
    cached_s: list[float] = []
    uncached_s: list[float] = []
    for step in range(max_new_tokens):

        def cached(ids: Tensor = ids, step: int = step) -> Tensor:
            hidden = model.hidden_states(ids if step == 0 else ids[:, -1:], caches)
            # (N, V) -> (N, 1)
            return model.lm_head(hidden[:, -1]).argmax(dim=-1, keepdim=True)

        def uncached(ids: Tensor = ids) -> Tensor:
            hidden = model.hidden_states(ids, None)
            return model.lm_head(hidden[:, -1]).argmax(dim=-1, keepdim=True)

        order = (("cached", cached), ("uncached", uncached))
        if step % 2:
            order = order[::-1]
        for name, fn in order:
            synchronize(device)
            start = time.perf_counter()
            out = fn()
            synchronize(device)
            (cached_s if name == "cached" else uncached_s).append(
                time.perf_counter() - start
            )
            if name == "cached":
                next_id = out
        ids = torch.cat([ids, next_id], dim=1)  # (N, T) -> (N, T + 1)
    return ids, cached_s, uncached_s


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")  # Linux; elsewhere fall back to what platform knows
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info(device: torch.device | str = "cpu") -> dict[str, object]:
    """Where a measurement came from: CPU model, cores, threads, torch version, date,
    accelerator."""
    device = torch.device(device)
    info: dict[str, object] = {
        "device": device.type,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["accelerator"] = props.name
        info["accelerator_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cuda_version"] = torch.version.cuda
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return info
