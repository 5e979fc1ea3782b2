"""The adaptive reminder service against the in-memory table and a manual clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy.clock import to_ms
from orleanspy.errors import GrainCallTimeoutError, SiloUnavailableError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service import persist
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import (
    FireOutcome,
    MissedReminder,
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ReminderPriority,
    TickStatus,
)
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

START = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
OPTIONS = ReminderOptions(
    look_ahead=timedelta(minutes=5),
    poll_interval=timedelta(seconds=30),
    base_bucket_size=64,
    permits=4,
    retry_initial=timedelta(milliseconds=100),
    retry_max=timedelta(seconds=1),
    adaptive=False,
    # Stated rather than defaulted: the tests below count on it.
    missed_tick_grace=timedelta(seconds=30),
)


class Recorder:
    """A fake ``deliver``: records acknowledged ticks; can fail or block on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[ReminderEntry, TickStatus]] = []
        self.attempts = 0
        self.failures: dict[str, list[BaseException]] = {}
        self.gate: asyncio.Event | None = None
        self.blocked = 0
        self.on_call: Callable[[], None] | None = None
        self.deadlines: list[float] = []

    async def __call__(
        self, entry: ReminderEntry, status: TickStatus, deadline: float = 0.0
    ) -> None:
        self.attempts += 1
        self.deadlines.append(deadline)
        if self.on_call is not None:
            self.on_call()
        queue = self.failures.get(entry.name)
        if queue:
            raise queue.pop(0)
        if self.gate is not None:
            self.blocked += 1
            await self.gate.wait()
        self.calls.append((entry, status))

    def slots(self, name: str | None = None) -> list[datetime]:
        return [s.current_tick_time for e, s in self.calls if name is None or e.name == name]

    def keys(self) -> list[str]:
        return [e.key for e, _ in self.calls]


async def advance(clock: ManualClock, delta: float | timedelta) -> None:
    """Let the service's tasks register their sleeps, then move the clock.

    A sleep is registered with the clock only once the sleeping task runs; a
    jump made before that would not see the deadline.
    """
    await clock.settle()
    await clock.advance(delta)


def entry(clock: ManualClock, key: int | str = 1, name: str = "r", **kw: Any) -> ReminderEntry:
    kw.setdefault("period", 10)
    now = kw.pop("now", clock.now())
    return new_entry(
        ReminderSpec(**kw),
        service_id="default",
        grain_id=GrainId("G", key),
        name=name,
        now=now,
        options=OPTIONS,
    )


@asynccontextmanager
async def running(
    table: Any,
    clock: ManualClock,
    recorder: Recorder,
    *,
    options: ReminderOptions = OPTIONS,
    ranges: tuple[RingRange, ...] = (RingRange.full(),),
    **kw: Any,
) -> AsyncIterator[ReminderService]:
    async with AsyncExitStack() as stack:
        service = ReminderService(table, deliver=recorder, clock=clock, options=options, **kw)
        service.set_ranges(ranges)
        await service.start(stack)
        await service.refill_now()
        yield service


@pytest.fixture
async def table() -> AsyncIterator[InMemoryReminderTable]:
    async with AsyncExitStack() as stack:
        t = InMemoryReminderTable()
        await t.start(stack)
        yield t


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


# -- schedules -------------------------------------------------------------------------


async def test_interval_ticks_stay_on_the_grid(table, clock) -> None:
    await table.upsert(entry(clock, due=10, period=10))
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        for k in range(1, 31):
            await advance(clock, 10)
            await wait_for(lambda k=k: len(rec.calls) == k, 5.0, interval=0)
        assert rec.slots() == [START + 10 * k * S for k in range(1, 31)]
        assert all(s.delivered_at == s.current_tick_time for _, s in rec.calls)
        assert all(
            s.missed_ticks == 0 and s.first_tick_time == START + 10 * S for _, s in rec.calls
        )
        await svc.wait_persisted()
        row = await table.read(GrainId("G", 1), "r")
        assert row.next_due == START + 310 * S
        assert row.last_fire == START + 300 * S
        # One sleeper for all rows, not a timer per reminder.
        assert clock.sleepers <= 3


async def test_cron_ticks_follow_the_expression(table, clock) -> None:
    await table.upsert(entry(clock, period=None, cron="0 0 * * * *"))  # hourly, seconds first
    rec = Recorder()
    async with running(table, clock, rec):
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)  # 00:00 is due at once
        for h in range(1, 25):
            await advance(clock, timedelta(hours=1))
            await wait_for(lambda h=h: len(rec.calls) == h + 1, 5.0, interval=0)
        assert rec.slots() == [START + timedelta(hours=h) for h in range(25)]
        assert rec.calls[0][1].cron == "0 0 * * * *" and rec.calls[0][1].period is None


# -- ownership -------------------------------------------------------------------------


async def test_complementary_ranges_deliver_each_row_once(table, clock) -> None:
    half = HASH_SPACE // 2
    low, high = RingRange(0, half), RingRange(half, 0)
    for i in range(60):
        await table.upsert(entry(clock, i, due=10))
    a, b = Recorder(), Recorder()
    async with (
        running(table, clock, a, ranges=(low,), name="a"),
        running(table, clock, b, ranges=(high,), name="b"),
    ):
        await advance(clock, 10)
        await wait_for(lambda: len(a.calls) + len(b.calls) == 60, 5.0, interval=0)
    assert a.calls and b.calls
    assert all(e.hash in low for e, _ in a.calls)
    assert all(e.hash in high for e, _ in b.calls)
    assert len(set(a.keys()) | set(b.keys())) == 60


