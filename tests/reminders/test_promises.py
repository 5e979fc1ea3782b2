"""The reminder service's promises at the edges: priority-first admission, live
management changes on held rows, and ticks after storage trouble.

In-memory table and a manual clock; the Redis and multi-process versions of the
storage promises live in ``test_redis_faults.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import timedelta

import pytest

from orleanspy.errors import StorageUnavailableError
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderEntry,
    ReminderPriority,
    ScheduleUpdate,
    TickStatus,
)
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from tests.reminders.test_service import (
    OPTIONS,
    START,
    Recorder,
    S,
    _Silent,
    advance,
    entry,
    running,
)


@pytest.fixture
async def table() -> AsyncIterator[InMemoryReminderTable]:
    async with AsyncExitStack() as stack:
        t = InMemoryReminderTable()
        await t.start(stack)
        yield t


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


class SlowRecorder(Recorder):
    """Each acknowledged tick takes ``cost`` seconds of the manual clock."""

    def __init__(self, clock: ManualClock, cost: float) -> None:
        super().__init__()
        self._clock = clock
        self._cost = cost

    async def __call__(
        self, entry: ReminderEntry, status: TickStatus, deadline: float = 0.0
    ) -> None:
        await self._clock.sleep(self._cost)
        await super().__call__(entry, status, deadline)


async def run_until(clock: ManualClock, done: object, step: float, limit: float) -> None:
    """Advance the clock in ``step`` seconds until ``done()`` holds (at most ``limit`` s)."""
    assert callable(done)
    spent = 0.0
    while not done():
        assert spent < limit, f"condition not reached on the manual clock by {clock.now()}"
        await advance(clock, step)
        spent += step


# -- priority-first admission --------------------------------------------------------


async def test_critical_row_behind_a_background_backlog_larger_than_the_bucket_is_on_time(
    table, clock
) -> None:
    # Bucket 10; 100 BACKGROUND rows due at +1.0 s, one CRITICAL row due at +1.1 s.
    # Admitting by due time would hold only BACKGROUND rows until ~90 of them were
    # through; priority first holds the CRITICAL row from the first refill.
    for i in range(100):
        await table.upsert(
            entry(clock, i, due=1, period=3600, priority=ReminderPriority.BACKGROUND)
        )
    critical = entry(clock, "crit", due=timedelta(milliseconds=1100), period=3600)
    critical = replace(critical, priority=ReminderPriority.CRITICAL)
    await table.upsert(critical)
    rec = SlowRecorder(clock, 0.02)
    options = replace(OPTIONS, base_bucket_size=10, permits=4)
    async with running(table, clock, rec, options=options) as svc:
        assert svc._window.get(critical.key) is not None, (
            "the CRITICAL row is not held although it comes first in admission order"
        )
        await run_until(clock, lambda: "crit" in {e.grain_id.key for e, _ in rec.calls}, 0.005, 5)
        status = next(s for e, s in rec.calls if e.grain_id.key == "crit")
        late = status.delivered_at - status.current_tick_time
        assert status.current_tick_time == START + timedelta(milliseconds=1100)
        assert late <= timedelta(milliseconds=50), f"CRITICAL tick {late} late"
        await run_until(clock, lambda: len(rec.calls) == 101, 0.05, 30)
        assert svc.stats.resident <= 10 or svc.stats.high_water <= 10


async def test_higher_priority_arrival_evicts_a_queued_lower_priority_row(table, clock) -> None:
    for i in range(4):
        await table.upsert(entry(clock, i, due=10, period=3600, priority=ReminderPriority.NORMAL))
    rec = Recorder()
    options = replace(OPTIONS, base_bucket_size=4)
    async with running(table, clock, rec, options=options) as svc:
        assert svc.stats.loaded == 4
        late = replace(entry(clock, "crit", due=20, period=3600), priority=100)
        await table.upsert(late)  # the feed tells the service; it must make room
        await wait_for(lambda: svc._window.get(late.key) is not None, 5.0, interval=0)
        assert svc.stats.resident == 4 and svc.stats.evicted == 1
        await run_until(clock, lambda: len(rec.calls) == 5, 1.0, 60)
        # The evicted NORMAL row came back at a later refill and ticked too.
        assert sorted(str(e.grain_id.key) for e, _ in rec.calls) == ["0", "1", "2", "3", "crit"]


# -- ticks after storage trouble ------------------------------------------------------


class FrozenStoreTable(InMemoryReminderTable):
    """A store that, while ``frozen``, applies each schedule write but answers it
    with a timeout (as a frozen Redis does once it wakes up), then refuses the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = False
        self.applied_while_frozen = 0

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        if not self.frozen:
            return await super().update_schedule_many(updates)
        if not self.applied_while_frozen:
            await super().update_schedule_many(updates)
        self.applied_while_frozen += 1
        raise StorageUnavailableError("Timeout reading from socket")


