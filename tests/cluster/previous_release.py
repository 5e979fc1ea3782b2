"""The previous release, built from this repository's history, for the tests that
run it beside the checkout (``test_rolling_upgrade.py``).

``previous_release_python()`` is the interpreter of a venv (under ``build/``,
kept between runs) with the package of ``PREVIOUS_COMMIT`` installed from a
``git archive`` of that commit: not editable, not importing the checkout, its
dependencies pinned by ``constraints/dev.txt`` as every install here is. A
checkout without that commit (a shallow clone) fetches it from ``origin``; if
that fails too, the test fails and says how to get the history: it never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The commit 0.2.0 follows: the last of the 0.1 line.
PREVIOUS_COMMIT = "47a65a20881e358608d2c357e3c0a1460f292a9c"
PREVIOUS_VERSION = "0.1.0"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def _have_commit() -> bool:
    return _git("cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}").returncode == 0


def previous_release_python() -> Path:
    """The previous release's interpreter (built on first use); the test fails,
    naming what is missing, when it cannot be built."""
    home = ROOT / "build" / f"release-{PREVIOUS_COMMIT[:12]}"
    python = home / "venv" / "bin" / "python"
    done = home / ".installed"
    if done.exists() and python.exists():
        return python
    if not _have_commit():
        _git("fetch", "--quiet", "origin", PREVIOUS_COMMIT)
    if not _have_commit():
        pytest.fail(
            f"commit {PREVIOUS_COMMIT} (orleanspy {PREVIOUS_VERSION}) is not in this checkout "
            "and could not be fetched: clone with history (not --depth 1)"
        )
    source = home / "src"
    subprocess.run(["rm", "-rf", str(home)], check=True)
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_COMMIT], cwd=ROOT, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    env = {**os.environ, "PIP_CONSTRAINT": str(ROOT / "constraints" / "dev.txt")}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{source}[postgres]"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        pytest.fail(f"installing orleanspy {PREVIOUS_VERSION} failed:\n{installed.stderr[-3000:]}")
    version = subprocess.run(
        [str(python), "-P", "-c", "import orleanspy; print(orleanspy.__version__)"],
        capture_output=True, text=True, cwd=home, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == PREVIOUS_VERSION, version
    done.touch()
    return python
