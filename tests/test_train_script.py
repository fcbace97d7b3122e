"""End-to-end tests of ``python -m transformer_course.train_gpt``: DDP with two CPU processes (gloo), exact resume (also
after SIGKILL inside a checkpoint save), flag and out-dir checks, and sampling from a checkpoint.
Tiny model, a few steps each."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import train_gpt_hooks

import transformer_course as tc
from bench import trainer_mfu
from transformer_course import train_gpt
from transformer_course.checkpoint import load_checkpoint, save_checkpoint, state_dict_sha256
from transformer_course.train_gpt import run as train_run

# The command line that a reader types: ``python -m transformer_course.train_gpt ...``
MODULE = ["-m", "transformer_course.train_gpt"]
# The same program with the test hooks installed (tests/train_gpt_hooks.py)
HOOKED = [str(Path(__file__).with_name("train_gpt_hooks.py"))]

TINY = [
    "--context-length", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--batch-size", "4", "--eval-every", "2", "--eval-iters", "1", "--log-every", "1",
    "--warmup-steps", "2", "--lr-decay-steps", "6", "--seed", "3",
]  # fmt: skip


@pytest.fixture(scope="module")
def script():
    return train_gpt


@pytest.fixture(autouse=True)
def _single_process_env(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def _torchrun(out_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        *HOOKED, "--rank-state", "train", "--out-dir", str(out_dir), "--device", "cpu",
        *TINY, *extra,
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run(cmd, cwd=out_dir.parent, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _rank_states(out_dir: Path) -> list[dict]:
    return [json.loads((out_dir / "rank_state" / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ddp_two_cpu_processes_stay_identical_and_resume(script, tmp_path):
    out = tmp_path / "ddp"
    # A cheap in-process run writes the checkpoint at step 2; two processes then resume it
    # under DDP, so a single torchrun launch checks DDP and resuming together
    # (--grad-accum 2 also exercises DDP's no_sync() on the first micro-step).
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "2", *TINY]) == 0
    before = state_dict_sha256(load_checkpoint(out / "ckpt.pt")["model"])

    proc = _torchrun(out, "--max-steps", "4", "--resume", "--grad-accum", "2")
    assert f"从 {out / 'ckpt.pt'} 的第 2 步接着训练" in proc.stdout
    assert proc.stdout.count("第      4 步 | 训练损失") == 1  # only rank 0 logs
    r0, r1 = _rank_states(out)
    assert (r0["rank"], r1["rank"], r0["world_size"], r1["world_size"]) == (0, 1, 2, 2)
    assert (r0["start_step"], r0["step"], r1["start_step"], r1["step"]) == (2, 4, 2, 4)
    # the ranks drew different batches, yet DDP kept their weights bitwise identical
    assert r0["first_batch_sha256"] != r1["first_batch_sha256"]
    assert r0["weights_sha256"] == r1["weights_sha256"] != before
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["step"] == 4 and ckpt["extra"]["world_size"] == 2
    assert state_dict_sha256(ckpt["model"]) == r0["weights_sha256"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[-1] == 4
    assert any("val_loss" in r and r["step"] == 4 for r in records)


def test_resume_continues_exactly_like_an_uninterrupted_run(script, tmp_path, capsys, monkeypatch):
    train_gpt_hooks.install(monkeypatch.setattr, rank_state=True)
    common = ["--dropout", "0.1", *TINY]
    assert script.main(["train", "--out-dir", str(tmp_path / "a"), "--max-steps", "6", *common]) == 0
    assert script.main(["train", "--out-dir", str(tmp_path / "b"), "--max-steps", "3", *common]) == 0
    assert load_checkpoint(tmp_path / "b" / "ckpt.pt")["step"] == 3
    assert script.main(["train", "--out-dir", str(tmp_path / "b"), "--max-steps", "6", "--resume", *common]) == 0
    a = json.loads((tmp_path / "a" / "rank_state" / "rank0.json").read_text())
    b = json.loads((tmp_path / "b" / "rank_state" / "rank0.json").read_text())
    assert (a["start_step"], b["start_step"], a["step"], b["step"]) == (0, 3, 6, 6)
    assert a["weights_sha256"] == b["weights_sha256"]
    ckpt_a = load_checkpoint(tmp_path / "a" / "ckpt.pt")
    ckpt_b = load_checkpoint(tmp_path / "b" / "ckpt.pt")
    assert ckpt_b["step"] == 6
    for name, value in ckpt_a["model"].items():
        assert torch.equal(value, ckpt_b["model"][name]), name

    # resuming a finished run does nothing and says so
    capsys.readouterr()
    assert script.main(["train", "--out-dir", str(tmp_path / "b"), "--max-steps", "6", "--resume", *common]) == 0
    assert "检查点已在第 6 步，不少于 --max-steps 6：没有要训练的步数" in capsys.readouterr().out


def test_sample_loads_checkpoint_with_weights_only(script, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "2", *TINY]) == 0
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    capsys.readouterr()
    args = [
        "sample",
        "--ckpt",
        str(out / "ckpt.pt"),
        "--prompt",
        "The fox",
        "--max-new-tokens",
        "20",
    ]
    assert script.main([*args, "--greedy"]) == 0
    first = capsys.readouterr().out
    assert calls == [True]
    assert first.startswith("The fox") and len(first.rstrip("\n")) >= len("The fox")
    assert len(first) == len("The fox") + 20 + 1  # 20 new characters and print's newline
    assert script.main([*args, "--greedy"]) == 0
    assert capsys.readouterr().out == first  # greedy decoding is deterministic
    assert script.main([*args, "--num-samples", "2", "--top-k", "5", "--seed", "1"]) == 0
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("-----")]
    assert headers == ["----- 样本 1/2（检查点第 2 步）", "----- 样本 2/2（检查点第 2 步）"]
    # a prompt longer than the window (16) is printed whole; stderr says the model saw the end
    long_prompt = "The fox has a red apple. " * 2
    assert script.main(["sample", "--ckpt", str(out / "ckpt.pt"), "--prompt", long_prompt,
                        "--max-new-tokens", "5", "--greedy"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out.startswith(long_prompt) and len(captured.out) == len(long_prompt) + 5 + 1
    assert f"提示有 {len(long_prompt)} 个词元，超过检查点的上下文长度 16" in captured.err
    assert script.main([*args, "--greedy"]) == 0
    assert "上下文长度" not in capsys.readouterr().err  # a short prompt: no note
    _expect_usage_error(script, ["sample", "--ckpt", str(out / "ckpt.pt"), "--prompt", "Zürich"],
                        "--prompt 'Zürich' 里有训练文本中没有的字符 ['Z', 'ü']", capsys)  # fmt: skip
    _expect_usage_error(script, ["sample", "--ckpt", str(out / "ckpt.pt"), "--prompt", ""],
                        "--prompt 不能是空的", capsys)  # fmt: skip
    # best.pt (the lowest validation loss) samples too
    assert script.main(["sample", "--ckpt", str(out / "best.pt"), "--prompt", "The", "-n", "5", "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("The")


def _expect_usage_error(script, argv: list[str], message: str, capsys) -> str:
    """``main(argv)`` exits with status 2, and stderr ends with the line
    ``PROG: 错误：...`` holding ``message`` (argparse's own errors print the usage first)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        script.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("python -m transformer_course.train_gpt") and ": 错误：" in last, err
    assert message in last, err
    assert "usage:" not in err and "error:" not in err, err
    return err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--weight-decay", "-0.1", "必须是 [0.0, inf) 中的有限数，得到 -0.1"),
        ("--grad-clip", "-1", "必须是 [0.0, inf) 中的有限数，得到 -1"),
        ("--lr", "0", "必须是 (0.0, inf) 中的有限数，得到 0"),
        ("--lr", "nan", "得到 nan"),
        ("--min-lr", "inf", "得到 inf"),
        ("--beta2", "1", "[0.0, 1.0) 中的有限数，得到 1"),
        ("--dropout", "1.0", "[0.0, 1.0) 中的有限数，得到 1.0"),
        ("--dropout", "-0.1", "得到 -0.1"),
        ("--val-fraction", "1.5", "(0.0, 1.0) 中的有限数，得到 1.5"),
        ("--val-fraction", "0", "得到 0"),
        ("--max-steps", "0", "必须是 >= 1 的整数，得到 0"),
        ("--batch-size", "0", "得到 0"),
        ("--grad-accum", "-2", "得到 -2"),
        ("--eval-every", "0", "得到 0"),
        ("--eval-iters", "0", "得到 0"),
        ("--log-every", "0", "得到 0"),
        ("--lr-decay-steps", "0", "得到 0"),
        ("--warmup-steps", "-1", "必须是 >= 0 的整数，得到 -1"),
        ("--seed", "-1", "得到 -1"),
        ("--context-length", "abc", "需要一个整数，得到 'abc'"),
        ("--d-model", "0", "得到 0"),
        ("--num-heads", "-1", "得到 -1"),
        ("--num-layers", "0", "得到 0"),
        ("--positional", "bogus", "取值 'bogus' 不在可选范围内（可选："),
        ("--preset", "big", "取值 'big' 不在可选范围内（可选：'cpu-small', 'cpu-medium'"),
    ],
)
def test_every_numeric_train_flag_is_checked(script, tmp_path, capsys, flag, value, message):
    out = tmp_path / "never"
    _expect_usage_error(script, ["train", "--out-dir", str(out), *TINY, flag, value], f"参数 {flag}：", capsys)
    _expect_usage_error(script, ["train", "--out-dir", str(out), *TINY, flag, value], message, capsys)
    assert not out.exists()  # rejected before anything was created


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("-n", "-1", "参数 -n/--max-new-tokens：必须是 >= 0 的整数，得到 -1"),
        ("--num-samples", "0", "参数 --num-samples：必须是 >= 1 的整数，得到 0"),
        ("--temperature", "0", "参数 --temperature：必须是 (0.0, inf) 中的有限数，得到 0"),
        ("--temperature", "nan", "参数 --temperature：必须是 (0.0, inf) 中的有限数，得到 nan"),
        ("--top-k", "0", "参数 --top-k：必须是 >= 1 的整数，得到 0"),
        ("--top-p", "0", "参数 --top-p：必须是 (0.0, 1.0] 中的有限数，得到 0"),
        ("--top-p", "1.5", "参数 --top-p：必须是 (0.0, 1.0] 中的有限数，得到 1.5"),
    ],
)
def test_every_numeric_sample_flag_is_checked(script, tmp_path, capsys, flag, value, message):
    _expect_usage_error(script, ["sample", "--ckpt", str(tmp_path / "x.pt"), flag, value], message, capsys)


