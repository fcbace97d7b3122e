#!/usr/bin/env python
r"""Train a character-level MiniGPT on the course corpus, nanoGPT style; sample from it.

One CPU or one GPU (``--preset`` sizes the model and the run; see :data:`PRESETS`)::

    python -m transformer_course.train_gpt train --out-dir runs/gpt   # cpu-small
    python -m transformer_course.train_gpt train --preset gpu --out-dir runs/gpt-gpu
    python -m transformer_course.train_gpt sample --ckpt runs/gpt/ckpt.pt \
        --prompt "The fox" -n 300

Several processes or GPUs (PyTorch DistributedDataParallel; gloo on CPU, nccl on GPU)::

    torchrun --standalone --nproc_per_node 4 -m transformer_course.train_gpt train \
        --out-dir runs/gpt

Resume an interrupted run (the step count, model and optimizer states continue)::

    python -m transformer_course.train_gpt train --out-dir runs/gpt --resume

The validation text is the last tenth of the corpus' paragraphs, whole paragraphs as in
chapter 5 (:func:`transformer_course.split_paragraphs`): each paragraph is one story,
so the validation loss is measured on stories the model never saw.

Nothing is lost when a run is killed, even with SIGKILL in the middle of a save:

* ``OUT_DIR/ckpt.pt`` (latest) and ``OUT_DIR/best.pt`` (lowest validation loss;
  weights only) are written to a temporary file, fsynced and renamed into place
  (``save_checkpoint``); a start removes the temporary files a killed save left behind;
* on ``--resume`` the model flags given on the command line must equal the
  checkpoint's config (only the flags you type are compared; leave them out to take
  the checkpoint's), and ``OUT_DIR/metrics.jsonl`` is cut back to the checkpoint's
  step, so a resumed run's log has every step exactly once and equals an uninterrupted
  run's; a resumed run ends with weights bitwise equal to an uninterrupted one (batches
  and dropout masks depend only on the seed, rank and step: :func:`derived_seed`);
* a run without ``--resume`` refuses an OUT_DIR that already holds a checkpoint;
* every numeric flag is range-checked, and OUT_DIR must be writable, before any work
  starts; user errors exit with status 2 and one ``error:`` line.

Every rank draws its own batches; DDP averages the gradients, so all replicas stay
identical, and the effective batch is ``batch_size * grad_accum * world_size``
sequences.
Checkpoints hold only tensors and plain Python values and are read back with
``torch.load(..., weights_only=True)`` (see ``transformer_course.checkpoint``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import transformer_course as tc
from transformer_course.checkpoint import (
    atomic_write,
    config_from_dict,
    load_checkpoint,
    remove_temp_files,
    save_checkpoint,
    state_dict_sha256,
)

CKPT_NAME = "ckpt.pt"
BEST_NAME = "best.pt"
METRICS_NAME = "metrics.jsonl"
PAUSE_ENV = "TRAIN_GPT_PAUSE_IN_SAVE"
RANK_STATE_ENV = "TRAIN_GPT_RANK_STATE"
PAUSE_MARKER = "paused-in-save"
# The model flags. Their parser default is None, so that on --resume the flags a user
# typed can be told apart from defaults and compared with the checkpoint's config.
MODEL_FLAGS = ("context_length", "d_model", "num_heads", "num_layers", "dropout",
               "positional", "norm", "activation")  # fmt: skip
MODEL_DEFAULTS = {"positional": "learned", "norm": "layernorm", "activation": "gelu"}
#: Sizes for the shipped corpus (about 41K training characters). ``cpu-small`` (the
#: default, chapter 5's recipe) is half a minute on a 2-core laptop, ``cpu-medium``
#: (twice the context, a larger model, 2.5x the steps) about a quarter of an hour;
#: both beat the n-gram baseline (README). ``gpu`` is nanoGPT's character-level
#: Shakespeare model (``config/train_shakespeare_char.py``).
#: Flags typed on the command line win over the preset.
PRESETS = {
    "cpu-small": dict(
        context_length=128, d_model=96, num_heads=4, num_layers=3, dropout=0.0,
        batch_size=32, max_steps=400, lr=1e-2, min_lr=1e-3, warmup_steps=20,
        eval_every=100, eval_iters=10,
    ),
    "cpu-medium": dict(
        context_length=256, d_model=128, num_heads=4, num_layers=4, dropout=0.1,
        batch_size=32, max_steps=1000, lr=5e-3, min_lr=5e-4, warmup_steps=50,
        eval_every=200, eval_iters=40,
    ),
    "gpu": dict(
        context_length=256, d_model=384, num_heads=6, num_layers=6, dropout=0.2,
        batch_size=64, max_steps=5000, lr=1e-3, min_lr=1e-4, warmup_steps=100,
        eval_every=250, eval_iters=200,
    ),
}  # fmt: skip
DEFAULT_PRESET = "cpu-small"


class UsageError(Exception):
    """A mistake in the command line or the out dir: reported as one line, exit status
    2."""


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
            "Train a character-level MiniGPT on the course corpus, or sample from it."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train (single process or under torchrun)")
    t.add_argument("--out-dir", default="runs/gpt", help="checkpoint and log folder")
    t.add_argument(
        "--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt"
    )
    t.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=DEFAULT_PRESET,
        help="model size and run length (flags typed here win); default %(default)s",
    )
    # model: on --resume the checkpoint's config is used, and a flag given here must
    # equal it
    d = MODEL_DEFAULTS
    t.add_argument("--context-length", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--d-model", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--num-heads", type=POSITIVE_INT, help="default: the preset")
    t.add_argument("--num-layers", type=POSITIVE_INT, help="default: the preset")
    t.add_argument(
        "--dropout", type=PROBABILITY_BELOW_ONE, help="in [0, 1); default: the preset"
    )
    t.add_argument(
        "--positional",
        choices=["learned", "sinusoidal", "rope", "none"],
        help=f"default {d['positional']}",
    )
    t.add_argument(
        "--norm", choices=["layernorm", "rmsnorm"], help=f"default {d['norm']}"
    )
    t.add_argument(
        "--activation", choices=list(tc.ACTIVATIONS), help=f"default {d['activation']}"
    )
    # optimisation
    t.add_argument(
        "--batch-size",
        type=POSITIVE_INT,
        help="sequences per rank per micro-step; default: the preset",
    )
    t.add_argument(
        "--grad-accum",
        type=POSITIVE_INT,
        default=1,
        help="micro-steps per optimizer step",
    )
    t.add_argument("--max-steps", type=POSITIVE_INT, help="train until this step")
    t.add_argument("--lr", type=POSITIVE_FLOAT, help="peak learning rate")
    t.add_argument(
        "--min-lr", type=NON_NEGATIVE_FLOAT, help="learning rate at the end of decay"
    )
    t.add_argument("--warmup-steps", type=NON_NEGATIVE_INT)
    t.add_argument(
        "--lr-decay-steps",
        type=POSITIVE_INT,
        default=None,
        help="cosine decay length (default: --max-steps)",
    )
    t.add_argument("--weight-decay", type=NON_NEGATIVE_FLOAT, default=0.1)
    t.add_argument("--beta2", type=PROBABILITY_BELOW_ONE, default=0.99)
    t.add_argument(
        "--grad-clip", type=NON_NEGATIVE_FLOAT, default=1.0, help="0 disables clipping"
    )
    # evaluation, logging, checkpoints
    t.add_argument("--val-fraction", type=FRACTION, default=0.1, help="in (0, 1)")
    t.add_argument(
        "--eval-every", type=POSITIVE_INT, help="evaluate + checkpoint every N steps"
    )
    t.add_argument(
        "--eval-iters", type=POSITIVE_INT, help="validation batches per evaluation"
    )
    t.add_argument("--log-every", type=POSITIVE_INT, default=10)
    # system
    t.add_argument("--seed", type=NON_NEGATIVE_INT, default=1337)
    t.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    t.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="autocast dtype (auto: bfloat16 on a GPU that supports it, else float32)",
    )
    t.add_argument(
        "--compile", action="store_true", help="wrap the model in torch.compile"
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


def apply_preset(args: argparse.Namespace) -> None:
    """Fill the run flags left out (None) from ``args.preset``; the model flags stay
    None here (:func:`model_config` fills them for a new run, a resumed run takes the
    checkpoint's)."""
    for name, value in PRESETS[args.preset].items():
        if name not in MODEL_FLAGS and getattr(args, name) is None:
            setattr(args, name, value)


def check_train_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks that involve two flags (one flag's range is checked by its argparse
    type)."""
    if args.min_lr > args.lr:
        parser.error(f"--min-lr ({args.min_lr}) must not exceed --lr ({args.lr})")


# --------------------------------------------------------------------------- helpers
@dataclasses.dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Read torchrun's environment, pick the device and start the process group."""
    info = DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
    )
    if device_name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda was given but torch.cuda.is_available() is False"
        )
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if info.enabled:
        if use_cuda:
            torch.cuda.set_device(info.local_rank)
            device = torch.device("cuda", info.local_rank)
            dist.init_process_group("nccl", device_id=device)
        else:
            if device_name == "mps":
                raise ValueError(
                    "multi-process training supports cpu (gloo) or cuda (nccl), not mps"
                )
            device = torch.device("cpu")
            dist.init_process_group("gloo")
    else:
        device = torch.device("cuda") if use_cuda else tc.get_device(device_name)
    return info, device


