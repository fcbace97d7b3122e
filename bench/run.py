"""Run the benchmarks of the transformer_course package and write results + figures.

    python -m bench.run --quick            # a minute or two, results in a temp folder
    python -m bench.run --full             # the full suite -> bench/results/<device>.json + PNGs

(from the repository root: ``-m`` puts the root on ``sys.path``, so ``bench`` is a package)

The device is CUDA when present (``--device auto``, the default), else the CPU. On the CPU the
suite uses one intra-op thread by default (``--threads 1``): numbers from a busy machine are then
reproducible, and multi-threaded kernels do not stall on a descheduled thread; ``--threads 0``
keeps PyTorch's default. All timings are medians of interleaved repeats, reported as ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import attention, chapters, generation, memory, reference, tokenizer, training
from bench.common import Context, log
from transformer_course import benchmarking as tb

ROOT = Path(__file__).resolve().parent.parent

BENCHMARKS = {
    "attention": attention,
    "memory": memory,
    "generation": generation,
    "training": training,
    "reference": reference,
    "chapters": chapters,
    "tokenizer": tokenizer,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes, few repeats (the default)")
    mode.add_argument("--full", action="store_true", help="the full suite; writes bench/results/")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads on the CPU (0: torch default)")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: bench/results for --full, a temp folder for --quick)")  # fmt: skip
    p.add_argument("--nbval-junit", type=Path, default=None, help="read chapter times from this JUnit XML")
    p.add_argument("--skip-chapters", action="store_true", help="do not run nbval over the book in --full")
    p.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers for the nbval run")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = not args.full
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))  # fmt: skip
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    out = args.out or (ROOT / "bench" / "results" if not quick else Path(tempfile.gettempdir()) / "tc-bench-quick")
    out.mkdir(parents=True, exist_ok=True)
    info = tb.machine_info(device)
    threads = torch.get_num_threads()
    if device.type == "cuda":
        label = f"cuda: {info['accelerator']}"
    else:
        label = f"cpu: {info['cpu_model']}, {threads} thread{'s' if threads > 1 else ''}"
    ctx = Context(device=device, quick=quick, out_dir=out, label=label, seed=args.seed,
                  nbval_junit=args.nbval_junit, skip_chapters=args.skip_chapters, jobs=args.jobs)  # fmt: skip
    path = out / f"{device.type}.json"
    results: dict = {}
    merge = bool(args.only) and path.exists()
    if merge:  # re-running a subset keeps the other benchmarks' results and the machine record
        results = json.loads(path.read_text(encoding="utf-8"))
        if results.get("mode") != ("quick" if quick else "full") or results.get("label") != label:
            raise SystemExit(f"{path} holds {results.get('mode')} results for {results.get('label')!r}; "
                             "use another --out or run all benchmarks")  # fmt: skip
    else:
        results.update(machine=info, label=label, mode="quick" if quick else "full")
    results.setdefault("benchmarks", {})
    results.setdefault("figures", {})
    results.setdefault("seconds", {})
    log(f"benchmarks {names} on {label} ({results['mode']}) -> {path}")
    for name in names:
        log(f"[{name}]")
        start = time.perf_counter()
        result = BENCHMARKS[name].run(ctx)
        now = tb.machine_info(device)
        result["measured_at"] = now["date"]
        result["load_average_1min_end"] = now.get("load_average_1min")  # a busy machine shows here
        results["benchmarks"][name] = result
        plot = getattr(BENCHMARKS[name], "plot", None)
        figure = plot(result, ctx) if plot is not None else None
        if figure:
            results["figures"][name] = figure
        results["seconds"][name] = round(time.perf_counter() - start, 1)
        path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if not merge:
        results["machine"]["load_average_1min_end"] = tb.machine_info(device).get("load_average_1min")
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(summary(results))
    print(f"results: {path}")
    return 0


def summary(results: dict) -> str:
    """A few lines with the headline ratios."""
    b = results["benchmarks"]
    lines = [f"{results['label']} ({results['mode']})"]
    if "attention" in b:
        for r in b["attention"]["sizes"]:
            lines.append(f"attention N={r['N']} L={r['L']} E={r['E']} H={r['H']}: "
                         f"fused/nn.MHA {r['ratio_vs_torch']['fused']:.3f}, "
                         f"explicit/nn.MHA {r['ratio_vs_torch']['explicit']:.3f}, "
                         f"sdpa/nn.MHA {r['ratio_vs_torch']['sdpa']:.3f}")  # fmt: skip
    if "memory" in b:
        e = b["memory"]["exponent"]
        lines.append(f"memory exponents (saved for backward): explicit {e['explicit']['saved']}, "
                     f"fused {e['fused']['saved']} ({b['memory']['fused_kernel']})")  # fmt: skip
    if "generation" in b:
        for r in b["generation"]["rows"]:
            lines.append(f"generation n={r['new_tokens']}: cache speedup {r['speedup']:.2f}x")
        gen = b["generation"]["generate"]
        lines.append(f"generate() n={gen['new_tokens']}: cache speedup {gen['speedup']:.2f}x")
        for r in b["generation"].get("past_the_window", {}).get("rows", []):
            lines.append(f"past the window ({r['positional']}, {r['mode']}): cache speedup {r['speedup']:.2f}x")
    if "training" in b:
        t = b["training"]
        lines.append(f"training: {t['tokens_per_s']} tok/s, MFU {t['mfu']}")
    if "reference" in b:
        for r in b["reference"]["rows"]:
            lines.append(f"vs GPT2LMHeadModel ({r['name']}, {r['parameters']:,} params): training tokens/s "
                         f"{r['train_tokens_per_s_ratio']:.3f}x, "
                         f"eval forward time {r['eval_time_ratio']:.3f}x")  # fmt: skip
    if "tokenizer" in b:
        t = b["tokenizer"]
        lines.append(f"BPE training ({t['merges']} merges, {t['characters']:,} chars): tc {t['tc_s']} s, "
                     f"tokenizers {t['tokenizers_s']} s, ratio {t['ratio_tc_over_tokenizers']}")  # fmt: skip
    if "chapters" in b and "per_notebook" in b["chapters"]:
        lines.append(f"chapters: {b['chapters']['total_cell_s']} s of cells")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
