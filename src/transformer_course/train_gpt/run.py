"""A training run: the data, the model and optimizer (new or resumed), and nanoGPT's
loop in named steps, with evaluation, checkpoints and the metrics log."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

import transformer_course as tc
from transformer_course.checkpoint import (
    atomic_write,
    remove_temp_files,
    save_checkpoint,
)

from . import distributed
from .config import TrainConfig, UsageError, read_checkpoint, saved_model_config
from .data import Data, bits_per_char, load_data, tokenizer_extra
from .distributed import DistInfo, log

CKPT_NAME = "ckpt.pt"
BEST_NAME = "best.pt"
METRICS_NAME = "metrics.jsonl"


@dataclasses.dataclass
class Run:
    """What the training steps share: settings, data, the model (``model`` may be
    wrapped in DDP/compile, ``raw_model`` is the module itself) and the counters."""

    cfg: TrainConfig
    info: DistInfo
    device: torch.device
    data: Data
    model_cfg: tc.GPTConfig
    raw_model: tc.MiniGPT
    model: nn.Module
    optimizer: torch.optim.Optimizer
    amp: contextlib.AbstractContextManager
    start_step: int = 0
    best_val: float = float("inf")


def train(cfg: TrainConfig) -> Run:
    """Check the checkpoint and the data, prepare the out dir and the processes, then
    :func:`train_loop`; returns the finished run. Bad input is refused before anything
    is written."""
    info = DistInfo.from_env()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    resume = read_resume(cfg)
    saved = None if resume is None else resume["extra"]
    data = load_data(cfg, run_context_length(cfg, resume), saved)
    model_cfg = run_model_config(cfg, data, resume)
    if saved is not None:
        cfg.check_schedule(saved.get("lr_schedule"))
    device = distributed.pick_device(cfg.device, info)
    prepare_out_dir(cfg.out_dir, is_main=info.is_main)
    device = distributed.setup(info, device)
    try:
        return train_loop(cfg, info, device, data, model_cfg, resume)
    finally:
        distributed.teardown(info)


def train_loop(
    cfg: TrainConfig,
    info: DistInfo,
    device: torch.device,
    data: Data,
    model_cfg: tc.GPTConfig,
    resume: dict | None,
) -> Run:
    """Build the model (new or resumed), then train: nanoGPT's loop in named steps."""
    run = build(cfg, info, device, data, model_cfg, resume)
    log_start(run)
    step = run.start_step
    # ms/step: training time since the last log line over the steps since then
    # (evaluation and checkpointing are not counted)
    t0, elapsed, steps_timed = time.perf_counter(), 0.0, 0
    while step < cfg.max_steps:
        lr = set_lr(run.optimizer, step, cfg)
        loss = train_step(run, step)
        step += 1
        steps_timed += 1
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            train_loss = distributed.mean_over_ranks(loss, info)
            elapsed += time.perf_counter() - t0
            log(
                info,
                f"第 {step:6d} 步 | 训练损失 {train_loss:.4f} | 学习率 {lr:.2e} | "
                f"{1000 * elapsed / steps_timed:.0f} ms/步",
            )
            write_metrics(run, {"step": step, "train_loss": train_loss, "lr": lr})
            t0, elapsed, steps_timed = time.perf_counter(), 0.0, 0
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            elapsed += time.perf_counter() - t0
            evaluate_and_checkpoint(run, step)
            t0 = time.perf_counter()
    if run.start_step >= cfg.max_steps:
        log(
            info,
            f"检查点已在第 {run.start_step} 步，不少于 --max-steps {cfg.max_steps}："
            "没有要训练的步数",
        )
    return run


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
            f"--out-dir {str(out_dir)!r} 不是可写的文件夹：{error}"
        ) from None
    if is_main:
        for name in (CKPT_NAME, BEST_NAME, METRICS_NAME):
            for tmp in remove_temp_files(out_dir / name):
                print(f"删去了上次保存中断时留下的临时文件 {tmp.name}", flush=True)


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
    for line in path.read_text(encoding="utf-8").splitlines():
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


