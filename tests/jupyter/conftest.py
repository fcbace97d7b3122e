"""``make jupyter``: run every page as a learner would, outside the repository.

Kept out of the unit-test run (``pytest tests``); collected only when this folder is named::

    pytest tests/jupyter

The JupyterLab browser test in ``lab/`` (``make lab-test``) needs JupyterLab and Chromium: it is
collected only when ``tests/jupyter/lab`` (or a file in it) is named.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def _named(folder: Path, config) -> bool:
    args = (Path(a.split("::")[0]).resolve() for a in config.args)
    return any(folder == p or folder in p.parents for p in args)


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    lab = HERE / "lab"
    if (collection_path == lab or lab in collection_path.parents) and not _named(lab, config):
        return True
    return None if _named(HERE, config) else True
