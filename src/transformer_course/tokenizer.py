"""A byte-level BPE tokenizer (byte-pair encoding, Sennrich et al., 2016; GPT-2's byte
variant), small enough to read in the book.

* The base vocabulary is the 256 byte values: any text, in any script, is encodable,
  and ``decode(encode(s)) == s`` for every string ``s``.
* Training repeats one step (:func:`count_pairs`, then :func:`merge_pair` on the most
  frequent adjacent pair) until the vocabulary has ``vocab_size`` tokens. The pair
  counts are kept up to date incrementally: after a merge only the chunks that held
  the merged pair are counted again, never the whole text.
* Ties between equally frequent pairs go to the smallest pair of ids, so training is
  deterministic.
* Encoding applies the learned merges in the order they were learned (the lowest rank
  first), exactly as GPT-2 and the Hugging Face ``tokenizers`` byte-level BPE do.

**Pre-tokenisation.** Before BPE the text is cut into chunks by :data:`PATTERN`
(GPT-2's rule without its English contractions): a run of letters, a run of digits 0-9,
or a run of punctuation, each with at most one leading space, and runs of whitespace.
Merges never cross a chunk boundary. Chinese characters are letters, so a run of 汉字
between two punctuation marks is one chunk and BPE can learn words such as 注意力
inside it, but never a token that glues a character to the following "，". The tests
configure the Hugging Face tokenizer with the same pattern.
"""

from __future__ import annotations

import heapq
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path

__all__ = [
    "PATTERN",
    "BPETokenizer",
    "PairIndex",
    "count_pairs",
    "merge_pair",
    "pretokenize",
]

_SPACE = " \t\n\r\f\v"
#: Punctuation and symbols: ASCII (but ``_``), Latin-1, general punctuation, arrows and
#: mathematical operators, CJK punctuation (。、「」 and the ideographic space) and the
#: full-width forms (，：！（） ...). Spelled out, not ``\\w``/``\\s``: Python's ``re``
#: and the Oniguruma engine of Hugging Face ``tokenizers`` disagree on those for some
#: characters (``²`` is ``\\w`` in one and not in the other).
_PUNCT = (
    re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~")
    + "\u00a1-\u00bf\u00d7\u00f7\u2000-\u206f\u2190-\u22ff\u3000-\u303f"
    + "\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
)
#: A run of letters (everything that is not a space, a digit 0-9 or punctuation: 汉字,
#: letters of any script, ``_``, emoji), of digits, or of punctuation, each with at most
#: one leading space; then runs of whitespace, which leave their last space to the next
#: chunk (GPT-2's rule without its English contractions).
PATTERN = (
    f" ?[^{_SPACE}0-9{_PUNCT}]+| ?[0-9]+| ?[{_PUNCT}]+"
    f"|[{_SPACE}]+(?![^{_SPACE}])|[{_SPACE}]+"
)
_CHUNK = re.compile(PATTERN)
_FORMAT = "transformer_course byte-level BPE"


def pretokenize(text: str) -> list[str]:
    """The chunks of ``text`` (see :data:`PATTERN`); ``"".join`` of them is ``text``."""
    return _CHUNK.findall(text)


