import math

import pytest
import torch

import transformer_course as tc
from transformer_course import notebook as nb
from transformer_course.notebook import SourceCode


def test_course_seed_reads_the_environment(monkeypatch):
    monkeypatch.delenv(nb.SEED_ENV, raising=False)
    assert nb.course_seed() == 0 and nb.course_seed(7) == 7
    monkeypatch.setenv(nb.SEED_ENV, "3")
    assert nb.course_seed() == 30_000 and nb.course_seed(7) == 30_007


@pytest.mark.parametrize("raw", ["x", "-1", "1.5"])
def test_course_seed_rejects_bad_environment(monkeypatch, raw):
    monkeypatch.setenv(nb.SEED_ENV, raw)
    with pytest.raises(ValueError, match=repr(raw).replace(".", r"\.")):
        nb.course_seed()


@pytest.mark.parametrize("offset", [-1, 10_000])
def test_course_seed_rejects_bad_offset(offset):
    with pytest.raises(ValueError, match=str(offset)):
        nb.course_seed(offset)


def test_setup_chapter_seeds_from_the_environment(monkeypatch):
    monkeypatch.setenv(nb.SEED_ENV, "2")
    threads = torch.get_num_threads()
    try:
        assert tc.setup_chapter() == 20_000
        first = torch.rand(3)
        tc.setup_chapter()
        assert torch.equal(first, torch.rand(3))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_show_source_is_the_package_source():
    src = tc.show_source(tc.causal_mask)
    assert isinstance(src, SourceCode)
    assert src.path == "transformer_course/masks.py"
    assert src.code.startswith("def causal_mask(")
    with open(tc.masks.__file__, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[src.first_line - 1].startswith("def causal_mask(")
    assert src.code.rstrip().splitlines()[-1].strip() == lines[src.last_line - 1].strip()
    md = src._repr_markdown_()
    assert "````python\ndef causal_mask(" in md and f"第 {src.first_line}–{src.last_line} 行" in md


def test_show_source_dedents_methods():
    src = tc.show_source(tc.MultiHeadAttention.forward)
    assert src.code.startswith("def forward(") and src.qualname == "MultiHeadAttention.forward"


@pytest.mark.parametrize("obj", [torch.nn.Linear, math.sqrt])
def test_show_source_refuses_foreign_code(obj):
    with pytest.raises((TypeError, ValueError), match="show_source"):
        tc.show_source(obj)


def test_show_source_refuses_non_code():
    with pytest.raises(TypeError, match="42"):
        tc.show_source(42)


def test_check_prints_verdict_and_raises(capsys):
    nb.claim(torch.tensor(True), "holds")
    assert capsys.readouterr().out == "✓ holds\n"
    with pytest.raises(AssertionError, match="fails"):
        nb.claim(1 > 2, "fails")
    with pytest.raises(ValueError, match=r"\(2,\)"):
        nb.claim(torch.tensor([True, True]), "ambiguous")


def test_check_close_reports_error(capsys):
    expected = torch.tensor([1.0, 2.0 + 1e-7], dtype=torch.float64)
    assert nb.claim_close(torch.tensor([1.0, 2.0]), expected, "close", atol=1e-6, rtol=0) is None
    assert capsys.readouterr().out == "✓ close（最大误差 1.0e-07）\n"
    with pytest.raises(AssertionError, match="far"):
        nb.claim_close(torch.tensor([1.0]), torch.tensor([1.1]), "far")
    with pytest.raises(AssertionError, match="shapes"):
        nb.claim_close(torch.zeros(2), torch.zeros(3), "shape")
    with pytest.raises(ValueError, match="atol"):
        nb.claim_close(1.0, 1.0, "tol", atol=1e-3)


def test_checks_prints_one_line_for_a_block(capsys):
    with nb.claims("一节的检查"):
        nb.claim(True, "a")
        nb.claim_close(torch.ones(2), torch.ones(2), "b")
    assert capsys.readouterr().out == "✓ 一节的检查（2 项检查）\n"
    nb.claim(True, "outside")
    assert capsys.readouterr().out == "✓ outside\n"


def test_checks_fails_at_the_first_failed_check(capsys):
    with pytest.raises(AssertionError, match="claim failed: b"):
        with nb.claims("s"):
            nb.claim(True, "a")
            nb.claim(False, "b")
    assert capsys.readouterr().out == ""
    nb.claim(True, "after")  # the block is closed again: checks print
    assert capsys.readouterr().out == "✓ after\n"


def test_report_claims_prints_the_quiet_checks_once(capsys):
    with nb.claims("一节", quiet=True):
        nb.claim(True, "a")
    with nb.claims("另一节", quiet=True):
        nb.claim(True, "b")
        nb.claim(True, "c")
    assert capsys.readouterr().out == ""
    nb.report_claims("全页")
    assert capsys.readouterr().out == "✓ 全页（3 项检查）\n"
    with pytest.raises(AssertionError, match="no unreported check"):
        nb.report_claims("再报一次")
    with nb.claims("下一节"):  # the reported checks are not counted again
        nb.claim(True, "d")
    assert capsys.readouterr().out == "✓ 下一节（1 项检查）\n"
    with pytest.raises(RuntimeError, match="inside a claims block"):
        with nb.claims("外层"):
            nb.claim(True, "e")
            nb.report_claims("里面")
    with pytest.raises(TypeError, match="summary"):
        nb.report_claims("")


def test_checks_refuses_a_block_without_checks():
    with pytest.raises(AssertionError, match="no check ran"):
        with nb.claims("nothing"):
            pass
    with pytest.raises(TypeError, match="summary"):
        with nb.claims(""):
            pass


def test_quiet_checks_are_counted_in_the_next_printed_line(capsys):
    with nb.claims("第一格", quiet=True):
        nb.claim(True, "a")
        nb.claim(True, "b")
    assert capsys.readouterr().out == ""
    with nb.claims("一节的检查"):
        nb.claim(True, "c")
    assert capsys.readouterr().out == "✓ 一节的检查（3 项检查）\n"
    with nb.claims("下一节"):
        nb.claim(True, "d")
    assert capsys.readouterr().out == "✓ 下一节（1 项检查）\n"
    with pytest.raises(AssertionError, match="claim failed: e"):
        with nb.claims("quiet failure", quiet=True):
            nb.claim(False, "e")
    with pytest.raises(TypeError, match="quiet"):
        with nb.claims("s", quiet="yes"):
            nb.claim(True, "f")
