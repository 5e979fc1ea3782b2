"""Paused rows meet the priority lanes and bulk writes, on real Redis: a paused
row is out of the due index whichever script wrote it, a resumed row goes back
into its priority lane, and a changed declaration keeps an operator's pause."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange, ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.ring import RingRange

T0 = datetime(2030, 1, 1, tzinfo=UTC)
OPTIONS = ReminderOptions()


def entry(key: str, *, priority: int = 0, minutes: int = 0, paused: bool = False) -> ReminderEntry:
    row = new_entry(
        ReminderSpec(period=3600, due=0, priority=priority),
        service_id="default",
        grain_id=GrainId("Lanes", key),
        name="r",
        now=T0 + timedelta(minutes=minutes),
        options=OPTIONS,
    )
    return replace(row, paused=paused)


PROBE = entry("probe")


async def prime(table: RedisReminderTable, feed: AsyncIterator[ReminderChange]) -> None:
    """Write a probe row until its change arrives (the feed is then live), then remove it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    pending = asyncio.ensure_future(anext(feed))
    try:
        while not pending.done():
            assert loop.time() < deadline, "the change feed delivered nothing"
            await table.upsert(PROBE)
            await asyncio.wait({pending}, timeout=0.05)
    finally:
        pending.cancel()
    row = await table.read(PROBE.grain_id, "r")
    assert row is not None and row.etag is not None
    assert await table.remove(PROBE.grain_id, "r", row.etag)


async def next_change(feed: AsyncIterator[ReminderChange]) -> ReminderChange:
    """The next change of a row other than the probe."""
    while True:
        change = await asyncio.wait_for(anext(feed), 10)
        if change.grain_id != PROBE.grain_id:
            return change


async def test_bulk_and_conditional_writes_keep_paused_rows_out_of_the_lanes(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default", shards=4)
        await table.start(stack)
        feed = table.changes()
        stack.push_async_callback(feed.aclose)
        await prime(table, feed)

        late_high = entry("high", priority=100, minutes=5)
        early_low = entry("low", priority=0)
        paused = entry("paused", priority=127, paused=True)
        etags = await table.upsert_many([late_high, paused, early_low])
        # One script call per shard: the changes come in shard order.
        changes = {c.grain_id.key: c for c in [await next_change(feed) for _ in range(3)]}
        assert {k: (c.next_due, c.priority) for k, c in changes.items()} == {
            "high": (late_high.next_due, 100),
            "paused": (None, None),
            "low": (early_low.next_due, 0),
        }
        before = T0 + timedelta(hours=1)
        due = await table.read_due(RingRange.full(), before, 10)
        assert [e.grain_id.key for e in due] == ["high", "low"], "a paused row is in the lanes"
        stored = await table.read(paused.grain_id, "r")
        assert stored is not None and stored.paused

        # Resumed through upsert_if: back at the head of its (highest) lane.
        resumed = replace(stored, paused=False)
        assert await table.upsert_if(resumed, etags[1]) is not None
        change = await next_change(feed)
        assert (change.next_due, change.priority) == (resumed.next_due, 127)
        due = await table.read_due(RingRange.full(), before, 10)
        assert [e.grain_id.key for e in due] == ["paused", "high", "low"]

        # A schedule CAS scores the row in its stored priority's lane.
        row = due[0]
        assert row.etag is not None
        later = row.next_due + timedelta(minutes=30)
        assert await table.update_schedule(row.grain_id, "r", row.etag, later, None) is not None
        due = await table.read_due(RingRange.full(), before, 10)
        assert [e.grain_id.key for e in due] == ["paused", "high", "low"]
        assert due[0].next_due == later


TYPE = "test_pause_lanes_redis.Declared"


@pytest.fixture
def _forget_class() -> Iterator[None]:
    yield
    grain_module._registry.pop(TYPE, None)


def declared(period: int) -> type[Grain]:
    grain_module._registry.pop(TYPE, None)

    @register_reminder("report", period=period)
    class Declared(Grain, Remindable, type_name=TYPE):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    return Declared


@pytest.mark.slow
@pytest.mark.usefixtures("_forget_class")
async def test_a_changed_declaration_keeps_the_pause(redis_url: str) -> None:
    gid = GrainId(TYPE, "")

    def options(cls: type[Grain]) -> SiloOptions:
        return SiloOptions(redis_url=redis_url, grain_types=(cls,))

    async with Silo(options(declared(30))) as silo:
        paused = await silo.client.reminders.pause(gid, "report")
        assert paused.paused and paused.period == timedelta(seconds=30)
    async with Silo(options(declared(60))) as silo:
        [row] = await silo.client.reminders.list_for_grain(gid)
        assert row.period == timedelta(seconds=60), "the declaration was not applied"
        assert row.paused, "a changed declaration resumed an operator's pause"
