"""What every benchmark module shares: the run context, logging, rounding and figure output."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Context:
    """Settings of one benchmark run."""

    device: torch.device
    quick: bool
    out_dir: Path
    label: str  # e.g. "cpu: Intel(R) Xeon(R) Processor, 1 thread" (figure titles)
    seed: int = 0
    nbval_junit: Path | None = None
    skip_chapters: bool = False
    jobs: int = 2
    started: float = field(default_factory=time.perf_counter)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def figure_path(self, name: str) -> Path:
        return self.out_dir / f"{self.device.type}_{name}.png"


def log(*parts: object) -> None:
    """Progress on stderr, so that stdout stays clean for the summary."""
    print(*parts, file=sys.stderr, flush=True)


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (keeps the results file small)."""
    if x == 0 or x != x:
        return x
    return float(f"{x:.{digits}g}")


def save_figure(fig: plt.Figure, path: Path) -> str:
    """Write a PNG at 240 dpi (sharp on high-density screens) and close the figure; return the file name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=240, bbox_inches="tight")
    plt.close(fig)
    return path.name
