"""What a team adopting the package relies on: the licence, the versions it claims,
``python -m orleanspy``, a typed package, uvloop optional."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_licence_file_is_the_one_pyproject_names() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n")


def test_classifiers_name_the_versions_ci_tests() -> None:
    versions = {
        c.rpartition(":: ")[2]
        for c in PROJECT["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    assert versions == {"3.11", "3.12", "3.13"}
    assert PROJECT["requires-python"] == ">=3.11"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert all(v in ci for v in ("3.12", "3.13"))


def test_the_package_is_typed_and_has_a_changelog() -> None:
    assert (ROOT / "orleanspy" / "py.typed").exists()
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")


def test_python_m_orleanspy_runs_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orleanspy", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: orleanspy" in result.stdout


def test_uvloop_is_an_extra_and_run_falls_back_to_asyncio() -> None:
    assert not any(d.startswith("uvloop") for d in PROJECT["dependencies"])
    assert any(d.startswith("uvloop") for d in PROJECT["optional-dependencies"]["uvloop"])
    code = (
        "import sys; sys.modules['uvloop'] = None\n"
        "import asyncio, orleanspy\n"
        "async def main():\n"
        "    return type(asyncio.get_running_loop()).__module__\n"
        "print(orleanspy.run(main()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("asyncio")


def test_one_place_names_the_release_and_the_metadata_reads_it() -> None:
    import importlib.metadata

    import orleanspy
    from orleanspy import versions

    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "orleanspy.versions.__version__"
    assert orleanspy.__version__ == versions.__version__ != "0.1.0"
    assert importlib.metadata.version("orleanspy") == orleanspy.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## {orleanspy.__version__} — " in changelog
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"orleanspy-{orleanspy.__version__}-py3-none-any.whl" in readme


def test_the_wheel_carries_the_protos_and_py_typed() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = pyproject["tool"]["setuptools"]["package-data"]["orleanspy"]
    assert "py.typed" in data
    assert "messaging/protos/orleanspy/v1/*.proto" in data
    assert sorted(p.name for p in (ROOT / "orleanspy/messaging/protos/orleanspy/v1").iterdir()) == [
        "messages.proto",
        "services.proto",
    ]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/wheel" in ci
