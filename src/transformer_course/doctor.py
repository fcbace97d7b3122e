"""环境检查 (``make doctor``, or ``python -m transformer_course.doctor``).

Checks what the course needs on a reader's machine and says, in Chinese, what is
wrong and the one command that fixes it:

- must-haves (the exit status is 1 when one fails): Python >= 3.11, the project's
  ``.venv``, torch importable at the pinned version, the package's Chinese figure font;
- advice (never an error): torch's thread count against the CPU count, free disk, and
  the system Chromium that only the browser tests need.

It imports nothing beyond the standard library at the top and runs as a plain script
(``python src/transformer_course/doctor.py``), so it reports a missing torch instead of
failing on it.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_PYTHON = (3, 11)
FONT_FILE = Path(__file__).resolve().parent / "fonts" / "CourseSansSC-Regular.ttf"
FREE_DISK_GB = 3.0  # .venv takes about 1.8 GB, _build a few hundred MB


@dataclass
class Finding:
    ok: bool
    text: str
    fix: str = ""
    required: bool = True


def _repo_root() -> Path | None:
    """The checkout this module runs from (it is ``src/transformer_course``), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "requirements.txt").is_file() else None


def check_python() -> Finding:
    version = ".".join(map(str, sys.version_info[:3]))
    need = ".".join(map(str, MIN_PYTHON))
    if sys.version_info[:2] >= MIN_PYTHON:
        return Finding(True, f"Python {version}（需要 ≥ {need}）")
    return Finding(
        False, f"Python {version} 太旧，需要 ≥ {need}", f"安装 Python {need} 或更新版本"
    )


def check_venv(root: Path | None) -> Finding:
    in_venv = sys.prefix != sys.base_prefix
    if in_venv:
        return Finding(True, f"虚拟环境 {sys.prefix}")
    if root is not None and (root / ".venv" / "bin" / "python").exists():
        where = root / ".venv"
        return Finding(False, f"没有在虚拟环境里运行（{where} 已存在）", "make doctor")
    return Finding(False, "没有虚拟环境 .venv", "make venv")


def _pinned_torch(root: Path | None) -> str | None:
    if root is None:
        return None
    text = (root / "requirements.txt").read_text(encoding="utf-8")
    match = re.search(r"^torch==([\w.+-]+)", text, re.M)
    return match.group(1) if match else None


def check_torch(root: Path | None) -> Finding:
    pin = _pinned_torch(root)
    try:
        torch = importlib.import_module("torch")
    except ImportError as error:
        return Finding(False, f"无法导入 torch（{error}）", "make venv")
    version = torch.__version__.split("+")[0]
    if pin is not None and version != pin.split("+")[0]:
        return Finding(
            False,
            f"torch {torch.__version__}，与固定版本 {pin} 不同",
            "make venv（requirements.txt 改动后会自动重装）",
        )
    return Finding(
        True, f"torch {torch.__version__}" + (f"（固定版本 {pin}）" if pin else "")
    )


def check_font() -> Finding:
    if not FONT_FILE.is_file():
        return Finding(
            False,
            f"缺少图中文字体 {FONT_FILE}",
            "git checkout -- src/transformer_course/fonts",
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import font_manager, pyplot
    except ImportError as error:
        return Finding(False, f"无法导入 matplotlib（{error}）", "make venv")
    font_manager.fontManager.addfont(str(FONT_FILE))
    name = font_manager.FontProperties(fname=str(FONT_FILE)).get_name()
    fig = pyplot.figure(dpi=72)
    text = fig.text(0, 0, "注意力", fontsize=10, family=name)
    fig.canvas.draw()
    width = text.get_window_extent().width
    pyplot.close(fig)
    if abs(width - 30) > 1.5:  # three characters of 10 pt at 72 dpi: 30 px
        return Finding(
            False, f"图中文字体 {name} 画出的宽度不对（{width:.1f} px）", "make venv"
        )
    return Finding(True, f"图中文字体 {name}（随包发布，不依赖系统字体）")


def check_threads() -> Finding:
    cores = os.cpu_count() or 1
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return Finding(
            False, "torch 未安装，无法检查线程数", "make venv", required=False
        )
    threads = torch.get_num_threads()
    text = f"torch 使用 {threads} 个线程，本机 {cores} 个 CPU 核"
    if threads > cores:
        return Finding(
            False,
            text + "：线程多于核，会变慢",
            f"export OMP_NUM_THREADS={cores}",
            False,
        )
    return Finding(True, text, required=False)


def check_disk(root: Path | None) -> Finding:
    free = shutil.disk_usage(root or Path.cwd()).free / 1e9
    if free < FREE_DISK_GB:
        return Finding(
            False,
            f"磁盘剩余 {free:.1f} GB，不足 {FREE_DISK_GB:.0f} GB",
            "make clean",
            required=False,
        )
    return Finding(True, f"磁盘剩余 {free:.0f} GB", required=False)


def check_chromium() -> Finding:
    exe = (
        os.environ.get("CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )
    if exe:
        return Finding(True, f"Chromium {exe}（只有浏览器测试需要）", required=False)
    return Finding(
        False,
        "没有 Chromium（只有 make lab-test / make browser 需要；"
        "读书和运行笔记本不需要）",
        "bash scripts/install_browser_deps.sh",
        required=False,
    )


def run() -> int:
    root = _repo_root()
    findings = [
        check_python(),
        check_venv(root),
        check_torch(root),
        check_font(),
        check_threads(),
        check_disk(root),
        check_chromium(),
    ]
    for f in findings:
        mark = "✓" if f.ok else ("✗" if f.required else "!")
        print(f"{mark} {f.text}" + ("" if f.ok else f"\n    修复：{f.fix}"))
    failed = [f for f in findings if f.required and not f.ok]
    print(
        f"\n{len(failed)} 项必需检查未通过"
        if failed
        else "\n环境可以运行本书的全部章节"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
