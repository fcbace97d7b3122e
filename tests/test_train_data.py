"""The trainer on any text: ``--data``, ``--tokenizer char|bpe``, ``--vocab-size``; the
tokenizer and the text's hash in the checkpoint; every bad input refused with one line and
nothing written. Tiny model, a few steps each."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_course import train_gpt
from transformer_course.checkpoint import load_checkpoint

# a fixed decay length, so that a resumed run may ask for more steps on the same schedule
TINY = [
    "--context-length", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--batch-size", "4", "--eval-every", "10", "--eval-iters", "1", "--log-every", "10",
    "--warmup-steps", "2", "--lr-decay-steps", "24", "--seed", "3", "--device", "cpu",
]  # fmt: skip
BPE = ["--tokenizer", "bpe", "--vocab-size", "300"]
SENTENCES = [
    "注意力让每个位置看见它前面的所有位置。",
    "位置编码告诉模型每个词在句子里的顺序。",
    "残差连接把输入加回输出，梯度因此更容易传回去。",
    "训练时模型预测下一个字，损失越低预测越准。",
]


def chinese_text(paragraphs: int = 12) -> str:
    """A small Chinese corpus: ``paragraphs`` paragraphs of the sentences above."""
    rows = ["".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(3)) for i in range(paragraphs)]
    return "\n\n".join(rows) + "\n"


def train(*args: str) -> int:
    return train_gpt.main(["train", *TINY, *args])


def expect_error(argv: list[str], message: str, capsys) -> str:
    """``main(argv)`` exits with status 2 and one ``PROG: 错误：`` line holding ``message``."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        train_gpt.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("python -m transformer_course.train_gpt: 错误："), err
    assert message in err, err
    return err


