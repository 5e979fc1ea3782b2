"""The reminder service's private parts: bucket formula, ownership, window, lanes and
their drainer, backoff."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy._retry import Backoff
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders._service.adaptive import LoadSignals, bucket_size, read_memory_load
from orleanspy.reminders._service.delivery import call_wait
from orleanspy.reminders._service.history import History
from orleanspy.reminders._service.lanes import LaneDrainer, Lanes
from orleanspy.reminders._service.missed import TickPlan, plan_tick
from orleanspy.reminders._service.ownership import Ownership
from orleanspy.reminders._service.window import DueWindow, Row, RowState
from orleanspy.reminders.calendars import Calendar, Excluded
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    RetryPolicy,
)
from orleanspy.reminders.schedule import schedule_for
from orleanspy.ring import HASH_SPACE, RingRange, ranges_contain
from orleanspy.testing.cluster import wait_for

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


def _row(i: int, due_s: float, priority: int = 0, action: MissedReminderAction = 2) -> Row:
    entry = ReminderEntry(
        service_id="default",
        grain_id=GrainId("G", i),
        name="r",
        start_at=T0,
        next_due=T0 + due_s * S,
        period=10 * S,
        priority=priority,
        action=MissedReminderAction(action),
        etag="1",
    )
    return Row(entry, schedule_for(entry), entry.next_due, None)


# -- adaptive ----------------------------------------------------------------------------


def test_bucket_size_matches_the_design_example() -> None:
    # 16 cores, 60 % memory, 40 000 grains -> 1024 x 4 x 0.4 x 1
    assert bucket_size(1024, LoadSignals(16, 0.6, 40_000)) == 1638


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        (LoadSignals(2, 0.0, 0), 1024),  # fewer than 4 cores count as one
        (LoadSignals(8, 0.0, 100_000), 1024),  # 2 x 0.5
        (LoadSignals(4, 0.95, 0), 256),  # memory factor floors at 0.25
        (LoadSignals(4, 0.0, 10), 1024),  # few grains never enlarge the window
        (LoadSignals(1, 1.0, 10**9), 1),  # never below one row
    ],
)
def test_bucket_size_factors(signals: LoadSignals, expected: int) -> None:
    assert bucket_size(1024, signals) == expected


def test_memory_load_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree: 100 kB\nMemAvailable:  250 kB\n")
    assert read_memory_load(str(meminfo)) == pytest.approx(0.75)
    assert read_memory_load(str(tmp_path / "missing")) == 0.0


# -- ownership ---------------------------------------------------------------------------


def test_ownership_loads_only_ranges_not_held_before() -> None:
    own = Ownership()
    half = HASH_SPACE // 2
    assert own.update([RingRange(0, half)]) == [RingRange(0, half)]
    assert not own.owns_everything()
    # A split of an owned range needs no load; a range beyond it does.
    assert own.update([RingRange(0, 100), RingRange(100, half)]) == []
    assert own.update([RingRange(0, 100), RingRange(half, half + 5)]) == [RingRange(half, half + 5)]
    assert own.update([RingRange(0, 0)]) == [RingRange(0, 0)]
    assert own.owns_everything()
    assert own.update([RingRange(7, 3)]) == []  # everything was owned
    assert not own.owns_everything()
    g = GrainId("G", 1)
    assert own.owns(g) == (g.uniform_hash() in RingRange(7, 3))
    assert own.update([RingRange(3, 7), RingRange(7, 3)]) == [RingRange(3, 7)]
    assert own.owns_everything()


def test_ownership_holds_a_handed_over_part_until_its_time() -> None:
    own = Ownership()
    half = HASH_SPACE // 2
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    assert own.assign([RingRange(0, half)]) == [RingRange(0, half)]
    # The ring adds (half, 0]; its first quarter comes from a live silo: held.
    quarter = half + half // 2
    loaded = own.assign(
        [RingRange(0, half), RingRange(half, 0)], hold=[RingRange(half, quarter)], until=t0
    )
    # What is loaded now covers the new part not held (whole ranges may be
    # re-read: the window never loads a row twice), never the held part.
    assert ranges_contain(loaded, quarter + 1) and not ranges_contain(loaded, half + 1)
    assert own.next_release == t0
    assert not own.owns_hash(half + 1) and own.owns_hash(quarter + 1)
    assert own.release(t0 - timedelta(milliseconds=1)) == []
    # A ring change meanwhile keeps the hold for what is still assigned.
    own.assign([RingRange(0, 0)])
    assert not own.owns_hash(half + 1)
    assert ranges_contain(own.release(t0), half + 1)
    assert own.owns_hash(half + 1) and own.next_release is None
    # A hold of ranges no longer assigned goes away with them.
    own.assign([RingRange(0, half)], hold=[RingRange(half, quarter)], until=t0)
    assert own.next_release is None


# -- window ------------------------------------------------------------------------------


def test_window_keeps_the_earliest_rows_and_evicts_later_queued_ones() -> None:
    w = DueWindow(3)
    loaded, evicted = w.merge([_row(1, 30), _row(2, 20), _row(3, 40)])
    assert (loaded, evicted) == (3, [])
    loaded, evicted = w.merge([_row(4, 10), _row(5, 50)])
    assert loaded == 1 and [r.entry.grain_id.key for r in evicted] == [3]
    assert len(w) == 3 and w.head_due() == T0 + 10 * S
    assert [r.entry.grain_id.key for r in w.pop_due(T0 + 25 * S)] == [4, 2]
    # Due rows keep their room: nothing can evict them.
    loaded, evicted = w.merge([_row(6, 1), _row(7, 2)])
    assert loaded == 1 and [r.entry.grain_id.key for r in evicted] == [1]
    assert len(w) == 3 and w.high_water == 3


def test_window_evicts_the_worst_queued_row_as_it_fills_and_empties_again() -> None:
    # Random admissions, ticks and releases that cross "full" and "under half
    # full" many times (the eviction heap is built on demand and dropped below
    # half): every eviction must take the worst queued row by brute force.
    rnd = random.Random(7)
    window = DueWindow(16)
    rows = [_row(i, rnd.uniform(0, 100), priority=rnd.choice([-60, 0, 0, 60])) for i in range(400)]
    fresh = iter(rows)
    for step in range(2_000):
        queued = [r for r in rows if r.state is RowState.QUEUED]
        if step % 200 < 120:  # filling: admit candidates, checking who loses
            candidate = next(fresh, None)
            if candidate is None:
                break

            def key(r: Row) -> tuple[int, datetime]:
                return (-r.priority, r.next_due)

            worst = max(queued, key=key, default=None)
            full = len(window) >= window.bucket_size
            loaded, evicted = window.merge([candidate])
            if full and worst is not None:
                better = key(candidate) < key(worst)
                assert (loaded, evicted) == ((1, [worst]) if better else (0, []))
            else:
                assert (loaded, evicted) == (1, [])
        elif queued:  # emptying: release rows as their ticks would
            window.release(rnd.choice(queued))
        assert len(window) <= window.bucket_size


def test_an_ordered_merge_builds_no_candidate_after_the_first_that_loses() -> None:
    w = DueWindow(3)
    w.merge([_row(1, 10), _row(2, 20), _row(3, 30)])
    drawn: list[int] = []

    def candidates() -> Iterator[Row]:
        for i, due in ((4, 5), (5, 15), (6, 35), (7, 40)):  # best first
            drawn.append(i)
            yield _row(i, due)

    loaded, evicted = w.merge(candidates(), ordered=True)
    # 4 and 5 beat the worst queued rows (3, then 2); 6 loses, so 7 is never built.
    assert loaded == 2 and [r.entry.grain_id.key for r in evicted] == [2, 3]
    assert drawn == [4, 5, 6]


def _rotating_window(bucket: int) -> DueWindow:
    w = DueWindow(bucket)
    w.merge([_row(i, i) for i in range(bucket)])
    return w


def test_a_read_cut_at_its_limit_lets_the_rotation_release_a_batch() -> None:
    # The loader saw only 2 rows waiting, but its read stopped at its limit:
    # the window counts on a batch (a quarter of 64) and asks for the refill
    # after 16 releases, not after 2.
    for more, batch in ((False, 2), (True, 16)):
        w = _rotating_window(64)
        w.left_outside(2, (0, T0 + 0.5 * S), more=more)
        released = 0
        for row in w.pop_due(T0 + 63 * S):
            assert not w.low.is_set()
            w.ticked(row, row.next_due + 100 * S, keep=True)  # after the waiting row
            released += row.state is RowState.GONE
            if w.low.is_set():
                break
        assert released == batch and w.rotated == batch


def test_window_shrinks_to_a_lower_bucket_size() -> None:
    w = DueWindow(4)
    w.merge([_row(i, i) for i in range(4)])
    w.bucket_size = 2
    _, evicted = w.merge([])
    assert [r.entry.grain_id.key for r in evicted] == [2, 3] and len(w) == 2


def test_window_orders_equal_due_times_by_priority() -> None:
    w = DueWindow(10)
    w.merge([_row(1, 5, priority=-100), _row(2, 5, priority=100), _row(3, 5)])
    assert [r.priority for r in w.pop_due(T0 + 5 * S)] == [100, 0, -100]


def test_released_rows_leave_the_heap() -> None:
    w = DueWindow(10)
    rows = [_row(i, i) for i in range(5)]
    w.merge(rows)
    w.release(rows[0])
    assert w.head_due() == T0 + 1 * S and len(w) == 4 and rows[0].state is RowState.GONE


# -- ticks and lanes ---------------------------------------------------------------------


def _plan(row: Row, now: datetime, grace: timedelta) -> TickPlan:
    return plan_tick(row.schedule, row.entry.action, row.next_due, now, grace)


def test_plan_tick_within_grace_delivers_the_slot() -> None:
    # 5 s late on a 10 s grid: the only passed slot, inside the grace.
    plan = _plan(_row(1, 10), T0 + 15 * S, 30 * S)
    assert plan.deliver and not plan.missed and plan.slot == T0 + 10 * S


def test_plan_tick_past_grace_applies_the_action() -> None:
    now = T0 + 95 * S
    fire = _plan(_row(1, 10, action=MissedReminderAction.FIRE_IMMEDIATELY), now, 30 * S)
    # One catch-up for the latest passed slot (+90), the eight before it folded in.
    assert (fire.deliver, fire.slot, fire.missed_ticks, fire.resume) == (
        True,
        T0 + 90 * S,
        8,
        T0 + 100 * S,
    )
    skip = _plan(_row(1, 10, action=MissedReminderAction.SKIP), now, 30 * S)
    assert (skip.deliver, skip.slot, skip.missed_ticks, skip.resume) == (
        False,
        T0 + 10 * S,
        9,
        T0 + 100 * S,
    )


def test_plan_tick_one_slot_past_its_grace_is_missed() -> None:
    row = _row(1, 10, action=MissedReminderAction.SKIP)
    # +10 is 1.5 s late with a 1 s grace; +20 is not due yet.
    late = _plan(row, T0 + 11.5 * S, 1 * S)
    assert (late.deliver, late.missed, late.missed_ticks, late.resume) == (
        False,
        True,
        1,
        T0 + 20 * S,
    )
    assert _plan(row, T0 + 10.5 * S, 1 * S).deliver


@pytest.mark.parametrize("grace_s", [0, 1, 30, 3600, 10**6])
@pytest.mark.parametrize("action", list(MissedReminderAction))
def test_plan_tick_several_passed_slots_never_burst_whatever_the_grace(
    grace_s: int, action: MissedReminderAction
) -> None:
    # A 2 s row whose owner was killed: 11 s later six slots have passed. Each
    # plan is followed as the service follows it (deliver or skip, then resume).
    entry = dataclasses.replace(_row(1, 2, action=action).entry, period=2 * S)
    row = Row(entry, schedule_for(entry), entry.next_due, None)
    now = T0 + 13 * S
    deliveries, slot = 0, row.next_due
    while slot <= now:
        plan = plan_tick(row.schedule, action, slot, now, grace_s * S)
        deliveries += plan.deliver
        slot = plan.resume or row.schedule.next_after(plan.slot)
    assert deliveries == (1 if action is MissedReminderAction.FIRE_IMMEDIATELY else 0)
    assert slot == T0 + 14 * S
    plan = plan_tick(row.schedule, action, row.next_due, now, grace_s * S)
    assert plan.missed and plan.resume == T0 + 14 * S
    if plan.deliver:
        assert (plan.slot, plan.missed_ticks) == (T0 + 12 * S, 5)
    else:
        assert (plan.slot, plan.missed_ticks) == (T0 + 2 * S, 6)


def test_plan_tick_catches_up_a_cron_row_on_its_latest_slot() -> None:
    # Every 10 s by cron, reached 25 s after +10: +10, +20, +30 have passed.
    entry = ReminderEntry(
        service_id="s",
        grain_id=GrainId("G", 1),
        name="r",
        start_at=T0,
        next_due=T0 + 10 * S,
        period=None,
        cron="*/10 * * * * *",
        action=MissedReminderAction.FIRE_IMMEDIATELY,
    )
    plan = plan_tick(schedule_for(entry), entry.action, entry.next_due, T0 + 35 * S, 60 * S)
    assert (plan.deliver, plan.slot, plan.missed_ticks, plan.resume) == (
        True,
        T0 + 30 * S,
        2,
        T0 + 40 * S,
    )


@pytest.mark.parametrize("action", list(MissedReminderAction))
def test_plan_tick_a_bounded_jittered_row_never_bursts_and_ends(
    action: MissedReminderAction,
) -> None:
    # Five slots 10 s apart with up to 3 s of jitter, all passed when the row is
    # reached: at most one delivery, for the latest (jittered) slot, and no slot
    # after it, so the row ends.
    entry = ReminderEntry(
        service_id="s",
        grain_id=GrainId("G", 1),
        name="r",
        start_at=T0,
        next_due=T0,
        period=10 * S,
        action=action,
        jitter=3 * S,
        max_ticks=5,
        final_due=T0 + 40 * S,
    )
    schedule = schedule_for(entry)
    first = schedule.next_after(T0 - timedelta(milliseconds=1))
    assert first is not None
    plan = plan_tick(schedule, action, first, T0 + 60 * S, 30 * S)
    assert plan.missed and plan.ended and plan.resume is None
    last = schedule.next_after(T0 + 40 * S - timedelta(milliseconds=1))
    if action is MissedReminderAction.FIRE_IMMEDIATELY:
        assert (plan.deliver, plan.slot, plan.missed_ticks) == (True, last, 4)
        assert schedule.nominal(plan.slot) == T0 + 40 * S
    else:
        assert (plan.deliver, plan.slot, plan.missed_ticks) == (False, first, 5)


@pytest.mark.parametrize("action", list(MissedReminderAction))
def test_plan_tick_a_one_shot_is_on_time_within_its_grace_else_missed(
    action: MissedReminderAction,
) -> None:
    entry = ReminderEntry(
        service_id="s", grain_id=GrainId("G", 1), name="once", start_at=T0, next_due=T0
    )
    schedule = schedule_for(entry)
    on_time = plan_tick(schedule, action, T0, T0 + 5 * S, 10 * S)
    assert (on_time.deliver, on_time.missed, on_time.resume) == (True, False, None)
    late = plan_tick(schedule, action, T0, T0 + 11 * S, 10 * S)
    assert (
        late.missed
        and late.ended
        and late.missed_ticks == (0 if action is MissedReminderAction.FIRE_IMMEDIATELY else 1)
    )
    assert late.deliver is (action is MissedReminderAction.FIRE_IMMEDIATELY)


def test_a_last_slot_gets_the_longest_tick_deadline() -> None:
    options = ReminderOptions()
    once = ReminderEntry(
        service_id="s", grain_id=GrainId("G", 1), name="once", start_at=T0, next_due=T0
    )
    assert call_wait(schedule_for(once), T0, options) == options.tick_timeout.total_seconds()
    # A 3 s interval row: its period, inside minimum_tick_timeout .. tick_timeout.
    every = dataclasses.replace(once, period=3 * S)
    assert call_wait(schedule_for(every), T0, options) == 3.0


def test_lanes_take_critical_first() -> None:
    lanes = Lanes()
    for i, p in enumerate([-100, 0, 100, -50, 50, 49]):
        lanes.put(_row(i, 0, priority=p))
    order = [lanes.pop().priority for _ in range(6)]  # type: ignore[union-attr]
    assert order == [100, 50, 0, 49, -100, -50]
    assert lanes.pop() is None


def _due_window(rows: int) -> DueWindow:
    window = DueWindow(16)
    for i in range(rows):
        window.push(_row(i, 0))
    assert len(window.pop_due(T0)) == rows
    return window


async def test_drainer_delivers_rows_due_together_in_one_task_when_none_suspends() -> None:
    window = _due_window(5)
    tasks: list[asyncio.Task[object] | None] = []

    async def deliver(row: Row) -> None:
        tasks.append(asyncio.current_task())

    drainer = LaneDrainer(window, permits=4, deliver=deliver)
    drainer.kick()
    await wait_for(lambda: len(tasks) == 5 and drainer.in_flight == 0, 5.0, interval=0)
    assert len(set(tasks)) == 1


async def test_drainer_does_not_hold_rows_behind_a_delivery_that_suspends() -> None:
    window = _due_window(5)
    gate = asyncio.Event()
    delivered: list[str] = []
    first = window.lanes._lanes[1][0].key

    async def deliver(row: Row) -> None:
        if row.key == first:
            await gate.wait()
        delivered.append(row.key)

    drainer = LaneDrainer(window, permits=2, deliver=deliver)
    drainer.kick()
    # The other four go through the second permit while the first row waits.
    await wait_for(lambda: len(delivered) == 4, 5.0, interval=0)
    assert first not in delivered and drainer.in_flight == 1
    gate.set()
    await wait_for(lambda: len(delivered) == 5 and drainer.in_flight == 0, 5.0, interval=0)


def test_backoff_doubles_up_to_the_maximum_with_jitter() -> None:
    b = Backoff(timedelta(milliseconds=100), timedelta(seconds=1), rng=lambda: 1.0)
    assert [round(b.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    low = Backoff(timedelta(milliseconds=100), timedelta(seconds=1), rng=lambda: 0.0)
    assert low.next() == pytest.approx(0.05)


def test_ownership_keeps_the_feed_scope_on_the_owned_ranges() -> None:
    ownership = Ownership()
    scope = ownership.feed_scope
    assert scope.skip_own_writes
    assert scope.ranges == () and not scope.wants_hash(5)
    seen: list[int] = []
    scope.add_listener(lambda: seen.append(scope.version))
    ownership.update([RingRange(0, 10)])
    assert scope.ranges == (RingRange(0, 10),)
    assert scope.wants_hash(5) and not scope.wants_hash(11)
    assert seen == [1]


def test_rescheduled_keeps_every_other_field() -> None:
    # Every field set away from its default, so a field added to ReminderEntry
    # and forgotten in ``rescheduled`` shows up here.
    t = datetime(2030, 1, 1, tzinfo=UTC)
    entry = ReminderEntry(
        service_id="svc",
        grain_id=GrainId("t.G", 7),
        name="r",
        start_at=t,
        next_due=t,
        period=None,
        cron="*/5 * * * * *",
        tz="Europe/Paris",
        last_fire=t - timedelta(seconds=5),
        priority=60,
        action=MissedReminderAction.NOTIFY,
        etag="e1",
        declared=True,
        paused=True,
        fingerprint="abc:60:2",
        grace=timedelta(seconds=3),
        jitter=timedelta(seconds=2),
        starts_at=t,
        ends_at=t + timedelta(days=1),
        max_ticks=9,
        final_due=t + timedelta(seconds=40),
        payload={"k": [1, 2]},
        retry=RetryPolicy(2, timedelta(seconds=1)),
        overlap=OverlapPolicy.CANCEL_OTHER,
        catchup_window=timedelta(minutes=5),
        deadline=timedelta(seconds=4),
        resumed_at=t - timedelta(hours=1),
        trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        labels={"tenant": "acme"},
        calendar="de",
        on_excluded=Excluded.NEXT_BUSINESS_DAY,
        calendar_version=4,
        _calendar_rules=Calendar(exclude_weekdays=[6]),
    )
    later = t + timedelta(seconds=5)
    moved = entry.rescheduled(later, t, "e2")
    assert moved == dataclasses.replace(entry, next_due=later, last_fire=t, etag="e2")
    assert moved.trace_context == entry.trace_context  # not compared by ==
    # (``period`` stays at its default: a row has a period or a cron, not both.)
    at_default = [
        f.name
        for f in dataclasses.fields(entry)
        if f.default is not dataclasses.MISSING and getattr(entry, f.name) == f.default
    ]
    assert at_default == ["period"]


# -- fire history -------------------------------------------------------------------------


class _SlowHistoryTable:
    """``append_history`` that waits for ``release``; records what it wrote."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.written: list[str] = []

    async def append_history(self, records: list[FireRecord], keep: int) -> None:
        self.started.set()
        await self.release.wait()
        self.written += [r.name for r in records]


async def test_history_flush_waits_for_a_batch_already_being_written() -> None:
    # The persister flushes the history before it ends rows: the records a
    # linger batch already took must be in the table by then too, or the end
    # would remove the row before them and they would be dropped.
    table = _SlowHistoryTable()
    history = History(table, keep=10, silo="s")  # type: ignore[arg-type]
    entry = _row(1, 10).entry
    history.fired(entry, T0, T0, FireOutcome.OK)
    linger = asyncio.create_task(history.flush())
    await table.started.wait()  # the linger batch is in flight, the buffer empty
    flush = asyncio.create_task(history.flush())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not flush.done()
    table.release.set()
    await asyncio.gather(linger, flush)
    assert table.written == ["r"]