def count_pairs(ids: Sequence[int]) -> Counter:
    """How often each adjacent pair occurs in ``ids``: ``[1, 1, 1]`` has ``(1, 1)``
    twice (the pairs overlap)."""
    return Counter(pairwise(ids))


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, left to right:
    ``[1, 1, 1]`` with the pair ``(1, 1)`` becomes ``[new_id, 1]``."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class BPETokenizer:
    """Byte-level BPE: ids ``0..255`` are the bytes, ``256..`` the merges in the order
    they were learned, then the special tokens.

    ``BPETokenizer().train(text, vocab_size)`` learns ``vocab_size - 256 -
    len(special_tokens)`` merges (fewer if no pair occurs twice any more); an untrained
    tokenizer encodes to raw UTF-8 bytes.
    """

    def __init__(self) -> None:
        self.merges: dict[tuple[int, int], int] = {}  # pair -> new id, in rank order
        self.special_tokens: dict[str, int] = {}
        self.vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
        self._cache: dict[str, list[int]] = {}
        self._special_re: re.Pattern | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.vocab) + len(self.special_tokens)

    def train(
        self, text: str, vocab_size: int, special_tokens: Sequence[str] = ()
    ) -> BPETokenizer:
        """Learn merges from ``text``; returns ``self``."""
        n_merges = _check_train_args(text, vocab_size, special_tokens)
        chunks = Counter(pretokenize(text))  # identical chunks are counted once
        pairs = PairIndex([list(c.encode("utf-8")) for c in chunks], chunks.values())
        merges = {}
        while len(merges) < n_merges:
            pair = pairs.most_frequent()
            if pair is None:  # no pair occurs twice any more
                break
            merges[pair] = 256 + len(merges)
            pairs.merge(pair, merges[pair])
        self._set(merges, special_tokens)
        return self

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens in ``text`` become their own ids."""
        _check_str("text", text)
        ids = []
        for part in self._split_special(text):
            if part in self.special_tokens:
                ids.append(self.special_tokens[part])
            else:
                for chunk in pretokenize(part):
                    ids.extend(self._encode_chunk(chunk))
        return ids

    def _encode_chunk(self, chunk: str) -> list[int]:
        """Apply the merges to one chunk, the earliest learned first."""
        if chunk in self._cache:
            return self._cache[chunk]
        ids = list(chunk.encode("utf-8"))
        while len(ids) >= 2:
            pair = min(pairwise(ids), key=lambda p: self.merges.get(p, _NEVER))
            if pair not in self.merges:
                break
            ids = merge_pair(ids, pair, self.merges[pair])
        self._cache[chunk] = ids
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 (a sampled sequence can
        cut a character) become U+FFFD."""
        ids = _check_ids(ids, self.vocab_size)
        names = {i: s.encode("utf-8") for s, i in self.special_tokens.items()}
        data = b"".join(names[i] if i in names else self.vocab[i] for i in ids)
        return data.decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        """A JSON-ready description (what :meth:`save` writes)."""
        return {
            "format": _FORMAT,
            "pattern": PATTERN,
            "merges": [list(pair) for pair in self.merges],
            "special_tokens": list(self.special_tokens),
        }

    @classmethod
    def from_dict(cls, data: dict) -> BPETokenizer:
        """The tokenizer described by :meth:`to_dict`."""
        merges, specials = _check_dict(data)
        tok = cls()
        tok._set({pair: 256 + i for i, pair in enumerate(merges)}, specials)
        return tok

    def save(self, path: str | Path) -> None:
        """Write the tokenizer to ``path`` as UTF-8 JSON."""
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1)
        Path(path).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def _set(self, merges: dict, special_tokens: Sequence[str]) -> None:
        self.merges = dict(merges)
        self.vocab = {i: bytes([i]) for i in range(256)}
        for (a, b), new_id in self.merges.items():
            self.vocab[new_id] = self.vocab[a] + self.vocab[b]
        first = len(self.vocab)
        self.special_tokens = {s: first + i for i, s in enumerate(special_tokens)}
        longest_first = sorted(self.special_tokens, key=len, reverse=True)
        alternatives = "|".join(re.escape(s) for s in longest_first)
        self._special_re = re.compile(f"({alternatives})") if alternatives else None
        self._cache = {}

    def _split_special(self, text: str) -> list[str]:
        if self._special_re is None:
            return [text]
        return [part for part in self._special_re.split(text) if part]

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"special_tokens={list(self.special_tokens)})"
        )


_NEVER = float("inf")  # the rank of a pair that was never merged