def lr_at(
    step: int, *, lr: float, min_lr: float, warmup: int, decay_steps: int
) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then cosine decay to
    ``min_lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def derived_seed(*parts: object) -> int:
    """A 64-bit seed that depends only on ``parts``, e.g. ``(seed, rank, step)``: the
    one seeding rule for batches, dropout masks and validation batches."""
    key = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def batch_generator(seed: int, rank: int, step: int, micro: int) -> torch.Generator:
    """A generator whose batches depend only on (seed, rank, step, micro-step).

    This makes a resumed run draw exactly the batches the uninterrupted run would have.
    """
    return torch.Generator().manual_seed(derived_seed(seed, rank, step, micro))


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (nanoGPT's grouping)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, args.beta2))


def autocast_context(
    device: torch.device, dtype_name: str
) -> contextlib.AbstractContextManager:
    if dtype_name == "auto":
        bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype_name = "bfloat16" if bf16_ok else "float32"
    if dtype_name == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: torch.Tensor,
    args: argparse.Namespace,
    context_length: int,
    device: torch.device,
    amp,
) -> float:
    """Mean loss over ``eval_iters`` fixed batches (the same on every rank and every
    call)."""
    model.eval()
    gen = torch.Generator().manual_seed(derived_seed(args.seed, "validation"))
    total = 0.0
    for _ in range(args.eval_iters):
        x, y = tc.lm_batch(data, args.batch_size, context_length, generator=gen)
        with amp:
            _, loss = model(x.to(device), targets=y.to(device))
        total += float(loss)
    model.train()
    return total / args.eval_iters


