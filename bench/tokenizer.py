"""Benchmark: training the byte-level BPE, ``tc.BPETokenizer`` next to Hugging Face ``tokenizers``.

Both learn 2,000 merges (quick: 200) from the same 200,000 characters (quick: 20,000) of the book's
Chinese corpus ``tc.load_text_corpus("zh")``, repeated when the corpus is shorter, with the same
pre-tokenisation (``transformer_course.tokenizer.PATTERN``) and the 256 bytes as the initial
alphabet. ``tokenizers`` runs single-threaded (``TOKENIZERS_PARALLELISM=false``, set before its first
use), like the rest of the CPU suite. Reported: the median seconds of each (interleaved repeats) and
the ratio ``tc / tokenizers``; tc is pure Python, ``tokenizers`` is Rust.
"""

from __future__ import annotations

import os

import transformer_course as tc
from transformer_course import benchmarking as tb
from transformer_course.tokenizer import PATTERN

from .common import Context, log, sig


def _text(chars: int) -> str:
    corpus = tc.load_text_corpus("zh")
    return (corpus * (chars // len(corpus) + 1))[:chars]


def _hf_train(text: str, vocab_size: int) -> int:
    """Train the Hugging Face byte-level BPE; return its number of merges."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    hf.train_from_iterator([text], trainer=trainer)
    return hf.get_vocab_size() - 256


def run(ctx: Context) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    chars, merges = (20_000, 200) if ctx.quick else (200_000, 2_000)
    text = _text(chars)
    learned = {}

    def ours() -> None:
        learned["tc"] = len(tc.BPETokenizer().train(text, 256 + merges).merges)

    def theirs() -> None:
        learned["tokenizers"] = _hf_train(text, 256 + merges)

    repeats = 3 if ctx.quick else 5
    med = tb.medians(tb.time_interleaved({"tc": ours, "tokenizers": theirs}, repeats=repeats, warmup=1))
    if learned != {"tc": merges, "tokenizers": merges}:
        raise AssertionError(f"expected {merges} merges from both, got {learned}")
    ratio = med["tc"] / med["tokenizers"]
    log(f"  BPE training, {merges} merges on {chars:,} characters: tc {med['tc']:.2f} s, "
        f"tokenizers {med['tokenizers']:.3f} s, ratio {ratio:.1f}")  # fmt: skip
    return {
        "what": "byte-level BPE training on the zh corpus, same pre-tokenisation, single-threaded",
        "characters": chars,
        "utf8_bytes": len(text.encode("utf-8")),
        "merges": merges,
        "tc_s": sig(med["tc"]),
        "tokenizers_s": sig(med["tokenizers"]),
        "ratio_tc_over_tokenizers": sig(ratio, 3),
        "repeats": repeats,
    }