def write_metrics(run: Run, record: dict) -> None:
    if run.info.is_main:
        with (run.cfg.out_dir / METRICS_NAME).open("a") as f:
            f.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------- start
def read_resume(cfg: TrainConfig) -> dict | None:
    """The checkpoint to resume from (None for a new run); nothing is written."""
    ckpt_path = cfg.out_dir / CKPT_NAME
    if not cfg.resume:
        if ckpt_path.exists():
            raise UsageError(
                f"{str(ckpt_path)!r} 已经存在：要接着那次训练请加 --resume，"
                "否则换一个 --out-dir"
            )
        return None
    return read_checkpoint(ckpt_path, "--resume")


def run_context_length(cfg: TrainConfig, resume: dict | None) -> int:
    """The checkpoint's context length if it records one, else the flags' or the
    preset's (what the data must be longer than)."""
    saved = resume.get("config") if resume is not None else None
    if isinstance(saved, dict) and isinstance(saved.get("context_length"), int):
        return saved["context_length"]
    return cfg.model_config(vocab_size=1).context_length


def run_model_config(cfg: TrainConfig, data: Data, resume: dict | None) -> tc.GPTConfig:
    """A new run's model config, or the checkpoint's (whose vocabulary must be the
    tokenizer's, and which the model flags typed must equal)."""
    if resume is None:
        return cfg.model_config(data.tokenizer.vocab_size)
    model_cfg = saved_model_config(resume, "--resume")
    if model_cfg.vocab_size != data.tokenizer.vocab_size:
        raise UsageError(
            f"--resume：检查点的模型有 {model_cfg.vocab_size} 个词元 id，"
            f"它的分词器却有 {data.tokenizer.vocab_size} 个"
        )
    cfg.check_matches(resume["config"])
    return model_cfg


def autocast_context(
    device: torch.device, dtype_name: str
) -> contextlib.AbstractContextManager:
    if dtype_name == "auto":
        bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
        dtype_name = "bfloat16" if bf16_ok else "float32"
    if dtype_name == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def build(
    cfg: TrainConfig,
    info: DistInfo,
    device: torch.device,
    data: Data,
    model_cfg: tc.GPTConfig,
    resume: dict | None,
) -> Run:
    """Model and optimizer, restored from ``resume`` if given, wrapped for
    compile/DDP."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    raw_model = tc.MiniGPT(model_cfg).to(device)
    groups = tc.decay_param_groups(raw_model, cfg.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2))
    model = torch.compile(raw_model) if cfg.compile else raw_model
    if info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    run = Run(
        cfg=cfg,
        info=info,
        device=device,
        data=data,
        model_cfg=model_cfg,
        raw_model=raw_model,
        model=model,
        optimizer=optimizer,
        amp=autocast_context(device, cfg.dtype),
    )
    if resume is not None:
        raw_model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        run.start_step = int(resume["step"])
        run.best_val = float(resume["extra"].get("best_val_loss", float("inf")))
    return run


def log_start(run: Run) -> None:
    """Log the run's sizes; cut the metrics log back to the starting step."""
    cfg, info = run.cfg, run.info
    tokens = cfg.batch_size * cfg.grad_accum * info.world_size
    tokens *= run.model_cfg.context_length
    log(
        info,
        f"设备 {run.device} | 进程数 {info.world_size} | "
        f"参数 {tc.count_parameters(run.raw_model):,} 个 | "
        f"词表 {run.data.tokenizer.vocab_size} | "
        f"训练集 {len(run.data.train):,} 个词元 | 每步 {tokens:,} 个词元",
    )
    if run.start_step:
        log(info, f"从 {cfg.out_dir / CKPT_NAME} 的第 {run.start_step} 步接着训练")
    if info.is_main:
        metrics = cfg.out_dir / METRICS_NAME
        cut = truncate_metrics(metrics, run.start_step)
        if cut:
            log(
                info,
                f"从 {metrics} 删去第 {run.start_step} 步之后的 {cut} 条记录",
            )
    distributed.barrier(info)