async def test_set_ranges_drops_unowned_rows_and_loads_new_ones(table, clock) -> None:
    half = HASH_SPACE // 2
    low, high = RingRange(0, half), RingRange(half, 0)
    entries = [entry(clock, i, due=60) for i in range(40)]
    for e in entries:
        await table.upsert(e)
    in_low = {e.key for e in entries if e.hash in low}
    rec = Recorder()
    async with running(table, clock, rec, ranges=(low,)) as svc:
        assert svc.stats.loaded == len(in_low)
        svc.set_ranges([high])
        assert svc.stats.loaded == 0  # dropped at once
        await wait_for(
            lambda: svc.stats.loaded == 40 - len(in_low), 5.0, interval=0
        )  # loaded without a poll
        await advance(clock, 60)
        await wait_for(lambda: len(rec.calls) == 40 - len(in_low), 5.0, interval=0)
    assert not in_low & set(rec.keys())


@pytest.mark.parametrize("delay", [0.5, 0.0])
async def test_ranges_taken_from_a_live_silo_are_read_after_the_handover_delay(
    table, clock, delay: float
) -> None:
    # The silo that had the high half is still alive and may be finishing a tick
    # of its rows: they are read ``handover_delay`` later, not at once (else a
    # slot it ticked just before the move could be delivered again).
    half = HASH_SPACE // 2
    low, high = RingRange(0, half), RingRange(half, 0)
    entries = [entry(clock, i, due=0.1, period=60) for i in range(40)]
    for e in entries:
        await table.upsert(e)
    in_high = {e.key for e in entries if e.hash in high}
    rec = Recorder()
    options = replace(OPTIONS, handover_delay=timedelta(seconds=delay))
    async with running(table, clock, rec, ranges=(low,), options=options) as svc:
        svc.set_ranges([RingRange.full()], from_live=[high])
        await advance(clock, 0.2)
        await wait_for(lambda: len(rec.calls) >= 40 - len(in_high), 5.0, interval=0)
        early = set(rec.keys())
        await advance(clock, 0.4)
        await wait_for(lambda: len(rec.calls) == 40, 5.0, interval=0)
    if delay:
        assert not early & in_high, "a row taken from a live silo was ticked at once"
    else:
        assert in_high <= early
    assert set(rec.keys()) == {e.key for e in entries}


# -- the bounded window ----------------------------------------------------------------


async def test_window_never_exceeds_bucket_size_under_a_large_backlog(table, clock) -> None:
    bucket = 32
    for i in range(10 * bucket):
        await table.upsert(entry(clock, i, due=0, period=3600))
    options = replace(OPTIONS, base_bucket_size=bucket)
    rec = Recorder()
    seen: list[tuple[int, int]] = []
    svc_ref: list[ReminderService] = []

    def sample() -> None:
        st = svc_ref[0].stats
        seen.append((st.loaded, st.resident))

    rec.on_call = sample
    async with AsyncExitStack() as stack:
        svc = ReminderService(table, deliver=rec, clock=clock, options=options)
        svc_ref.append(svc)
        svc.set_ranges([RingRange.full()])
        await svc.start(stack)

        def done() -> bool:
            sample()
            return len(rec.calls) == 10 * bucket

        await wait_for(done, 5.0, interval=0)
        stats = svc.stats
    assert stats.high_water <= bucket
    assert max(loaded for loaded, _ in seen) <= bucket
    assert max(resident for _, resident in seen) <= bucket
    assert max(resident for _, resident in seen) == bucket  # the window was used fully
    assert len(set(rec.keys())) == 10 * bucket  # every row, each once
    assert stats.delivered == 10 * bucket


async def test_rows_beyond_the_look_ahead_are_not_loaded(table, clock) -> None:
    await table.upsert(entry(clock, 1, due=60, period=3600))
    await table.upsert(entry(clock, 2, due=600, period=3600))
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        assert svc.stats.loaded == 1
        await advance(clock, 600)
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        assert rec.slots() == [START + 60 * S, START + 600 * S]


# -- change feed -----------------------------------------------------------------------


async def test_row_inserted_after_start_is_delivered_without_waiting_for_the_poll(
    table, clock
) -> None:
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await table.upsert(entry(clock, due=20))
        await wait_for(lambda: svc.stats.loaded == 1, 5.0, interval=0)
        await advance(clock, 20)  # less than poll_interval (30 s)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.slots() == [START + 20 * S]
        assert svc.stats.refills == 1  # only the one at start


async def test_local_hint_schedules_a_row_without_the_feed(clock) -> None:
    table = QuietTable()
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        e = entry(clock, due=5)
        await table.upsert(e)
        svc.notify_change(ReminderChange(e.grain_id, e.name, e.next_due))
        await wait_for(lambda: svc.stats.loaded == 1, 5.0, interval=0)
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)


