"""One-shot, bounded, jittered and retried reminders through the service on real
Redis and PostgreSQL: the row's fields survive the store, the row is removed
after its last tick with its history kept, and a retried slot is persisted once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome, ReminderEntry, RetryPolicy
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.schedule import schedule_for
from orleanspy.reminders.table import EndingReminderTable, ReminderTable
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from tests.reminders.test_service import Recorder, advance, entry, running

START = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)


@asynccontextmanager
async def _table(kind: str, url: str) -> AsyncIterator[ReminderTable]:
    async with AsyncExitStack() as stack:
        sid = f"sched-{uuid.uuid4().hex[:8]}"
        table: ReminderTable
        if kind == "redis":
            table = RedisReminderTable(url, service_id=sid)
        else:
            table = PostgresReminderTable(url, service_id=sid)
        await table.start(stack)
        yield table


@pytest.fixture(params=["redis", "postgres"])
def store(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The backend and its URL (a sync fixture: the PostgreSQL one is sync)."""
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "postgres_url")
    return request.param, url


def _row(clock: ManualClock, table: ReminderTable, **kw: Any) -> ReminderEntry:
    return replace(entry(clock, **kw), service_id=getattr(table, "service_id", "default"))


async def test_schedules_end_and_retry_on_a_real_store(store: tuple[str, str]) -> None:
    async with _table(*store) as table:
        await _end_and_retry(table)


async def _end_and_retry(table: ReminderTable) -> None:
    clock = ManualClock(START)
    payload = {"order": 7, "at": START}
    rows = [
        _row(clock, table, key=1, name="once", period=None, due=5, payload=payload),
        _row(clock, table, key=2, name="three", due=10, period=10, max_ticks=3, jitter=3),
        _row(clock, table, key=3, name="flaky", due=10, period=60, retry=RetryPolicy(2, 2 * S)),
    ]
    for row in rows:
        await table.upsert(row)
    rec = Recorder()
    rec.failures["flaky"] = [ValueError("once")]
    three_slots = schedule_for(rows[1])

    def expected(now: datetime) -> tuple[int, int]:
        """Ticks delivered and grain errors by ``now``: once at +5, three's jittered
        slots, flaky's failure at +10 and its retry at +12."""
        ticks = (now >= START + 5 * S) + (now >= START + 12 * S)
        ticks += three_slots.slots_between(START, now)
        return ticks, int(now >= START + 10 * S)

    async with running(table, clock, rec) as svc:
        for _ in range(45):
            await advance(clock, 1)
            # The store is real: its I/O runs in real time, so each second's work
            # is awaited before the clock moves on (a jump past it would make the
            # ticks late, and a late tick with a passed slot behind it is missed).
            want = expected(clock.now())
            await wait_for(
                lambda: (len(rec.calls), svc.stats.grain_errors) == want,
                10.0,
                interval=0.01,
                what=f"{want} by {clock.now()}",
            )
        assert len(rec.calls) == 5
        await svc.wait_persisted()

        async def ended() -> bool:
            return all(
                [
                    await table.read(GrainId("G", k), n) is None
                    for k, n in ((1, "once"), (2, "three"))
                ]
            )

        await wait_for(ended, 10.0, interval=0.01)
        flaky = await table.read(GrainId("G", 3), "flaky")
        # The ended rows' histories keep their final deliveries.
        assert isinstance(table, EndingReminderTable)
        once_history = await table.read_history(GrainId("G", 1), "once")
        three_history = await table.read_history(GrainId("G", 2), "three")
    once = [s for e, s in rec.calls if e.name == "once"]
    assert [(s.payload, s.final) for s in once] == [(payload, True)]
    three = [s for e, s in rec.calls if e.name == "three"]
    assert [s.current_tick_time for s in three] == [START + k * 10 * S for k in (1, 2, 3)]
    assert all(
        s.due_at is not None and timedelta(0) <= s.due_at - s.current_tick_time < 3 * S
        for s in three
    )
    assert [s.final for s in three] == [False, False, True]
    [retried] = [s for e, s in rec.calls if e.name == "flaky"]
    assert (retried.attempt, retried.delivered_at) == (2, START + 12 * S)
    assert flaky is not None and flaky.next_due == START + 70 * S
    assert flaky.retry == RetryPolicy(2, 2 * S)
    assert [(r.outcome, r.final) for r in once_history] == [(FireOutcome.OK, True)]
    assert [r.final for r in three_history] == [True, False, False]