def test_bad_arguments_and_out_dirs(script, tmp_path, capsys):
    _expect_usage_error(script, ["train", "--out-dir", str(tmp_path / "none"), "--resume", *TINY],
                        f"--resume：{str(tmp_path / 'none' / 'ckpt.pt')!r} 处没有检查点文件", capsys)  # fmt: skip
    _expect_usage_error(script, ["train", "--out-dir", str(tmp_path / "x"), *TINY, "--lr", "0.01", "--min-lr", "0.1"],
                        "--min-lr 0.1 不能大于 --lr 0.01", capsys)  # fmt: skip
    _expect_usage_error(script, ["train", "--out-dir", str(tmp_path / "x"), *TINY, "--context-length", "100000"],
                        "context_length + 1 = 100001", capsys)  # fmt: skip
    _expect_usage_error(script, ["train", "--out-dir", str(tmp_path / "x"), *TINY, "--num-heads", "3"],
                        "模型参数不能这样组合（--d-model、--num-heads、--positional 等）：", capsys)  # fmt: skip
    # an out dir that cannot be created (its parent is a file) is reported before step 1
    (tmp_path / "file").write_text("not a folder")
    _expect_usage_error(script, ["train", "--out-dir", str(tmp_path / "file" / "run"), *TINY],
                        f"--out-dir {str(tmp_path / 'file' / 'run')!r} 不是可写的文件夹：", capsys)  # fmt: skip
    _expect_usage_error(script, ["sample", "--ckpt", str(tmp_path / "missing.pt")],
                        f"--ckpt：{str(tmp_path / 'missing.pt')!r} 处没有检查点文件", capsys)  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write to read-only folders")
