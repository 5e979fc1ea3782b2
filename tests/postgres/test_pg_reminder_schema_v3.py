"""Version 3 of the PostgreSQL reminder schema: a v2 table migrates in place (rows
kept and not paused, the due indexes rebuilt as partial indexes, the history
table added), and a v2 silo's whole-row write keeps a pause it does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome, FireRecord, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable, migrations
from orleanspy.ring import RingRange

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(days=1)

# A whole-row write as a v2 silo sends it: every column it knows, not ``paused``.
_V2_UPSERT = """
INSERT INTO orleanspy_reminders AS t (service_id, grain_id, name, grain_hash, bucket,
    priority, start_at, next_due, period_ms, action, declared, version)
VALUES ('svc', $1, 'r', $2, $3, $4, $5, $5, 60000, 2, true, nextval('orleanspy_reminder_version'))
ON CONFLICT (service_id, grain_id, name) DO UPDATE SET
    grain_hash = EXCLUDED.grain_hash, bucket = EXCLUDED.bucket,
    priority = EXCLUDED.priority, start_at = EXCLUDED.start_at,
    next_due = EXCLUDED.next_due, period_ms = EXCLUDED.period_ms,
    action = EXCLUDED.action, declared = EXCLUDED.declared, version = EXCLUDED.version
"""


@asynccontextmanager
async def table_at(url: str) -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id="svc")
        await table.start(stack)
        yield table


async def _migrate_v2(url: str) -> None:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:2])
    finally:
        await pool.close()


async def _v2_upsert(conn: asyncpg.Connection, gid: GrainId, priority: int) -> None:
    h = gid.uniform_hash()
    await conn.execute(_V2_UPSERT, gid.canonical, h, h >> 24, priority, to_ms(T0))


async def test_a_v2_table_migrates_and_keeps_its_rows(postgres_url: str) -> None:
    old, other = GrainId("Old", "row"), GrainId("Old", "other")
    await _migrate_v2(postgres_url)
    conn = await asyncpg.connect(postgres_url)
    try:
        await _v2_upsert(conn, old, 100)
        await _v2_upsert(conn, other, 0)
    finally:
        await conn.close()

    async with table_at(postgres_url) as table:
        row = await table.read(old, "r")
        assert row is not None and row.etag is not None
        assert row == ReminderEntry(
            service_id="svc",
            grain_id=old,
            name="r",
            start_at=T0,
            next_due=T0,
            period=timedelta(minutes=1),
            priority=100,
            etag=row.etag,
            declared=True,
            paused=False,
        )
        assert [e.grain_id for e in await table.upcoming(LATER, 10)] == [old, other]

        # Pause and history work on the migrated table.
        await table.upsert(replace(row, paused=True))
        slot = T0 + timedelta(minutes=1)
        await table.append_history(
            [FireRecord(old, "r", slot, slot, FireOutcome.OK, "silo-a")], keep=10
        )
        assert [e.grain_id for e in await table.upcoming(LATER, 10)] == [other]
        assert [e.grain_id for e in await table.read_due(RingRange.full(), LATER, 10)] == [other]

        # A v2 silo still running during the upgrade rewrites the whole row: the
        # pause it does not know about stays, and so does the history.
        conn = await asyncpg.connect(postgres_url)
        try:
            await _v2_upsert(conn, old, 50)
            version = await conn.fetchval(
                "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
            )
            indexes = {
                r["indexname"]: r["indexdef"]
                for r in await conn.fetch(
                    "SELECT indexname, indexdef FROM pg_indexes "
                    "WHERE tablename = 'orleanspy_reminders'"
                )
            }
        finally:
            await conn.close()
        rewritten = await table.read(old, "r")
        assert rewritten is not None and rewritten.paused and rewritten.priority == 50
        assert [r.silo for r in await table.read_history(old, "r")] == ["silo-a"]
        assert [e.grain_id for e in await table.upcoming(LATER, 10)] == [other]

    assert version == len(migrations.STEPS)
    for name in ("orleanspy_reminders_due", "orleanspy_reminders_upcoming"):
        assert "WHERE (NOT paused)" in indexes[name], indexes[name]
    assert "WHERE" not in indexes["orleanspy_reminders_hash"]
