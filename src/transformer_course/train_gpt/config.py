"""The trainer's settings: one typed :class:`TrainConfig`, built once from the command
line, the presets, and the rules that tie a resumed run to its checkpoint (model flags
and learning-rate schedule).

Every default is stated once: the model's in :class:`~transformer_course.GPTConfig`,
the run's in :class:`TrainConfig`; a preset overrides both, a flag typed on the
command line overrides the preset.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import transformer_course as tc
from transformer_course.checkpoint import config_from_dict, load_checkpoint

#: The model flags. Their parser default is None, so that on --resume the flags a user
#: typed can be told apart from defaults and compared with the checkpoint's config.
MODEL_FLAGS = ("context_length", "d_model", "num_heads", "num_layers", "dropout",
               "positional", "norm", "activation")  # fmt: skip
#: Sizes for the shipped corpus (about 41K training characters). ``cpu-small`` (the
#: default, chapter 5's recipe) is half a minute on a 2-core laptop, ``cpu-medium``
#: (twice the context, a larger model, 2.5x the steps) about a quarter of an hour;
#: both beat the n-gram baseline (README). ``zh`` is a byte-level BPE (1024 ids,
#: learned on the training split) and a small model on the book's Chinese prose
#: (``tc.load_text_corpus("zh")``, about 117K characters, regenerated with the book).
#: ``gpu`` is nanoGPT's character-level Shakespeare model
#: (``config/train_shakespeare_char.py``).
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
    "zh": dict(
        corpus="zh", tokenizer="bpe", vocab_size=1024,
        context_length=64, d_model=64, num_heads=4, num_layers=3, dropout=0.1,
        batch_size=16, max_steps=1200, lr=3e-3, min_lr=3e-4, warmup_steps=30,
        eval_every=200, eval_iters=20,
    ),
    "gpu": dict(
        context_length=256, d_model=384, num_heads=6, num_layers=6, dropout=0.2,
        batch_size=64, max_steps=5000, lr=1e-3, min_lr=1e-4, warmup_steps=100,
        eval_every=250, eval_iters=200,
    ),
}  # fmt: skip
DEFAULT_PRESET = "cpu-small"
#: The BPE vocabulary when neither --vocab-size nor the preset gives one.
DEFAULT_BPE_VOCAB = 512


def model_default(name: str) -> object:
    """``GPTConfig``'s default for a model flag that no preset sets."""
    return {f.name: f.default for f in dataclasses.fields(tc.GPTConfig)}[name]


def tokenizer_for(
    values: dict, *, typed_vocab: int | None
) -> tuple[str | None, int | None]:
    """The run's ``(tokenizer, vocab_size)``: typed, else the preset's, else ``char``
    (and DEFAULT_BPE_VOCAB for bpe). On --resume what was not given stays None: the
    checkpoint's is taken. --vocab-size with the character tokenizer is an error."""
    tokenizer = values.get("tokenizer")
    if tokenizer is None and not values.get("resume"):
        tokenizer = "char"
    if tokenizer == "char":
        if typed_vocab is not None:
            raise UsageError(
                f"--vocab-size {typed_vocab} 只用于 --tokenizer bpe，"
                "现在的分词器是 char"
            )
        return tokenizer, None
    vocab_size = values.get("vocab_size")
    if tokenizer == "bpe" and vocab_size is None and not values.get("resume"):
        vocab_size = DEFAULT_BPE_VOCAB
    return tokenizer, vocab_size


class UsageError(Exception):
    """A mistake in the command line, the data, the checkpoint or the out dir: reported
    as one Chinese line, exit status 2."""


def read_checkpoint(path: Path, flag: str) -> dict:
    """``load_checkpoint`` (``weights_only=True`` inside); a missing or unreadable file
    is a :class:`UsageError` naming ``flag`` and the path (the package's own English
    diagnosis follows as the detail)."""
    try:
        return load_checkpoint(path, map_location="cpu")
    except FileNotFoundError:
        raise UsageError(f"{flag}：{str(path)!r} 处没有检查点文件") from None
    except ValueError as error:
        raise UsageError(
            f"{flag}：{str(path)!r} 不是本训练脚本写出的完整检查点"
            f"（文件损坏、被截断或是别的格式）；详情：{error}"
        ) from None


def saved_model_config(ckpt: dict, flag: str) -> tc.GPTConfig:
    """The checkpoint's ``GPTConfig``; a checkpoint without a usable one is a
    :class:`UsageError`."""
    try:
        return config_from_dict(tc.GPTConfig, ckpt["config"])
    except (TypeError, ValueError) as error:
        raise UsageError(f"{flag}：检查点里没有可用的 GPTConfig（{error}）") from None


