"""Version 2 of the PostgreSQL reminder schema: a v1 table migrates in place (rows
kept, ``declared`` added, the upcoming index replaced) and v1 writers still work."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import MissedReminderAction, ReminderChange, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable, migrations, sql
from tests.postgres.rows import copy_rows

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@asynccontextmanager
async def table_at(url: str, service_id: str = "svc") -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id=service_id)
        await table.start(stack)
        yield table


async def _indexes(conn: Any) -> set[str]:
    rows = await conn.fetch(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'orleanspy_reminders'"
    )
    return {r["indexname"] for r in rows}


async def test_a_v1_table_migrates_and_keeps_its_rows(postgres_url: str) -> None:
    old = GrainId("Old", "row")
    await _migrate_v1(postgres_url)
    conn = await asyncpg.connect(postgres_url)
    try:
        assert "orleanspy_reminders_next_due" in await _indexes(conn)
        # A row as a v1 silo wrote it (no declared column yet).
        h = old.uniform_hash()
        await conn.execute(
            "INSERT INTO orleanspy_reminders (service_id, grain_id, name, grain_hash, bucket, "
            "priority, start_at, next_due, period_ms, action, version) VALUES "
            "('svc', $1, 'r', $2, $3, 100, $4, $4, 60000, 3, "
            "nextval('orleanspy_reminder_version'))",
            old.canonical,
            h,
            h >> 24,
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
            priority=100,
            action=MissedReminderAction.NOTIFY,
            etag=row.etag,
            declared=False,
        )
        # The new column works on the migrated table, and a CAS keeps it.
        declared = ReminderEntry(
            service_id="svc",
            grain_id=GrainId("New", "decl"),
            name="d",
            start_at=T0,
            next_due=T0,
            period=timedelta(minutes=1),
            declared=True,
        )
        etag = await table.upsert(declared)
        assert await table.update_schedule(declared.grain_id, "d", etag, T0 + timedelta(1), T0)
        moved = await table.read(declared.grain_id, "d")
        assert moved is not None and moved.declared
        assert [e.grain_id for e in await table.upcoming(T0 + timedelta(2), 10)] == [
            old,
            declared.grain_id,
        ]

        # A v1 silo still running during the upgrade writes through the v1 notify
        # function; its changes reach v2 feeds, without a priority.
        feed = table.changes()
        await table._p.execute(
            "SELECT orleanspy_reminder_notify($1, 7::bigint, $2::bigint, $3, 'r')",
            table._channel,
            to_ms(T0),
            old.canonical,
        )
        change = await asyncio.wait_for(anext(feed), 10)
        assert change == ReminderChange(old, "r", T0) and change.priority is None
        await feed.aclose()

    conn = await asyncpg.connect(postgres_url)
    try:
        version = await conn.fetchval(
            "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
        )
        assert version == len(migrations.STEPS)
        indexes = await _indexes(conn)
        assert "orleanspy_reminders_upcoming" in indexes
        assert "orleanspy_reminders_next_due" not in indexes
    finally:
        await conn.close()


async def _migrate_v1(url: str) -> None:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:1])
    finally:
        await pool.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def test_upcoming_reads_the_upcoming_index_not_the_table(postgres_url: str) -> None:
    """With 30,000 rows in three priorities, 5 % of them due, ``upcoming`` looks at
    about ``limit`` index entries per priority: no sequential scan, no sort of the
    due rows."""
    async with table_at(postgres_url) as table:
        rng = random.Random(5)
        now = to_ms(T0)
        records = []
        for i in range(30_000):
            g = GrainId("Up", i)
            h = g.uniform_hash()
            due = now + rng.randrange(60_000) if i % 20 == 0 else now + 86_400_000
            records.append(
                ("svc", g.canonical, "r", h, h >> 24, rng.choice([-100, 0, 100]),
                 due, due, 60_000, 2, i)
            )  # fmt: skip
        await copy_rows(table, records)
        async with table._p.acquire() as conn:
            limit = 100
            before = now + 120_000
            raw = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.UPCOMING, "svc", before, limit
            )
        (plan,) = json.loads(raw)
        nodes = list(_nodes(plan["Plan"]))
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
        scans = [n for n in nodes if n.get("Relation Name") == "orleanspy_reminders"]
        assert any(n.get("Index Name") == "orleanspy_reminders_upcoming" for n in scans), scans
        looked_at = sum(
            (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0))
            * n.get("Actual Loops", 1)
            for n in scans
        )
        # 1,500 rows are due; each of the 3 priorities gives at most `limit`.
        assert looked_at <= 3 * limit + 10, looked_at
        got = await table.upcoming(T0 + timedelta(minutes=2), limit)
        assert len(got) == limit and {e.priority for e in got} == {100}