class PairIndex:
    """The pair counts of a training run, kept up to date merge after merge.

    ``words`` are the distinct chunks as byte ids, ``freqs`` how often each occurs;
    ``counts[pair]`` is the number of occurrences over the whole text, ``where[pair]``
    the chunks that hold (or held) the pair, and ``heap`` a priority queue of
    ``(-count, pair)`` whose out-of-date entries are skipped when popped.
    """

    def __init__(self, words: list[list[int]], freqs: Iterable[int]) -> None:
        self.words, self.freqs = words, list(freqs)
        self.counts, self.where = Counter(), {}
        for w, word in enumerate(words):
            for pair, n in count_pairs(word).items():
                self.counts[pair] += n * self.freqs[w]
                self.where.setdefault(pair, set()).add(w)
        self.heap = [(-n, pair) for pair, n in self.counts.items()]
        heapq.heapify(self.heap)

    def most_frequent(self) -> tuple[int, int] | None:
        """The most frequent pair (ties: the smallest pair of ids) if it occurs at
        least twice, else ``None``."""
        while self.heap:
            neg, pair = heapq.heappop(self.heap)
            if self.counts[pair] == -neg:  # an up-to-date entry
                return pair if -neg >= 2 else None
        return None

    def merge(self, pair: tuple[int, int], new_id: int) -> None:
        """Merge ``pair`` in the chunks that hold it; only their counts change."""
        for w in self.where.pop(pair):
            before = count_pairs(self.words[w])
            self.words[w] = merge_pair(self.words[w], pair, new_id)
            self._add(w, count_pairs(self.words[w]), before)

    def _add(self, w: int, after: Counter, before: Counter) -> None:
        """Replace chunk ``w``'s contribution ``before`` by ``after``."""
        for pair in after.keys() | before.keys():
            delta = (after[pair] - before[pair]) * self.freqs[w]
            if delta:
                self.counts[pair] += delta
                heapq.heappush(self.heap, (-self.counts[pair], pair))
            if after[pair]:
                self.where.setdefault(pair, set()).add(w)


def _check_str(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")


def _check_train_args(text: object, vocab_size: object, specials: object) -> int:
    """Validate the arguments of :meth:`BPETokenizer.train`; return the merge count."""
    _check_str("text", text)
    if not text:
        raise ValueError("text must not be empty, got ''")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an int, got {vocab_size!r}")
    _check_specials(specials)
    if vocab_size < 256 + len(specials):
        raise ValueError(
            f"vocab_size must be >= 256 (the bytes) + {len(specials)} special "
            f"tokens = {256 + len(specials)}, got {vocab_size}"
        )
    return vocab_size - 256 - len(specials)


def _check_specials(specials: object) -> None:
    if isinstance(specials, str) or not isinstance(specials, Sequence):
        raise TypeError(f"special_tokens must be a list of str, got {specials!r}")
    bad = [s for s in specials if not isinstance(s, str) or not s]
    if bad or len(set(specials)) != len(specials):
        raise ValueError(
            f"special_tokens must be distinct non-empty strings, got {list(specials)!r}"
        )


def _check_ids(ids: object, vocab_size: int) -> list[int]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be an iterable of ints, got {ids!r:.60}")
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"ids out of range [0, {vocab_size}): {bad[:5]}")
    return ids


def _check_dict(data: object) -> tuple[list[tuple[int, int]], list[str]]:
    """Validate a :meth:`BPETokenizer.to_dict` description; return merges, specials."""
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError(f"not a {_FORMAT} description: {data!r:.80}")
    if data.get("pattern") != PATTERN:
        raise ValueError(
            f"pre-tokenisation pattern {data.get('pattern')!r} differs from {PATTERN!r}"
        )
    merges = [tuple(pair) for pair in data.get("merges", [])]
    for rank, pair in enumerate(merges):
        ok = len(pair) == 2 and all(
            isinstance(i, int) and 0 <= i < 256 + rank for i in pair
        )
        if not ok:
            raise ValueError(f"merge {rank} is {list(pair)!r}: not two earlier ids")
    specials = data.get("special_tokens", [])
    _check_specials(specials)
    return merges, specials