@pytest.mark.parametrize("feed", [True, False], ids=["with-feed", "without-feed"])
async def test_write_applied_despite_a_timeout_is_recognised_and_no_slot_repeats(
    clock, feed: bool
) -> None:
    table = FrozenStoreTable()
    e = entry(clock, due=1, period=1)
    await table.upsert(e)
    rec = Recorder()
    async with AsyncExitStack() as stack:
        await table.start(stack)
        if not feed:
            table.changes = _Silent  # type: ignore[method-assign]
        async with running(table, clock, rec) as svc:
            await run_until(clock, lambda: len(rec.calls) == 2, 0.25, 5)
            await svc.wait_persisted()
            table.frozen = True
            # Ten more ticks while every write times out (the first one applied).
            await run_until(clock, lambda: len(rec.calls) == 12, 0.25, 20)
            table.frozen = False
            await run_until(clock, lambda: len(rec.calls) == 16, 0.25, 20)
            await svc.wait_persisted()
            stats = svc.stats
        slots = rec.slots()
        assert len(slots) == len(set(slots)), "a slot was delivered twice"
        assert slots == [START + (i + 1) * S for i in range(16)], "the grid broke"
        assert stats.cas_conflicts == 0, "our own applied write was taken for another writer"
        stored = await table.read(e.grain_id, e.name)
        assert stored is not None and stored.next_due == START + 17 * S


# -- management changes on held rows --------------------------------------------------


async def _stored(table: InMemoryReminderTable, e: ReminderEntry) -> ReminderEntry:
    row = await table.read(e.grain_id, e.name)
    assert row is not None
    return row


async def test_set_priority_on_a_held_row_applies_at_once_and_repeats_no_slot(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await run_until(clock, lambda: len(rec.calls) == 1, 1.0, 20)
        # What the management grain's set_priority writes: the stored row, re-prioritised.
        await table.upsert(replace(await _stored(table, e), priority=ReminderPriority.CRITICAL))
        await wait_for(lambda: svc._window.get(e.key).priority == 100, 5.0, interval=0)
        await run_until(clock, lambda: len(rec.calls) == 3, 1.0, 30)
        await svc.wait_persisted()
        assert rec.slots() == [START + 10 * S, START + 20 * S, START + 30 * S]
        assert [s.priority for _, s in rec.calls] == [0, 100, 100]
        assert svc.stats.cas_conflicts == 0
        stored = await _stored(table, e)
        assert stored.priority == 100 and stored.next_due == START + 40 * S


async def test_set_action_while_the_tick_is_being_delivered_repeats_no_slot(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    rec.gate = asyncio.Event()
    async with running(table, clock, rec) as svc:
        await run_until(clock, lambda: rec.blocked == 1, 1.0, 20)
        fire = MissedReminderAction.FIRE_IMMEDIATELY
        await table.upsert(replace(await _stored(table, e), action=fire))
        await wait_for(lambda: svc._window.get(e.key).entry.action is fire, 5.0, interval=0)
        rec.gate.set()
        rec.gate = None
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        await run_until(clock, lambda: len(rec.calls) == 3, 1.0, 30)
        await svc.wait_persisted()
        assert rec.slots() == [START + 10 * S, START + 20 * S, START + 30 * S]
        assert svc.stats.cas_conflicts == 0
        stored = await _stored(table, e)
        assert stored.action is fire and stored.next_due == START + 40 * S


async def test_reregistering_a_held_row_takes_the_new_schedule_at_once(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await run_until(clock, lambda: len(rec.calls) == 1, 1.0, 20)
        # register_or_update_reminder with period 3 s, anchored at now (t=10).
        await table.upsert(entry(clock, due=3, period=3))
        await wait_for(lambda: svc._window.get(e.key).next_due == START + 13 * S, 5.0, interval=0)
        await run_until(clock, lambda: len(rec.calls) == 4, 0.5, 20)
        assert rec.slots() == [START + 10 * S, START + 13 * S, START + 16 * S, START + 19 * S]
        assert svc.stats.cas_conflicts == 0


async def test_repair_and_delete_of_held_rows_repeat_no_slot(table, clock) -> None:
    a = entry(clock, "a", due=10, period=10)
    b = entry(clock, "b", due=10, period=10)
    await table.upsert(a)
    await table.upsert(b)
    rec = Recorder()
    rec.gate = asyncio.Event()
    async with running(table, clock, rec) as svc:
        await run_until(clock, lambda: rec.blocked == 2, 1.0, 20)
        # repair of a: its first slot after now (t=10) is 20, the row is being delivered.
        await table.upsert(replace(await _stored(table, a), next_due=START + 20 * S))
        stored_b = await _stored(table, b)
        assert stored_b.etag is not None
        assert await table.remove(b.grain_id, b.name, stored_b.etag)
        await wait_for(lambda: svc._window.get(b.key) is None, 5.0, interval=0)
        rec.gate.set()
        rec.gate = None
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        await run_until(clock, lambda: len(rec.calls) == 4, 1.0, 40)
        await svc.wait_persisted()
        by_key: dict[str, list[object]] = {}
        for entry_, status in rec.calls:
            by_key.setdefault(str(entry_.grain_id.key), []).append(status.current_tick_time)
        assert by_key == {
            "a": [START + 10 * S, START + 20 * S, START + 30 * S],
            "b": [START + 10 * S],
        }
        assert await table.read(b.grain_id, b.name) is None
