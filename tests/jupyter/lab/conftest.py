"""Fixtures of the JupyterLab browser test (``make lab-test``).

A JupyterLab server (4.4, with jupyterlab-myst 2.7 and jupytext 1.19: ``requirements-lab.txt``)
runs on 127.0.0.1 with a private token, settings, workspace and kernel folder, over a temporary
copy of the book's notebook pages (a learner's copy: the test never writes into ``book/``).
Its one kernel, ``python3``, is the Python that runs pytest (the course's ``.venv``, with torch
and ``transformer_course``). Settings: every cell in the DOM (no windowing), no autosave, no news.
The browser is the browser tests' headless Chromium (``tests/browser/bookbrowser.py``).

``JUPYTER_LAB`` names the ``jupyter-lab`` program (default: the one next to this Python).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from bookbrowser import CHROMIUM_MISSING, chromium_executable, launch_chromium  # noqa: E402

SETTINGS = {
    # every cell is in the DOM, so the test can read all of them
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # the test's copy is never saved (jupytext would rewrite it)
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    # no "get news?" toast over the notebook, no network request
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter_lab() -> str:
    exe = os.environ.get("JUPYTER_LAB") or shutil.which("jupyter-lab", path=str(Path(sys.executable).parent))
    if not exe:
        pytest.fail(
            "jupyter-lab not found: `make lab-test` installs requirements-lab.txt (or set JUPYTER_LAB)",
            pytrace=False,
        )
    return exe


class Lab:
    def __init__(self, url: str, token: str, root: Path):
        self.url, self.token, self.root = url, token, root

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(
            f"{self.url}api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for kernel in self.api("kernels"):
            self.api(f"kernels/{kernel['id']}", method="DELETE")


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "notebooks"
    root.mkdir()
    for folder, settings in SETTINGS.items():
        path = home / "settings" / f"{folder}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings), encoding="utf-8")
    kernel = home / "data" / "kernels" / "python3"
    kernel.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3",
        "language": "python",
    }
    (kernel / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    token, port = secrets.token_hex(16), _free_port()
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        JUPYTER_PATH=str(home / "data"),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        OMP_NUM_THREADS="1",
    )
    cmd = [_jupyter_lab(), "--no-browser", f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.token={token}"]
    # window.jupyterapp: the test reads each cell's execution count from the notebook's model
    cmd += [f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False", "--LabApp.expose_app_in_browser=True"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    lab = Lab(f"http://127.0.0.1:{port}/", token, root)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                lab.api("status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(home / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield lab
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="session")
def browser() -> Iterator:
    if not chromium_executable():
        pytest.fail(CHROMIUM_MISSING, pytrace=False)
    with launch_chromium() as browser:
        yield browser