def test_read_only_out_dir_is_reported_before_step_one(script, tmp_path, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        _expect_usage_error(script, ["train", "--out-dir", str(out), *TINY], "不是可写的文件夹", capsys)
    finally:
        out.chmod(0o700)


def test_resume_refuses_model_flags_that_differ_from_the_checkpoint(script, tmp_path, capsys):
    out = tmp_path / "run"
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "2", *TINY]) == 0
    before = (out / "ckpt.pt").read_bytes()
    differ = "--d-model 64（检查点：16）、--norm 'rmsnorm'（检查点：'layernorm'）"
    argv = ["train", "--out-dir", str(out), "--max-steps", "4", "--resume", *TINY, "--d-model", "64"]
    argv += ["--norm", "rmsnorm"]
    _expect_usage_error(script, argv, differ, capsys)
    assert (out / "ckpt.pt").read_bytes() == before
    # without --resume an existing checkpoint is never overwritten
    _expect_usage_error(script, ["train", "--out-dir", str(out), "--max-steps", "4", *TINY],
                        f"{str(out / 'ckpt.pt')!r} 已经存在：要接着那次训练请加 --resume", capsys)  # fmt: skip
    assert (out / "ckpt.pt").read_bytes() == before
    # model flags left out: the checkpoint's config is used
    rest = TINY[TINY.index("--batch-size") :]
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "4", "--resume", *rest]) == 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["step"] == 4 and ckpt["config"]["d_model"] == 16


