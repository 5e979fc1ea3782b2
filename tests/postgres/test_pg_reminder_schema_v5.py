"""Version 5 of the PostgreSQL reminder schema: a v4 table migrates in place (rows
and history kept, read without optional fields), rows with jitter, bounds, payload
and retry round-trip, history keeps attempts, and a v4 silo's whole-row write
keeps the optional fields it does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome, FireRecord, ReminderEntry, RetryPolicy
from orleanspy.reminders.postgres import PostgresReminderTable, migrations

T0 = datetime(2030, 1, 1, tzinfo=UTC)

# A whole-row write as a v4 silo sends it: every column it knows, not ``extras``.
_V4_UPSERT = """
INSERT INTO orleanspy_reminders AS t (service_id, grain_id, name, grain_hash, bucket,
    priority, start_at, next_due, period_ms, action, declared, paused, grace_ms, version)
VALUES ('svc', $1, 'r', $2, $3, $4, $5, $5, 60000, 2, false, false, NULL,
        nextval('orleanspy_reminder_version'))
ON CONFLICT (service_id, grain_id, name) DO UPDATE SET
    grain_hash = EXCLUDED.grain_hash, bucket = EXCLUDED.bucket,
    priority = EXCLUDED.priority, start_at = EXCLUDED.start_at,
    next_due = EXCLUDED.next_due, period_ms = EXCLUDED.period_ms,
    action = EXCLUDED.action, declared = EXCLUDED.declared, paused = EXCLUDED.paused,
    grace_ms = EXCLUDED.grace_ms, version = EXCLUDED.version
"""


@asynccontextmanager
async def table_at(url: str) -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id="svc")
        await table.start(stack)
        yield table


async def _migrate_v4(url: str) -> None:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:4])
    finally:
        await pool.close()


async def _v4_upsert(conn: asyncpg.Connection, gid: GrainId, priority: int) -> None:
    h = gid.uniform_hash()
    await conn.execute(_V4_UPSERT, gid.canonical, h, h >> 24, priority, to_ms(T0))


async def test_a_v4_table_migrates_and_keeps_its_rows_and_history(postgres_url: str) -> None:
    old = GrainId("Old", "row")
    await _migrate_v4(postgres_url)
    conn = await asyncpg.connect(postgres_url)
    try:
        await _v4_upsert(conn, old, 0)
        await conn.execute(
            "INSERT INTO orleanspy_reminder_history (service_id, grain_id, name, batch, i, "
            "slot, at, outcome, silo, triggered) VALUES ('svc', $1, 'r', "
            "nextval('orleanspy_reminder_history_batch'), 1, $2, $2, 'ok', "
            "'silo-a', false)",
            old.canonical,
            to_ms(T0),
        )
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
            etag=row.etag,
        )
        [record] = await table.read_history(old, "r")
        assert (record.silo, record.attempt, record.final) == ("silo-a", 1, False)

        # The new fields on the migrated table, and a v4 whole-row write that keeps them.
        shaped = replace(
            row,
            jitter=timedelta(seconds=7),
            ends_at=T0 + timedelta(days=2),
            max_ticks=30,
            final_due=T0 + timedelta(minutes=29),
            payload={"order": 42, "at": T0},
            retry=RetryPolicy(4, timedelta(seconds=2)),
        )
        await table.upsert(shaped)
        await table.append_history(
            [FireRecord(old, "r", T0, T0, FireOutcome.RETRYING, "silo-b", attempt=2, final=True)],
            keep=10,
        )
        conn = await asyncpg.connect(postgres_url)
        try:
            await _v4_upsert(conn, old, 50)
            version = await conn.fetchval(
                "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
            )
        finally:
            await conn.close()
        rewritten = await table.read(old, "r")
        assert rewritten is not None
        assert rewritten.priority == 50
        assert replace(rewritten, priority=0, etag=None) == replace(shaped, etag=None)
        newest = (await table.read_history(old, "r"))[0]
        assert (newest.outcome, newest.attempt, newest.final) == (FireOutcome.RETRYING, 2, True)
    assert version == len(migrations.STEPS) >= 5


async def test_a_one_shot_row_needs_neither_period_nor_cron(postgres_url: str) -> None:
    gid = GrainId("Once", "a")
    async with table_at(postgres_url) as table:
        entry = ReminderEntry(
            service_id="svc", grain_id=gid, name="once", start_at=T0, next_due=T0, payload=b"x"
        )
        await table.upsert(entry)
        stored = await table.read(gid, "once")
        assert stored is not None and stored.one_shot
        assert replace(stored, etag=None) == entry
