"""The reminder service's private parts: bucket formula, ownership, window, lanes and
their drainer, backoff."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy._retry import Backoff
from orleanspy.identity import GrainId
from orleanspy.reminders._service.adaptive import LoadSignals, bucket_size, read_memory_load
from orleanspy.reminders._service.lanes import LaneDrainer, Lanes
from orleanspy.reminders._service.missed import TickPlan, plan_tick
from orleanspy.reminders._service.ownership import Ownership
from orleanspy.reminders._service.window import DueWindow, Row, RowState
from orleanspy.reminders.model import MissedReminderAction, ReminderEntry
from orleanspy.reminders.schedule import schedule_for
from orleanspy.ring import HASH_SPACE, RingRange
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
    # A split of an owned range needs no load; a range beyond it does.
    assert own.update([RingRange(0, 100), RingRange(100, half)]) == []
    assert own.update([RingRange(0, 100), RingRange(half, half + 5)]) == [RingRange(half, half + 5)]
    assert own.update([RingRange(0, 0)]) == [RingRange(0, 0)]
    assert own.update([RingRange(7, 3)]) == []  # everything was owned
    g = GrainId("G", 1)
    assert own.owns(g) == (g.uniform_hash() in RingRange(7, 3))


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


def _plan(row: Row, now: datetime, grace: timedelta, *, reloaded: bool = False) -> TickPlan:
    return plan_tick(row.schedule, row.entry.action, row.next_due, now, grace, reloaded=reloaded)


def test_plan_tick_within_grace_delivers_the_slot() -> None:
    plan = _plan(_row(1, 10), T0 + 35 * S, 30 * S)
    assert plan.deliver and not plan.missed and plan.slot == T0 + 10 * S


def test_plan_tick_past_grace_applies_the_action() -> None:
    now = T0 + 95 * S
    fire = _plan(_row(1, 10, action=MissedReminderAction.FIRE_IMMEDIATELY), now, 30 * S)
    assert (fire.deliver, fire.missed_ticks, fire.resume) == (True, 8, T0 + 100 * S)
    skip = _plan(_row(1, 10, action=MissedReminderAction.SKIP), now, 30 * S)
    assert (skip.deliver, skip.missed_ticks, skip.resume) == (False, 9, T0 + 100 * S)


def test_plan_tick_of_a_reloaded_row_behind_by_several_slots_applies_the_action() -> None:
    # A row read back from the table 25 s behind its 10 s grid, inside a 30 s grace:
    # the slots at 10, 20 and 30 s have passed, so they count as missed.
    now = T0 + 35 * S
    row = _row(1, 10, action=MissedReminderAction.SKIP)
    assert _plan(row, now, 30 * S).deliver  # a held row: late but on time
    skip = _plan(row, now, 30 * S, reloaded=True)
    assert (skip.deliver, skip.missed_ticks, skip.resume) == (False, 3, T0 + 40 * S)
    fire = _plan(
        _row(1, 10, action=MissedReminderAction.FIRE_IMMEDIATELY), now, 30 * S, reloaded=True
    )
    assert (fire.deliver, fire.missed_ticks, fire.slot) == (True, 2, T0 + 10 * S)
    # Behind by less than one period: an ordinary late tick.
    assert _plan(row, T0 + 15 * S, 30 * S, reloaded=True).deliver


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
    )
    later = t + timedelta(seconds=5)
    assert entry.rescheduled(later, t, "e2") == dataclasses.replace(
        entry, next_due=later, last_fire=t, etag="e2"
    )
    # (``period`` stays at its default: a row has a period or a cron, not both.)
    at_default = [
        f.name
        for f in dataclasses.fields(entry)
        if f.default is not dataclasses.MISSING and getattr(entry, f.name) == f.default
    ]
    assert at_default == ["period"]