async def test_removal_through_the_feed_stops_ticks(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        await svc.wait_persisted()
        row = await table.read(e.grain_id, e.name)
        assert await table.remove(e.grain_id, e.name, row.etag)
        await wait_for(lambda: svc.stats.resident == 0, 5.0, interval=0)
        await advance(clock, 60)
        assert len(rec.calls) == 1


async def test_reregistration_by_another_writer_moves_the_schedule(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await table.upsert(entry(clock, due=25, period=100))  # same row, new schedule
        await wait_for(
            lambda: svc.stats.loaded == 1 and svc._window.head_due() == START + 25 * S,
            5.0,
            interval=0,
        )
        await advance(clock, 30)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.slots() == [START + 25 * S]


# -- missed ticks ----------------------------------------------------------------------


async def _late_start(table, clock, action) -> ReminderEntry:
    e = entry(clock, due=10, period=10, action=action)
    await table.upsert(e)
    await advance(clock, 95)  # slots +10 .. +90 pass with no service running
    return e


async def test_missed_fire_immediately_coalesces_then_resumes_the_grid(table, clock) -> None:
    e = await _late_start(table, clock, MissedReminderAction.FIRE_IMMEDIATELY)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        status = rec.calls[0][1]
        assert status.current_tick_time == START + 90 * S  # the latest missed slot
        assert status.missed_ticks == 8  # +10 .. +80 folded into it
        assert status.delivered_at == START + 95 * S
        await svc.wait_persisted()
        assert (await table.read(e.grain_id, e.name)).next_due == START + 100 * S
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        assert rec.calls[1][1].current_tick_time == START + 100 * S
        assert rec.calls[1][1].missed_ticks == 0
        assert svc.stats.missed == 1


async def test_missed_skip_moves_to_the_next_slot(table, clock) -> None:
    e = await _late_start(table, clock, MissedReminderAction.SKIP)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await wait_for(lambda: svc.stats.skipped == 1, 5.0, interval=0)
        await svc.wait_persisted()
        row = await table.read(e.grain_id, e.name)
        assert row.next_due == START + 100 * S and row.last_fire is None
        assert rec.calls == []
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.slots() == [START + 100 * S]


async def test_missed_notify_publishes_and_skips(table, clock) -> None:
    e = await _late_start(table, clock, MissedReminderAction.NOTIFY)
    rec = Recorder()
    events: list[MissedReminder] = []

    async def publish(event: MissedReminder) -> None:
        events.append(event)

    async with running(table, clock, rec, publish_missed=publish) as svc:
        await wait_for(lambda: len(events) == 1, 5.0, interval=0)
        ev = events[0]
        assert (ev.grain_id, ev.name) == (e.grain_id, e.name)
        assert ev.scheduled == START + 10 * S
        assert ev.detected_at == START + 95 * S
        assert ev.missed_ticks == 9  # +10 .. +90, none delivered
        assert ev.next_due == START + 100 * S
        assert rec.calls == []
        assert svc.stats.notified == 1 and svc.stats.skipped == 1


async def test_late_tick_within_grace_is_delivered_on_its_slot(table, clock) -> None:
    await table.upsert(entry(clock, due=10, period=10, action=MissedReminderAction.SKIP))
    await advance(clock, 18)  # slot +10 is 8 s late (< 30 s grace); +20 not yet due
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        await advance(clock, 2)
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        assert rec.slots() == [START + 10 * S, START + 20 * S]
        assert svc.stats.missed == 0


async def test_row_loaded_several_slots_behind_after_an_outage_gets_its_action(clock) -> None:
    # The rows fall due while the store is down, so no refill can load them. Once
    # it is back, slots +400 to +420 have passed: inside the grace, but a burst
    # of old ticks after an outage is what the missed-tick action is for.
    table = FlakyTable()
    await table.upsert(entry(clock, 1, due=400, period=10, action=MissedReminderAction.SKIP))
    fire = MissedReminderAction.FIRE_IMMEDIATELY
    await table.upsert(entry(clock, 2, due=400, period=10, action=fire))
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        assert svc.stats.loaded == 0  # beyond the look-ahead
        table.down = True
        await advance(clock, 30)  # a poll fails
        await wait_for(lambda: svc.stats.load_errors >= 1, 5.0, interval=0)
        await advance(clock, 395)  # t=425
        table.down = False
        await svc.refill_now()
        await wait_for(lambda: len(rec.calls) == 1 and svc.stats.skipped == 1, 5.0, interval=0)
        # FIRE_IMMEDIATELY: one catch-up for +420 with +400, +410 folded in; SKIP: nothing.
        ((caught_up, status),) = rec.calls
        assert caught_up.grain_id.key == 2
        assert (status.current_tick_time, status.missed_ticks) == (START + 420 * S, 2)
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 3, 5.0, interval=0)
        assert sorted(rec.slots()[1:]) == [START + 430 * S, START + 430 * S]


async def test_row_behind_its_grid_by_more_than_a_period_is_never_a_burst(table, clock) -> None:
    # Slots +10 and +20 have passed, both inside the 30 s grace: still no burst.
    # SKIP delivers neither; FIRE_IMMEDIATELY one tick for +20 standing for both.
    await table.upsert(entry(clock, 1, due=10, period=10, action=MissedReminderAction.SKIP))
    fire = MissedReminderAction.FIRE_IMMEDIATELY
    await table.upsert(entry(clock, 2, due=10, period=10, action=fire))
    await advance(clock, 25)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await wait_for(lambda: len(rec.calls) == 1 and svc.stats.skipped == 1, 5.0, interval=0)
        ((caught_up, status),) = rec.calls
        assert caught_up.grain_id.key == 2
        assert (status.current_tick_time, status.missed_ticks) == (START + 20 * S, 1)
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 3, 5.0, interval=0)
        assert rec.slots()[1:] == [START + 30 * S] * 2
        assert svc.stats.missed == 2