# --------------------------------------------------------------------------- steps
def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    lr = tc.cosine_lr(
        step,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup=cfg.warmup_steps,
        decay_steps=cfg.decay_steps,
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def step_batch(run: Run, step: int, micro: int) -> tuple[Tensor, Tensor]:
    """The training batch of (seed, rank, step, micro-step), on the device: it depends
    on nothing else, so a resumed run draws the batches of an uninterrupted one."""
    seed = tc.derived_seed(run.cfg.seed, run.info.rank, step, micro)
    gen = torch.Generator().manual_seed(seed)
    x, y = tc.lm_batch(
        run.data.train, run.cfg.batch_size, run.model_cfg.context_length, generator=gen
    )
    return x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True)


def train_step(run: Run, step: int) -> Tensor:
    """One optimizer step over ``grad_accum`` micro-batches; returns the mean loss."""
    cfg, info, model = run.cfg, run.info, run.model
    model.train()
    torch.manual_seed(tc.derived_seed(cfg.seed, info.rank, step, "dropout"))
    loss_sum = torch.zeros((), device=run.device)
    for micro in range(cfg.grad_accum):
        x, y = step_batch(run, step, micro)
        last_micro = micro == cfg.grad_accum - 1
        # DDP averages the gradients once, after the last micro-batch
        sync = info.enabled and not last_micro
        with model.no_sync() if sync else contextlib.nullcontext():
            with run.amp:
                _, loss = model(x, targets=y)
            (loss / cfg.grad_accum).backward()
        loss_sum += loss.detach()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_sum / cfg.grad_accum


@torch.no_grad()
def evaluate(run: Run) -> float:
    """Mean validation loss over ``eval_iters`` fixed batches (the same on every rank
    and every call)."""
    cfg, model = run.cfg, run.raw_model
    model.eval()
    gen = torch.Generator().manual_seed(tc.derived_seed(cfg.seed, "validation"))
    total = 0.0
    for _ in range(cfg.eval_iters):
        x, y = tc.lm_batch(
            run.data.val, cfg.batch_size, run.model_cfg.context_length, generator=gen
        )
        with run.amp:
            _, loss = model(x.to(run.device), targets=y.to(run.device))
        total += float(loss)
    model.train()
    return total / cfg.eval_iters


def evaluate_and_checkpoint(run: Run, step: int) -> None:
    """Validation loss; ``best.pt`` if it improved, then ``ckpt.pt`` (main rank)."""
    val_loss = evaluate(run)
    val_bpc = bits_per_char(val_loss, run.data.val_tokens_per_char)
    improved = val_loss < run.best_val
    run.best_val = min(run.best_val, val_loss)
    log(
        run.info,
        f"第 {step:6d} 步 | 验证损失 {val_loss:.4f}（{val_bpc:.3f} 比特/字符）| "
        f"最好 {run.best_val:.4f}",
    )
    write_metrics(run, {"step": step, "val_loss": val_loss, "val_bpc": val_bpc})
    if run.info.is_main:
        out, common = (
            run.cfg.out_dir,
            dict(
                step=step,
                config=run.model_cfg,
                **tokenizer_extra(run.data.tokenizer),
                data_sha256=run.data.sha256,
                vocab_size_asked=run.data.vocab_size_asked,
                world_size=run.info.world_size,
                seed=run.cfg.seed,
                lr_schedule=run.cfg.lr_schedule(),
            ),
        )
        # best.pt first: a kill between the two saves then loses nothing
        if improved:
            save_checkpoint(
                out / BEST_NAME, run.raw_model, None, val_loss=val_loss, **common
            )
        save_checkpoint(
            out / CKPT_NAME, run.raw_model, run.optimizer,
            best_val_loss=run.best_val, **common,
        )  # fmt: skip
    distributed.barrier(run.info)
