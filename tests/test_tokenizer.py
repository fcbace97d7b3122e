"""tc.BPETokenizer: the same ids as the Hugging Face ``tokenizers`` byte-level BPE built from its merges,
exact round trips for any string, deterministic training, and clear errors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

import transformer_course as tc
from transformer_course.tokenizer import PATTERN, count_pairs, merge_pair, pretokenize

MIXED = (
    "注意力机制让每个位置直接读取所有位置。位置编码（positional encoding）告诉模型词元的顺序，"
    "The Transformer uses self-attention: 3 heads × 64 dims = 192!  Tabs\tand\nnewlines\n\n"
    "emoji 😀🚀, café, naïve, Ünïcödé, 日本語のテキスト, 한국어, snake_case_name, x1 = y2 + 30.5%\n"
)
SPECIALS = ["<|endoftext|>", "<|pad|>"]


@pytest.fixture(scope="module")
def corpus():
    return tc.load_text_corpus("zh")[:30_000] + MIXED * 3


@pytest.fixture(scope="module")
def trained(corpus):
    return tc.BPETokenizer().train(corpus, 600, special_tokens=SPECIALS)


def hf_tokenizer(tok):
    """A Hugging Face byte-level BPE with tok's merges, its pre-tokenisation pattern and specials."""
    b2u = bytes_to_unicode()

    def name(i):
        return "".join(b2u[b] for b in tok.vocab[i])

    vocab = {name(i): i for i in tok.vocab}
    assert len(vocab) == len(tok.vocab), "two ids with the same bytes: HF cannot represent this vocabulary"
    merges = [(name(a), name(b)) for a, b in tok.merges]
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(list(tok.special_tokens))
    return hf


def test_same_ids_as_hugging_face_tokenizers(trained, corpus):
    hf = hf_tokenizer(trained)
    assert hf.get_vocab_size() == trained.vocab_size == 600
    held_out = tc.load_text_corpus("zh")[-20_000:] + MIXED + "<|endoftext|>开头<|pad|>" + MIXED
    for text in (corpus[:20_000], held_out):
        ids = trained.encode(text)
        assert ids == hf.encode(text).ids
        assert trained.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text
    assert len(trained.encode(held_out)) < 0.6 * len(held_out.encode("utf-8"))  # it does compress


def test_pretokenisation_matches_hugging_face_split(corpus):
    split = pre_tokenizers.Split(Regex(PATTERN), behavior="isolated")
    assert [piece for piece, _ in split.pre_tokenize_str(corpus)] == pretokenize(corpus)
    assert pretokenize("注意力，位置编码 and  GPT-2") == ["注意力", "，", "位置编码", " and", " ", " GPT", "-", "2"]