def log(info: DistInfo, message: str) -> None:
    if info.is_main:
        print(message, flush=True)


# --------------------------------------------------------------------------- files
def prepare_out_dir(out_dir: Path, *, is_main: bool) -> None:
    """Create OUT_DIR, prove it writable, and (main rank) remove temporary files of
    killed saves."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # created, then deleted
        tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-").close()
    except OSError as error:
        raise UsageError(
            f"--out-dir {str(out_dir)!r} is not a writable folder: {error}"
        ) from None
    if is_main:
        for name in (CKPT_NAME, BEST_NAME, METRICS_NAME):
            for tmp in remove_temp_files(out_dir / name):
                print(f"removed {tmp.name}, left by an interrupted save", flush=True)


def model_config(args: argparse.Namespace, vocab_size: int) -> tc.GPTConfig:
    """The config of a new run: the model flags given, the preset's (or
    MODEL_DEFAULTS) for the others."""
    defaults = {**PRESETS[args.preset], **MODEL_DEFAULTS}
    given = {name: getattr(args, name) for name in MODEL_FLAGS}
    values = {name: defaults[name] if v is None else v for name, v in given.items()}
    try:
        return tc.GPTConfig(vocab_size=vocab_size, **values)
    except (ValueError, TypeError) as error:
        raise UsageError(f"invalid model flags: {error}") from None


def check_model_flags_match(args: argparse.Namespace, saved: dict) -> None:
    """On --resume: every model flag given on the command line must equal the
    checkpoint's config.

    Flags left out take the checkpoint's values; a flag that differs is an error rather
    than being ignored (a run that silently trains another model than the one asked for
    loses the user's intent).
    """
    differ = [
        (
            f"--{name.replace('_', '-')} {getattr(args, name)!r} "
            f"(checkpoint: {saved.get(name)!r})"
        )
        for name in MODEL_FLAGS
        if getattr(args, name) is not None and getattr(args, name) != saved.get(name)
    ]
    if differ:
        raise UsageError(
            "--resume: model flags differ from the checkpoint's config: "
            + ", ".join(differ)
            + "; leave them out to continue the checkpoint's model, "
            + "or train into a new --out-dir"
        )


def truncate_metrics(path: Path, last_step: int) -> int:
    """Keep the records of ``path`` (JSON lines) with ``step <= last_step``; return how
    many were cut.

    A run killed after its last checkpoint wrote records for steps it will redo on
    resume, and maybe half a line; both go, so that the resumed log has every record
    exactly once. The file is rewritten atomically (temporary file, fsync, rename).
    """
    if not path.is_file():
        return 0
    kept, cut = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            keep = isinstance(record, dict) and int(record["step"]) <= last_step
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            cut += 1
    if cut:
        atomic_write(path, "".join(kept).encode())
    return cut


# --------------------------------------------------------------------------- train
@dataclasses.dataclass
class Run:
    """What the training steps share: the data, the model (``model`` may be wrapped in
    DDP/compile, ``raw_model`` is the module itself) and the counters."""

    args: argparse.Namespace
    info: DistInfo
    device: torch.device
    tok: tc.CharTokenizer
    train_data: torch.Tensor
    val_data: torch.Tensor
    cfg: tc.GPTConfig
    raw_model: tc.MiniGPT
    model: nn.Module
    optimizer: torch.optim.Optimizer
    amp: contextlib.AbstractContextManager
    start_step: int = 0
    best_val: float = float("inf")

    @property
    def out_dir(self) -> Path:
        return Path(self.args.out_dir)


def train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    apply_preset(args)
    check_train_args(parser, args)
    prepare_out_dir(Path(args.out_dir), is_main=int(os.environ.get("RANK", 0)) == 0)
    info, device = setup_distributed(args.device)
    hooks = TestHooks.from_env(Path(args.out_dir))
    try:
        hooks.after_training(_train(args, info, device, hooks))
        return 0
    finally:
        if info.enabled:
            dist.destroy_process_group()


def _train(
    args: argparse.Namespace, info: DistInfo, device: torch.device, hooks: TestHooks
) -> Run:
    """Load the data, resume or start, then train: nanoGPT's loop in named steps."""
    tok, train_data, val_data = load_splits(args)
    cfg, resume = resume_or_new(args, tok)
    check_split_lengths(cfg, train_data, val_data)
    run = build(args, info, device, tok, train_data, val_data, cfg, resume)
    log_start(run)
    step = run.start_step
    t0 = time.perf_counter()
    while step < args.max_steps:
        lr = set_lr(run.optimizer, step, args)
        loss = train_step(run, step)
        step += 1
        if step % args.log_every == 0 or step == args.max_steps:
            train_loss = mean_over_ranks(loss, info)
            dt, t0 = (time.perf_counter() - t0) / args.log_every, time.perf_counter()
            log(
                info,
                f"step {step:6d} | loss {train_loss:.4f} | lr {lr:.2e} | "
                f"{1000 * dt:.0f} ms/step",
            )
            write_metrics(run, {"step": step, "train_loss": train_loss, "lr": lr})
        if step % args.eval_every == 0 or step == args.max_steps:
            evaluate_and_checkpoint(run, step, hooks)
    if run.start_step >= args.max_steps:
        log(
            info,
            f"checkpoint is at step {run.start_step} >= --max-steps {args.max_steps}; "
            "nothing to do",
        )
    return run


def load_splits(args: argparse.Namespace) -> tuple[tc.CharTokenizer, Tensor, Tensor]:
    """The shipped corpus, split by whole paragraphs as in chapter 5
    (:func:`transformer_course.split_paragraphs`), as two id tensors."""
    text = tc.load_text_corpus()
    tok = tc.CharTokenizer(text)
    train_text, val_text = tc.split_paragraphs(text, args.val_fraction)
    return tok, _ids(tok, train_text), _ids(tok, val_text)


def _ids(tok: tc.CharTokenizer, text: str) -> Tensor:
    return torch.tensor(tok.encode(text), dtype=torch.long)


def resume_or_new(
    args: argparse.Namespace, tok: tc.CharTokenizer
) -> tuple[tc.GPTConfig, dict | None]:
    """The config of the run, and the checkpoint to resume from (None for a new run)."""
    ckpt_path = Path(args.out_dir) / CKPT_NAME
    if not args.resume:
        if ckpt_path.exists():
            raise UsageError(
                f"{str(ckpt_path)!r} exists: pass --resume to continue that run, "
                "or choose another --out-dir"
            )
        return model_config(args, tok.vocab_size), None
    if not ckpt_path.is_file():
        raise UsageError(
            f"--resume given but there is no checkpoint at {str(ckpt_path)!r}"
        )
    try:
        resume = load_checkpoint(ckpt_path, map_location="cpu")
    except ValueError as error:
        raise UsageError(f"--resume: {error}") from None
    if resume["extra"].get("tokenizer_chars") != tok.chars:
        raise UsageError(
            "--resume: the checkpoint's tokenizer does not match the corpus' characters"
        )
    try:
        cfg = config_from_dict(tc.GPTConfig, resume["config"])
    except (TypeError, ValueError) as error:
        raise UsageError(
            f"--resume: the checkpoint holds no usable GPTConfig: {error}"
        ) from None
    check_model_flags_match(args, resume["config"])
    return cfg, resume


def check_split_lengths(
    cfg: tc.GPTConfig, train_data: Tensor, val_data: Tensor
) -> None:
    for name, split in (("training", train_data), ("validation", val_data)):
        if len(split) <= cfg.context_length + 1:
            raise UsageError(
                f"the {name} split has {len(split)} tokens, "
                f"not more than context_length + 1 = {cfg.context_length + 1}; "
                "lower --context-length or change --val-fraction"
            )


def build(
    args: argparse.Namespace,
    info: DistInfo,
    device: torch.device,
    tok: tc.CharTokenizer,
    train_data: Tensor,
    val_data: Tensor,
    cfg: tc.GPTConfig,
    resume: dict | None,
) -> Run:
    """Model and optimizer, restored from ``resume`` if given, wrapped for
    compile/DDP."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    raw_model = tc.MiniGPT(cfg).to(device)
    optimizer = make_optimizer(raw_model, args)
    model = torch.compile(raw_model) if args.compile else raw_model
    if info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    run = Run(
        args,
        info,
        device,
        tok,
        train_data,
        val_data,
        cfg,
        raw_model,
        model,
        optimizer,
        autocast_context(device, args.dtype),
    )
    if resume is not None:
        raw_model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        run.start_step = int(resume["step"])
        run.best_val = float(resume["extra"].get("best_val_loss", float("inf")))
    return run


def log_start(run: Run) -> None:
    """Log the run's sizes; cut the metrics log back to the starting step."""
    args, info = run.args, run.info
    tokens = args.batch_size * args.grad_accum * info.world_size
    tokens *= run.cfg.context_length
    log(
        info,
        f"device={run.device} world_size={info.world_size} "
        f"params={tc.count_parameters(run.raw_model):,} vocab={run.tok.vocab_size} "
        f"train_tokens={len(run.train_data):,} tokens/step={tokens:,}",
    )
    if run.start_step:
        log(info, f"resumed from {run.out_dir / CKPT_NAME} at step {run.start_step}")
    if info.is_main:
        metrics = run.out_dir / METRICS_NAME
        cut = truncate_metrics(metrics, run.start_step)
        if cut:
            log(
                info,
                f"removed {cut} record(s) past step {run.start_step} from {metrics}",
            )
    if info.enabled:
        dist.barrier()


def set_lr(
    optimizer: torch.optim.Optimizer, step: int, args: argparse.Namespace
) -> float:
    decay_steps = args.lr_decay_steps or args.max_steps
    lr = lr_at(
        step,
        lr=args.lr,
        min_lr=args.min_lr,
        warmup=args.warmup_steps,
        decay_steps=decay_steps,
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def train_step(run: Run, step: int) -> Tensor:
    """One optimizer step over ``grad_accum`` micro-batches; returns the mean loss."""
    args, info, model = run.args, run.info, run.model
    model.train()
    torch.manual_seed(derived_seed(args.seed, info.rank, step, "dropout"))
    loss_sum = torch.zeros((), device=run.device)
    for micro in range(args.grad_accum):
        x, y = step_batch(run, step, micro)
        last_micro = micro == args.grad_accum - 1
        # DDP averages the gradients once, after the last micro-batch
        sync = info.enabled and not last_micro
        with model.no_sync() if sync else contextlib.nullcontext():
            with run.amp:
                _, loss = model(x, targets=y)
            (loss / args.grad_accum).backward()
        loss_sum += loss.detach()
    if args.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_sum / args.grad_accum


def step_batch(run: Run, step: int, micro: int) -> tuple[Tensor, Tensor]:
    """The training batch of (seed, rank, step, micro-step), on the device."""
    gen = batch_generator(run.args.seed, run.info.rank, step, micro)
    x, y = tc.lm_batch(
        run.train_data, run.args.batch_size, run.cfg.context_length, generator=gen
    )
    return x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True)


def mean_over_ranks(loss: Tensor, info: DistInfo) -> float:
    if info.enabled:
        loss = loss.clone()
        dist.all_reduce(loss)  # gloo has no AVG: sum, then divide
        loss = loss / info.world_size
    return float(loss)


def evaluate_and_checkpoint(run: Run, step: int, hooks: TestHooks) -> None:
    """Validation loss; ``best.pt`` if it improved, then ``ckpt.pt`` (main rank)."""
    val_loss = evaluate(
        run.raw_model,
        run.val_data,
        run.args,
        run.cfg.context_length,
        run.device,
        run.amp,
    )
    improved = val_loss < run.best_val
    run.best_val = min(run.best_val, val_loss)
    log(run.info, f"step {step:6d} | val loss {val_loss:.4f} | best {run.best_val:.4f}")
    write_metrics(run, {"step": step, "val_loss": val_loss})
    if run.info.is_main:
        common = dict(
            step=step,
            config=run.cfg,
            tokenizer_chars=run.tok.chars,
            world_size=run.info.world_size,
            seed=run.args.seed,
        )
        # best.pt first: a kill between the two saves then loses nothing
        if improved:
            pause = hooks.pause(BEST_NAME, step)
            save_checkpoint(
                run.out_dir / BEST_NAME, run.raw_model, None, val_loss=val_loss,
                before_replace=pause, **common,
            )  # fmt: skip
        pause = hooks.pause(CKPT_NAME, step)
        save_checkpoint(
            run.out_dir / CKPT_NAME, run.raw_model, run.optimizer,
            best_val_loss=run.best_val, before_replace=pause, **common,
        )  # fmt: skip
    if run.info.enabled:
        dist.barrier()


def write_metrics(run: Run, record: dict) -> None:
    if run.info.is_main:
        with (run.out_dir / METRICS_NAME).open("a") as f:
            f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- test hooks
@dataclasses.dataclass
class TestHooks:
    """Hooks for the end-to-end tests, read once from the environment; both off in a
    normal run.

    * ``TRAIN_GPT_PAUSE_IN_SAVE=NAME:STEP`` (e.g. ``ckpt.pt:4``): the save of NAME at
      STEP writes its complete temporary file, creates ``OUT_DIR/paused-in-save`` and
      sleeps, so a test can kill the process at the most delicate moment of a save;
    * ``TRAIN_GPT_RANK_STATE=1``: after training every rank writes
      ``OUT_DIR/rank_state/rank<r>.json`` with the SHA-256 of its final weights and of
      its first batch.
    """

    out_dir: Path
    pause_at: str | None = None
    rank_state: bool = False

    @classmethod
    def from_env(cls, out_dir: Path) -> TestHooks:
        return cls(
            out_dir, os.environ.get(PAUSE_ENV), os.environ.get(RANK_STATE_ENV) == "1"
        )

    def pause(self, name: str, step: int) -> Callable[[Path], None] | None:
        if self.pause_at != f"{name}:{step}":
            return None

        def pause(tmp: Path) -> None:
            (self.out_dir / PAUSE_MARKER).write_text(str(tmp))
            time.sleep(3600)  # until the test kills the process

        return pause

    def after_training(self, run: Run) -> None:
        if not self.rank_state:
            return
        x, _ = step_batch(run, run.start_step, 0)
        state = {
            "rank": run.info.rank,
            "world_size": run.info.world_size,
            "start_step": run.start_step,
            "step": max(run.start_step, run.args.max_steps),
            "weights_sha256": state_dict_sha256(run.raw_model.state_dict()),
            "first_batch_sha256": hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest(),
        }
        folder = self.out_dir / "rank_state"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{run.info.rank}.json").write_text(json.dumps(state))


# --------------------------------------------------------------------------- sample
def sample(args: argparse.Namespace) -> int:
    device = tc.get_device(args.device)
    try:
        # weights_only=True inside
        ckpt = load_checkpoint(args.ckpt, map_location="cpu")
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--ckpt: {error}") from None
    cfg = config_from_dict(tc.GPTConfig, ckpt["config"])
    tok = tc.CharTokenizer(ckpt["extra"]["tokenizer_chars"])
    model = tc.MiniGPT(cfg)
    model.load_state_dict(ckpt["model"])
    model.to(device).eval()

    prompt = args.prompt
    if prompt is None:
        prompt = "\n" if "\n" in tok.chars else tok.chars[0]
    unknown = sorted(set(prompt) - set(tok.chars))
    if not prompt or unknown:
        raise UsageError(
            "the prompt must be non-empty and use the training characters; "
            f"unknown characters: {unknown}"
        )
    ids = torch.tensor(
        [tok.encode(prompt)] * args.num_samples, dtype=torch.long, device=device
    )
    ids = ids[:, -cfg.context_length :]
    gen = torch.Generator(device=device).manual_seed(args.seed)
    out = model.generate(
        ids,
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        greedy=args.greedy,
        generator=gen,
    )
    for i, row in enumerate(out.tolist()):
        if args.num_samples > 1:
            print(f"----- sample {i} (step {ckpt['step']})")
        print(tok.decode(row), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return train(parser, args)
        return sample(args)
    except UsageError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