def test_train_resume_and_sample_chinese_text_with_bpe(tmp_path, capsys):
    data = tmp_path / "zh.txt"
    data.write_text(chinese_text(), encoding="utf-8")
    out = tmp_path / "run"
    assert train("--data", str(data), *BPE, "--out-dir", str(out), "--max-steps", "20") == 0
    saved = load_checkpoint(out / "ckpt.pt")
    assert saved["step"] == 20
    assert saved["extra"]["tokenizer"]["kind"] == "bpe"
    assert saved["config"]["vocab_size"] == 300
    sha = hashlib.sha256(data.read_text(encoding="utf-8").encode()).hexdigest()
    assert saved["extra"]["data_sha256"] == sha
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_bpc" in r] == [10, 20]

    assert train("--data", str(data), "--out-dir", str(out), "--max-steps", "24", "--resume") == 0
    assert f"从 {out / 'ckpt.pt'} 的第 20 步接着训练" in capsys.readouterr().out
    assert load_checkpoint(out / "ckpt.pt")["step"] == 24

    # the real command line, in another process: the tokenizer comes from the checkpoint
    cmd = [sys.executable, "-m", "transformer_course.train_gpt", "sample", "--ckpt",
           str(out / "ckpt.pt"), "--prompt", "注意力", "-n", "12", "--device", "cpu"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.startswith("注意力") and len(proc.stdout) > len("注意力\n")


def test_a_folder_gives_its_txt_and_md_files_in_sorted_order(tmp_path):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.md").write_text(chinese_text(6), encoding="utf-8")
    (folder / "sub" / "a.txt").write_text(chinese_text(6), encoding="utf-8")
    (folder / "skip.py").write_bytes(b"\0\0 not read")
    (folder / ".hidden.md").write_bytes(b"\xff not read")
    out = tmp_path / "run"
    assert train("--data", str(folder), "--out-dir", str(out), "--max-steps", "2") == 0
    text = chinese_text(6) + "\n\n" + chinese_text(6)
    expected = hashlib.sha256(text.encode()).hexdigest()
    assert load_checkpoint(out / "ckpt.pt")["extra"]["data_sha256"] == expected


def _bad_inputs(tmp: Path) -> list[tuple[Path, str]]:
    """(a --data path, the message it must get) for each bad input."""
    good = chinese_text().encode()
    cases = {
        "missing.txt": (None, "：没有这个文件或文件夹"),
        "latin1.txt": (good[:30] + "é".encode("latin-1") + good,
                       "不是 UTF-8 编码：字节偏移 30 处是字节 0xe9"),
        "empty.txt": (b"", "：文本是空的"),
        "blank.txt": (b"\n\n  \n\n", "：文本是空的"),
        "short.txt": ("甲乙。\n\n丙丁。\n".encode(), "个词元，不多于 context_length + 1 = 17"),
        "binary.txt": (b"abc\0def", "像是二进制文件（字节偏移 3 处有 NUL 字节）"),
        "one.txt": (good.replace(b"\n\n", b""), "只有 1 段，划分训练集和验证集至少要 2 段"),
    }  # fmt: skip
    found = []
    for name, (content, message) in cases.items():
        if content is not None:
            (tmp / name).write_bytes(content)
        found.append((tmp / name, message))
    (tmp / "code").mkdir()
    (tmp / "code" / "train.py").write_text("print('no text here')\n")
    found.append((tmp / "code", "：文件夹里没有 .txt/.md 文件"))
    return found


def test_every_bad_input_is_refused_and_nothing_is_written(tmp_path, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for path, message in _bad_inputs(inputs):
        out = tmp_path / f"run-{path.name}"
        for tokenizer in ("char", "bpe"):
            err = expect_error(
                ["train", *TINY, "--data", str(path), "--tokenizer", tokenizer,
                 "--out-dir", str(out)], message, capsys)  # fmt: skip
            assert str(path) in err
            assert not out.exists(), f"{path.name}: {sorted(out.iterdir())}"


def test_the_same_checks_run_on_resume(tmp_path, capsys):
    data = tmp_path / "zh.txt"
    data.write_text(chinese_text(), encoding="utf-8")
    out = tmp_path / "run"
    assert train("--data", str(data), "--out-dir", str(out), "--max-steps", "2") == 0
    data.write_bytes(b"abc\0def")
    expect_error(["train", *TINY, "--data", str(data), "--out-dir", str(out), "--resume"],
                 "像是二进制文件", capsys)  # fmt: skip


def test_resume_refuses_other_data_or_another_tokenizer(tmp_path, capsys):
    data, other = tmp_path / "zh.txt", tmp_path / "other.txt"
    data.write_text(chinese_text(), encoding="utf-8")
    other.write_text(chinese_text(13), encoding="utf-8")
    out = tmp_path / "run"
    assert train("--data", str(data), *BPE, "--out-dir", str(out), "--max-steps", "2") == 0
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    resume = ["train", *TINY, "--out-dir", str(out), "--resume", "--max-steps", "4"]
    expect_error([*resume, "--data", str(other)], "--resume：文本与检查点训练时用的不同（SHA-256 不同）", capsys)
    expect_error([*resume], "--resume：文本与检查点训练时用的不同", capsys)  # the shipped corpus
    expect_error([*resume, "--data", str(data), "--tokenizer", "char"],
                 "要的是 'char'，检查点的分词器是 'bpe 300'", capsys)  # fmt: skip
    expect_error([*resume, "--data", str(data), *BPE[:2], "--vocab-size", "280"],
                 "要的是 'bpe 280'，检查点的分词器是 'bpe 300'", capsys)  # fmt: skip
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before


def test_tokenizer_flags_are_checked(tmp_path, capsys):
    out = str(tmp_path / "run")
    expect_error(["train", "--vocab-size", "300", "--out-dir", out],
                 "--vocab-size 300 只用于 --tokenizer bpe", capsys)  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_gpt.main(["train", *BPE[:2], "--vocab-size", "255", "--out-dir", out])
    assert "必须是 >= 256 的整数，得到 255" in capsys.readouterr().err
    assert not Path(out).exists()


def test_a_small_text_may_learn_fewer_merges_and_still_resumes(tmp_path):
    data = tmp_path / "zh.txt"
    data.write_text(chinese_text(), encoding="utf-8")
    out = tmp_path / "run"
    big = ["--data", str(data), "--tokenizer", "bpe", "--vocab-size", "5000", "--out-dir", str(out)]
    big += ["--context-length", "4"]  # the merges leave few tokens
    assert train(*big, "--max-steps", "2") == 0
    learned = load_checkpoint(out / "ckpt.pt")["config"]["vocab_size"]
    assert 256 < learned < 5000  # no pair occurs twice any more
    assert train(*big, "--max-steps", "4", "--resume") == 0  # the same flags resume


def _shown_commands(path: Path) -> list[list[str]]:
    """The ``train_gpt`` command lines in ``path``'s ``bash`` code blocks (``text`` blocks show
    output, such as the trainer's error lines), as argument lists."""
    prefix, fence, commands = "-m transformer_course.train_gpt ", None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence == "bash" and prefix in line:
            commands.append(shlex.split(line.split(prefix, 1)[1], comments=True))
    return commands


@pytest.mark.parametrize("page", ["book/project_zh_gpt.md", "README.md"])
def test_the_commands_shown_in_the_book_and_readme_parse(page):
    commands = _shown_commands(Path(__file__).parents[1] / page)
    assert any(c[0] == "train" and "--preset" in c for c in commands), commands
    parser = train_gpt.cli.build_parser()
    for argv in commands:
        parser.parse_args(argv)  # SystemExit(2) on an unknown flag or choice