async def test_repair_skips_long_overdue_rows_the_window_has_no_room_for(table, clock) -> None:
    options = replace(OPTIONS, base_bucket_size=4, permits=4)
    rec = Recorder()
    rec.gate = asyncio.Event()
    for i in range(4):
        await table.upsert(entry(clock, i, name="busy", due=0, period=3600))
    async with running(table, clock, rec, options=options) as svc:
        await wait_for(
            lambda: rec.blocked == 4, 5.0, interval=0
        )  # the window is full of deliveries
        stale = [
            entry(clock, 100 + i, name="old", due=0, period=60, now=START - timedelta(hours=1))
            for i in range(3)
        ]
        for e in stale:
            await table.upsert(e)
        await advance(clock, timedelta(minutes=1))  # one repair pass
        await wait_for(lambda: svc.stats.repaired == 3, 5.0, interval=0)
        await svc.wait_persisted()
        for e in stale:
            row = await table.read(e.grain_id, e.name)
            assert row.next_due == START + timedelta(minutes=2)
        assert svc.stats.resident == 4
        rec.gate.set()
        await wait_for(lambda: len(rec.calls) == 4, 5.0, interval=0)
        assert {e.name for e, _ in rec.calls} == {"busy"}


# -- priority lanes --------------------------------------------------------------------


def _backlog(clock: ManualClock) -> list[ReminderEntry]:
    # Background rows are due first and critical rows last, so only the lanes
    # (not the heap order) can put critical first.
    rows = []
    for i in range(10):
        for offset, prio in ((-20, ReminderPriority.BACKGROUND), (-15, 0), (-10, 100)):
            rows.append(
                entry(
                    clock,
                    f"{int(prio)}-{i}",
                    due=0,
                    period=3600,
                    priority=prio,
                    now=START + offset * S,
                )
            )
    return rows


async def _through_the_ramp(clock: ManualClock, rec: Recorder, n: int) -> None:
    """Step the clock until ``n`` ticks came: the backlog is overdue, so herd
    control (on by default) spaces its grain calls on the manual clock."""
    async with asyncio.timeout(10):
        while len(rec.calls) < n:
            await advance(clock, 0.01)


async def test_backlog_is_delivered_critical_first_background_last(table, clock) -> None:
    for e in _backlog(clock):
        await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec, options=replace(OPTIONS, permits=1)):
        await _through_the_ramp(clock, rec, 30)
    prios = [int(e.priority) for e, _ in rec.calls]
    assert prios == [100] * 10 + [0] * 10 + [-100] * 10


async def test_overdue_low_priority_rows_are_not_starved_by_higher_ones_not_due_yet(
    table, clock
) -> None:
    """More normal rows fall due within the look-ahead than the bucket holds, none
    of them due yet; background rows are overdue. The silo has nothing else to do:
    the overdue rows go first, within seconds, not after the normal rows have
    drained the look-ahead (they used to wait outside while normal rows' later
    slots filled the window, refill after refill)."""
    for i in range(200):  # due from 10 s to 4 min from now: 3x the bucket of 64
        await table.upsert(entry(clock, f"n{i}", due=10 + i, period=3600))
    for i in range(20):  # overdue by a minute
        await table.upsert(
            entry(
                clock,
                f"b{i}",
                due=0,
                period=3600,
                priority=ReminderPriority.BACKGROUND,
                action=MissedReminderAction.FIRE_IMMEDIATELY,
                now=START - 60 * S,
            )
        )
    rec = Recorder()
    async with running(table, clock, rec):
        async with asyncio.timeout(10):
            waited = 0.0
            while len(rec.calls) < 20 and waited < 5.0:
                await advance(clock, 0.05)
                waited += 0.05
    names = [str(e.grain_id.key) for e, _ in rec.calls]
    assert sorted(names) == sorted(f"b{i}" for i in range(20)), names
    assert waited < 5.0


async def test_without_priorities_the_backlog_goes_in_due_order(table, clock) -> None:
    for e in _backlog(clock):
        await table.upsert(e)
    rec = Recorder()
    options = replace(OPTIONS, permits=1, enable_priority=False)
    async with running(table, clock, rec, options=options):
        await _through_the_ramp(clock, rec, 30)
    prios = [int(e.priority) for e, _ in rec.calls]
    assert prios == [-100] * 10 + [0] * 10 + [100] * 10


# -- delivery and persistence ----------------------------------------------------------


async def test_transient_failure_is_retried_and_persisted_only_after_ack(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    rec.failures["r"] = [SiloUnavailableError("down"), SiloUnavailableError("down")]
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: rec.attempts == 1, 5.0, interval=0)
        before = await table.read(e.grain_id, e.name)
        assert before.next_due == START + 10 * S and before.last_fire is None
        # The retry waits in the window, holding no permit.
        await wait_for(lambda: svc.stats.in_flight == 0 and svc.stats.loaded == 1, 5.0, interval=0)
        while not rec.calls:
            await advance(clock, 0.5)  # through the retry backoff
        assert rec.attempts == 3 and svc.stats.retries == 2
        status = rec.calls[0][1]
        assert status.current_tick_time == START + 10 * S
        await svc.wait_persisted()
        after = await table.read(e.grain_id, e.name)
        assert after.next_due == START + 20 * S
        assert status.delivered_at > START + 10 * S
        assert to_ms(after.last_fire) == to_ms(status.delivered_at)  # stored in ms
        assert svc.stats.delivered == 1