def test_resume_refuses_to_reshape_the_learning_rate_schedule(script, tmp_path, capsys):
    """Without --lr-decay-steps the cosine decay runs over --max-steps: resuming with another
    --max-steps would change the learning rate of every remaining step, so it is refused,
    naming both values, before anything is written; --lr-decay-steps keeps the schedule."""
    out = tmp_path / "run"
    schedule_free = [a for a in TINY if a not in ("--lr-decay-steps", "6")]
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "2", *schedule_free]) == 0
    saved = load_checkpoint(out / "ckpt.pt")["extra"]["lr_schedule"]
    assert saved["decay_steps"] == 2 and saved["warmup_steps"] == 2
    before = (out / "ckpt.pt").read_bytes()
    resume = ["train", "--out-dir", str(out), "--resume", *schedule_free]
    _expect_usage_error(script, [*resume, "--max-steps", "4"],
                        "余弦衰减 4 步（--max-steps 4）（检查点：2）", capsys)  # fmt: skip
    _expect_usage_error(script, [*resume, "--max-steps", "4"],
                        "加上 --lr-decay-steps 2（之后学习率保持在 --min-lr）", capsys)  # fmt: skip
    _expect_usage_error(script, [*resume, "--max-steps", "2", "--lr", "0.5"],
                        "--lr 0.5（检查点：0.01）、--min-lr 0.05（检查点：0.001）", capsys)  # fmt: skip
    assert (out / "ckpt.pt").read_bytes() == before
    # the checkpoint's schedule, continued past its end: allowed, and the rate stays at min_lr
    assert script.main([*resume, "--max-steps", "4", "--lr-decay-steps", "2"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in records if "lr" in r and r["step"] > 2] == [saved["min_lr"]] * 2


def test_resume_hint_when_the_warm_up_outlasts_the_decay(script, tmp_path, capsys):
    """A run shorter than its warm-up never reaches the decay: continued past its end on the
    same schedule, the learning rate goes on warming up (tc.cosine_lr tests the warm-up
    first) and only then stays at --min-lr. The --lr-decay-steps hint says so, and the run
    that follows the hint logs exactly that."""
    out = tmp_path / "run"
    args = [a for a in TINY if a not in ("--lr-decay-steps", "6")]
    args[args.index("--warmup-steps") + 1] = "4"
    assert script.main(["train", "--out-dir", str(out), "--max-steps", "2", *args]) == 0
    saved = load_checkpoint(out / "ckpt.pt")["extra"]["lr_schedule"]
    assert saved["warmup_steps"] == 4 and saved["decay_steps"] == 2
    resume = ["train", "--out-dir", str(out), "--resume", *args]
    _expect_usage_error(script, [*resume, "--max-steps", "6"],
                        "加上 --lr-decay-steps 2（检查点的预热（4 步）比衰减（2 步）还长：学习率继续升到 "
                        "--lr，直到第 4 步，之后保持在 --min-lr）", capsys)  # fmt: skip
    assert script.main([*resume, "--max-steps", "6", "--lr-decay-steps", "2"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["lr"] for r in records if "lr" in r}
    peak, low = saved["lr"], saved["min_lr"]
    assert [logged[s] for s in (3, 4, 5, 6)] == pytest.approx([peak * 3 / 4, peak, low, low])


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b""], ids=["random-bytes", "empty"])
def test_corrupted_checkpoint_gives_a_clear_message(script, tmp_path, capsys, content):
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(content)
    shown = f"{str(out / 'ckpt.pt')!r} 不是本训练脚本写出的完整检查点（文件损坏、被截断或是别的格式）"
    _expect_usage_error(script, ["train", "--out-dir", str(out), "--resume", *TINY], f"--resume：{shown}", capsys)
    _expect_usage_error(script, ["sample", "--ckpt", str(out / "ckpt.pt")], f"--ckpt：{shown}", capsys)


