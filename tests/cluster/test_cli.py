"""The ``orleanspy`` command: a silo process serving imported grains, then reminders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from orleanspy import ClusterClient
from orleanspy.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'cluster'}")
    return subprocess.Popen(
        [sys.executable, "-m", "orleanspy.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


async def test_silo_command_serves_imported_grains_and_stops_on_sigterm(redis_url: str) -> None:
    proc = _cli(
        "--redis-url", redis_url, "--log-level", "WARNING", "silo", "--import", "cli_grains"
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        async with ClusterClient(redis_url=redis_url) as client:
            grain = client.get_grain("CliEchoGrain", "k")
            assert await grain.pid() == proc.pid
            await grain.remind_me()
            assert await client.reminders.count_all() == 1
        count = subprocess.run(
            [sys.executable, "-m", "orleanspy.cli", "--redis-url", redis_url,
             "--log-level", "WARNING", "reminders", "count"],
            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        )  # fmt: skip
        assert count.returncode == 0, count.stderr
        assert count.stdout.strip() == "1"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_missing_redis_url_is_a_clear_error(capsys, monkeypatch) -> None:
    monkeypatch.delenv("ORLEANSPY_REDIS_URL", raising=False)
    assert main(["silo"]) == 2
    assert "--redis-url" in capsys.readouterr().err


async def test_silo_command_keeps_grain_state_in_the_storage_url(
    redis_url: str, postgres_url: str
) -> None:
    import asyncpg

    proc = _cli(
        *("--redis-url", redis_url, "--log-level", "WARNING", "silo"),
        *("--import", "cli_grains", "--storage", postgres_url),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        async with ClusterClient(redis_url=redis_url) as client:
            await client.get_grain("CliStateGrain", "k").save("kept in postgres")
        conn = await asyncpg.connect(postgres_url)
        try:
            rows = await conn.fetch("SELECT grain_id, state_name FROM orleanspy_grain_state")
        finally:
            await conn.close()
        assert [tuple(r) for r in rows] == [("CliStateGrain/s:k", "note")]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_storage_flag_needs_a_redis_or_postgres_url(capsys) -> None:
    assert main(["--redis-url", "redis://127.0.0.1:1/0", "silo", "--storage", "mysql://x"]) == 1
    assert "--storage 'mysql://x'" in capsys.readouterr().err
