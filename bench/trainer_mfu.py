"""The trainer's ``gpu`` preset on a GPU: throughput and MFU with and without ``torch.compile``.

    python -m bench.trainer_mfu                       # needs CUDA; writes bench/results/trainer_mfu/cuda.json
    python -m bench.trainer_mfu --steps 600 --full-run --out /tmp/x

Each mode runs ``python -m transformer_course.train_gpt train --preset gpu`` as a child
process for ``--steps`` optimizer steps with no evaluation in between and reads the
``ms/step`` lines it logs; the first logged interval (warm-up, and compilation for
``--compile``) is dropped and the median of the rest is the step time.

MFU = model FLOPs per step / step time / peak, where the model FLOPs come from
``tc.gpt_flops_per_token`` (the nanoGPT/PaLM convention) and the peak is **measured** in
this process: a bfloat16 8192³ matmul (the trainer trains in bfloat16 autocast on a GPU).
``--full-run`` also trains the whole preset once with ``--compile`` (its evaluation
schedule included) and records the final validation loss and bits per character.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import transformer_course as tc
from transformer_course import benchmarking as tb
from transformer_course.train_gpt.config import PRESETS

# the trainer's log lines (tests/test_train_script.py checks that these match them)
STEP_LINE = re.compile(r"第\s+(\d+) 步 \| 训练损失 [\d.]+ \| 学习率 \S+ \| (\d+) ms/步")
VAL_LINE = re.compile(r"第\s+(\d+) 步 \| 验证损失 ([\d.]+)（([\d.]+) 比特/字符）")
VOCAB = re.compile(r"词表 (\d+)")
RESULTS = Path(__file__).parent / "results" / "trainer_mfu" / "cuda.json"  # not results/*.json (make bench's)


def bf16_peak(n: int = 8192, repeats: int = 10) -> float:
    """Measured bfloat16 matmul FLOP/s on the current GPU (median of ``repeats``)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    samples = tb.time_interleaved({"mm": lambda: torch.mm(a, b)}, repeats=repeats, warmup=3, device="cuda")
    return 2 * n**3 / statistics.median(samples["mm"])


def train(args: list[str], out_dir: Path) -> tuple[str, float]:
    """Run the trainer; return its log and the wall time in seconds."""
    cmd = [sys.executable, "-m", "transformer_course.train_gpt", "train", "--preset", "gpu",
           "--out-dir", str(out_dir), *args]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr, wall


def step_ms(log_text: str) -> float:
    """Median ms/step over the logged intervals, the first one (warm-up/compile) dropped."""
    values = [int(m.group(2)) for m in STEP_LINE.finditer(log_text)]
    if len(values) < 3:
        raise SystemExit(f"too few ms/step lines in the trainer's log:\n{log_text[-2000:]}")
    return statistics.median(values[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="optimizer steps per throughput run")
    p.add_argument("--full-run", action="store_true", help="also train the whole preset with --compile")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    args = p.parse_args(argv)
    if args.steps < 300:
        raise SystemExit(f"--steps must be >= 300 (three logged intervals of 100), got {args.steps}")
    if not torch.cuda.is_available():
        raise SystemExit("bench.trainer_mfu needs a CUDA GPU")
    preset = PRESETS["gpu"]
    cfg = tc.GPTConfig(vocab_size=256, context_length=preset["context_length"], d_model=preset["d_model"],
                       num_heads=preset["num_heads"], num_layers=preset["num_layers"])  # fmt: skip
    peak = bf16_peak()
    result: dict[str, object] = {"machine": tb.machine_info("cuda"), "preset": preset,
                                 "bf16_matmul_peak_tflop_s": round(peak / 1e12, 1), "modes": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in (("eager", []), ("compile", ["--compile"])):
            log_text, wall = train(["--max-steps", str(args.steps), "--eval-every", str(args.steps),
                                    "--log-every", "100"] + extra, Path(tmp) / mode)  # fmt: skip
            vocab = int(VOCAB.search(log_text).group(1))
            fpt = tc.gpt_flops_per_token(dataclasses.replace(cfg, vocab_size=vocab), seq_len=cfg.context_length)
            tokens = preset["batch_size"] * preset["context_length"]
            ms = step_ms(log_text)
            result["modes"][mode] = {
                "steps": args.steps,
                "wall_s": round(wall, 1),
                "step_ms": ms,
                "tokens_per_s": round(tokens / ms * 1e3),
                "mfu": round(fpt * tokens / (ms / 1e3) / peak, 4),
            }
            print(mode, result["modes"][mode], flush=True)
        if args.full_run:
            log_text, wall = train(["--compile"], Path(tmp) / "full")
            last = list(VAL_LINE.finditer(log_text))[-1]
            result["full_run"] = {"compile": True, "steps": int(last.group(1)), "wall_s": round(wall, 1),
                                  "step_ms": step_ms(log_text), "val_loss": float(last.group(2)),
                                  "val_bits_per_char": float(last.group(3))}  # fmt: skip
            print("full run", result["full_run"], flush=True)
    e, c = result["modes"]["eager"], result["modes"]["compile"]
    result["compile_speedup"] = round(e["step_ms"] / c["step_ms"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("bf16_matmul_peak_tflop_s", "compile_speedup")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
