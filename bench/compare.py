"""Side-by-side timings of several versions of the package, interleaved in one run.

    python -m bench.compare --tree v4=. --tree main=/tmp/wt-main --tree 8489c97=/tmp/wt-old

Each ``--tree NAME=PATH`` names a checkout; one worker process per checkout imports
``transformer_course`` from ``PATH/src`` (one intra-op thread) and builds the same models
with the same seed. The parent asks the workers for one figure at a time, in turn (the
order of the versions rotates every round), so that a busy shared machine slows every
version alike; each figure is the best of ``--rounds`` timings. Written to
``bench/results/side_by_side/cpu.json`` (or ``--output``) with the ratios against the first
tree. With ``--counts``, each worker first counts, per generated token of every decoding
figure, its Python function calls and the operator calls reaching the dispatcher: figures
that do not depend on how busy the machine is.

Figures (4 layers, d_model 256, 4 heads, vocabulary 256, batch 1 for decoding, greedy):

* ``train_tok_s``: tokens per second of a training step (forward, backward, AdamW),
  context 256, batch 8;
* ``generate_cached_512`` / ``generate_uncached_512``: seconds for 512 new tokens after a
  16-token prompt, context 1088, with and without the KV cache;
* ``window_{learned,rope}_{cached,uncached}``: seconds for 256 new tokens with a 128-token
  context window (past the window: re-encoding half the window for learned positions,
  the rolling cache for rotary ones).

Only the public API that every compared version has is used (``GPTConfig``, ``MiniGPT``,
``MiniGPT.generate``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FIGURES = (
    "train_tok_s",
    "generate_cached_512",
    "generate_uncached_512",
    "window_learned_cached",
    "window_learned_uncached",
    "window_rope_cached",
    "window_rope_uncached",
)
RESULTS = Path(__file__).parent / "results" / "side_by_side" / "cpu.json"  # not results/*.json: those are make bench's


def _decoding(tc, torch, figure: str):
    """``(work, new_tokens)``: ``work()`` runs the ``generate`` call of a decoding figure."""
    window = figure.startswith("window")
    positional = "rope" if "rope" in figure else "learned"
    context, new = (128, 256) if window else (1088, 512)
    cfg = tc.GPTConfig(
        vocab_size=256, context_length=context, d_model=256, num_heads=4, num_layers=4, positional=positional
    )
    model = tc.MiniGPT(cfg).eval()
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    use_cache = figure.endswith("_cached") or figure == "generate_cached_512"

    def work():
        model.generate(prompt, new, greedy=True, use_cache=use_cache)

    return work, new


def _count(tc, torch, figure: str) -> dict:
    """Per generated token of a decoding figure, counts that do not depend on the machine's load:
    Python function calls (cProfile) and operator calls that reach the dispatcher's Python key
    (a ``TorchDispatchMode``; under ``no_grad`` every one of them has first passed the autograd
    layer, under ``inference_mode`` none has)."""
    import cProfile
    import pstats

    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    tc.set_seed(0)
    work, new = _decoding(tc, torch, figure)
    work()  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    python_calls = sum(calls for _, calls, *_ in pstats.Stats(profiler).stats.values())
    with Ops() as ops:
        work()
    return {"python_calls": python_calls / new, "dispatched_ops": ops.calls / new}


def _measure(tc, torch, figure: str) -> float:
    """One timing of ``figure`` (after one untimed warm-up run of the same work)."""
    tc.set_seed(0)
    if figure == "train_tok_s":
        cfg = tc.GPTConfig(vocab_size=256, context_length=256, d_model=256, num_heads=4, num_layers=4)
        model = tc.MiniGPT(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        x = torch.randint(0, 256, (8, 256), generator=torch.Generator().manual_seed(0))

        def work():
            for _ in range(3):
                _, loss = model(x, x)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        tokens = 3 * x.numel()
    else:
        work, _ = _decoding(tc, torch, figure)
        tokens = None
    work()  # warm-up
    start = time.perf_counter()
    work()
    seconds = time.perf_counter() - start
    return tokens / seconds if tokens else seconds


def worker(src: str) -> None:
    """Serve figures read from stdin, one per line, as JSON lines on stdout."""
    sys.path.insert(0, src)
    import torch

    torch.set_num_threads(1)
    import transformer_course as tc

    print(json.dumps({"file": tc.__file__}), flush=True)
    for line in sys.stdin:
        what, figure = line.split()
        value = _count(tc, torch, figure) if what == "count" else _measure(tc, torch, figure)
        print(json.dumps({"value": value}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figures", nargs="*", default=list(FIGURES), choices=FIGURES)
    parser.add_argument("--counts", action="store_true", help="also count calls per token of the decoding figures")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON file to write (default {RESULTS})")
    parser.add_argument("--note", help="a line about the run, stored as note_machine")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    trees = dict(t.split("=", 1) for t in args.tree)
    procs = {}
    for name, path in trees.items():
        src = str((Path(path) / "src").resolve())
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bench.compare", "--worker", src],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
            cwd=Path(__file__).parent.parent,
        )
        loaded = json.loads(procs[name].stdout.readline())["file"]
        if not loaded.startswith(src):
            raise SystemExit(f"{name}: imported {loaded}, not from {src}")

    def ask(name: str, what: str, figure: str):
        procs[name].stdin.write(f"{what} {figure}\n")
        procs[name].stdin.flush()
        return json.loads(procs[name].stdout.readline())["value"]

    decoding = [f for f in args.figures if f != "train_tok_s"]
    counts = {name: {f: ask(name, "count", f) for f in decoding} for name in trees} if args.counts else None
    load_start = os.getloadavg()
    samples = {name: {f: [] for f in args.figures} for name in trees}
    names = list(trees)
    for r in range(args.rounds):
        for figure in args.figures:
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                value = ask(name, "time", figure)
                samples[name][figure].append(value)
                print(f"round {r} {figure:24s} {name:10s} {value:.4g}", flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    best = {
        name: {f: (max(v) if f.endswith("tok_s") else min(v)) for f, v in figs.items()}
        for name, figs in samples.items()
    }
    for name in names:  # derived: the KV-cache speed-ups
        b = best[name]
        for kind in ("generate", "window_learned", "window_rope"):
            cached = f"{kind}_cached_512" if kind == "generate" else f"{kind}_cached"
            uncached = cached.replace("_cached", "_uncached")
            if cached in b and uncached in b:
                b[f"{kind}_speedup"] = b[uncached] / b[cached]
    base = names[0]

    def base_advantage(figure: str, ours: float, theirs: float) -> float:
        higher_is_better = figure.endswith(("tok_s", "speedup"))
        return ours / theirs if higher_is_better else theirs / ours

    ratios = {name: {f: base_advantage(f, best[base][f], v) for f, v in best[name].items()} for name in names[1:]}
    result = {
        "trees": trees,
        "rounds": args.rounds,
        "load_average_1_5_15min": {"start": load_start, "end": os.getloadavg()},
        "threads": 1,
        "best": best,
        "samples": samples,
        "note": f"advantage of {base} over each other version, per figure: > 1 means {base} is "
        "better (seconds: their time / ours; tok_s and speed-ups: ours / theirs)",
        "advantage_of_" + base: ratios,
    }
    if counts:
        result["per_token_counts"] = counts
        result["note_counts"] = (
            "per generated token, independent of the machine's load: python_calls (cProfile) and "
            "dispatched_ops (operator calls reaching the dispatcher's Python key)"
        )
    if args.note:
        result["note_machine"] = args.note
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    if counts:
        print(json.dumps(counts, indent=1))
    print(json.dumps(result["best"], indent=1))
    print(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
