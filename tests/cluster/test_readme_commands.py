"""Every command line of the Operations page (docs/operations.md) runs, as written
from the repository root, against a real silo process serving the grains of
``samples/operations.py`` and Redis (ports made free ones; ``curl`` fetched over
HTTP the same way), and the outputs the page shows have the shape the command
prints."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orleanspy.testing.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "operations.md").read_text()

pytestmark = pytest.mark.slow


def _section(title: str) -> str:
    start = PAGE.index(f"# {title}\n")
    end = PAGE.find("\n## ", start + 1)
    return PAGE[start:end]


def _blocks(text: str, lang: str) -> list[str]:
    found = re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)
    return [body for kind, body in found if kind == lang]


def _sh_lines(text: str) -> list[str]:
    return [ln.strip() for block in _blocks(text, "sh") for ln in block.splitlines() if ln.strip()]


def _text_blocks(text: str) -> list[list[str]]:
    return [block.splitlines() for block in _blocks(text, "")]


def test_the_operations_section_has_the_commands_this_test_runs() -> None:
    lines = _sh_lines(_section("Operations"))
    assert lines[0].startswith("export ORLEANSPY_REDIS_URL=")
    assert any(line.startswith("orleanspy silo --import samples.operations ") for line in lines)
    assert all(line.split()[0] in ("export", "orleanspy", "curl") for line in lines), lines


async def test_every_operations_command_line_runs(redis_url: str) -> None:
    ports = {"30000": str(free_port()), "9100": str(free_port())}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORLEANSPY_")}
    env["PYTHONPATH"] = str(ROOT)

    def adapt(line: str) -> list[str]:
        for readme_port, port in ports.items():
            line = line.replace(readme_port, port)
        return shlex.split(line)

    lines = _sh_lines(_section("Operations"))
    outputs: dict[str, str] = {}
    silo: subprocess.Popen[str] | None = None
    try:
        for line in lines:
            words = adapt(line)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                # The README's URL, made the test's server; other values as written.
                env[name] = redis_url if name.endswith("_URL") else value
                continue
            if words[0] == "curl":
                url = words[-1]
                with urllib.request.urlopen(url, timeout=10) as resp:
                    assert resp.status == 200, line
                continue
            # `python -P`: no cwd on the path, as with the installed console script.
            cmd = [sys.executable, "-P", "-m", "orleanspy.cli", *words[1:]]
            if words[1] == "silo":
                silo = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    cwd=ROOT, env=env,
                )  # fmt: skip
                assert silo.stdout is not None
                ready = await asyncio.to_thread(silo.stdout.readline)
                assert ready.startswith("READY ") and ready.split()[3] == ports["9100"], ready
                continue
            proc = await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, timeout=120,
                cwd=ROOT, env=env, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, (line, proc.stderr)
            outputs[" ".join(words[1:3])] = proc.stdout
    finally:
        if silo is not None:
            silo.send_signal(signal.SIGTERM)
            silo.wait(30)
            for pipe in (silo.stdout, silo.stderr):
                if pipe is not None:
                    pipe.close()

    shown = _text_blocks(_section("Operations"))
    status_block = next(b for b in shown if b[0].startswith("cluster 'dev'"))
    real_status = outputs["cluster status"].splitlines()
    assert real_status[0].startswith("cluster 'dev' service 'default'")
    assert real_status[1].split() == status_block[1].split()  # the same columns
    assert "silo-a  active" in real_status[2]
    get_block = next(b for b in shown if b[0].startswith("grain_id"))
    real_get = outputs["reminders get"].splitlines()
    fields = real_get.index("")  # the row, a blank line, then its fire history
    assert [r.split()[0] for r in real_get[:fields]] == [
        r.split()[0] for r in get_block[: get_block.index("")]
    ]
    assert "name            ping" in real_get
    assert real_get[fields + 1].split() == get_block[get_block.index("") + 1].split()
    assert "ok (triggered)" in real_get[fields + 2]
    assert "silo stopped cleanly" in outputs["demo"]
