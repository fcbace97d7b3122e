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
    for name, part in (("training", train_text), ("validation", val_text)):
        ids = torch.tensor(tok.encode(part), dtype=torch.long)[None]
        ids = check_token_ids(f"{name} ids", ids, tok.vocab_size)[0]
        if len(ids) <= context_length + 1:
            raise UsageError(
                f"{source}: the {name} split has {len(ids)} tokens, not more than "
                f"context_length + 1 = {context_length + 1}; give more text, lower "
                "--context-length or change --val-fraction"
            )
        splits.append(ids)
    return Data(tok, *splits, len(val_text), sha256, asked)


# --------------------------------------------------------------------------- reading
def read_text(path: Path | None, corpus: str) -> tuple[str, str]:
    """The text of ``path`` (a file, or a folder's ``.txt``/``.md`` files joined by
    blank lines) and a name for messages; ``None``: the shipped ``corpus``."""
    if path is None:
        return tc.load_text_corpus(corpus), f"the shipped {corpus!r} corpus"
    if not path.exists():
        raise UsageError(f"--data {str(path)!r}: no such file or folder")
    files = text_files(path) if path.is_dir() else [path]
    if not files:
        raise UsageError(
            f"--data {str(path)!r}: the folder holds no {'/'.join(TEXT_SUFFIXES)} files"
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
        raise UsageError(f"--data: cannot read {str(file)!r}: {error}") from None
    if b"\0" in data:
        raise UsageError(
            f"--data: {str(file)!r} looks binary (a NUL byte at byte offset "
            f"{data.index(0)}); give a UTF-8 text file"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        offset = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        raise UsageError(
            f"--data: {str(file)!r} is not UTF-8: byte 0x{data[offset]:02x} at byte "
            f"offset {offset}"
        ) from None
    return text.replace("\r\n", "\n")


def split_text(text: str, source: str, val_fraction: float) -> tuple[str, str]:
    """:func:`transformer_course.split_paragraphs`, with empty text or too few
    paragraphs refused."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        raise UsageError(f"{source}: the text is empty")
    needed = max(1, round(val_fraction * len(paragraphs))) + 1
    if len(paragraphs) < needed:
        raise UsageError(
            f"{source}: {len(paragraphs)} paragraph(s), but the split into training "
            f"and validation text needs at least {needed}; separate paragraphs by a "
            "blank line"
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
        why = "its SHA-256 differs" if "data_sha256" in saved else "it records none"
        raise UsageError(
            "--resume: the text differs from the one the checkpoint was trained on "
            f"({why}); give the same --data, or train into a new --out-dir"
        )
    tok = tokenizer_from_extra(saved)
    kind = "char" if isinstance(tok, tc.CharTokenizer) else "bpe"
    saved_vocab = saved.get("vocab_size_asked") if kind == "bpe" else None
    have = describe(kind, saved_vocab)
    asked = describe(cfg.tokenizer or kind, cfg.vocab_size or saved_vocab)
    if asked != have:
        raise UsageError(
            f"--resume: --tokenizer/--vocab-size ask for {asked!r}, the checkpoint's "
            f"tokenizer is {have!r}; leave them out to continue it, or train into a "
            "new --out-dir"
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
        raise UsageError(f"the checkpoint's tokenizer is unusable: {error}") from None
    raise UsageError("the checkpoint holds no tokenizer written by this trainer")


def bits_per_char(loss: float, tokens_per_char: float) -> float:
    """A loss in nats per token as bits per character, so that tokenizers compare."""
    return loss * tokens_per_char / math.log(2)
