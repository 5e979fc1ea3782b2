"""``RedisReminderTable.upsert_many`` on one Redis: one script call writes rows
of many shards, grouped per shard (``_UPSERT_MANY_SHARDS``). Each row reads back
as written with its own etag, a row twice in a batch ends as its last write
(paused or not), a shard's batch larger than the script's HSET slice is whole,
and every row is published on the change feed."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    RetryPolicy,
)
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.ring import RingRange

T0 = datetime(2030, 1, 1, tzinfo=UTC)
OPTIONS = ReminderOptions()


def row(key: object, *, minutes: int = 0, priority: int = 0) -> ReminderEntry:
    return new_entry(
        ReminderSpec(period=3600, due=60 * minutes, priority=priority),
        service_id="default",
        grain_id=GrainId("Bulk", key),
        name="r",
        now=T0,
        options=OPTIONS,
    )


async def test_rows_of_many_shards_read_back_with_their_own_etags(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="bulk-shards", shards=16)
        await table.start(stack)
        rows = [row(i, minutes=i % 50, priority=i % 5) for i in range(400)]
        assert len({table.shard_of(r.hash) for r in rows}) == 16
        etags = await table.upsert_many(rows)
        # Etags count per shard: within one, no two rows share one.
        tagged = {(table.shard_of(r.hash), etag) for r, etag in zip(rows, etags, strict=True)}
        assert len(tagged) == len(rows), "etags repeat within a shard"
        for r, etag in zip(rows, etags, strict=True):
            assert await table.read(r.grain_id, "r") == r.with_etag(etag)
        due = await table.read_due(RingRange.full(), T0 + timedelta(days=1), 1000)
        assert sorted(e.grain_id.key for e in due) == list(range(400))
        # The next write of a row gets an etag its shard has not given before.
        again = await table.upsert_many(rows[:20])
        assert not {(table.shard_of(r.hash), e) for r, e in zip(rows, again, strict=False)} & tagged


async def test_a_row_twice_in_a_batch_ends_as_its_last_write(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="bulk-twice", shards=4)
        await table.start(stack)
        a, b = row("a", minutes=1), row("b", minutes=2)
        later_a = row("a", minutes=9)
        paused_b = replace(b, paused=True)
        resumed_a = replace(row("a", minutes=5), paused=True)
        # a: written, rewritten, paused, then written live again; b: live then paused.
        batch = [a, b, later_a, resumed_a, paused_b, replace(resumed_a, paused=False)]
        etags = await table.upsert_many(batch)
        stored_a = await table.read(a.grain_id, "r")
        stored_b = await table.read(b.grain_id, "r")
        assert stored_a == replace(resumed_a, paused=False).with_etag(etags[5])
        assert stored_b == paused_b.with_etag(etags[4])
        due = await table.read_due(RingRange.full(), T0 + timedelta(days=1), 10)
        assert [(e.grain_id.key, e.next_due) for e in due] == [("a", stored_a.next_due)]


async def test_a_shard_batch_beyond_one_slice_is_whole_and_published(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="bulk-slices", shards=1)
        await table.start(stack)
        feed = table.changes()
        stack.push_async_callback(feed.aclose)
        changes: list[ReminderChange] = []

        async def collect(n: int) -> None:
            async for change in feed:
                changes.append(change)
                if len(changes) == n:
                    return

        # The feed is live once a probe row's change arrives.
        probe = row("probe")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        pending = asyncio.ensure_future(collect(1))
        while not pending.done():
            assert loop.time() < deadline, "the change feed delivered nothing"
            await table.upsert(probe)
            await asyncio.wait({pending}, timeout=0.05)
        changes.clear()
        rows = [row(f"k{i}", minutes=i % 7) for i in range(1300)]
        waiter = asyncio.ensure_future(collect(len(rows)))
        etags = await table.upsert_many(rows)
        await asyncio.wait_for(waiter, 10)
        assert await table.count() == len(rows) + 1
        for r, etag in list(zip(rows, etags, strict=True))[::97]:
            assert await table.read(r.grain_id, "r") == r.with_etag(etag)
        assert [(c.grain_id, c.next_due) for c in changes] == [
            (r.grain_id, r.next_due) for r in rows
        ]


async def test_a_row_with_every_field_reads_back_as_written(redis_url: str) -> None:
    # More than 15 fields: the record's map header is the 3-byte form.
    full = replace(
        new_entry(
            ReminderSpec(
                cron="0 * * * *",
                tz="Europe/Paris",
                priority=-7,
                action=MissedReminderAction.NOTIFY,
                grace=30,
                jitter=5,
                starts_at=T0 + timedelta(hours=1),
                ends_at=T0 + timedelta(days=3),
                max_ticks=10,
                payload={"order": 12, "tags": ["a", "b"]},
                retry=RetryPolicy(3, timedelta(seconds=2)),
            ),
            service_id="default",
            grain_id=GrainId("Bulk", "full"),
            name="everything",
            now=T0,
            options=OPTIONS,
            declared=True,
            fingerprint="abc:1:2:",
        ),
        last_fire=T0 - timedelta(minutes=1),
        paused=True,
    )
    small = row("small")
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="bulk-full", shards=2)
        await table.start(stack)
        etags = await table.upsert_many([full, small])
        assert len(full.to_compact_record()) > 15
        assert await table.read(full.grain_id, "everything") == full.with_etag(etags[0])
        assert await table.read(small.grain_id, "r") == small.with_etag(etags[1])
