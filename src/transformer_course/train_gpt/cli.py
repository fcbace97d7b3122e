"""The command line: flag types, the parser, ``main``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import transformer_course as tc

from . import run
from .config import (
    DEFAULT_BPE_VOCAB,
    DEFAULT_PRESET,
    PRESETS,
    TrainConfig,
    UsageError,
    model_default,
)
from .sample import sample


# --------------------------------------------------------------------------- flag types
def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum`` (argparse names the flag in its
    error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be an integer >= {minimum}, got {value}"
            )
        return value

    return parse


def float_in(
    low: float, high: float, *, low_inclusive: bool, high_inclusive: bool
) -> Callable[[str], float]:
    """An argparse type: a finite float in the interval from ``low`` to ``high``."""
    interval = (
        f"{'[' if low_inclusive else '('}{low}, {high}{']' if high_inclusive else ')'}"
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number, got {text!r}"
            ) from None
        above = value >= low if low_inclusive else value > low
        below = value <= high if high_inclusive else value < high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {interval}, got {text}"
            )
        return value

    return parse


POSITIVE_INT = int_at_least(1)
NON_NEGATIVE_INT = int_at_least(0)
POSITIVE_FLOAT = float_in(0.0, math.inf, low_inclusive=False, high_inclusive=False)
NON_NEGATIVE_FLOAT = float_in(0.0, math.inf, low_inclusive=True, high_inclusive=False)
FRACTION = float_in(0.0, 1.0, low_inclusive=False, high_inclusive=False)
PROBABILITY_BELOW_ONE = float_in(0.0, 1.0, low_inclusive=True, high_inclusive=False)


# --------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_course.train_gpt",
        description=(
            "Train a MiniGPT on the course corpus or your own text, or sample from it."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train (single process or under torchrun)")
    t.add_argument("--out-dir", help="checkpoint and log folder (default runs/gpt)")
    t.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="continue from OUT_DIR/ckpt.pt",
    )
    t.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=DEFAULT_PRESET,
        help="model size and run length (flags typed here win); default %(default)s",
    )
    # data
    t.add_argument(
        "--data",
        help="a UTF-8 text file, or a folder of .txt/.md files (default: the "
        "preset's shipped corpus); paragraphs are separated by blank lines",
    )
    t.add_argument(
        "--tokenizer", choices=["char", "bpe"], help="default: the preset's, else char"
    )
    t.add_argument(
        "--vocab-size",
        type=int_at_least(256),
        help=f"bpe ids, >= 256 (default: the preset's, else {DEFAULT_BPE_VOCAB})",
    )
    # model: on --resume the checkpoint's config is used, and a flag given here must
    # equal it
    t.add_argument("--context-length", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--d-model", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--num-heads", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--num-layers", type=POSITIVE_INT, help="default: the preset")
    t.add_argument(
        "--dropout", type=PROBABILITY_BELOW_ONE, help="in [0, 1); default: the preset"
    )
    for flag, choices in (
        ("positional", tc.POSITIONAL_ENCODINGS),
        ("norm", tc.NORMS),
        ("activation", tc.ACTIVATIONS),
    ):
        t.add_argument(
            f"--{flag}", choices=list(choices), help=f"default {model_default(flag)}"
        )
    # optimisation
    t.add_argument(
        "--batch-size",
        type=POSITIVE_INT,
        help="sequences per rank per micro-step; default: the preset",
    )
    t.add_argument(
        "--grad-accum", type=POSITIVE_INT, help="micro-steps per optimizer step"
    )
    t.add_argument("--max-steps", type=POSITIVE_INT, help="train until this step")
    t.add_argument("--lr", type=POSITIVE_FLOAT, help="peak learning rate")
    t.add_argument(
        "--min-lr",
        type=NON_NEGATIVE_FLOAT,
        help="learning rate at the end of decay (default: the preset's, or --lr / 10)",
    )
    t.add_argument("--warmup-steps", type=NON_NEGATIVE_INT)
    t.add_argument(
        "--lr-decay-steps",
        type=POSITIVE_INT,
        help="cosine decay length (default: --max-steps)",
    )
    t.add_argument("--weight-decay", type=NON_NEGATIVE_FLOAT)
    t.add_argument("--beta2", type=PROBABILITY_BELOW_ONE)
    t.add_argument("--grad-clip", type=NON_NEGATIVE_FLOAT, help="0 disables clipping")
    # evaluation, logging, checkpoints
    t.add_argument("--val-fraction", type=FRACTION, help="in (0, 1)")
    t.add_argument(
        "--eval-every", type=POSITIVE_INT, help="evaluate + checkpoint every N steps"
    )
    t.add_argument(
        "--eval-iters", type=POSITIVE_INT, help="validation batches per evaluation"
    )
    t.add_argument("--log-every", type=POSITIVE_INT)
    # system
    t.add_argument("--seed", type=NON_NEGATIVE_INT)
    t.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    t.add_argument(
        "--threads",
        type=POSITIVE_INT,
        help="CPU threads for torch (default: torch's, one per physical core)",
    )
    t.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        help="autocast dtype (auto: bfloat16 on a GPU that supports it, else float32)",
    )
    t.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="wrap the model in torch.compile",
    )

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument(
        "--ckpt", required=True, help="path to a ckpt.pt or best.pt written by train"
    )
    s.add_argument("--prompt", default=None, help="start text (default: a newline)")
    s.add_argument("-n", "--max-new-tokens", type=NON_NEGATIVE_INT, default=300)
    s.add_argument("--num-samples", type=POSITIVE_INT, default=1)
    s.add_argument("--temperature", type=POSITIVE_FLOAT, default=0.8)
    s.add_argument("--top-k", type=POSITIVE_INT, default=None)
    s.add_argument(
        "--top-p",
        type=float_in(0.0, 1.0, low_inclusive=False, high_inclusive=True),
        default=None,
    )
    s.add_argument("--greedy", action="store_true")
    s.add_argument("--seed", type=NON_NEGATIVE_INT, default=0)
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    options = {k: v for k, v in vars(args).items() if k != "command"}
    try:
        if args.command == "train":
            run.train(TrainConfig.from_args(args))
            return 0
        return sample(**options)
    except UsageError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
