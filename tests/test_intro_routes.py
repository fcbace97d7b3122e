"""The preface's routes to running the book (book/intro.md): the Colab cell clones the repository that the
reader copies from the book's GitHub button and installs that clone; the local commands name files and
targets that exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
INTRO = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")


def test_colab_clones_the_repository_of_the_github_button_and_installs_the_clone():
    # the book's GitHub button links to _config.yml's repository; the Colab cell asks the reader
    # to paste that address (the published one), so it shows a placeholder, not a guess
    url = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    assert url.startswith("https://github.com/"), url
    repo = re.findall(r'^\s*REPO = "(\S+)"', INTRO, flags=re.M)
    assert repo == ["https://github.com/<用户名>/<仓库名>"], repo
    assert "GitHub 图标" in INTRO and "不替换会克隆失败" in INTRO
    clone = re.findall(r"^\s*!git clone --depth 1 \{REPO\} (\S+)$", INTRO, flags=re.M)
    assert len(clone) == 1, clone
    # a regular install: an editable one (-e) is importable only after restarting the runtime
    assert re.findall(r"^\s*%pip install -q (\S+)$", INTRO, flags=re.M) == [f"./{clone[0]}"]


def test_local_routes_name_files_and_targets_that_exist():
    assert "make lab" in INTRO and re.search(r"^lab:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    for requirements in re.findall(r"-r (\S+)", INTRO):
        assert (ROOT / requirements).is_file(), requirements
    assert ".venv/bin/python -m pip install -r requirements.txt -r requirements-lab.txt" in INTRO
    # requirements.txt installs this repository's package too (its last line), as make lab does
    assert (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()[-1] == "-e ."