def test_foreign_checkpoints_are_refused_on_resume(script, tmp_path, capsys):
    out = tmp_path / "run"
    text = tc.load_text_corpus()
    sha = hashlib.sha256(text.encode()).hexdigest()
    save_checkpoint(out / "ckpt.pt", torch.nn.Linear(2, 2), step=1, tokenizer_chars="abc")
    resume = ["train", "--out-dir", str(out), "--resume", *TINY]
    _expect_usage_error(script, resume, "--resume：文本与检查点训练时用的不同（检查点没有记录文本的 SHA-256）", capsys)
    save_checkpoint(out / "ckpt.pt", torch.nn.Linear(2, 2), step=1, data_sha256=sha, tokenizer=["abc"])
    _expect_usage_error(script, resume, "检查点里没有本训练脚本写出的分词器", capsys)
    chars = tc.CharTokenizer(text).chars
    save_checkpoint(out / "ckpt.pt", torch.nn.Linear(2, 2), step=1, data_sha256=sha, tokenizer_chars=chars)
    _expect_usage_error(script, resume, "--resume：检查点里没有可用的 GPTConfig", capsys)
    # sample refuses the same checkpoint with one line, not a traceback
    _expect_usage_error(
        script, ["sample", "--ckpt", str(out / "ckpt.pt")], "--ckpt：检查点里没有可用的 GPTConfig", capsys
    )


