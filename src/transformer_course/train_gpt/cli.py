"""The command line: flag types, the parser, ``main``."""

from __future__ import annotations

import argparse
import math
import re
import sys
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
            raise argparse.ArgumentTypeError(f"需要一个整数，得到 {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"必须是 >= {minimum} 的整数，得到 {value}"
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
            raise argparse.ArgumentTypeError(f"需要一个数，得到 {text!r}") from None
        above = value >= low if low_inclusive else value > low
        below = value <= high if high_inclusive else value < high
        if not (math.isfinite(value) and above and below):
            raise argparse.ArgumentTypeError(
                f"必须是 {interval} 中的有限数，得到 {text}"
            )
        return value

    return parse


POSITIVE_INT = int_at_least(1)
NON_NEGATIVE_INT = int_at_least(0)
POSITIVE_FLOAT = float_in(0.0, math.inf, low_inclusive=False, high_inclusive=False)
NON_NEGATIVE_FLOAT = float_in(0.0, math.inf, low_inclusive=True, high_inclusive=False)
FRACTION = float_in(0.0, 1.0, low_inclusive=False, high_inclusive=False)
PROBABILITY_BELOW_ONE = float_in(0.0, 1.0, low_inclusive=True, high_inclusive=False)


# ------------------------------------------------------------------- Chinese argparse
#: argparse's own messages (the same in Python 3.11 to 3.13) and their Chinese; a
#: message not listed here is shown as argparse wrote it.
ARGPARSE_MESSAGES = (
    (r"argument (?P<name>\S+): (?P<message>.*)", "参数 {name}：{message}"),
    (r"the following arguments are required: (?P<names>.*)", "缺少必需的参数 {names}"),
    (r"unrecognized arguments: (?P<names>.*)", "不认识的参数 {names}"),
    (r"expected one argument", "后面要跟一个值"),
    (
        r"invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)",
        "取值 {value} 不在可选范围内（可选：{choices}）",
    ),
    (r"ambiguous option: (?P<option>\S+) could match (?P<matches>.*)",
     "{option} 有歧义，可能是 {matches}"),
    (r"ignored explicit argument (?P<value>.*)", "这个开关不带值，多给了 {value}"),
    (r"invalid (?P<type>\S+) value: (?P<value>.*)", "{value} 不是合法的 {type} 值"),
)  # fmt: skip


def chinese_argparse_message(message: str) -> str:
    """``message`` (one of argparse's error messages) in Chinese."""
    for pattern, template in ARGPARSE_MESSAGES:
        match = re.fullmatch(pattern, message, flags=re.DOTALL)
        if match:
            parts = match.groupdict()
            if "message" in parts:
                parts["message"] = chinese_argparse_message(parts["message"])
            return template.format(**parts)
    return message


class ChineseHelpFormatter(argparse.HelpFormatter):
    """argparse's help layout with a Chinese ``用法：`` line."""

    def add_usage(self, usage, actions, groups, prefix=None) -> None:
        super().add_usage(
            usage, actions, groups, "用法：" if prefix is None else prefix
        )


class ChineseArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help headings and error lines are Chinese, like
    the help texts and the trainer's own messages (subcommand parsers are of the same
    class)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", ChineseHelpFormatter)
        kwargs["add_help"] = False
        super().__init__(*args, **kwargs)
        # the titles of argparse's two default groups (no public setter)
        self._positionals.title = "位置参数"
        self._optionals.title = "选项"
        self.add_argument(
            "-h", "--help", action="help", default=argparse.SUPPRESS,
            help="显示本帮助并退出",
        )  # fmt: skip

    def error(self, message: str) -> None:
        self.print_usage(sys.stderr)
        self.fail(chinese_argparse_message(message))

    def fail(self, message: str) -> None:
        """Exit with status 2 and one line ``PROG: 错误：MESSAGE``."""
        self.exit(2, f"{self.prog}: 错误：{message}\n")


