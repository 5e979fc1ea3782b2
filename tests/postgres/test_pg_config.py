"""Table URLs: PostgreSQL wherever Redis works, one table here and one there,
the CLI on PostgreSQL, and clear errors for other schemes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from orleanspy import (
    ClusterClient,
    Grain,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.errors import ConfigurationError
from orleanspy.identity import GrainId
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.reminders.model import FireOutcome, FireRecord
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.tables import table_backend
from orleanspy.testing.cluster import FAST_MEMBERSHIP, wait_for

ROOT = Path(__file__).resolve().parents[2]
TICKS: list[str] = []


class MixedTickGrain(Grain, Remindable, type_name="test_pg_config.Tick"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append(name)

    async def start(self) -> None:
        await self.register_or_update_reminder(
            "mixed", due=timedelta(milliseconds=100), period=timedelta(milliseconds=300)
        )


def test_table_backend_reads_the_scheme_only() -> None:
    assert table_backend("redis://h:1/0") == "redis"
    assert table_backend("rediss://h") == "redis"
    assert table_backend("unix:///tmp/r.sock") == "redis"
    assert table_backend("postgresql://u:secret@h/db") == "postgres"
    assert table_backend("postgres://h/db") == "postgres"
    with pytest.raises(ConfigurationError, match="'mysql'") as info:
        table_backend("mysql://user:secret@h/db")
    assert "secret" not in str(info.value)


def test_options_choose_a_url_per_table() -> None:
    pg, rd = "postgresql://h/db", "redis://h/0"
    only_pg = SiloOptions(storage_url=pg)
    assert only_pg.clustered
    assert (only_pg.membership_table_url, only_pg.reminders_url, only_pg.directory_url) == (
        pg,
        pg,
        pg,
    )
    assert only_pg.streams_url is None  # no Redis at all: streams stay in memory
    mixed = SiloOptions(membership_url=rd, reminder_table_url=pg)
    assert (mixed.membership_table_url, mixed.reminders_url, mixed.directory_url) == (rd, pg, rd)
    assert mixed.streams_url == rd
    legacy = SiloOptions(redis_url=rd, reminder_table_url=pg)
    assert (legacy.membership_table_url, legacy.reminders_url, legacy.streams_url) == (rd, pg, rd)
    assert not SiloOptions().clustered
    with pytest.raises(ConfigurationError, match="storage_url"):
        SiloOptions(storage_url="http://h")
    with pytest.raises(ConfigurationError, match="membership_url"):
        SiloOptions(membership_url="mysql://h")
    with pytest.raises(ConfigurationError, match="embedded"):
        Silo.local(SiloOptions(storage_url=pg))


@pytest.mark.timeout(60)
async def test_reminders_on_postgres_membership_on_redis(postgres_url: str, redis_url: str) -> None:
    TICKS.clear()
    options = SiloOptions(
        # This grain only: a silo hosts every imported grain class otherwise, and
        # their declared reminders would be rows of this table too.
        grain_types=(MixedTickGrain,),
        membership_url=redis_url,
        reminder_table_url=postgres_url,
        membership=FAST_MEMBERSHIP,
        reminders=ReminderOptions(minimum_period=timedelta(milliseconds=100)),
    )
    async with AsyncExitStack() as stack:
        silo = await stack.enter_async_context(Silo(options))
        await silo.client.get_grain(MixedTickGrain, "k").start()
        await wait_for(lambda: TICKS.count("mixed") >= 2, timeout=20, what="two ticks")
        conn = await asyncpg.connect(postgres_url)
        try:
            stored = await conn.fetch("SELECT name FROM orleanspy_reminders")
            tables = {
                r["tablename"]
                for r in await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname='public'"
                )
            }
        finally:
            await conn.close()
        assert [r["name"] for r in stored] == ["mixed"]
        # Membership (and with it the directory) stayed on Redis.
        assert "orleanspy_membership" not in tables and "orleanspy_directory" not in tables
        table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
        await table.start(stack)
        assert (await table.read_all()).active_silos() == (silo.address,)


@pytest.mark.timeout(90)
async def test_cli_silo_and_reminders_on_postgres(postgres_url: str) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'cluster'}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orleanspy.cli", "--storage-url", postgres_url,
         "--log-level", "WARNING", "silo", "--import", "cli_grains"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), (line, proc.stderr.read() if proc.stderr else "")
        async with ClusterClient(membership_url=postgres_url) as client:
            grain = client.get_grain("CliEchoGrain", "k")
            assert await grain.pid() == proc.pid
            await grain.remind_me()
        count = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "orleanspy.cli", "--storage-url", postgres_url,
             "--log-level", "WARNING", "reminders", "count"],
            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        )  # fmt: skip
        assert count.returncode == 0, count.stderr
        assert count.stdout.strip() == "1"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0

        # No silo up: the reminder commands use the PostgreSQL table itself,
        # pause and resume included, and show the row's fire history.
        def direct(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "orleanspy.cli", "--storage-url", postgres_url,
                 "--log-level", "WARNING", "reminders", *args],
                capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
            )  # fmt: skip

        def get() -> dict[str, Any]:
            shown = direct("get", "CliEchoGrain/k", "hourly", "--json")
            assert shown.returncode == 0, shown.stderr
            assert "via the PostgreSQL table at" in shown.stderr
            doc: dict[str, Any] = json.loads(shown.stdout)
            return doc

        gid = GrainId("CliEchoGrain", "k")
        before = await asyncio.to_thread(get)
        assert before["paused"] is False and before["history"] == []
        async with AsyncExitStack() as stack:
            table = PostgresReminderTable(postgres_url, service_id="default")
            await table.start(stack)
            slot = datetime(2030, 1, 1, tzinfo=UTC)
            await table.append_history(
                [
                    FireRecord(
                        gid, "hourly", slot, slot + timedelta(seconds=2), FireOutcome.OK, "s1"
                    )
                ],
                5,
            )
            paused = await asyncio.to_thread(direct, "pause", "CliEchoGrain/k", "hourly")
            assert paused.returncode == 0, paused.stderr
            row = await table.read(gid, "hourly")
            assert row is not None and row.paused, "the CLI's pause did not reach the table"
            far = datetime.now(UTC) + timedelta(days=3650)
            assert gid not in [e.grain_id for e in await table.upcoming(far, 100)]
            shown = await asyncio.to_thread(get)
            assert shown["paused"] is True
            assert [(h["outcome"], h["silo"], h["lateness_seconds"]) for h in shown["history"]] == [
                ("ok", "s1", 2.0)
            ]
            resumed = await asyncio.to_thread(direct, "resume", "CliEchoGrain/k", "hourly")
            assert resumed.returncode == 0, resumed.stderr
            row = await table.read(gid, "hourly")
            assert row is not None and not row.paused
            assert gid in [e.grain_id for e in await table.upcoming(far, 100)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
