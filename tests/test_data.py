import pytest
import torch

import transformer_course as tc


def test_char_tokenizer_round_trip_and_errors():
    text = tc.load_text_corpus()
    tok = tc.CharTokenizer(text)
    assert tok.decode(tok.encode(text[:500])) == text[:500]
    assert tok.vocab_size == len(set(text))
    with pytest.raises(ValueError, match=r"\['#'\]"):
        tok.encode("a#")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])


def test_shipped_corpus_is_the_generators_output():
    assert tc.load_text_corpus() == tc.generate_text_corpus()
    assert len(tc.load_text_corpus()) > 20_000


def test_word_tokenizer_round_trip_specials_and_padding():
    tok = tc.WordTokenizer(["我 爱 北京", "I love Beijing"])
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    ids = tok.encode("我 爱 北京", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "我 爱 北京"
    assert tok.encode("上海") == [tok.unk_id]
    batch = tok.encode_batch(["我 爱 北京", "我"], add_eos=True)
    assert batch.tolist()[1] == [tok.stoi["我"], 2, 0, 0]
    for bad in ([], "我 爱"):
        with pytest.raises(ValueError, match="non-empty sequence of strings"):
            tok.encode_batch(bad)
    with pytest.raises(ValueError, match="4 distinct"):
        tc.WordTokenizer([], specials=("a", "b"))


def test_copy_task_layout():
    src, tgt = tc.copy_task(5, 4, 9, seed=1)
    assert src.shape == (5, 4) and tgt.shape == (5, 6)
    assert (src >= 3).all() and (src < 9).all()
    assert torch.equal(tgt[:, 1:-1], src) and tgt[:, 0].eq(1).all() and tgt[:, -1].eq(2).all()
    _, rev = tc.copy_task(5, 4, 9, seed=1, reverse=True)
    assert torch.equal(rev[:, 1:-1], src.flip(1))
    assert torch.equal(tc.copy_task(5, 4, 9, seed=1)[0], src)
    with pytest.raises(ValueError, match="^vocab_size must be >= 4, got 3$"):
        tc.copy_task(5, 4, 3)


def test_translation_corpus_grammar_and_held_out_pair():
    pairs = tc.translation_corpus()
    assert tc.HELD_OUT_PAIR in pairs
    assert ("他 很 喜欢 茶", "he likes tea very much".capitalize()) in pairs
    assert len(pairs) == len(set(pairs))
    held = tc.translation_corpus(exclude=[tc.HELD_OUT_PAIR])
    assert tc.HELD_OUT_PAIR not in held and len(held) == len(pairs) - 1
    # every word of the held-out pair still occurs in training
    zh_words = {w for zh, _ in held for w in zh.split()}
    en_words = {w for _, en in held for w in en.split()}
    assert set(tc.HELD_OUT_PAIR[0].split()) <= zh_words
    assert set(tc.HELD_OUT_PAIR[1].split()) <= en_words
    assert tc.translation_corpus(seed=3) != pairs and sorted(tc.translation_corpus(seed=3)) == sorted(pairs)
    with pytest.raises(ValueError, match="not in the corpus"):
        tc.translation_corpus(exclude=[("x", "y")])


def test_translation_corpus_pairs_each_landmark_with_its_own_city():
    pairs = tc.translation_corpus()
    # SUBJECT [很] VERB OBJECT: the object is what follows the verb
    objects = {" ".join(zh.replace(" 很 ", " ").split()[2:]) for zh, _ in pairs}
    city_sight = {o for o in objects if " " in o}
    assert city_sight == {"北京 天安门", "北京 长城", "杭州 西湖", "西安 兵马俑"}
    assert ("我们 参观 西安 兵马俑", "We visit Xian Terracotta Army") in pairs
    assert not any("西安 天安门" in zh or "上海 长城" in zh for zh, _ in pairs)
    # only the feeling verbs take 很 or a thing: no "参观 茶", no "很 看见"
    assert not any("参观 茶" in zh or "看见 音乐" in zh or "很 参观" in zh for zh, _ in pairs)
    assert ("她 很 想念 猫", "She misses cats very much") in pairs


def test_lm_batch_targets_are_shifted_inputs():
    data = torch.arange(100)
    x, y = tc.lm_batch(data, 4, 8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)
    small = tc.lm_batch(data.to(torch.int16), 4, 8, generator=torch.Generator().manual_seed(0))
    assert all(t.dtype == torch.int64 for t in small) and torch.equal(small[0], x)
    with pytest.raises(ValueError, match="context_length=100"):
        tc.lm_batch(data, 4, 100)
    with pytest.raises(ValueError, match=r"1-D integer .* \(10, 10\) torch.int64"):
        tc.lm_batch(data.view(10, 10), 4, 3)
    with pytest.raises(ValueError, match="torch.float32"):
        tc.lm_batch(data.float(), 4, 3)
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        tc.lm_batch(data, 0, 3)


def test_split_paragraphs_keeps_paragraphs_whole_and_takes_the_last_ones():
    text = tc.load_text_corpus()
    paragraphs = text.strip().split("\n\n")
    train, val = tc.split_paragraphs(text)
    assert train.strip().split("\n\n") == paragraphs[:-20]
    assert val.strip().split("\n\n") == paragraphs[-20:]
    assert train.endswith("\n") and val.endswith("\n")
    assert tc.split_paragraphs("a\n\nb\n\n\n\nc\n", 0.3) == ("a\n\nb\n", "c\n")
    assert tc.split_paragraphs("a\n\nb", 0.01) == ("a\n", "b\n")  # at least one paragraph each
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\), got 1.0"):
        tc.split_paragraphs(text, 1.0)
    with pytest.raises(ValueError, match="paragraphs must be >= 2, got 1"):
        tc.split_paragraphs("one paragraph only\n")
