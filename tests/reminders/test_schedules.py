"""One-shot reminders, jitter, bounds, payloads and retries, end to end through the
service on the in-memory table with a manual clock."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orleanspy.errors import ReminderError, SiloUnavailableError
from orleanspy.identity import GrainId
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import (
    FireOutcome,
    MissedReminder,
    MissedReminderAction,
    RetryPolicy,
    TickStatus,
)
from orleanspy.reminders.schedule import schedule_for
from orleanspy.serialization import Codec
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from tests.reminders.test_service import OPTIONS, Recorder, advance, entry, running

START = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


@pytest.fixture
async def table() -> AsyncIterator[InMemoryReminderTable]:
    async with AsyncExitStack() as stack:
        t = InMemoryReminderTable()
        await t.start(stack)
        yield t


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


async def _gone(table: InMemoryReminderTable, name: str, key: int | str = 1) -> None:
    async def missing() -> bool:
        return await table.read(GrainId("G", key), name) is None

    await wait_for(missing, 5.0, interval=0.005, what=f"row {name!r} removed")


# -- one-shot ---------------------------------------------------------------------------


async def test_one_shot_fires_once_then_its_row_is_removed(table, clock) -> None:
    await table.upsert(entry(clock, name="once", period=None, due=5, payload={"order": 7}))
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        await advance(clock, 5)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        _, status = rec.calls[0]
        assert status.current_tick_time == START + 5 * S == status.due_at
        assert status.final and status.period is None and status.cron is None
        assert status.payload == {"order": 7}
        await _gone(table, "once")
        # The row went; its history keeps the final delivery.

        async def recorded() -> bool:
            return len(await table.read_history(GrainId("G", 1), "once")) == 1

        await wait_for(recorded, 5.0, interval=0.01)
        [record] = await table.read_history(GrainId("G", 1), "once")
        assert (record.outcome, record.final, record.slot) == (FireOutcome.OK, True, START + 5 * S)
        await advance(clock, 3600)
        await clock.settle()
        assert len(rec.calls) == 1
        assert svc.stats.delivered == 1


async def test_one_shot_at_fires_at_its_instant(table, clock) -> None:
    at = START + timedelta(minutes=3, milliseconds=250)
    await table.upsert(entry(clock, name="at", period=None, at=at))
    rec = Recorder()
    async with running(table, clock, rec):
        await advance(clock, timedelta(minutes=3))
        await clock.settle()
        assert rec.calls == []
        await advance(clock, timedelta(milliseconds=250))
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert rec.calls[0][1].current_tick_time == at
        await _gone(table, "at")


async def test_a_one_shot_whose_grain_failed_still_ends(table, clock) -> None:
    # At least once, and then it goes: a grain error is the grain's (no retry
    # policy), so the row is removed after that delivery as after a success.
    await table.upsert(entry(clock, name="once", period=None, due=1))
    rec = Recorder()
    rec.failures["once"] = [ValueError("boom")]
    async with running(table, clock, rec) as svc:
        await advance(clock, 1)
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await _gone(table, "once")


async def _missed_one_shot(
    table: InMemoryReminderTable, clock: ManualClock, action: MissedReminderAction
) -> None:
    await table.upsert(entry(clock, name="once", period=None, due=10, action=action))
    await advance(clock, 100)  # down for 90 s past the slot: beyond the 30 s grace


async def test_missed_one_shot_under_skip_is_dropped_with_a_missed_record(table, clock) -> None:
    await _missed_one_shot(table, clock, MissedReminderAction.SKIP)
    rec = Recorder()
    events: list[MissedReminder] = []

    async def publish(event: MissedReminder) -> None:
        events.append(event)

    async with running(table, clock, rec, publish_missed=publish) as svc:
        await wait_for(lambda: len(events) == 1, 5.0, interval=0)
        ev = events[0]
        assert ev.scheduled == START + 10 * S and ev.next_due is None and ev.missed_ticks == 1
        await _gone(table, "once")
        assert rec.calls == [] and svc.stats.skipped == 1


async def test_missed_one_shot_under_fire_immediately_fires_late(table, clock) -> None:
    await _missed_one_shot(table, clock, MissedReminderAction.FIRE_IMMEDIATELY)
    rec = Recorder()
    async with running(table, clock, rec):
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        status = rec.calls[0][1]
        assert status.current_tick_time == START + 10 * S
        assert status.delivered_at == START + 100 * S and status.final
        await _gone(table, "once")


# -- jitter -----------------------------------------------------------------------------


async def test_jitter_spreads_ticks_inside_their_slots_the_same_way_every_time(
    table, clock
) -> None:
    rows = [entry(clock, key=k, due=10, period=10, jitter=4) for k in range(40)]
    for row in rows:
        await table.upsert(row)
    rec = Recorder()
    async with running(table, clock, rec):
        for _ in range(3):
            await advance(clock, 10)
        await advance(clock, 4)
        await wait_for(lambda: len(rec.calls) == 120, 5.0, interval=0)
    offsets: dict[tuple[str, datetime], timedelta] = {}
    for row, status in rec.calls:
        assert status.due_at is not None
        offset = status.due_at - status.current_tick_time
        assert timedelta(0) <= offset < 4 * S, offset
        assert status.delivered_at >= status.due_at
        assert (status.current_tick_time - START) % (10 * S) == timedelta(0)
        # The offset is the row's schedule's: any silo computes the same one.
        assert schedule_for(row).next_after(status.current_tick_time - timedelta(milliseconds=1))
        offsets[(row.key, status.current_tick_time)] = offset
    assert len(offsets) == 120
    assert len(set(offsets.values())) > 60, "offsets are not spread over the window"
    # Deterministic: the same row and slot give the same offset on a fresh schedule.
    for (key, slot), offset in offsets.items():
        row = next(r for r in rows if r.key == key)
        again = schedule_for(row).next_after(slot - timedelta(milliseconds=1))
        assert again == slot + offset


# -- bounds -----------------------------------------------------------------------------


async def test_max_ticks_stops_the_reminder_and_removes_its_row(table, clock) -> None:
    await table.upsert(entry(clock, name="five", due=10, period=10, max_ticks=5))
    rec = Recorder()
    async with running(table, clock, rec) as svc:
        for _ in range(8):
            await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 5, 5.0, interval=0)
        await _gone(table, "five")
        await advance(clock, 60)
        await clock.settle()
        assert svc.stats.ended == 1
    assert rec.slots("five") == [START + 10 * k * S for k in range(1, 6)]
    assert [s.final for _, s in rec.calls] == [False] * 4 + [True]


async def test_ends_at_stops_the_reminder_after_its_last_slot(table, clock) -> None:
    ends = START + 35 * S
    await table.upsert(entry(clock, name="until", due=10, period=10, ends_at=ends))
    rec = Recorder()
    async with running(table, clock, rec):
        for _ in range(6):
            await advance(clock, 10)
        await wait_for(lambda: len(rec.calls) == 3, 5.0, interval=0)
        await _gone(table, "until")
    assert rec.slots() == [START + 10 * S, START + 20 * S, START + 30 * S]
    assert all(s.current_tick_time <= ends for _, s in rec.calls)


async def test_starts_at_holds_the_first_tick_back(table, clock) -> None:
    starts = START + 25 * S
    row = entry(clock, name="later", due=0, period=10, starts_at=starts)
    assert row.next_due == START + 30 * S  # the grid's first slot at or after starts_at
    await table.upsert(row)
    rec = Recorder()
    async with running(table, clock, rec):
        await advance(clock, 30)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
    assert rec.slots() == [START + 30 * S]


# -- retry ------------------------------------------------------------------------------


async def test_retry_redelivers_within_the_slot_and_holds_no_permit(table, clock) -> None:
    # One permit. "flaky" fails twice; while it waits for its retries, "other"
    # (due in between) is delivered: the waiting retry holds no permit.
    options = dataclasses.replace(OPTIONS, permits=1)
    retry = RetryPolicy(3, timedelta(seconds=2))
    await table.upsert(entry(clock, key=1, name="flaky", due=10, period=60, retry=retry))
    await table.upsert(entry(clock, key=2, name="other", due=11, period=60))
    rec = Recorder()
    rec.failures["flaky"] = [ValueError("one"), ValueError("two")]
    async with running(table, clock, rec, options=options) as svc:
        await advance(clock, 10)  # flaky fails (attempt 1), retry at +12
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await advance(clock, 1)  # other is delivered while flaky waits
        await wait_for(lambda: rec.slots("other") == [START + 11 * S], 5.0, interval=0)
        await advance(clock, 1)  # attempt 2 fails, retry at +14
        await wait_for(lambda: svc.stats.grain_errors == 2, 5.0, interval=0)
        await advance(clock, 2)  # attempt 3 succeeds
        await wait_for(lambda: len(rec.slots("flaky")) == 1, 5.0, interval=0)
        status = next(s for e, s in rec.calls if e.name == "flaky")
        assert status.current_tick_time == START + 10 * S
        assert status.attempt == 3 and status.delivered_at == START + 14 * S
        gid = GrainId("G", 1)

        async def three_records() -> bool:
            return len(await table.read_history(gid, "flaky")) == 3

        await wait_for(three_records, 5.0, interval=0.01)
        records = await table.read_history(gid, "flaky")
        assert [(r.attempt, r.outcome) for r in records] == [
            (3, FireOutcome.OK),
            (2, FireOutcome.RETRYING),
            (1, FireOutcome.RETRYING),
        ]
        # The slot was persisted once, after the success: the next slot is +70.
        stored = await table.read(gid, "flaky")
        assert stored is not None and stored.next_due == START + 70 * S


async def test_retry_is_given_up_when_the_next_slot_comes(table, clock) -> None:
    retry = RetryPolicy(10, timedelta(seconds=6))
    await table.upsert(entry(clock, name="bad", due=10, period=10, retry=retry))
    rec = Recorder()
    rec.failures["bad"] = [ValueError(str(i)) for i in range(3)]
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)  # attempt 1 fails at +10; retry at +16
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await advance(clock, 6)  # attempt 2 fails at +16; +22 is past the next slot
        await wait_for(lambda: svc.stats.grain_errors == 2, 5.0, interval=0)
        await advance(clock, 4)  # the slot +20: attempt 1 again, fails
        await wait_for(lambda: svc.stats.grain_errors == 3, 5.0, interval=0)
        await advance(clock, 6)  # its retry at +26 succeeds
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
        assert (svc.stats.grain_retries, svc.stats.retries_given_up) == (2, 1)
    status = rec.calls[0][1]
    assert (status.current_tick_time, status.attempt) == (START + 20 * S, 2)


async def test_a_retry_that_fails_on_the_call_path_is_the_same_attempt_again(table, clock) -> None:
    # Attempt 1 raises in the grain; attempt 2 meets an unreachable silo twice
    # (each time its permit is given back) and then reaches the grain: it is still
    # attempt 2, and the records keep the grain's exception.
    retry = RetryPolicy(3, timedelta(seconds=2))
    await table.upsert(entry(clock, name="flaky", due=10, period=60, retry=retry))
    rec = Recorder()
    rec.failures["flaky"] = [
        ValueError("bad input"),
        SiloUnavailableError("down"),
        SiloUnavailableError("down"),
    ]
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await advance(clock, 2)  # attempt 2: the call path fails
        await wait_for(lambda: svc.stats.retries == 1, 5.0, interval=0)
        await wait_for(lambda: svc.stats.in_flight == 0, 5.0, interval=0)
        while not rec.calls:
            await advance(clock, 0.5)  # through the call-path backoff
        assert rec.attempts == 4 and svc.stats.retries == 2
        [(_, status)] = rec.calls
        assert (status.current_tick_time, status.attempt) == (START + 10 * S, 2)
        gid = GrainId("G", 1)

        async def two_records() -> bool:
            return len(await table.read_history(gid, "flaky")) == 2

        await wait_for(two_records, 5.0, interval=0.01)
        records = await table.read_history(gid, "flaky")
        assert [(r.attempt, r.outcome, r.error) for r in records] == [
            (2, FireOutcome.OK, None),
            (1, FireOutcome.RETRYING, "ValueError: bad input"),
        ]
        await svc.wait_persisted()
        stored = await table.read(gid, "flaky")
        assert stored is not None and stored.next_due == START + 70 * S


async def test_no_retry_by_default(table, clock) -> None:
    await table.upsert(entry(clock, name="plain", due=10, period=10))
    rec = Recorder()
    rec.failures["plain"] = [ValueError("boom")]
    async with running(table, clock, rec) as svc:
        await advance(clock, 10)
        await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)
        await advance(clock, 9)
        await clock.settle()
        assert rec.attempts == 1
        await advance(clock, 1)
        await wait_for(lambda: len(rec.calls) == 1, 5.0, interval=0)
    assert rec.calls[0][1].current_tick_time == START + 20 * S
    assert rec.calls[0][1].attempt == 1


# -- a property through the service -----------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    period_s=st.integers(1, 30),
    jitter_pct=st.one_of(st.none(), st.integers(1, 100)),
    max_ticks=st.one_of(st.none(), st.integers(1, 8)),
    span_s=st.one_of(st.none(), st.integers(0, 200)),
    action=st.sampled_from(list(MissedReminderAction)),
    outage_s=st.one_of(st.none(), st.integers(1, 120)),
)
async def test_the_service_never_ticks_past_the_bounds(
    period_s: int,
    jitter_pct: int | None,
    max_ticks: int | None,
    span_s: int | None,
    action: MissedReminderAction,
    outage_s: int | None,
) -> None:
    # Whatever the schedule, jitter, action and an outage before the start: no
    # tick past ends_at, at most max_ticks, each within its jitter, and the row
    # goes once its last slot has passed.
    clock = ManualClock(START)
    period = period_s * S
    jitter = None if jitter_pct is None else period * jitter_pct / 100
    ends = None if span_s is None else START + span_s * S
    async with AsyncExitStack() as stack:
        table = InMemoryReminderTable()
        await table.start(stack)
        try:
            row = entry(clock, name="b", due=period_s, period=period_s, jitter=jitter,
                        ends_at=ends, max_ticks=max_ticks, action=action)  # fmt: skip
        except ReminderError:
            assert ends is not None and ends < START + period  # no slot at all
            return
        await table.upsert(row)
        if outage_s is not None:
            await clock.advance(outage_s)  # no service yet: slots pass unseen
        rec = Recorder()
        last = ends or START + 240 * S
        async with running(table, clock, rec):
            while clock.now() < last + 2 * period:
                await advance(clock, 1)
            await clock.settle()
        statuses = [s for _, s in rec.calls]
        assert max_ticks is None or len(statuses) <= max_ticks
        for status in statuses:
            assert ends is None or status.current_tick_time <= ends
            assert status.due_at is not None
            assert ends is None or status.due_at <= ends
            offset = status.due_at - status.current_tick_time
            assert timedelta(0) <= offset < (jitter or timedelta(milliseconds=1))
        if ends is not None or max_ticks is not None:
            assert await table.read(row.grain_id, "b") is None, "an ended row was kept"
        if outage_s is None and action is MissedReminderAction.SKIP:
            # No outage: every slot inside the bounds is delivered.
            expected = [
                START + k * period
                for k in range(1, 10_000)
                if START + k * period <= last and (max_ticks is None or k <= max_ticks)
            ]
            if ends is None and max_ticks is None:
                expected = [t for t in expected if t <= clock.now() - period]
                assert [s.current_tick_time for s in statuses][: len(expected)] == expected
            else:
                assert [s.current_tick_time for s in statuses] == expected


def test_rows_and_tick_statuses_with_every_field_travel_through_the_codec() -> None:
    # What client.reminders returns through a gateway, and what a tick carries.
    codec = Codec()
    row = entry(
        ManualClock(START), period=60, jitter=5, ends_at=START + timedelta(days=1),
        max_ticks=10, payload={"id": uuid.UUID(int=3), "at": START, "raw": b"\x01"},
        retry=RetryPolicy(4, 2 * S),
    )  # fmt: skip
    assert codec.decode(codec.encode(row)) == row
    status = TickStatus(
        first_tick_time=START, period=60 * S, cron=None, current_tick_time=START,
        delivered_at=START, due_at=START + 2 * S, payload=row.payload, attempt=2, final=True,
    )  # fmt: skip
    assert codec.decode(codec.encode(status)) == status