def after_decay(schedule: dict) -> str:
    """What ``tc.cosine_lr`` gives past the end of ``schedule``'s decay: ``--min-lr``,
    unless the warm-up outlasts the decay (``tc.cosine_lr`` tests the warm-up first)."""
    warmup, decay = schedule.get("warmup_steps", 0), schedule.get("decay_steps")
    if decay is None or warmup <= decay:
        return "之后学习率保持在 --min-lr"
    return (
        f"检查点的预热（{warmup} 步）比衰减（{decay} 步）还长：学习率继续升到 "
        f"--lr，直到第 {warmup} 步，之后保持在 --min-lr"
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs, typed. ``model`` holds the model flags that
    were given (a new run fills the others from the preset and ``GPTConfig``; a resumed
    run takes the checkpoint's)."""

    # set by every preset
    batch_size: int  # sequences per rank per micro-step
    max_steps: int
    lr: float
    min_lr: float
    warmup_steps: int
    eval_every: int
    eval_iters: int
    # the same for every preset
    out_dir: Path = Path("runs/gpt")
    data: Path | None = None  # a text file or folder; None: the shipped ``corpus``
    corpus: str = "en"  # the shipped corpus (tc.load_text_corpus), without --data
    tokenizer: str | None = None  # "char" or "bpe"; None only on --resume (the ckpt's)
    vocab_size: int | None = None  # bpe only; None only on --resume (the ckpt's)
    resume: bool = False
    preset: str = DEFAULT_PRESET
    model: dict = dataclasses.field(default_factory=dict)
    grad_accum: int = 1
    lr_decay_steps: int | None = None  # None: max_steps
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    val_fraction: float = 0.1
    log_every: int = 10
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    threads: int | None = (
        None  # torch intra-op threads on the CPU; None: torch's default
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """Flags typed > the preset > the defaults above; checks that involve two flags
        (one flag's range is checked by its argparse type)."""
        preset = PRESETS[args.preset]
        values = {}
        for f in dataclasses.fields(cls):
            if f.name == "model":
                continue
            typed = getattr(args, f.name, None)
            if typed is not None:
                values[f.name] = typed
            elif f.name in preset:
                values[f.name] = preset[f.name]
        values["out_dir"] = Path(values["out_dir"])
        if values.get("data") is not None:
            values["data"] = Path(values["data"])
        if args.lr is not None and args.min_lr is None:
            values["min_lr"] = (
                args.lr / 10
            )  # every preset decays to a tenth of its peak
        values["tokenizer"], values["vocab_size"] = tokenizer_for(
            values, typed_vocab=args.vocab_size
        )
        model = {name: getattr(args, name) for name in MODEL_FLAGS}
        cfg = cls(**values, model={k: v for k, v in model.items() if v is not None})
        if cfg.min_lr > cfg.lr:
            raise UsageError(f"--min-lr {cfg.min_lr} 不能大于 --lr {cfg.lr}")
        return cfg

    @property
    def decay_steps(self) -> int:
        return self.lr_decay_steps or self.max_steps

    def lr_schedule(self) -> dict:
        """The learning-rate curve (``tc.cosine_lr``'s arguments), saved in every
        checkpoint so that ``--resume`` can refuse to reshape it mid-run."""
        return dict(
            lr=self.lr,
            min_lr=self.min_lr,
            warmup_steps=self.warmup_steps,
            decay_steps=self.decay_steps,
        )

    def check_schedule(self, saved: dict | None) -> None:
        """On --resume: the learning-rate curve must be the checkpoint's.

        ``decay_steps`` defaults to ``--max-steps``, so resuming with another
        ``--max-steps`` would silently stretch or squeeze the cosine decay (the learning
        rate jumps at the resumed step). A checkpoint written before schedules were
        saved (``saved`` None) is not compared.
        """
        if saved is None:
            return

        def described(name: str, value: object) -> str:
            if name != "decay_steps":
                return f"--{name.replace('_', '-')} {value!r}"
            source = "--lr-decay-steps" if self.lr_decay_steps else "--max-steps"
            return f"余弦衰减 {value} 步（{source} {value}）"

        differ = [
            f"{described(name, value)}（检查点：{saved.get(name)!r}）"
            for name, value in self.lr_schedule().items()
            if value != saved.get(name)
        ]
        if not differ:
            return
        keep = saved.get("decay_steps")
        longer = (
            f"要按检查点的学习率曲线训练到第 {keep} 步以后，加上 "
            f"--lr-decay-steps {keep}（{after_decay(saved)}）；"
            if self.decay_steps != keep
            else ""
        )
        raise UsageError(
            "--resume：学习率曲线与检查点的不同："
            + "、".join(differ)
            + "；"
            + longer
            + "请照写检查点的取值，或换一个 --out-dir 重新训练"
        )

    def model_config(self, vocab_size: int) -> tc.GPTConfig:
        """The config of a new run: the model flags given, else the preset's, else
        ``GPTConfig``'s."""
        preset = PRESETS[self.preset]
        values = {
            name: self.model.get(name, preset.get(name, model_default(name)))
            for name in MODEL_FLAGS
        }
        try:
            return tc.GPTConfig(vocab_size=vocab_size, **values)
        except (ValueError, TypeError) as error:
            raise UsageError(
                "模型参数不能这样组合（--d-model、--num-heads、--positional 等）："
                f"{error}"
            ) from None

    def check_matches(self, saved: dict) -> None:
        """On --resume: every model flag given must equal the checkpoint's config.

        Flags left out take the checkpoint's values; a flag that differs is an error
        rather than being ignored (a run that silently trains another model than the
        one asked for loses the user's intent).
        """
        differ = [
            f"--{name.replace('_', '-')} {value!r}（检查点：{saved.get(name)!r}）"
            for name, value in self.model.items()
            if value != saved.get(name)
        ]
        if differ:
            raise UsageError(
                "--resume：模型参数与检查点的配置不同："
                + "、".join(differ)
                + "；去掉这些参数就接着训练检查点里的模型，"
                + "或换一个 --out-dir 重新训练"
            )
