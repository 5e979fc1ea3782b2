"""Paused rows and fire history in ``PostgresReminderTable``, beyond the shared
contract checks: every whole-row write keeps a paused row out of the due
indexes, paused rows cost a due read nothing, history stays bounded in storage
and never outlives its row, even when appends race removes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from orleanspy.clock import to_ms
from orleanspy.errors import StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    ReminderChange,
    ReminderEntry,
    ScheduleUpdate,
)
from orleanspy.reminders.postgres import PostgresReminderTable, sql
from orleanspy.reminders.postgres import rows as pg_rows
from orleanspy.reminders.postgres import table as pg_table
from orleanspy.ring import RingRange
from tests.postgres.rows import copy_rows

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LATER = T0 + timedelta(days=1)


def entry(key: str, *, priority: int = 0, minutes: int = 0, paused: bool = False) -> ReminderEntry:
    return ReminderEntry(
        service_id="svc",
        grain_id=GrainId("Pause", key),
        name="r",
        start_at=T0,
        next_due=T0 + timedelta(minutes=minutes),
        period=timedelta(hours=1),
        priority=priority,
        paused=paused,
    )


def record(gid: GrainId, i: int, outcome: FireOutcome = FireOutcome.OK) -> FireRecord:
    slot = T0 + timedelta(minutes=i)
    return FireRecord(gid, "r", slot, slot + timedelta(milliseconds=5), outcome, f"silo-{i}")


@asynccontextmanager
async def table_at(url: str) -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id="svc")
        await table.start(stack)
        yield table


async def changes_of(feed: AsyncIterator[ReminderChange], n: int) -> dict[str, ReminderChange]:
    got = [await asyncio.wait_for(anext(feed), 10) for _ in range(n)]
    return {c.grain_id.key: c for c in got}


def keys(rows: list[ReminderEntry]) -> list[str]:
    return [str(e.grain_id.key) for e in rows]


async def test_bulk_and_conditional_writes_keep_paused_rows_out_of_the_due_index(
    postgres_url: str,
) -> None:
    async with table_at(postgres_url) as table:
        feed = table.changes()
        try:
            late_high = entry("high", priority=100, minutes=5)
            early_low = entry("low")
            paused = entry("paused", priority=127, paused=True)
            etags = await table.upsert_many([late_high, paused, early_low])
            changes = await changes_of(feed, 3)
            assert {k: (c.next_due, c.priority) for k, c in changes.items()} == {
                "high": (late_high.next_due, 100),
                "paused": (None, None),
                "low": (early_low.next_due, 0),
            }
            assert keys(await table.read_due(RingRange.full(), LATER, 10)) == ["high", "low"]
            assert keys(await table.upcoming(LATER, 10)) == ["high", "low"]
            assert [e.paused for e in await table.read_range(RingRange.full())].count(True) == 1

            # A batch of schedule CASes moves the paused row but keeps it paused
            # (and, as every schedule CAS, publishes nothing: the next change
            # the feed gives is the resume below).
            moved = await table.update_schedule_many(
                [ScheduleUpdate(paused.grain_id, "r", etags[1], T0 + timedelta(minutes=1), T0)]
            )
            assert moved[0] is not None
            assert keys(await table.read_due(RingRange.full(), LATER, 10)) == ["high", "low"]

            # Resumed through upsert_if: back first (the highest priority).
            stored = await table.read(paused.grain_id, "r")
            assert stored is not None and stored.paused and stored.etag == moved[0]
            assert stored.next_due == T0 + timedelta(minutes=1)
            resumed = await table.upsert_if(replace(stored, paused=False), stored.etag)
            assert resumed is not None
            change = await asyncio.wait_for(anext(feed), 10)
            assert (change.grain_id, change.next_due, change.priority) == (
                paused.grain_id,
                stored.next_due,
                127,
            )
            assert keys(await table.read_due(RingRange.full(), LATER, 10)) == [
                "paused",
                "high",
                "low",
            ]

            # Paused again through upsert_if, and a conditional insert of a paused row.
            again = await table.upsert_if(replace(stored, paused=True), resumed)
            assert again is not None
            assert await table.upsert_if(entry("new", paused=True), None) is not None
            changes = await changes_of(feed, 2)
            assert {k: (c.next_due, c.priority) for k, c in changes.items()} == {
                "paused": (None, None),
                "new": (None, None),
            }
            assert keys(await table.upcoming(LATER, 10)) == ["high", "low"]
            assert await table.count() == 4
        finally:
            await feed.aclose()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _looked_at(raw: str) -> tuple[int, set[str]]:
    (plan,) = json.loads(raw)
    nodes = list(_nodes(plan["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    scans = [n for n in nodes if n.get("Relation Name") == "orleanspy_reminders"]
    looked = sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in scans
    )
    return looked, {n.get("Index Name", "") for n in scans}


async def test_paused_rows_cost_a_due_read_nothing(postgres_url: str) -> None:
    """20,000 paused rows, all due and of a priority no live row has, are not
    looked at by ``read_due`` or ``upcoming``: the partial indexes hold only
    the 200 live rows."""
    async with table_at(postgres_url) as table:
        now = to_ms(T0)
        records = []
        for i in range(20_200):
            g = GrainId("Cost", i)
            h = g.uniform_hash()
            live = i % 101 == 0
            records.append(
                ("svc", g.canonical, "r", h, h >> 24, 0 if live else 127,
                 now, now + i, 60_000, 2, not live, i)
            )  # fmt: skip
        await copy_rows(table, records, paused=True)
        async with table._p.acquire() as conn:
            limit = 50
            before = now + 30_000
            looked, indexes = _looked_at(
                await conn.fetchval(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.UPCOMING, "svc", before, limit
                )
            )
            assert "orleanspy_reminders_upcoming" in indexes, indexes
            assert looked <= limit + 10, looked
            buckets, los, his = pg_rows.slices(RingRange.full())
            looked, indexes = _looked_at(
                await conn.fetchval(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.READ_DUE,
                    "svc",
                    before,
                    16,
                    buckets,
                    los,
                    his,
                    None,
                    -1,
                )
            )
            assert "orleanspy_reminders_due" in indexes, indexes
            # At most the 200 live rows and a probe per bucket.
            assert looked <= 200 + len(buckets) + 10, looked
        due = await table.read_due(RingRange.full(), T0 + timedelta(minutes=1), 1000)
        assert len(due) == 200 and {e.priority for e in due} == {0}
        assert len(await table.upcoming(T0 + timedelta(minutes=1), 1000)) == 200


async def _stored_history(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM orleanspy_reminder_history"))
    finally:
        await conn.close()


async def test_history_is_bounded_in_storage_not_only_when_read(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        gid = GrainId("Pause", "hist")
        await table.upsert(entry("hist"))
        await table.append_history([record(gid, i) for i in range(10)], 4)
        assert [r.silo for r in await table.read_history(gid, "r")] == [
            "silo-9",
            "silo-8",
            "silo-7",
            "silo-6",
        ]
        await table.append_history([record(gid, 10), record(gid, 11, FireOutcome.NOTIFIED)], 4)
        got = await table.read_history(gid, "r")
        assert [r.silo for r in got] == ["silo-11", "silo-10", "silo-9", "silo-8"]
        assert got[0].outcome is FireOutcome.NOTIFIED
        assert await _stored_history(postgres_url) == 4
        # A smaller bound trims what is already stored on the next append.
        await table.append_history([record(gid, 12)], 2)
        assert [r.silo for r in await table.read_history(gid, "r")] == ["silo-12", "silo-11"]
        assert await _stored_history(postgres_url) == 2
        with pytest.raises(ValueError, match="keep"):
            await table.append_history([record(gid, 13)], 0)
        assert len(await table.read_history(gid, "r")) == 2


async def test_large_history_batches_keep_the_newest_per_row_run_after_run(
    postgres_url: str,
) -> None:
    """Batches from ``_CUSTOM_PLAN_FROM`` records on take their own plan; run
    more often than the five runs after which PostgreSQL may pick a generic plan,
    each still keeps exactly the newest ``keep`` records of every row."""
    rows, keep = 100, 3
    per_row = -(-pg_table._CUSTOM_PLAN_FROM // rows)  # records per row per batch
    async with table_at(postgres_url) as table:
        gids = [GrainId("Pause", f"big{k}") for k in range(rows)]
        assert await table.upsert_many([entry(f"big{k}") for k in range(rows)])
        for run in range(8):
            batch = [record(g, run * per_row + i) for i in range(per_row) for g in gids]
            assert len(batch) >= pg_table._CUSTOM_PLAN_FROM
            await table.append_history(batch, keep)
            newest = [f"silo-{run * per_row + per_row - 1 - i}" for i in range(keep)]
            for g in (gids[0], gids[-1]):
                assert [r.silo for r in await table.read_history(g, "r")] == newest, run
            assert await _stored_history(postgres_url) == rows * keep


async def test_history_appends_racing_removes_never_outlive_the_row(postgres_url: str) -> None:
    """Appends racing a remove either land before it (and go with the row) or
    find no row (and are dropped): never an error, never an orphan that a new
    row of the same key would inherit."""
    async with table_at(postgres_url) as table:
        gid = GrainId("Pause", "race")
        for _ in range(20):
            etag = await table.upsert(entry("race"))
            await table.append_history([record(gid, 0)], 3)
            await asyncio.gather(
                *(table.append_history([record(gid, i), record(gid, i + 1)], 3) for i in range(5)),
                table.remove(gid, "r", etag),
            )
            assert await table.read_history(gid, "r") == []
            await table.upsert(entry("race"))
            assert await table.read_history(gid, "r") == [], "a new row inherited a history"
            row = await table.read(gid, "r")
            assert row is not None and row.etag is not None
            assert await table.remove(gid, "r", row.etag)
        assert await _stored_history(postgres_url) == 0


async def test_malformed_history_is_a_storage_error(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        gid = GrainId("Pause", "bad")
        await table.upsert(entry("bad"))
        await table.append_history([record(gid, 0)], 3)
        await table._p.execute("UPDATE orleanspy_reminder_history SET outcome = 'exploded'")
        with pytest.raises(StorageError, match="malformed reminder history"):
            await table.read_history(gid, "r")