def test_truncate_metrics_keeps_records_up_to_the_step(script, tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "a": 1}', '{"step": 2, "a": 2}', '{"step": 2, "b": 2}', '{"step": 3, "a": 3}', '{"ste']
    path.write_text("\n".join(lines))  # the last record was cut by a kill
    assert train_run.truncate_metrics(path, 2) == 2
    assert path.read_text() == "\n".join(lines[:3]) + "\n"
    assert train_run.truncate_metrics(path, 2) == 0
    assert train_run.truncate_metrics(path, 0) == 3 and path.read_text() == ""
    assert train_run.truncate_metrics(tmp_path / "absent.jsonl", 0) == 0
    assert list(tmp_path.iterdir()) == [path]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("pause", ["ckpt.pt:4", "best.pt:4"])
def test_run_killed_inside_a_save_resumes_bit_exactly(script, tmp_path, pause, monkeypatch):
    """SIGKILL while a checkpoint's temporary file is complete but not yet renamed, then --resume:
    the final weights, best.pt and metrics.jsonl equal those of a run that was never stopped."""
    common = ["--max-steps", "6", "--dropout", "0.1", *TINY]
    assert script.main(["train", "--out-dir", str(tmp_path / "a"), *common]) == 0

    out = tmp_path / "b"
    out.mkdir()
    (out / "ckpt.pt.stale.tmp").write_text("left by an earlier kill")
    cmd = [sys.executable, *HOOKED, "--pause", pause, "train", "--out-dir", str(out), "--device", "cpu", *common]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = out / "paused-in-save"
    try:
        while not marker.exists():  # the save is paused until the kill; no wall-clock bound needed
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "ckpt.pt.stale.tmp").exists()  # removed when the run started
    name = pause.split(":")[0]
    assert Path(marker.read_text()).parent == out and Path(marker.read_text()).name.startswith(name + ".")
    assert Path(marker.read_text()).exists()  # the killed save's temporary file is left over
    # best.pt is saved before ckpt.pt, so either kill leaves the step-2 checkpoint, intact and loadable
    assert load_checkpoint(out / "ckpt.pt")["step"] == 2
    assert max(r["step"] for r in _records(out)) == 4  # records past the checkpoint's step
    marker.unlink()

    resume = ["train", "--out-dir", str(out), "--resume", *common]
    train_gpt_hooks.install(monkeypatch.setattr, rank_state=True)
    assert script.main(resume) == 0
    assert not list(out.glob("*.tmp"))
    assert _records(out) == _records(tmp_path / "a")  # every record once, values identical
    keys = [(r["step"], "val_loss" in r) for r in _records(out)]
    assert len(keys) == len(set(keys))
    for file in ("ckpt.pt", "best.pt"):
        a, b = load_checkpoint(tmp_path / "a" / file), load_checkpoint(out / file)
        assert a["step"] == b["step"]
        assert state_dict_sha256(a["model"]) == state_dict_sha256(b["model"]), file
    state = json.loads((out / "rank_state" / "rank0.json").read_text())
    assert state["weights_sha256"] == state_dict_sha256(load_checkpoint(tmp_path / "a" / "ckpt.pt")["model"])
    val = [r for r in _records(out) if "val_loss" in r]
    best = min(val, key=lambda r: r["val_loss"])
    assert load_checkpoint(out / "best.pt")["step"] == best["step"]
    assert load_checkpoint(out / "best.pt")["extra"]["val_loss"] == best["val_loss"]


@pytest.mark.parametrize(
    ("flags", "lr", "min_lr"),
    [
        ([], 1e-2, 1e-3),  # the preset's pair
        (["--lr", "0.004"], 4e-3, 4e-4),  # --lr alone: the minimum follows it (a tenth)
        (["--lr", "0.004", "--min-lr", "0.001"], 4e-3, 1e-3),
        (["--min-lr", "0.002"], 1e-2, 2e-3),
    ],
)
def test_lr_alone_brings_its_own_minimum(tmp_path, flags, lr, min_lr):
    from transformer_course.train_gpt.cli import build_parser
    from transformer_course.train_gpt.config import TrainConfig

    args = build_parser().parse_args(["train", "--out-dir", str(tmp_path), "--preset", "cpu-small", *flags])
    cfg = TrainConfig.from_args(args)
    assert (cfg.lr, cfg.min_lr) == pytest.approx((lr, min_lr))