async def test_grain_error_advances_the_schedule_and_is_counted(table, clock) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    rec.failures["r"] = [ValueError("grain bug")]
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await svc.wait_persisted()
        assert (await table.read(e.grain_id, e.name)).next_due == START + 20 * S
        assert svc.stats.retries == 0 and rec.attempts == 1
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.slots() == [START + 20 * S]


async def test_a_failing_tick_logs_its_traceback_rate_limited_and_keeps_its_error(
    table, clock, caplog: pytest.LogCaptureFixture
) -> None:
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    rec.failures["r"] = [ValueError("grain bug"), KeyError("gone")]
    with caplog.at_level(logging.WARNING, logger="orleanspy.reminders._delivery"):
        async with running(table, clock, rec) as svc:
            await advance(clock, 10)
            await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
            await advance(clock, 10)
            await wait_for(lambda: svc.stats.grain_errors == 2, 5.0, interval=0)

            async def recorded() -> bool:
                return len(await table.read_history(e.grain_id, e.name)) == 2

            await wait_for(recorded, 5.0)
    history = await table.read_history(e.grain_id, e.name)
    assert [(r.outcome, r.error) for r in history] == [
        (FireOutcome.GRAIN_ERROR, "KeyError: 'gone'"),
        (FireOutcome.GRAIN_ERROR, "ValueError: grain bug"),
    ]
    failed = [r for r in caplog.records if "tick failed in grain" in r.getMessage()]
    assert len(failed) == 2
    # The first failure carries its traceback; the second, within the minute, does not.
    assert failed[0].exc_info is not None and "grain bug" in caplog.text
    assert failed[1].exc_info is None and "KeyError: 'gone'" in failed[1].getMessage()


async def test_cas_conflict_drops_the_local_copy(clock) -> None:
    table = QuietTable()  # no feed: the service learns of the other writer by its CAS
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        assert svc.stats.loaded == 1
        row = await table.read(e.grain_id, e.name)
        moved = START + timedelta(days=1)
        assert await table.update_schedule(e.grain_id, e.name, row.etag, moved, None)
        await advance(clock, 10)
        await wait_for(lambda: svc.stats.cas_conflicts == 1, 5.0, interval=0)
        assert svc.stats.resident == 0
        assert (await table.read(e.grain_id, e.name)).next_due == moved
        await advance(clock, 60)
        assert len(rec.calls) == 1


async def test_a_lost_cas_reads_the_row_again_before_the_poll(clock, table) -> None:
    # Another writer (an earlier owner, say) moves a held row's schedule. A
    # schedule CAS is not published, so the service learns of it when its own
    # CAS loses; it then reads the row at once and delivers the other writer's
    # next slot, long before its 30 s poll would have found it.
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        row = await table.read(e.grain_id, e.name)
        moved = START + 15 * S
        assert await table.update_schedule(e.grain_id, e.name, row.etag, moved, None)
        await advance(clock, 10)  # the stale slot is delivered (at least once) ...
        await wait_for(lambda: svc.stats.cas_conflicts == 1, 5.0, interval=0)
        await wait_for(lambda: svc.stats.resident == 1, 5.0, interval=0)  # ... and re-read
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        assert rec.slots() == [START + 10 * S, moved]
        assert svc.stats.refills == 1  # the start's only: no poll was needed


async def test_a_row_rolled_back_by_the_store_keeps_the_schedule_delivered(clock, table) -> None:
    # A Redis primary acknowledges schedule writes and fails over before its
    # replica has them: the row (etag included) goes back to an earlier state of
    # the same registration. The next CAS loses; the re-read row is behind what
    # this silo delivered, and no slot it delivered is delivered again.
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    key = (e.grain_id.canonical, e.name)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        await svc.wait_persisted()
        before = table._rows[key]  # the row after the first slot, etag and all
        for k in (2, 3):
            await advance(clock, 10)
            await wait_for(lambda k=k: len(rec.calls) == k, 5.0, interval=0)
            await svc.wait_persisted()
        assert table._rows[key][0].next_due == START + 40 * S
        table._rows[key] = before  # the failover: two acknowledged writes lost
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 4, 5.0, interval=0)
        await wait_for(lambda: svc.stats.cas_conflicts == 1, 5.0, interval=0)
        await wait_for(lambda: svc.stats.resident == 1, 5.0, interval=0)  # read again
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) >= 5, 5.0, interval=0)
        await svc.wait_persisted()
        assert rec.slots() == [START + 10 * k * S for k in range(1, 6)]
        assert svc.stats.cas_conflicts == 1 and svc.stats.rolled_back == 1
        row = await table.read(e.grain_id, e.name)
        assert (row.next_due, row.last_fire) == (START + 60 * S, START + 50 * S)


async def test_a_row_moved_back_by_another_writer_is_taken_as_stored(clock, table) -> None:
    # Not a rollback: a re-registration (a new start) moves the schedule back.
    # The stored row is the truth and its slots are delivered.
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        await svc.wait_persisted()
        row = await table.read(e.grain_id, e.name)
        again = replace(row, start_at=START + 15 * S, next_due=START + 15 * S, last_fire=None)
        assert await table.upsert_if(again, row.etag)
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) >= 2, 5.0, interval=0)
        await svc.wait_persisted()
        assert START + 15 * S in rec.slots()
        assert svc.stats.rolled_back == 0


