"""``PostgresReminderTable``: the shared contract suite, then what only PostgreSQL has."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.reminders.postgres import PostgresReminderTable, migrations, sql
from orleanspy.reminders.postgres import rows as pg_rows
from orleanspy.reminders.table import (
    BatchingReminderTable,
    BulkReminderTable,
    ConditionalReminderTable,
    PausableReminderTable,
    ReminderTable,
)
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.testing.reminder_table import REMINDER_TABLE_CHECKS
from tests.postgres.rows import copy_rows

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def factory(url: str, service_id: str = "contract") -> Any:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            # Each check gets an empty table: clear this service's rows first.
            table = PostgresReminderTable(url, service_id=service_id)
            await table.start(stack)
            pool = table._p
            await pool.execute("DELETE FROM orleanspy_reminders WHERE service_id = $1", service_id)
            await pool.execute(
                "DELETE FROM orleanspy_reminder_calendars WHERE service_id = $1", service_id
            )
            yield table

    return make


@pytest.mark.parametrize("check", REMINDER_TABLE_CHECKS, ids=lambda c: c.__name__)
async def test_contract(postgres_url: str, check: Any) -> None:
    await check(factory(postgres_url))


def test_has_every_optional_capability() -> None:
    table = PostgresReminderTable("postgresql://x", service_id="s")
    assert isinstance(table, BatchingReminderTable)
    assert isinstance(table, ConditionalReminderTable)
    assert isinstance(table, BulkReminderTable)
    # So the contract's pause and history checks run here rather than skip.
    assert isinstance(table, PausableReminderTable)


def entry(grain: GrainId, name: str = "r", due: datetime = T0, priority: int = 0) -> ReminderEntry:
    return ReminderEntry(
        service_id="svc",
        grain_id=grain,
        name=name,
        start_at=T0,
        next_due=due,
        period=timedelta(minutes=1),
        priority=priority,
    )


@asynccontextmanager
async def table_at(url: str, service_id: str = "svc") -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id=service_id)
        await table.start(stack)
        yield table


async def test_read_due_orders_by_priority_then_due_time(postgres_url: str) -> None:
    rng = random.Random(7)
    async with table_at(postgres_url) as table:
        rows = []
        for i in range(300):
            prio = rng.choice([100, 0, -100, 5, -128, 127])
            due = T0 + timedelta(seconds=rng.randrange(600))
            rows.append(entry(GrainId("P", f"g{i}"), due=due, priority=prio))
        await asyncio.gather(*map(table.upsert, rows))
        before = T0 + timedelta(seconds=400)
        for _ in range(20):
            r = RingRange(rng.randrange(HASH_SPACE), rng.randrange(HASH_SPACE))
            limit = rng.choice([1, 7, 50, 1000])
            got = await table.read_due(r, before, limit)
            want = sorted(
                (e for e in rows if e.hash in r and e.next_due <= before),
                key=lambda e: (-e.priority, e.next_due, e.hash, e.key),
            )[:limit]
            assert [(e.key, e.priority) for e in got] == [(e.key, e.priority) for e in want]
        # A high-priority row due late comes before a normal one due early.
        got = await table.read_due(RingRange.full(), before, 1)
        assert got[0].priority == 127


async def test_wrapping_ranges_and_bucket_edges(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        grains = [GrainId("W", f"g{i}") for i in range(400)]
        await asyncio.gather(*(table.upsert(entry(g)) for g in grains))
        hashes = sorted(g.uniform_hash() for g in grains)
        top = HASH_SPACE - 1
        # Wrapping ranges, ranges ending exactly on a row's hash, bucket boundaries.
        cases = [
            RingRange(hashes[-5], hashes[4]),
            RingRange(top, hashes[0]),
            RingRange(hashes[10], hashes[10] - 1 if hashes[10] else top),
            RingRange(hashes[3] - 1, hashes[3]),
            RingRange((1 << 24) - 1, 1 << 24),
            RingRange(5 << 24, 9 << 24),
        ]
        for r in cases:
            want = sorted(e.key for g in grains if (e := entry(g)).hash in r)
            assert sorted(e.key for e in await table.read_range(r)) == want, r
            due = await table.read_due(r, T0, 10_000)
            assert sorted(e.key for e in due) == want, r


async def test_parallel_upserts_of_one_key_get_distinct_etags(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        g = GrainId("U", "same")
        etags = await asyncio.gather(
            *(table.upsert(entry(g, due=T0 + timedelta(seconds=i))) for i in range(50))
        )
        assert len(set(etags)) == 50
        row = await table.read(g, "r")
        assert row is not None and row.etag in etags
        # The stored row is exactly the upsert whose etag it carries.
        assert row.next_due == T0 + timedelta(seconds=etags.index(row.etag))


async def test_batch_with_a_key_twice_applies_the_first_only(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        g = GrainId("B", "twice")
        etag = await table.upsert(entry(g))
        later = T0 + timedelta(minutes=1)
        results = await table.update_schedule_many(
            [ScheduleUpdate(g, "r", etag, later, None), ScheduleUpdate(g, "r", etag, T0, None)]
        )
        assert results[0] is not None and results[1] is None
        row = await table.read(g, "r")
        assert row is not None and row.next_due == later


async def test_schema_is_versioned_and_a_newer_schema_is_refused(postgres_url: str) -> None:
    async with table_at(postgres_url):
        pass
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval(
            "SELECT version FROM orleanspy_schema WHERE component='reminders'"
        ) == len(migrations.STEPS)
        await conn.execute("UPDATE orleanspy_schema SET version = 99 WHERE component='reminders'")
    finally:
        await conn.close()
    with pytest.raises(StorageError, match="version 99"):
        async with table_at(postgres_url):
            pass


async def test_unreachable_server_is_storage_unavailable() -> None:
    with pytest.raises(StorageUnavailableError):
        async with table_at("postgresql://postgres@127.0.0.1:1/none"):
            pass


@pytest.mark.parametrize("source", ["url", "pool"])
async def test_killed_listen_connection_reports_a_gap_then_follows_again(
    postgres_url: str, source: str
) -> None:
    """pg_terminate_backend on the LISTEN connection: the feed raises once (its
    reader re-reads), and a new feed hears writes made after the reconnect. With
    a pool given, the LISTEN connection comes from the pool and is replaced there."""
    async with AsyncExitStack() as stack:
        if source == "pool":
            pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=3)
            stack.push_async_callback(pool.close)
            table = PostgresReminderTable(pool, service_id="svc")
        else:
            table = PostgresReminderTable(postgres_url, service_id="svc")
        await table.start(stack)
        feed = table.changes()
        g = GrainId("K", "x")
        await table.upsert(entry(g))
        assert await asyncio.wait_for(anext(feed), 10) == ReminderChange(g, "r", T0)
        killed = await table._p.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
        assert killed == 1
        with pytest.raises(StorageUnavailableError, match="interrupted"):
            await asyncio.wait_for(anext(feed), 30)
        await feed.aclose()
        fresh = table.changes()
        later = T0 + timedelta(minutes=1)
        await table.upsert(entry(g, due=later))
        assert await asyncio.wait_for(anext(fresh), 10) == ReminderChange(g, "r", later)
        await fresh.aclose()


async def test_malformed_payload_is_ignored(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        feed = table.changes()
        channel = table._channel
        await table._p.execute("SELECT pg_notify($1, 'garbage')", channel)
        g = GrainId("M", "x")
        await table.upsert(entry(g))
        assert await asyncio.wait_for(anext(feed), 10) == ReminderChange(g, "r", T0)
        await feed.aclose()


async def test_oversized_payload_makes_feeds_reread(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        feed = table.changes()
        await table.upsert(entry(GrainId("L", "k" * 9000)))
        with pytest.raises(StorageUnavailableError):
            await asyncio.wait_for(anext(feed), 10)
        await feed.aclose()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def test_read_due_reads_the_due_index_not_the_table(postgres_url: str) -> None:
    """With 50,000 rows, reading an arc of 1/90 of the ring touches index entries in
    proportion to the rows returned: no sequential scan, and few rows looked at."""
    async with table_at(postgres_url) as table:
        rng = random.Random(3)
        now = to_ms(T0)
        records = []
        for i in range(50_000):
            h = GrainId("Plan", i).uniform_hash()
            due = now + rng.randrange(60_000) if i % 20 == 0 else now + 86_400_000
            records.append(
                ("svc", GrainId("Plan", i).canonical, "r", h, h >> 24, rng.choice([0, 100]),
                 due, due, 60_000, 2, i)
            )  # fmt: skip
        await copy_rows(table, records)
        async with table._p.acquire() as conn:
            arc = RingRange(1 << 30, (1 << 30) + HASH_SPACE // 90)
            buckets, los, his = pg_rows.slices(arc)
            before = now + 120_000
            raw = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.READ_DUE,
                "svc", before, 1000, buckets, los, his, 1000, -1,
            )  # fmt: skip
        (plan,) = json.loads(raw)
        nodes = list(_nodes(plan["Plan"]))
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan"]
        scans = [n for n in nodes if n.get("Relation Name") == "orleanspy_reminders"]
        assert scans and all("orleanspy_reminders_" in n.get("Index Name", "") for n in scans)
        looked_at = sum(
            (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0))
            * n.get("Actual Loops", 1)
            for n in scans
        )
        due_in_arc = len(await table.read_due(arc, from_ms(before), 1000))
        assert due_in_arc > 0
        # Rows returned, plus the edge buckets' due rows outside the arc, plus the
        # priority probes: far below the 50,000 rows (or the ~550 of the arc).
        assert looked_at < 4 * due_in_arc + 200, (looked_at, due_in_arc)


async def test_read_due_finds_winners_crowded_into_one_bucket(postgres_url: str) -> None:
    """The first pass asks every bucket for a small share; when the best rows all
    sit in one bucket (one priority), the second pass must fetch the rest."""
    async with table_at(postgres_url) as table:
        spread = [entry(GrainId("Spread", i), due=T0) for i in range(300)]
        target = GrainId("Crowd", 0).uniform_hash() >> 24
        crowd: list[ReminderEntry] = []
        i = 0
        while len(crowd) < 60:
            g = GrainId("Crowd", i)
            if g.uniform_hash() >> 24 == target:
                due = T0 + timedelta(seconds=len(crowd) % 7)  # ties too
                crowd.append(entry(g, due=due, priority=100))
            i += 1
        await asyncio.gather(*map(table.upsert, spread + crowd))
        for limit in (17, 50, 60, 100):
            got = await table.read_due(RingRange.full(), T0 + timedelta(minutes=1), limit)
            want = sorted(spread + crowd, key=lambda e: (-e.priority, e.next_due, e.hash, e.key))
            assert [e.key for e in got] == [e.key for e in want[:limit]], limit
