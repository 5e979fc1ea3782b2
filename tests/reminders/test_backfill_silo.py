"""Backfill on embedded silos with a manual clock: every slot of a past range
delivered in order as backfill ticks, at the bounded rate, visible while it
runs, resumed by the next silo after a stop, cancelled, and bad input refused
with nothing written."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import FireOutcome
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

T0 = datetime(2030, 3, 1, 12, tzinfo=UTC)
MIN = timedelta(minutes=1)
#: One backfilled slot a second: the test moves the clock slot by slot.
REMINDERS = ReminderOptions(base_bucket_size=64, permits=4, adaptive=False, backfill_rate=1.0)
TICKS: list[tuple[str, TickStatus]] = []
GID = GrainId("test_backfill.Filled", "a")


class FilledGrain(Grain, Remindable, type_name="test_backfill.Filled"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((name, status))

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


@pytest.fixture(autouse=True)
def _clear_ticks() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def backfilled() -> list[datetime]:
    return [s.current_tick_time for _, s in TICKS if s.backfill]


def options() -> SiloOptions:
    return SiloOptions(grain_types=(FilledGrain,), reminders=REMINDERS)


async def test_every_slot_of_the_range_is_delivered_in_order_at_the_rate() -> None:
    clock = ManualClock(T0)
    async with Silo.local(options(), clock=clock) as silo:
        # Every minute, registered now: the range lies before the reminder existed.
        await silo.client.get_grain(FilledGrain, "a").register("tick", {"due": 60, "period": 60})
        mgmt = silo.client.reminders
        job = await mgmt.backfill(GID, "tick", T0 - 10 * MIN, T0, overlap="skip")
        assert (job.total, job.delivered, job.next, job.overlap) == (10, 0, T0 - 10 * MIN, "SKIP")
        # The first slot goes at once; the next waits a second (backfill_rate).
        await wait_for(lambda: len(backfilled()) == 1, 5.0, interval=0)
        await clock.advance(0.5)
        assert len(backfilled()) == 1
        await clock.advance(0.5)
        await wait_for(lambda: len(backfilled()) == 2, 5.0, interval=0)
        await wait_for(lambda: _delivered_stored(mgmt, 2), 5.0, interval=0)
        [running] = await mgmt.backfills()
        assert running.next == T0 - 8 * MIN and running.total == 10
        for _ in range(8):
            await clock.advance(1)
        await wait_for(lambda: len(backfilled()) == 10, 5.0, interval=0)
        assert backfilled() == [T0 - (10 - i) * MIN for i in range(10)]
        statuses = [s for _, s in TICKS if s.backfill]
        assert all(s.first_tick_time == T0 + MIN for s in statuses)
        assert all(s.due_at == s.current_tick_time and not s.triggered for s in statuses)
        await wait_for(_no_backfills(mgmt), 5.0, interval=0)
        svc = silo.reminder_service
        assert svc is not None and svc.stats.backfilled == 10
        # The live schedule is untouched: its first slot comes on time.
        await clock.advance(T0 + MIN - clock.now())
        await wait_for(lambda: any(not s.backfill for _, s in TICKS), 5.0, interval=0)

        # History is written behind the ticks (in real time): wait for the live one.
        async def live_recorded() -> bool:
            return any(not r.backfill for r in await mgmt.history(GID, "tick"))

        await wait_for(live_recorded, 5.0)
        history = await mgmt.history(GID, "tick")
        assert [r.backfill for r in history[:2]] == [False, True]
        assert history[1].slot == T0 - MIN and history[1].outcome is FireOutcome.OK


def _no_backfills(mgmt: Any) -> Any:
    async def check() -> bool:
        return await mgmt.backfills() == []

    return check


async def _delivered_stored(mgmt: Any, n: int) -> bool:
    jobs = await mgmt.backfills()
    return bool(jobs) and jobs[0].delivered >= n


async def test_a_backfill_goes_on_after_its_silo_stops_and_is_cancelled() -> None:
    clock = ManualClock(T0)
    table = InMemoryReminderTable("default")
    async with Silo.local(options(), clock=clock, reminder_table=table) as first:
        await first.client.get_grain(FilledGrain, "a").register("tick", {"due": 60, "period": 60})
        await first.client.reminders.backfill(GID, "tick", T0 - 10 * MIN, T0)
        await wait_for(lambda: len(backfilled()) == 1, 5.0, interval=0)
        for _ in range(3):
            await clock.advance(1)
        await wait_for(lambda: len(backfilled()) == 4, 5.0, interval=0)
        await wait_for(lambda: _delivered_stored(first.client.reminders, 4), 5.0, interval=0)
    # The silo stopped between two slots: the next one goes on where it stopped.
    [job] = await table.read_backfills()
    assert (job.delivered, job.next) == (4, T0 - 6 * MIN)
    async with Silo.local(options(), clock=clock, reminder_table=table) as second:
        await wait_for(lambda: len(backfilled()) == 5, 5.0, interval=0)
        await clock.advance(1)
        await wait_for(lambda: len(backfilled()) == 6, 5.0, interval=0)
        # Not restarted, none lost, none twice.
        assert backfilled() == [T0 - (10 - i) * MIN for i in range(6)]
        mgmt = second.client.reminders
        assert await mgmt.cancel_backfill(GID, "tick")
        assert not await mgmt.cancel_backfill(GID, "tick")
        for _ in range(5):
            await clock.advance(1)
        # Cancelled before the next slot: nothing after it.
        assert len(backfilled()) == 6
        assert await mgmt.backfills() == []


async def test_backfilled_slots_have_their_own_occurrence_ids() -> None:
    from orleanspy.reminders.model import bind_tick

    live = TickStatus(T0, MIN, None, T0, T0)
    filled = TickStatus(T0, MIN, None, T0, T0, backfill=True)
    for status in (live, filled):
        bind_tick(status, "default", GID, "tick")
    assert live.occurrence_id != filled.occurrence_id
    again = TickStatus(T0, MIN, None, T0, T0 + MIN, backfill=True)
    bind_tick(again, "default", GID, "tick")
    assert again.occurrence_id == filled.occurrence_id  # the same slot, delivered again


async def test_bad_backfills_are_refused_and_write_nothing() -> None:
    clock = ManualClock(T0)
    async with Silo.local(options(), clock=clock) as silo:
        grain = silo.client.get_grain(FilledGrain, "a")
        await grain.register("tick", {"due": 60, "period": 60})
        await grain.register("daily", {"cron": "0 0 9 * * *"})
        mgmt = silo.client.reminders
        cases: list[tuple[tuple[Any, ...], str]] = [
            ((GID, "tick", T0, T0), "is not before end"),
            ((GID, "tick", T0, T0 - MIN), "is not before end"),
            ((GID, "nope", T0 - MIN, T0), "has no reminder 'nope'"),
            ((GrainId("test_backfill.Filled", "zz"), "tick", T0 - MIN, T0), "has no reminder"),
            ((GID, "tick", T0 - MIN, T0 + MIN), "after now"),
            ((GID, "tick", datetime(2030, 3, 1), T0), "timezone-aware"),
            ((GID, "daily", T0 - 2 * MIN, T0), "no slot in"),
            ((GID, "tick", T0 - timedelta(days=100), T0), "more than 100000 slots"),
            ((GID, "tick", T0 - MIN, T0, "sometimes"), "not an overlap policy"),
        ]
        for args, message in cases:
            with pytest.raises(ReminderError, match=message):
                await mgmt.backfill(*args)
        assert await mgmt.backfills() == []
        await mgmt.backfill(GID, "tick", T0 - 5 * MIN, T0)
        with pytest.raises(ReminderError, match="is running"):
            await mgmt.backfill(GID, "tick", T0 - 2 * MIN, T0)
        assert [j.total for j in await mgmt.backfills()] == [5]


class _CountingTable(InMemoryReminderTable):
    """Counts the reads of the backfill jobs."""

    job_reads = 0

    async def read_backfills(self) -> list[Any]:
        self.job_reads += 1
        return await super().read_backfills()


@pytest.mark.parametrize("sole", [True, False])
async def test_a_lone_silo_reads_the_jobs_once_a_poll_and_a_shared_one_each_second(
    sole: bool,
) -> None:
    """Jobs asked for through another silo start within ``JOB_POLL``; a silo that
    owns the whole ring has no other silo to ask through, so it reads them once a
    ``poll_interval`` (kicks start its own at once) and a day of manual time
    costs it a few wake-ups, not 86,400."""
    from orleanspy.reminders._service.backfill import JOB_POLL, BackfillRunner

    table = _CountingTable()
    clock = ManualClock(T0)
    opts = ReminderOptions(poll_interval=timedelta(minutes=10), look_ahead=timedelta(minutes=20))

    async def deliver(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no job: nothing to deliver")

    runner = BackfillRunner(
        table, table, clock, opts, owns=lambda g: True, sole=lambda: sole, deliver=deliver
    )
    task = asyncio.create_task(runner.run())
    try:
        await wait_for(lambda: table.job_reads == 1, 5.0, interval=0)
        await clock.advance(hours=1)
        per_hour = 3600 / (opts.poll_interval if sole else JOB_POLL).total_seconds()
        assert table.job_reads == 1 + per_hour
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
