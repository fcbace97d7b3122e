"""`make doctor` (src/transformer_course/doctor.py): passes on this setup, and names the problem
and its fix on a broken one (no venv, torch missing, another torch)."""

import subprocess
import sys
from pathlib import Path

import pytest

from transformer_course import doctor

SCRIPT = Path(doctor.__file__)


def run(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], capture_output=True, text=True, encoding="utf-8", timeout=120, check=False)


def test_passes_in_the_project_venv():
    result = run(sys.executable, str(SCRIPT))
    assert result.returncode == 0, result.stdout + result.stderr
    for what in ("Python", "虚拟环境", "torch", "图中文字体 Course Sans SC"):
        assert any(line.startswith("✓") and what in line for line in result.stdout.splitlines()), what


def test_names_a_missing_torch():
    block_torch = (
        f"import runpy, sys; sys.modules['torch'] = None; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    result = run(sys.executable, "-c", block_torch)
    assert result.returncode == 1
    assert "✗ 无法导入 torch" in result.stdout and "修复：make venv" in result.stdout


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests run outside a venv")
def test_names_a_missing_venv():
    result = run(sys._base_executable, "-I", str(SCRIPT))
    assert result.returncode == 1
    assert "✗ 没有在虚拟环境里运行" in result.stdout or "✗ 没有虚拟环境" in result.stdout


def test_names_another_torch_version(monkeypatch):
    monkeypatch.setattr(doctor, "_pinned_torch", lambda root: "1.0.0")
    finding = doctor.check_torch(doctor._repo_root())
    assert not finding.ok and "与固定版本 1.0.0 不同" in finding.text and finding.fix.startswith("make venv")


def test_advice_never_fails_the_run(monkeypatch, capsys):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    monkeypatch.delenv("CHROMIUM", raising=False)
    assert not doctor.check_chromium().ok and not doctor.check_chromium().required
    monkeypatch.setattr(doctor, "FREE_DISK_GB", 1e9)
    assert not doctor.check_disk(None).ok
    assert doctor.run() == 0
    assert "! 没有 Chromium" in capsys.readouterr().out
