"""The preface's routes to running the book (book/intro.md): the Colab cell clones the repository that the
book's GitHub menu (源码库) links to and installs that clone; the local commands name files and targets that exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
INTRO = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")


def test_colab_clones_the_repository_of_the_github_button_and_installs_the_clone():
    url = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]
    clone = re.findall(r"^\s*!git clone --depth 1 (\S+)$", INTRO, flags=re.M)
    assert clone == [url + ".git"], clone
    folder = url.rstrip("/").rsplit("/", 1)[-1]
    # a regular install: an editable one (-e) is importable only after restarting the runtime
    assert re.findall(r"^\s*%pip install -q (\S+)$", INTRO, flags=re.M) == [f"./{folder}"]


def test_local_routes_name_files_and_targets_that_exist():
    assert "make lab" in INTRO and re.search(r"^lab:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    for requirements in re.findall(r"-r (\S+)", INTRO):
        assert (ROOT / requirements).is_file(), requirements
    assert ".venv/bin/python -m pip install -r requirements.txt -r requirements-lab.txt" in INTRO
    # requirements.txt installs this repository's package too (its last line), as make lab does
    assert (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()[-1] == "-e ."