# --------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    parser = ChineseArgumentParser(
        prog="python -m transformer_course.train_gpt",
        description="在课程语料或你自己的文本上训练 MiniGPT，或从训练好的模型采样。",
    )
    sub = parser.add_subparsers(
        title="命令", dest="command", required=True, metavar="{train,sample}"
    )

    t = sub.add_parser("train", help="训练（单进程，或在 torchrun 下多进程）")
    t.add_argument("--out-dir", help="存放检查点和日志的文件夹（默认 runs/gpt）")
    t.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="从 OUT_DIR/ckpt.pt 接着训练",
    )
    t.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=DEFAULT_PRESET,
        help="模型大小与训练长度（命令行上给出的选项优先）；默认 %(default)s",
    )
    # data
    t.add_argument(
        "--data",
        help="一个 UTF-8 文本文件，或一个含 .txt/.md 文件的文件夹"
        "（默认：预设自带的语料）；段落之间用空行分隔",
    )
    t.add_argument(
        "--tokenizer", choices=["char", "bpe"], help="默认：预设的分词方式，没有则 char"
    )
    t.add_argument(
        "--vocab-size",
        type=int_at_least(256),
        help=f"BPE 词表大小，>= 256（默认：预设的，没有则 {DEFAULT_BPE_VOCAB}）",
    )
    # model: on --resume the checkpoint's config is used, and a flag given here must
    # equal it
    t.add_argument("--context-length", type=POSITIVE_INT, help="默认：预设的值")
    t.add_argument("--d-model", type=POSITIVE_INT, help="默认：预设的值")
    t.add_argument("--num-heads", type=POSITIVE_INT, help="默认：预设的值")
    t.add_argument("--num-layers", type=POSITIVE_INT, help="默认：预设的值")
    t.add_argument(
        "--dropout", type=PROBABILITY_BELOW_ONE, help="取值 [0, 1)；默认：预设的值"
    )
    for flag, choices in (
        ("positional", tc.POSITIONAL_ENCODINGS),
        ("norm", tc.NORMS),
        ("activation", tc.ACTIVATIONS),
    ):
        t.add_argument(
            f"--{flag}", choices=list(choices), help=f"默认 {model_default(flag)}"
        )
    # optimisation
    t.add_argument(
        "--batch-size",
        type=POSITIVE_INT,
        help="每个进程每个微步的序列数；默认：预设的值",
    )
    t.add_argument("--grad-accum", type=POSITIVE_INT, help="每次优化器更新累积的微步数")
    t.add_argument("--max-steps", type=POSITIVE_INT, help="训练到第几步为止")
    t.add_argument("--lr", type=POSITIVE_FLOAT, help="学习率的峰值")
    t.add_argument(
        "--min-lr",
        type=NON_NEGATIVE_FLOAT,
        help="衰减结束时的学习率（默认：预设的值，没有则 --lr / 10）",
    )
    t.add_argument("--warmup-steps", type=NON_NEGATIVE_INT, help="学习率线性预热的步数")
    t.add_argument(
        "--lr-decay-steps",
        type=POSITIVE_INT,
        help="余弦衰减的步数（默认：--max-steps）",
    )
    t.add_argument(
        "--weight-decay",
        type=NON_NEGATIVE_FLOAT,
        help="AdamW 的权重衰减（只作用于矩阵权重）",
    )
    t.add_argument(
        "--beta2", type=PROBABILITY_BELOW_ONE, help="AdamW 的 β₂，取值 [0, 1)"
    )
    t.add_argument(
        "--grad-clip", type=NON_NEGATIVE_FLOAT, help="梯度裁剪的范数上限；0 表示不裁剪"
    )
    # evaluation, logging, checkpoints
    t.add_argument(
        "--val-fraction", type=FRACTION, help="留作验证集的段落比例，取值 (0, 1)"
    )
    t.add_argument(
        "--eval-every", type=POSITIVE_INT, help="每 N 步评估一次并保存检查点"
    )
    t.add_argument("--eval-iters", type=POSITIVE_INT, help="每次评估用的验证批次数")
    t.add_argument("--log-every", type=POSITIVE_INT, help="每 N 步打印一行训练损失")
    # system
    t.add_argument(
        "--seed", type=NON_NEGATIVE_INT, help=f"随机种子（默认 {TrainConfig.seed}）"
    )
    t.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda", "mps"],
        help="auto（默认）：有 CUDA 用 CUDA，再看 MPS，否则 CPU；"
        "多进程时只用 CUDA 或 CPU",
    )
    t.add_argument(
        "--threads",
        type=POSITIVE_INT,
        help="torch 使用的 CPU 线程数（默认：torch 的设置，每个物理核一个）",
    )
    t.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        help="自动混合精度的数据类型（auto：支持的 GPU 上用 bfloat16，否则 float32）",
    )
    t.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="用 torch.compile 编译模型",
    )

    s = sub.add_parser("sample", help="从检查点生成文本")
    s.add_argument(
        "--ckpt", required=True, help="train 写出的 ckpt.pt 或 best.pt 的路径"
    )
    s.add_argument("--prompt", default=None, help="开头的文本（默认：一个换行符）")
    s.add_argument(
        "-n",
        "--max-new-tokens",
        type=NON_NEGATIVE_INT,
        default=300,
        help="生成多少个词元；默认 %(default)s",
    )
    s.add_argument(
        "--num-samples", type=POSITIVE_INT, default=1, help="生成几段；默认 %(default)s"
    )
    s.add_argument(
        "--temperature", type=POSITIVE_FLOAT, default=0.8, help="温度；默认 %(default)s"
    )
    s.add_argument(
        "--top-k", type=POSITIVE_INT, default=None, help="只从概率最高的 k 个里抽"
    )
    s.add_argument(
        "--top-p",
        type=float_in(0.0, 1.0, low_inclusive=False, high_inclusive=True),
        default=None,
        help="只从累计概率达到 p 的最小集合里抽，取值 (0, 1]",
    )
    s.add_argument("--greedy", action="store_true", help="每步取概率最高的词元，不抽样")
    s.add_argument("--seed", type=NON_NEGATIVE_INT, default=0, help="抽样的随机种子")
    s.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda", "mps"],
        help="默认 auto：有 CUDA 用 CUDA，再看 MPS，否则 CPU",
    )
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
        parser.fail(str(error))