@pytest.fixture(scope="module")
def hf_bpe_only(trained):
    """The HF tokenizer without the Split step: it is fed tc's own chunks."""
    hf = hf_tokenizer(trained)
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return hf


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_same_ids_as_hugging_face_bpe_on_any_text(trained, hf_bpe_only, text):
    """Any string (combining marks, control characters, ...): with tc's chunks as the split, the
    merges give the same ids in both implementations."""
    text = text.replace("<|", "<")  # no special tokens here
    chunks = pretokenize(text)
    expected = hf_bpe_only.encode(chunks, is_pretokenized=True).ids if chunks else []
    assert trained.encode(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_decode_encode_round_trip_for_any_string(trained, text):
    assert trained.decode(trained.encode(text)) == text
    assert "".join(pretokenize(text)) == text


def test_training_is_deterministic_and_save_load_round_trips(trained, corpus, tmp_path):
    again = tc.BPETokenizer().train(corpus, 600, special_tokens=SPECIALS)
    assert again.merges == trained.merges and again.special_tokens == trained.special_tokens
    trained.save(tmp_path / "tok.json")
    loaded = tc.BPETokenizer.load(tmp_path / "tok.json")
    assert loaded.merges == trained.merges and loaded.vocab == trained.vocab
    assert loaded.special_tokens == {"<|endoftext|>": 598, "<|pad|>": 599}
    assert loaded.encode(MIXED + "<|pad|>") == trained.encode(MIXED + "<|pad|>")
    assert json.loads((tmp_path / "tok.json").read_text(encoding="utf-8"))["pattern"] == PATTERN


def test_training_equals_a_recount_after_every_merge(corpus):
    """The incremental counts pick the same merges as the plain algorithm (recount, merge, repeat)."""
    text = corpus[:3_000]
    words = [list(chunk.encode("utf-8")) for chunk in pretokenize(text)]
    merges = {}
    for new_id in range(256, 256 + 60):
        counts = count_pairs([])
        for w in words:
            counts.update(count_pairs(w))
        best = min(counts, key=lambda p: (-counts[p], p))
        if counts[best] < 2:
            break
        merges[best] = new_id
        words = [merge_pair(w, best, new_id) for w in words]
    assert tc.BPETokenizer().train(text, 256 + 60).merges == merges


def test_the_merge_step_on_small_examples():
    assert count_pairs([1, 1, 1]) == {(1, 1): 2}
    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    tok = tc.BPETokenizer().train("aaabdaaabac", 259)  # the example of Wikipedia's "Byte pair encoding"
    a, b = ord("a"), ord("b")
    assert list(tok.merges) == [(a, a), (a, b), (256, 257)]
    assert tok.decode(tok.encode("aaabdaaabac")) == "aaabdaaabac"
    assert tok.encode("aaabdaaabac") == [258, ord("d"), 258, a, ord("c")]


def test_merges_build_chinese_characters_then_words():
    text = tc.load_text_corpus("zh")
    tok = tc.BPETokenizer().train(text[:40_000], 1000)
    tokens = {tok.vocab[i].decode("utf-8", errors="ignore") for i in tok.vocab if i >= 256}
    assert {"注意力", "位置", "编码"} <= tokens
    assert len(tok.encode("注意力")) == 1


def test_an_untrained_tokenizer_is_the_utf8_bytes():
    tok = tc.BPETokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("汉字") == list("汉字".encode())
    assert tok.decode([0xE6]) == "\ufffd"  # a cut character


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("", 300), ValueError, "empty"),
        ((b"bytes", 300), TypeError, "bytes"),
        ((None, 300), TypeError, "NoneType"),
        (("abc", 255), ValueError, "255"),
        (("abc", 257, ["<s>", "</s>"]), ValueError, "258, got 257"),
        (("abc", 300.0), TypeError, "300.0"),
        (("abc", True), TypeError, "True"),
        (("abc", 300, "<s>"), TypeError, "'<s>'"),
        (("abc", 300, ["<s>", "<s>"]), ValueError, "distinct"),
        (("abc", 300, [""]), ValueError, "non-empty"),
    ],
)
def test_bad_training_input_is_refused_with_the_value(args, error, match):
    with pytest.raises(error, match=match):
        tc.BPETokenizer().train(*args)


def test_bad_encode_decode_and_load_input(trained, tmp_path):
    with pytest.raises(TypeError, match="list"):
        trained.encode(["a"])
    with pytest.raises(ValueError, match=r"\[600, -1\]"):
        trained.decode([1, 600, -1])
    with pytest.raises(TypeError, match="'abc'"):
        trained.decode("abc")
    bad = trained.to_dict() | {"merges": [[1, 2], [1, 999]]}
    with pytest.raises(ValueError, match=r"merge 1 is \[1, 999\]"):
        tc.BPETokenizer.from_dict(bad)
    with pytest.raises(ValueError, match="pattern"):
        tc.BPETokenizer.from_dict(trained.to_dict() | {"pattern": r"\S+"})
    with pytest.raises(ValueError, match="not a"):
        tc.BPETokenizer.from_dict({"merges": []})