def test_threads_flag_sets_torch_threads(tmp_path, monkeypatch):
    from transformer_course.train_gpt.cli import build_parser
    from transformer_course.train_gpt.config import TrainConfig

    assert TrainConfig.from_args(build_parser().parse_args(["train", "--out-dir", str(tmp_path)])).threads is None
    cfg = TrainConfig.from_args(build_parser().parse_args(["train", "--threads", "1", "--out-dir", str(tmp_path)]))
    assert cfg.threads == 1
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(train_run, "read_resume", lambda cfg: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        train_run.train(cfg)
    assert seen == [1]


def test_ms_per_step_counts_the_steps_of_the_interval_without_evaluation(script, tmp_path, capsys, monkeypatch):
    """With --log-every 4 and --max-steps 6 the last line covers 2 steps, and the time
    spent evaluating and saving is not training time. A fake clock: each training step
    takes 0.1 s, each evaluation and checkpoint 5 s."""
    clock = [0.0]
    monkeypatch.setattr(train_run.time, "perf_counter", lambda: clock[0])
    step, evaluate = train_run.train_step, train_run.evaluate_and_checkpoint

    def timed_step(run, i):
        clock[0] += 0.1
        return step(run, i)

    def timed_evaluate(run, i):
        clock[0] += 5.0
        return evaluate(run, i)

    monkeypatch.setattr(train_run, "train_step", timed_step)
    monkeypatch.setattr(train_run, "evaluate_and_checkpoint", timed_evaluate)
    args = [a for a in TINY]
    args[args.index("--log-every") + 1] = "4"
    assert script.main(["train", "--out-dir", str(tmp_path / "run"), "--max-steps", "6", *args]) == 0
    log = capsys.readouterr().out
    rates = [line.split("|")[-1].strip() for line in log.splitlines() if "ms/步" in line]
    assert rates == ["100 ms/步", "100 ms/步"], rates
    # bench/trainer_mfu.py reads these lines
    assert [(m[1], m[2]) for m in trainer_mfu.STEP_LINE.finditer(log)] == [("4", "100"), ("6", "100")]
    assert [m[1] for m in trainer_mfu.VAL_LINE.finditer(log)] == ["2", "4", "6"]
    assert trainer_mfu.VOCAB.search(log)[1] == str(
        load_checkpoint(tmp_path / "run" / "ckpt.pt")["config"]["vocab_size"]
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "错误：缺少必需的参数 {train,sample}"),
        (["trian"], "错误：参数 {train,sample}：取值 'trian' 不在可选范围内（可选："),
        (["train", "--bogus", "1"], "错误：不认识的参数 --bogus 1"),
        (["train", "--lr"], "错误：参数 --lr：后面要跟一个值"),
        (["train", "--eval", "3"], "错误：--eval 有歧义，可能是 --eval-every, --eval-iters"),
        (["train", "--resume=1"], "错误：参数 --resume：这个开关不带值，多给了 '1'"),
        (["sample"], "错误：缺少必需的参数 --ckpt"),
    ],
)
def test_argparse_errors_are_chinese(script, capsys, argv, message):
    """argparse's own errors, in the language of the help: a usage line, then one error line."""
    err = _expect_usage_error(script, argv, message, capsys)
    assert err.startswith("用法：python -m transformer_course.train_gpt"), err


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sample", "-h"]])
def test_help_is_chinese_throughout(script, capsys, argv):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        script.main(argv)
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert out.startswith("用法：") and "\n选项:\n" in out and "显示本帮助并退出" in out, out
    for english in ("usage:", "options:", "positional arguments", "show this help"):
        assert english not in out, english


@pytest.mark.parametrize("command", ["train", "sample"])
@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_an_absent_accelerator_is_one_line_before_anything_is_written(
    script, tmp_path, capsys, monkeypatch, command, device
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    out = tmp_path / "never"
    target = ["--out-dir", str(out), *TINY] if command == "train" else ["--ckpt", str(out / "ckpt.pt")]
    _expect_usage_error(script, [command, *target, "--device", device],
                        f"--device {device}：这台机器上的 torch 找不到 {device.upper()}", capsys)  # fmt: skip
    assert not out.exists()


def test_several_processes_refuse_mps(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    two = train_gpt.distributed.DistInfo(rank=0, local_rank=0, world_size=2)
    with pytest.raises(train_gpt.config.UsageError, match="--device mps：多进程训练只支持 cpu"):
        train_gpt.distributed.pick_device("mps", two)
    assert train_gpt.distributed.pick_device("auto", two) == torch.device("cpu")  # gloo
    one = train_gpt.distributed.DistInfo()
    assert train_gpt.distributed.pick_device("auto", one) == torch.device("mps")


def test_chinese_argparse_message_leaves_unknown_messages_alone():
    from transformer_course.train_gpt.cli import chinese_argparse_message

    assert chinese_argparse_message("argument --x: expected one argument") == "参数 --x：后面要跟一个值"
    assert chinese_argparse_message("something new in Python 3.99") == "something new in Python 3.99"
