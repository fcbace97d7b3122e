"""End-to-end tests of scripts/train_gpt.py: DDP with two CPU processes (gloo), exact resume,
and sampling from the checkpoint. Tiny model, a few steps: well under 30 s on two cores."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_course.checkpoint import load_checkpoint, state_dict_sha256

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_gpt.py"

TINY = [
    "--context-length", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--batch-size", "4", "--eval-every", "2", "--eval-iters", "1", "--log-every", "1",
    "--warmup-steps", "2", "--lr-decay-steps", "6", "--seed", "3",
]  # fmt: skip


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module  # dataclasses look their module up in sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("train_gpt", None)


@pytest.fixture(autouse=True)
def _single_process_env(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def _torchrun(out_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(SCRIPT), "train", "--out-dir", str(out_dir), "--device", "cpu",
        "--write-rank-state", *TINY, *extra,
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
    assert f"resumed from {out / 'ckpt.pt'} at step 2" in proc.stdout
    assert proc.stdout.count("step      4 | loss") == 1  # only rank 0 logs
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


def test_resume_continues_exactly_like_an_uninterrupted_run(script, tmp_path, capsys):
    common = ["--dropout", "0.1", "--write-rank-state", *TINY]
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
    assert "nothing to do" in capsys.readouterr().out


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
    assert capsys.readouterr().out.count("----- sample") == 2
    with pytest.raises(ValueError, match="unknown characters"):
        script.main(["sample", "--ckpt", str(out / "ckpt.pt"), "--prompt", "Zürich"])


def test_bad_arguments(script, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        script.main(["train", "--out-dir", str(tmp_path / "none"), "--resume", *TINY])
    with pytest.raises(ValueError, match="--val-fraction"):
        script.main(["train", "--out-dir", str(tmp_path / "x"), "--val-fraction", "1.5", *TINY])
    with pytest.raises(ValueError, match="--batch-size"):
        script.main(["train", "--out-dir", str(tmp_path / "x"), *TINY, "--batch-size", "0"])
    with pytest.raises(ValueError, match="context_length"):
        script.main(["train", "--out-dir", str(tmp_path / "x"), *TINY, "--context-length", "100000"])
    with pytest.raises(SystemExit):
        script.main(["train", "--positional", "bogus"])


def test_learning_rate_schedule(script):
    lr = dict(lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=110)
    assert script.lr_at(0, **lr) == pytest.approx(1e-4)
    assert script.lr_at(9, **lr) == pytest.approx(1e-3)
    assert script.lr_at(10, **lr) == pytest.approx(1e-3)
    assert script.lr_at(60, **lr) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert script.lr_at(110, **lr) == pytest.approx(1e-4)
    assert script.lr_at(500, **lr) == pytest.approx(1e-4)
    values = [script.lr_at(s, **lr) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values[:-1], values[1:], strict=True))
