"""`make help` is generated from the Makefile's own ``## ...`` comments: every target must carry one."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _targets() -> set[str]:
    """Every target named in a ``.PHONY`` line (continuation lines included)."""
    text = MAKEFILE.read_text().replace("\\\n", " ")
    return {name for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for name in line.split()}


def test_every_phony_target_has_a_help_comment():
    documented = set(re.findall(r"^([a-zA-Z][\w-]*):[^=\n]*## ", MAKEFILE.read_text(), re.M))
    assert {"help", "format", "compat", "lint", "unit", "test"} <= _targets()
    assert _targets() - documented == set()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target():
    out = subprocess.run(["make", "-s", "-f", str(MAKEFILE), "help"], capture_output=True, text=True, check=True)
    listed = set(re.findall(r"^  make (\S+)", out.stdout, re.M))
    assert listed == _targets()
