"""Tests for transformer_course.checkpoint."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import transformer_course as tc
from transformer_course.checkpoint import (
    FORMAT,
    config_from_dict,
    config_to_dict,
    load_checkpoint,
    remove_temp_files,
    save_checkpoint,
    state_dict_sha256,
    unwrap_model,
)


@dataclasses.dataclass
class _Cfg:
    width: int = 4
    name: str = "tiny"
    scale: float = 0.5
    flag: bool = True
    extra: int | None = None


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 3, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_round_trip_restores_model_optimizer_and_resumes_exactly(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, range(3))
    path = save_checkpoint(tmp_path / "ck.pt", model, opt, step=3, config=_Cfg(), note="hi")

    fresh = _model(seed=123)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    ckpt = load_checkpoint(path, fresh, fresh_opt)
    assert ckpt["format"] == FORMAT
    assert ckpt["step"] == 3
    assert ckpt["extra"] == {"note": "hi"}
    assert config_from_dict(_Cfg, ckpt["config"]) == _Cfg()
    assert state_dict_sha256(fresh.state_dict()) == state_dict_sha256(model.state_dict())

    # continuing from the checkpoint equals never stopping (bitwise)
    _train(model, opt, range(3, 6))
    _train(fresh, fresh_opt, range(3, 6))
    assert state_dict_sha256(fresh.state_dict()) == state_dict_sha256(model.state_dict())


def test_file_loads_with_weights_only_and_has_no_leftovers(tmp_path):
    model = _model()
    path = save_checkpoint(tmp_path / "sub" / "ck.pt", model, step=0, chars="abc")
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"format", "step", "model", "optimizer", "config", "extra"}
    assert raw["optimizer"] is None and raw["config"] is None
    assert raw["extra"]["chars"] == "abc"
    assert os.listdir(path.parent) == ["ck.pt"]


def test_minigpt_round_trip_with_tied_weights(tmp_path):
    cfg = tc.GPTConfig(vocab_size=11, context_length=8, d_model=16, num_heads=2, num_layers=1)
    torch.manual_seed(0)
    model = tc.MiniGPT(cfg)
    path = save_checkpoint(tmp_path / "gpt.pt", model, step=7, config=cfg)
    ckpt = load_checkpoint(path)
    cfg2 = config_from_dict(tc.GPTConfig, ckpt["config"])
    assert cfg2 == cfg
    torch.manual_seed(1)
    model2 = tc.MiniGPT(cfg2)
    load_checkpoint(path, model2)
    x = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(model2(x)[0], model(x)[0], rtol=0, atol=0)


def test_unwrap_data_parallel_and_ddp(tmp_path):
    inner = _model()
    assert unwrap_model(inner) is inner
    assert unwrap_model(nn.DataParallel(inner)) is inner

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(inner)
        assert unwrap_model(ddp) is inner
        path = save_checkpoint(tmp_path / "ddp.pt", ddp, step=1)
        keys = list(torch.load(path, weights_only=True)["model"])
        assert keys and not any(k.startswith("module.") for k in keys)
        other = _model(seed=5)
        load_checkpoint(path, nn.parallel.DistributedDataParallel(other))
        assert state_dict_sha256(other.state_dict()) == state_dict_sha256(inner.state_dict())
    finally:
        dist.destroy_process_group()

    with pytest.raises(TypeError, match="nn.Module"):
        unwrap_model("not a model")  # type: ignore[arg-type]


def test_config_helpers_validate():
    cfg = _Cfg(width=9, extra=3)
    data = config_to_dict(cfg)
    assert data == {"width": 9, "name": "tiny", "scale": 0.5, "flag": True, "extra": 3}
    assert config_from_dict(_Cfg, data) == cfg
    with pytest.raises(ValueError, match="bogus"):
        config_from_dict(_Cfg, {"width": 1, "bogus": 2})
    with pytest.raises(TypeError, match="dataclass instance"):
        config_to_dict({"width": 1})
    with pytest.raises(TypeError, match="dataclass instance"):
        config_to_dict(_Cfg)
    with pytest.raises(TypeError, match="dataclass type"):
        config_from_dict(dict, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        config_from_dict(_Cfg, [("width", 1)])  # type: ignore[arg-type]


def test_save_rejects_bad_values_and_writes_nothing(tmp_path):
    model = _model()
    with pytest.raises(TypeError, match=r"extra.*'bad'.*set"):
        save_checkpoint(tmp_path / "a.pt", model, step=0, bad={1, 2})
    with pytest.raises(TypeError, match="object"):
        save_checkpoint(tmp_path / "a.pt", model, step=0, bad=[object()])
    with pytest.raises(ValueError, match="-1"):
        save_checkpoint(tmp_path / "a.pt", model, step=-1)
    with pytest.raises(TypeError, match="2.0"):
        save_checkpoint(tmp_path / "a.pt", model, step=2.0)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_load_errors(tmp_path):
    model = _model()
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a"):
        load_checkpoint(tmp_path / "other.pt")
    path = save_checkpoint(tmp_path / "noopt.pt", model, step=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(path, model, opt)


def test_hash_sees_values_names_dtypes():
    sd = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    h = state_dict_sha256(sd)
    assert h == state_dict_sha256({k: v.clone() for k, v in sd.items()})
    assert len(h) == 64
    changed = dict(sd, a=sd["a"].clone())
    changed["a"][1, 2] = torch.nextafter(changed["a"][1, 2], torch.tensor(100.0))
    assert state_dict_sha256(changed) != h
    assert state_dict_sha256({"c": sd["a"], "b": sd["b"]}) != h
    assert state_dict_sha256(dict(sd, a=sd["a"].double())) != h
    assert state_dict_sha256(dict(sd, a=sd["a"].reshape(3, 2))) != h
    with pytest.raises(TypeError, match="'x'"):
        state_dict_sha256({"x": 1.0})  # type: ignore[dict-item]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=8), st.data())
def test_hash_equal_iff_bitwise_equal(values, data):
    a = torch.tensor(values, dtype=torch.float32)
    i = data.draw(st.integers(0, len(values) - 1))
    new = data.draw(st.floats(-1e3, 1e3, width=32))
    b = a.clone()
    b[i] = new
    same = torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert (state_dict_sha256({"w": a}) == state_dict_sha256({"w": b})) == same


@pytest.mark.parametrize(
    "content",
    [b"", b"hello, not a checkpoint\n", bytes(range(256)) * 8, "truncated"],
    ids=["empty", "text", "random-bytes", "truncated"],
)
def test_load_rejects_corrupted_files_with_a_clear_message(tmp_path, content):
    path = tmp_path / "bad.pt"
    if content == "truncated":
        good = save_checkpoint(tmp_path / "good.pt", _model(), step=1).read_bytes()
        content = good[: len(good) // 2]
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad.pt' is not a readable .* corrupted, truncated or of another format"):
        load_checkpoint(path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.99])
def test_truncated_checkpoint_raises_value_error_naming_file_and_problem(tmp_path, keep):
    """A checkpoint cut short (a full disk, a copy interrupted) is a ValueError that names the file and says what
    is wrong, not torch's ``OSError: [Errno 22] Invalid argument``."""
    model = torch.nn.Linear(64, 64)
    good = save_checkpoint(tmp_path / "good.pt", model, step=1).read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(good[: int(len(good) * keep)])
    size = path.stat().st_size
    with pytest.raises(ValueError, match=rf"cut.pt' .*not a complete zip archive \({size} bytes\).*truncated"):
        load_checkpoint(path)


