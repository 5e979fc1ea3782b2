"""Version 4 of the PostgreSQL reminder schema: a v3 table migrates in place (rows
and fire history kept, with no grace and no error), and a v3 silo's whole-row
write keeps a grace it does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome, FireRecord
from orleanspy.reminders.postgres import PostgresReminderTable, migrations

T0 = datetime(2030, 1, 1, tzinfo=UTC)

# A whole-row write as a v3 silo sends it: every column it knows, not ``grace_ms``.
_V3_UPSERT = """
INSERT INTO orleanspy_reminders AS t (service_id, grain_id, name, grain_hash, bucket,
    priority, start_at, next_due, period_ms, action, declared, paused, version)
VALUES ('svc', $1, 'r', $2, $3, $4, $5, $5, 60000, 2, false, false,
        nextval('orleanspy_reminder_version'))
ON CONFLICT (service_id, grain_id, name) DO UPDATE SET
    grain_hash = EXCLUDED.grain_hash, bucket = EXCLUDED.bucket,
    priority = EXCLUDED.priority, start_at = EXCLUDED.start_at,
    next_due = EXCLUDED.next_due, period_ms = EXCLUDED.period_ms,
    action = EXCLUDED.action, declared = EXCLUDED.declared, paused = EXCLUDED.paused,
    version = EXCLUDED.version
"""
_V3_HISTORY = """
INSERT INTO orleanspy_reminder_history
    (service_id, grain_id, name, batch, i, slot, at, outcome, silo, triggered)
VALUES ('svc', $1, 'r', nextval('orleanspy_reminder_history_batch'), 1, $2, $2,
        'grain_error', 'silo-v3', false)
"""


@asynccontextmanager
async def table_at(url: str) -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id="svc")
        await table.start(stack)
        yield table


async def test_a_v3_table_migrates_and_a_v3_write_keeps_the_grace(postgres_url: str) -> None:
    gid = GrainId("Old", "graced")
    h = gid.uniform_hash()
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:3])
        async with pool.acquire() as conn:
            await conn.execute(_V3_UPSERT, gid.canonical, h, h >> 24, 0, to_ms(T0))
            await conn.execute(_V3_HISTORY, gid.canonical, to_ms(T0))
    finally:
        await pool.close()

    async with table_at(postgres_url) as table:
        row = await table.read(gid, "r")
        assert row is not None and row.grace is None
        (old,) = await table.read_history(gid, "r")
        assert (old.outcome, old.error) == (FireOutcome.GRAIN_ERROR, None)

        await table.upsert(replace(row, grace=timedelta(seconds=3)))
        slot = T0 + timedelta(minutes=1)
        failed = FireRecord(gid, "r", slot, slot, FireOutcome.GRAIN_ERROR, "s", error="E: x")
        await table.append_history([failed], keep=10)
        assert (await table.read_history(gid, "r"))[0] == failed

        # A v3 silo still running during the upgrade rewrites the whole row: the
        # grace it does not know about stays.
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(_V3_UPSERT, gid.canonical, h, h >> 24, 50, to_ms(T0))
            version = await conn.fetchval(
                "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
            )
        finally:
            await conn.close()
        rewritten = await table.read(gid, "r")
        assert rewritten is not None and rewritten.priority == 50
        assert rewritten.grace == timedelta(seconds=3)
    assert version == len(migrations.STEPS)