async def test_polls_read_the_whole_look_ahead_and_find_rows_entering_it(clock) -> None:
    # Every poll reads the whole look-ahead (held rows left out by the table), so
    # a row far beyond the look-ahead at start (and, on a quiet feed, never
    # announced) is found by the poll after it comes near, and delivered on time.
    table = ReadCountingTable()
    near = entry(clock, 1, due=10, period=10)
    far = entry(clock, 2, due=OPTIONS.look_ahead + 45 * S, period=3600)
    for e in (near, far):
        await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        assert svc.stats.resident == 1
        for _ in range(4):  # two polls (30 s each), ticking the near row
            await advance(clock, 15)
        await wait_for(lambda: len(table.afters) == 3, 5.0, interval=0)
        assert table.afters == [None, None, None]
        assert svc.stats.resident == 2  # the far row entered with the second poll
        await clock.set(far.next_due)
        await wait_for(
            lambda: len(rec.slots(far.name)) > 0 and far.key in set(rec.keys()), 5.0, interval=0
        )
        late = next(s for e, s in rec.calls if e.key == far.key)
        assert late.current_tick_time == far.next_due and late.missed_ticks == 0


async def test_storage_outage_ticks_continue_and_persistence_catches_up(clock) -> None:
    table = FlakyTable()
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        table.down = True
        for k in range(1, 7):
            await advance(clock, 10)
            await wait_for(lambda k=k: len(rec.calls) == k, 5.0, interval=0)
        assert svc.stats.persist_failures > 0 and svc.stats.load_errors > 0
        assert (await table.inner.read(e.grain_id, e.name)).next_due == START + 10 * S
        table.down = False
        await advance(clock, 1)  # past the persistence backoff (retry_max)
        await svc.wait_persisted()
        row = await table.inner.read(e.grain_id, e.name)
        assert row.next_due == START + 70 * S
        assert row.last_fire == START + 60 * S
        await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 7, 5.0, interval=0)
    assert rec.slots() == [START + 10 * k * S for k in range(1, 8)]


# -- adaptive bucket size --------------------------------------------------------------


async def test_bucket_size_follows_the_load_signals(table, clock) -> None:
    from orleanspy.reminders._service.adaptive import LoadSignals

    signals = [LoadSignals(cpu_count=16, memory_load=0.6, active_grains=40_000)]
    rec = Recorder()
    options = replace(OPTIONS, adaptive=True, base_bucket_size=1024)
    async with running(table, clock, rec, options=options, load=lambda: signals[0]) as svc:
        assert svc.stats.bucket_size == 1638
        signals[0] = LoadSignals(cpu_count=4, memory_load=0.0, active_grains=100_000)
        await svc.refill_now()
        assert svc.stats.bucket_size == 512


# -- table wrappers ----------------------------------------------------------------------


