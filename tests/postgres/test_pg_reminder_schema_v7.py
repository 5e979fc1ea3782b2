"""Version 7 of the PostgreSQL reminder schema: the fence table. A v5 table
migrates in place (its rows kept); then a fenced writer's schedule write is
refused, and a write that names no writer (as a v5 silo's) still moves the row.
Version 6 is reserved for another column (docs/decisions.md)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.postgres import PostgresReminderTable, migrations

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)

# A row as a v5 silo writes it (the columns every version since v5 has).
_V5_INSERT = """
INSERT INTO orleanspy_reminders (service_id, grain_id, name, grain_hash, bucket, priority,
    start_at, next_due, period_ms, action, declared, paused, version)
VALUES ('svc', $1, 'r', $2, $3, 0, $4, $4, 1000, 1, false, false,
        nextval('orleanspy_reminder_version'))
"""


async def test_a_v5_table_migrates_and_fences_its_writers(postgres_url: str) -> None:
    gid = GrainId("Fenced", "a")
    h = gid.uniform_hash()
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:5])
        await pool.execute(_V5_INSERT, gid.canonical, h, h >> 24, to_ms(T0))
    finally:
        await pool.close()
    deposed = SiloAddress("10.0.0.1", 1, generation=1)
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(postgres_url, service_id="svc")
        await table.start(stack)
        row = await table.read(gid, "r")
        assert row is not None and row.etag is not None and row.next_due == T0
        await table.fence(deposed, at=T0)
        table.writer = deposed
        assert await table.update_schedule(gid, "r", row.etag, T0 + S, T0) is None
        assert await table.read(gid, "r") == row
        table.writer = None
        assert await table.update_schedule(gid, "r", row.etag, T0 + S, T0) is not None
    conn = await asyncpg.connect(postgres_url)
    try:
        version = await conn.fetchval(
            "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
        )
        fences = await conn.fetch("SELECT writer FROM orleanspy_reminder_fences")
    finally:
        await conn.close()
    assert version == len(migrations.STEPS) == 7
    assert [r["writer"] for r in fences] == [str(deposed)]
