"""The trainer's text: read from ``--data`` (or the shipped corpus), checked, split by
paragraphs, tokenized; and the tokenizer as a plain value for the checkpoint.

:func:`load_data` is the one place where text enters the trainer and where every bad
input is refused, for a new run and on ``--resume`` alike, before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import torch
from torch import Tensor

import transformer_course as tc
from transformer_course._validate import check_token_ids

from .config import TrainConfig, UsageError

#: The files a ``--data`` folder contributes (in sorted order, subfolders included).
TEXT_SUFFIXES = (".txt", ".md")
Tokenizer = tc.CharTokenizer | tc.BPETokenizer


@dataclasses.dataclass(frozen=True)
class Data:
    """The tokenizer, the two splits as id tensors, and what identifies the text."""

    tokenizer: Tokenizer
    train: Tensor
    val: Tensor
    val_chars: int  # characters of the validation text, for bits per character
    sha256: str  # of the whole text, so that --resume can refuse other data
    vocab_size_asked: int | None  # bpe: --vocab-size (a small text may learn fewer)

    @property
    def val_tokens_per_char(self) -> float:
        return len(self.val) / self.val_chars


def load_data(cfg: TrainConfig, context_length: int, saved: dict | None) -> Data:
    """Read and check the text, split it by whole paragraphs as in chapter 5
    (:func:`transformer_course.split_paragraphs`), tokenize it.

    ``saved`` is the checkpoint's ``extra`` on ``--resume``: its text hash and
    tokenizer must match (its tokenizer is reused); ``None`` for a new run, whose BPE
    tokenizer learns from the training split only. Any problem is a :class:`UsageError`.
    """
    text, source = read_text(cfg.data, cfg.corpus)
    train_text, val_text = split_text(text, source, cfg.val_fraction)
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if saved is None:
        tok, asked = new_tokenizer(cfg, text, train_text), cfg.vocab_size
    else:
        tok, asked = saved_tokenizer(cfg, saved, sha256)
    splits = []
    for split, name, part in (
        ("training", "训练集", train_text),
        ("validation", "验证集", val_text),
    ):
        ids = torch.tensor(tok.encode(part), dtype=torch.long)[None]
        ids = check_token_ids(f"{split} ids", ids, tok.vocab_size)[0]
        if len(ids) <= context_length + 1:
            raise UsageError(
                f"{source}：{name}只有 {len(ids)} 个词元，不多于 context_length + 1 = "
                f"{context_length + 1}；请给更多文本、调小 --context-length，"
                "或改 --val-fraction"
            )
        splits.append(ids)
    return Data(tok, *splits, len(val_text), sha256, asked)


# --------------------------------------------------------------------------- reading
def read_text(path: Path | None, corpus: str) -> tuple[str, str]:
    """The text of ``path`` (a file, or a folder's ``.txt``/``.md`` files joined by
    blank lines) and a name for messages; ``None``: the shipped ``corpus``."""
    if path is None:
        return tc.load_text_corpus(corpus), f"随包的语料 {corpus!r}"
    if not path.exists():
        raise UsageError(f"--data {str(path)!r}：没有这个文件或文件夹")
    files = text_files(path) if path.is_dir() else [path]
    if not files:
        raise UsageError(
            f"--data {str(path)!r}：文件夹里没有 {'/'.join(TEXT_SUFFIXES)} 文件"
        )
    return "\n\n".join(read_utf8(f) for f in files), f"--data {str(path)!r}"


def text_files(folder: Path) -> list[Path]:
    """The ``.txt``/``.md`` files under ``folder``, sorted; hidden ones left out."""
    return sorted(
        f
        for f in folder.rglob("*")
        if f.suffix in TEXT_SUFFIXES
        and f.is_file()
        and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )


def read_utf8(file: Path) -> str:
    """The text of ``file``; a binary file (a NUL byte) or bytes that are not UTF-8 are
    refused with the byte offset. Windows line ends become ``\\n``."""
    try:
        data = file.read_bytes()
    except OSError as error:
        raise UsageError(f"--data：无法读取 {str(file)!r}：{error}") from None
    if b"\0" in data:
        raise UsageError(
            f"--data：{str(file)!r} 像是二进制文件（字节偏移 {data.index(0)} 处有 "
            "NUL 字节）；请给 UTF-8 文本文件"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        offset = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        raise UsageError(
            f"--data：{str(file)!r} 不是 UTF-8 编码：字节偏移 {offset} 处是字节 "
            f"0x{data[offset]:02x}；请把它另存为 UTF-8"
        ) from None
    return text.replace("\r\n", "\n")


def split_text(text: str, source: str, val_fraction: float) -> tuple[str, str]:
    """:func:`transformer_course.split_paragraphs`, with empty text or too few
    paragraphs refused."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        raise UsageError(f"{source}：文本是空的")
    needed = max(1, round(val_fraction * len(paragraphs))) + 1
    if len(paragraphs) < needed:
        raise UsageError(
            f"{source}：只有 {len(paragraphs)} 段，划分训练集和验证集至少要 "
            f"{needed} 段；段落之间用空行分隔"
        )
    return tc.split_paragraphs(text, val_fraction)