class _Delegate:
    def __init__(self) -> None:
        self.inner = InMemoryReminderTable()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _forward(name: str) -> Any:
    def method(self: _Delegate, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


# The table's methods as real class attributes, not only through ``__getattr__``:
# from Python 3.12 on, ``isinstance`` against a runtime-checkable protocol (the
# service asks ``isinstance(table, SkippingReminderTable)``) looks attributes up
# statically and does not see what ``__getattr__`` would return.
for _name in dir(InMemoryReminderTable):
    if not _name.startswith("_") and callable(getattr(InMemoryReminderTable, _name)):
        setattr(_Delegate, _name, _forward(_name))


class _Silent:
    def __aiter__(self) -> _Silent:
        return self

    async def __anext__(self) -> ReminderChange:
        await asyncio.Event().wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass


class QuietTable(_Delegate):
    """The in-memory table with a change feed that never says anything."""

    def changes(self) -> _Silent:
        return _Silent()


class ReadCountingTable(QuietTable):
    """A quiet table that records the ``after`` bound of every due read."""

    def __init__(self) -> None:
        super().__init__()
        self.afters: list[datetime | None] = []

    async def read_due_skipping(self, *a: Any, after: datetime | None = None, **kw: Any) -> Any:
        self.afters.append(after)
        return await self.inner.read_due_skipping(*a, after=after, **kw)


class FlakyTable(_Delegate):
    """The in-memory table that raises ``StorageUnavailableError`` while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StorageUnavailableError("redis unreachable")

    async def read(self, *a: Any) -> Any:
        self._check()
        return await self.inner.read(*a)

    async def read_due(self, *a: Any) -> Any:
        self._check()
        return await self.inner.read_due(*a)

    async def read_due_skipping(self, *a: Any, **kw: Any) -> Any:
        self._check()
        return await self.inner.read_due_skipping(*a, **kw)

    async def update_schedule(self, *a: Any) -> Any:
        self._check()
        return await self.inner.update_schedule(*a)

    async def update_schedule_many(self, *a: Any) -> Any:
        self._check()
        return await self.inner.update_schedule_many(*a)


class _StuckHistoryTable(FlakyTable):
    """A flaky table whose fire-history appends never finish (a history backlog
    slower to write than the stop's budget)."""

    async def append_history(self, *a: Any) -> None:
        await asyncio.Event().wait()


async def test_a_history_backlog_does_not_keep_schedules_unwritten_at_stop(
    clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Schedules (what at-least-once rests on) and the best-effort history are
    # flushed side by side at stop: a history append that never ends neither
    # keeps the schedules from being written nor holds the stop past the
    # history's own share (the whole budget is a minute here; the stop must end
    # long before it).
    import orleanspy.reminders.service as service_module

    monkeypatch.setattr(service_module, "FINAL_FLUSH_SECONDS", 60.0)
    monkeypatch.setattr(service_module, "HISTORY_FLUSH_SECONDS", 0.2)
    table = _StuckHistoryTable()
    e = entry(clock, due=10, period=10)
    await table.upsert(e)
    rec = Recorder()
    async with asyncio.timeout(20):
        async with running(table, clock, rec) as svc:
            table.down = True  # the tick's schedule update stays pending
            await advance(clock, 10)
            await wait_for(lambda: len(rec.calls) == 1 and svc.stats.persist_failures > 0, 5.0)
            table.down = False
    row = await table.inner.read(e.grain_id, e.name)
    assert row.next_due == START + 20 * S and row.last_fire == START + 10 * S


# -- a window smaller than the near-due set rotates ------------------------------------


async def _steps(clock: ManualClock, seconds: float) -> None:
    """Move the clock in 0.1 s steps, letting the tasks catch up after each."""
    for _ in range(round(seconds * 10)):
        await advance(clock, 0.1)
        for _ in range(20):
            await asyncio.sleep(0)


def _ticks_per_row(
    rows: list[ReminderEntry], calls: list[tuple[ReminderEntry, TickStatus]]
) -> dict[str, int]:
    per_row = {e.key: 0 for e in rows}
    for e, _ in calls:
        per_row[e.key] += 1
    return per_row


async def _run_rotation(
    table, clock, rows: list[ReminderEntry], seconds: int
) -> tuple[Recorder, dict[str, int]]:
    for e in rows:
        await table.upsert(e)
    rec = Recorder()
    options = replace(OPTIONS, base_bucket_size=10, permits=10)
    async with running(table, clock, rec, options=options) as svc:
        await _steps(clock, seconds)
        assert svc.stats.rotated > 0  # the window released fired rows for waiting ones
        assert svc.stats.high_water <= 10
    return rec, _ticks_per_row(rows, rec.calls)


async def test_a_bucket_smaller_than_the_due_set_rotates_and_starves_no_row(table, clock) -> None:
    # 100 one-second reminders, first slots spread over one second, a window of 10:
    # every row must get ticks, not only the ten admitted first.
    rows = [entry(clock, i, due=0.01 * (i + 1), period=1) for i in range(100)]
    _, per_row = await _run_rotation(table, clock, rows, seconds=30)
    assert min(per_row.values()) >= 2, sorted(per_row.values())[:10]


async def test_rotation_keeps_priority_first(table, clock) -> None:
    # Five critical rows among 100: they stay in the window and get every slot,
    # and the normal rows rotate through the rest of it.
    rows = [
        entry(clock, i, due=0.01 * (i + 1), period=1, priority=100 if i % 20 == 0 else 0)
        for i in range(100)
    ]
    _, per_row = await _run_rotation(table, clock, rows, seconds=20)
    critical = [per_row[e.key] for e in rows if int(e.priority) == 100]
    normal = [per_row[e.key] for e in rows if int(e.priority) == 0]
    assert min(critical) >= 18, critical  # every slot of 20 s, less start-up
    assert min(normal) >= 2, sorted(normal)[:10]


class SlowWritesTable(_Delegate):
    """The in-memory table whose schedule writes can be held (a slow store): once
    ``release_on_read`` is set, the next due read lets them land after it read,
    so its answer predates them, as a network read's can."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = asyncio.Event()
        self.writes.set()
        self.release_on_read = False
        self.raced = 0

    async def update_schedule_many(self, *a: Any, **kw: Any) -> Any:
        await self.writes.wait()
        return await self.inner.update_schedule_many(*a, **kw)

    async def read_due_skipping(self, *a: Any, **kw: Any) -> Any:
        rows = await self.inner.read_due_skipping(*a, **kw)
        if self.release_on_read:
            self.release_on_read = False
            self.writes.set()
            for _ in range(20):  # the held writes land before the answer arrives
                await asyncio.sleep(0)
            self.raced += 1
        return rows


async def test_a_refill_that_raced_schedule_writes_keeps_the_rotation_going(
    clock, monkeypatch
) -> None:
    # 100 rows through a window of 10. The store holds the schedule writes for a
    # while, so the rows the rotation released pile up unwritten; then a refill's
    # read answers with their old state while all of those writes land. The read
    # leaves them out (its answer is stale), but they still wait: the refill must
    # not report that nothing waits outside, or the rotation stops and the ten
    # resident rows keep every slot until the 30 s poll.
    # Writes go as soon as they can, not after a linger in real time: what lands
    # during the read must not depend on the machine's speed.
    monkeypatch.setattr(persist, "LINGER_S", 0.0)
    table = SlowWritesTable()
    rows = [entry(clock, i, due=0.01 * (i + 1), period=1) for i in range(100)]
    for e in rows:
        await table.upsert(e)
    rec = Recorder()
    options = replace(OPTIONS, base_bucket_size=10, permits=10)
    async with running(table, clock, rec, options=options):
        await _steps(clock, 2)
        table.writes.clear()
        await _steps(clock, 5)
        table.release_on_read = True
        await _steps(clock, 1)
        assert table.raced == 1
        since = len(rec.calls)
        await _steps(clock, 10)
    per_row = _ticks_per_row(rows, rec.calls[since:])
    assert min(per_row.values()) >= 2, sorted(per_row.values())[:10]


class ReturnCountingTable(_Delegate):
    """The in-memory table recording how many rows each due read returned."""

    def __init__(self) -> None:
        super().__init__()
        self.returned: list[int] = []

    async def read_due_skipping(self, *a: Any, **kw: Any) -> Any:
        rows = await self.inner.read_due_skipping(*a, **kw)
        self.returned.append(len(rows))
        return rows


async def test_a_rotation_refill_reads_about_what_it_admits_not_a_bucket(clock) -> None:
    # 200 one-second reminders through a window of 64: each rotation refill
    # admits about an eighth of the bucket, and must read about that many rows
    # (each returned row is fetched and decoded), not a bucket's worth again
    # (the old refill read 68 to 96 rows each time here).
    table = ReturnCountingTable()
    rows = [entry(clock, i, due=0.005 * (i + 1), period=1) for i in range(200)]
    for e in rows:
        await table.upsert(e)
    rec = Recorder()
    options = replace(OPTIONS, base_bucket_size=64, permits=64)
    async with running(table, clock, rec, options=options) as svc:
        for _ in range(50):
            await advance(clock, 0.1)
            for _ in range(20):  # let the tasks catch up with the clock
                await asyncio.sleep(0)
            # Persistence keeps up, as it does in real time (rows released with
            # an update unwritten come back from a read: the table lags).
            await svc.wait_persisted()
        rotation_reads = table.returned[1:]  # after the start's refill
        assert svc.stats.rotated > 0 and len(rotation_reads) > 5
    # What it wants (free space + an eighth) plus released rows whose update is
    # not written yet (the table has them earlier: they come first).
    assert sum(rotation_reads) / len(rotation_reads) <= 64 // 2, rotation_reads
    assert max(rotation_reads) < 64, rotation_reads
    assert len(set(rec.keys())) == 200  # every row got ticks: the rotation still turns


# -- hand-over and permits ---------------------------------------------------------------


async def test_drain_finishes_ticks_in_flight_persists_them_and_delivers_nothing_more(
    table, clock
) -> None:
    await table.upsert(entry(clock, 1, due=10, period=10))
    await table.upsert(entry(clock, 2, due=11, period=10))
    rec = Recorder()
    rec.gate = asyncio.Event()
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: rec.blocked == 1, 5.0, interval=0)  # row 1 in flight
        drained = asyncio.create_task(svc.drain())
        await advance(clock, 1)  # row 2 falls due: not delivered any more
        await asyncio.sleep(0)
        assert not drained.done()
        rec.gate.set()
        assert await drained is True
        # Row 1's tick finished and its next slot is in the table before drain returned.
        assert (await table.read(GrainId("G", 1), "r")).next_due == START + 20 * S
        await advance(clock, 30)
        await clock.settle()
        assert rec.keys() == ["G/i:1|r"]
        assert (await table.read(GrainId("G", 2), "r")).next_due == START + 11 * S


async def test_a_tick_stuck_on_the_call_path_gives_its_permit_back(table, clock) -> None:
    # One permit. Row 1's call times out (as a call to an unreachable peer does
    # once its deadline passes) and waits 5 s for its retry: row 2, due at +11,
    # gets the permit at once instead of waiting behind it.
    await table.upsert(entry(clock, 1, due=10, period=10))
    await table.upsert(entry(clock, 2, due=11, period=10))
    rec = Recorder()
    rec.failures["r"] = [GrainCallTimeoutError("no answer within 10 s")]
    slow_retry = replace(OPTIONS, permits=1, retry_initial=5 * S, retry_max=5 * S)
    async with running(table, clock, rec, options=slow_retry) as svc:
        await advance(clock, 10)
        await wait_for(lambda: svc.stats.retries == 1, 5.0, interval=0)
        await advance(clock, 1)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.keys() == ["G/i:2|r"]
        # Row 1 is retried after its backoff, on its slot (inside the grace).
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 2, 5.0, interval=0)
        assert rec.keys()[1] == "G/i:1|r"
        assert rec.calls[1][1].current_tick_time == START + 10 * S
    # Each call was given the row's period as its deadline (10 s: within 2 .. 10 s).
    assert set(rec.deadlines) == {10.0}


async def test_a_row_whose_calls_keep_failing_is_tried_ever_more_rarely(table, clock) -> None:
    # The backoff carries over slots: a row whose grain stays unreachable does not
    # take a permit once per slot, and the healthy row beside it ticks every slot.
    await table.upsert(entry(clock, 1, "stuck", due=10, period=10))
    await table.upsert(entry(clock, 2, "ok", due=10, period=10))
    rec = Recorder()
    rec.failures["stuck"] = [GrainCallTimeoutError("unreachable")] * 1000
    options = replace(OPTIONS, permits=1, retry_initial=S / 10, retry_max=60 * S)
    async with running(table, clock, rec, options=options) as svc:
        for _ in range(60):  # 300 s: 30 slots
            await advance(clock, 5)
        await wait_for(lambda: len(rec.slots("ok")) == 30, 5.0, interval=0)
        stuck_attempts = rec.attempts - len(rec.calls)
        # 0.1, 0.2, 0.4 ... 51.2 s, then 60 s apart: about 13, not 30+.
        assert 8 <= stuck_attempts <= 16, stuck_attempts
        assert svc.stats.in_flight == 0