def test_load_rejects_a_damaged_dictionary(tmp_path):
    torch.save({"format": FORMAT, "step": "3"}, tmp_path / "damaged.pt")
    message = r"damaged .* missing keys \['model', 'optimizer', 'config', 'extra'\], step '3'"
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tmp_path / "damaged.pt")


def test_save_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path / "ck.pt", _model(), step=0)
    assert events == [("fsync", "file"), ("replace", "ck.pt"), ("fsync", "folder")]


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "ck.pt", _model(seed=0), step=1)
    before = path.read_bytes()
    seen = []

    def interrupt(tmp):
        seen.append(torch.load(tmp, weights_only=True)["step"])  # complete and loadable already
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _model(seed=1), step=2, before_replace=interrupt)
    assert seen == [2]
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.pt"]  # the temporary file is gone too


def test_remove_temp_files_removes_only_this_checkpoints_leftovers(tmp_path):
    names = ["ck.pt", "ck.pt.abc123.tmp", "ck.pt.x.tmp", "best.pt.abc.tmp", "ck.ptX.tmp", "notes.tmp"]
    for name in names:
        (tmp_path / name).write_text("x")
    removed = remove_temp_files(tmp_path / "ck.pt")
    assert [p.name for p in removed] == ["ck.pt.abc123.tmp", "ck.pt.x.tmp"]
    assert sorted(os.listdir(tmp_path)) == sorted(set(names) - {"ck.pt.abc123.tmp", "ck.pt.x.tmp"})
    assert remove_temp_files(tmp_path / "none" / "ck.pt") == []
