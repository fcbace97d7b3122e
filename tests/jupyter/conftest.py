"""``make jupyter``: run every page as a learner would, outside the repository.

Kept out of the unit-test run (``pytest tests``); collected only when this folder is named::

    pytest tests/jupyter
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    named = any(HERE == p or HERE in p.parents for p in (Path(a.split("::")[0]).resolve() for a in config.args))
    return None if named else True