# --------------------------------------------------------------------------- tokenizers
def new_tokenizer(cfg: TrainConfig, text: str, train_text: str) -> Tokenizer:
    """A character tokenizer over the whole text (as chapter 5), or a BPE learned on
    the training split."""
    if cfg.tokenizer == "char":
        return tc.CharTokenizer(text)
    return tc.BPETokenizer().train(train_text, cfg.vocab_size)


def saved_tokenizer(
    cfg: TrainConfig, saved: dict, sha256: str
) -> tuple[Tokenizer, int | None]:
    """The checkpoint's tokenizer and its asked vocabulary size, if the text and the
    tokenizer asked for are the checkpoint's."""
    if saved.get("data_sha256") != sha256:
        recorded = "data_sha256" in saved
        why = "SHA-256 不同" if recorded else "检查点没有记录文本的 SHA-256"
        raise UsageError(
            f"--resume：文本与检查点训练时用的不同（{why}）；"
            "请给同一个 --data，或换一个 --out-dir 重新训练"
        )
    tok = tokenizer_from_extra(saved)
    kind = "char" if isinstance(tok, tc.CharTokenizer) else "bpe"
    saved_vocab = saved.get("vocab_size_asked") if kind == "bpe" else None
    have = describe(kind, saved_vocab)
    asked = describe(cfg.tokenizer or kind, cfg.vocab_size or saved_vocab)
    if asked != have:
        raise UsageError(
            f"--resume：--tokenizer/--vocab-size 要的是 {asked!r}，检查点的分词器是 "
            f"{have!r}；去掉这两个参数就接着用检查点的分词器，"
            "或换一个 --out-dir 重新训练"
        )
    return tok, saved_vocab


def describe(tokenizer: str, vocab_size: int | None) -> str:
    """``"char"`` or ``"bpe VOCAB_SIZE"``, for messages."""
    return tokenizer if tokenizer == "char" else f"{tokenizer} {vocab_size}"


def tokenizer_extra(tok: Tokenizer) -> dict:
    """The tokenizer as plain checkpoint values: ``tokenizer_chars`` (a character
    tokenizer's characters, as chapter 5 saves them), or ``tokenizer`` =
    ``{"kind": "bpe", **tok.to_dict()}``."""
    if isinstance(tok, tc.CharTokenizer):
        return {"tokenizer_chars": tok.chars}
    return {"tokenizer": {"kind": "bpe", **tok.to_dict()}}


def tokenizer_from_extra(extra: dict) -> Tokenizer:
    """The tokenizer saved by :func:`tokenizer_extra`; anything else is a
    :class:`UsageError`."""
    chars, bpe = extra.get("tokenizer_chars"), extra.get("tokenizer")
    try:
        if isinstance(chars, str) and chars:
            return tc.CharTokenizer(chars)
        if isinstance(bpe, dict) and bpe.get("kind") == "bpe":
            return tc.BPETokenizer.from_dict(
                {k: v for k, v in bpe.items() if k != "kind"}
            )
    except (TypeError, ValueError) as error:
        raise UsageError(f"检查点里的分词器无法使用：{error}") from None
    raise UsageError("检查点里没有本训练脚本写出的分词器")


def bits_per_char(loss: float, tokens_per_char: float) -> float:
    """A loss in nats per token as bits per character, so that tokenizers compare."""
    return loss * tokens_per_char / math.log(2)
