"""Losing Redis for a while loses no reminders and crashes no silo
(docs/architecture.md, section 3: a store that is away).

A cluster silo whose membership, directory and reminder table live in a private
redis-server with an fsync-always append-only file: SIGKILL is an outage, not
a data loss, so "nothing lost" can be checked after the restart. Real time, so
periods are short and every wait is a poll with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from datetime import datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    MembershipOptions,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.ring import RingRange
from orleanspy.runtime.silo import SiloState
from orleanspy.testing import InProcessCluster, wait_for
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.redis_server import RedisServer

MS = timedelta(milliseconds=1)
TYPE = "test_redis_outage.Tick"
PERIOD = 200 * MS
KEYS = range(10)

#: (key, slot, time.monotonic() at receipt)
TICKS: list[tuple[int, datetime, float]] = []


class OutageTickGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((int(self.grain_key), status.current_tick_time, time.monotonic()))

    async def start(self) -> None:
        await self.register_or_update_reminder("r", due=PERIOD, period=PERIOD)


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


@pytest.fixture
async def silo(aof_redis: RedisServer) -> AsyncIterator[Silo]:
    options = SiloOptions(
        grain_types=(OutageTickGrain,),
        membership=MembershipOptions(
            table_refresh_interval=timedelta(milliseconds=300),
            probe_interval=timedelta(milliseconds=300),
            probe_timeout=timedelta(milliseconds=300),
            i_am_alive_interval=timedelta(milliseconds=500),
        ),
        reminders=ReminderOptions(
            # The window outlasts the outage: rows already held stay held.
            look_ahead=timedelta(seconds=6),
            poll_interval=timedelta(seconds=1),
            minimum_period=100 * MS,
            base_bucket_size=64,
            permits=8,
            retry_initial=50 * MS,
            retry_max=300 * MS,
            adaptive=False,
        ),
    )
    async with InProcessCluster(aof_redis.url, size=1, options=options) as cluster:
        yield cluster.silos[0]


def per_key(since: float = 0.0, before: float = float("inf")) -> dict[int, list[datetime]]:
    out: dict[int, list[datetime]] = defaultdict(list)
    for key, slot, at in TICKS:
        if since <= at < before:
            out[key].append(slot)
    return out


def every_key_has(n: int, since: float = 0.0) -> Callable[[], bool]:
    def check() -> bool:
        by = per_key(since)
        return len(by) == len(KEYS) and all(len(v) >= n for v in by.values())

    return check


async def test_ticks_continue_through_a_redis_outage_and_persistence_catches_up(
    silo: Silo, aof_redis: RedisServer
) -> None:
    service = silo.reminder_service
    assert isinstance(service, ReminderService)
    for k in KEYS:
        await silo.client.get_grain(OutageTickGrain, k).start()
    await wait_for(every_key_has(2), 10, interval=0.02, what="ticks before the outage")
    await service.wait_persisted()
    failures_before = service.stats.persist_failures

    aof_redis.kill()
    down = time.monotonic()
    await wait_for(
        every_key_has(8, since=down), 10, interval=0.02, what="ticks while Redis is down"
    )
    assert not aof_redis.running
    assert service.stats.persist_pending > 0  # updates wait for the store
    assert service.stats.persist_failures > failures_before
    last_slot_while_down = {k: max(v) for k, v in per_key(down).items()}

    aof_redis.start()
    up = time.monotonic()
    await wait_for(every_key_has(3, since=up), 10, interval=0.02, what="ticks after the restart")
    async with asyncio.timeout(10):
        await service.wait_persisted()

    # Persistence caught up: every row's stored schedule moved past the ticks
    # delivered while the store was away, and nothing was lost.
    table = silo.dispatcher.reminders.table
    assert await table.count() == len(KEYS)
    for k in KEYS:
        row = await table.read(GrainId(TYPE, k), "r")
        assert row is not None
        assert row.last_fire is not None
        assert row.next_due > last_slot_while_down[k]
    # No slot was skipped or repeated at any point: each grid is unbroken.
    for slots in per_key().values():
        ordered = sorted(slots)
        assert len(set(ordered)) == len(ordered)
        assert {b - a for a, b in itertools.pairwise(ordered)} == {PERIOD}
    assert silo.state is SiloState.RUNNING
    assert not silo.declared_dead


class _SwallowingTable(InMemoryReminderTable):
    """A store whose client, like redis-py's pooled pipelines at times, completes a
    call that was cancelled instead of raising ``CancelledError``."""

    def __init__(self) -> None:
        super().__init__("default")
        self.writing = asyncio.Event()
        self.reading = asyncio.Event()
        self.slow_reads = False

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        if self.slow_reads:
            self.reading.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.2)
        return await super().read(grain_id, name)

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        self.writing.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.2)
        return await super().update_schedule_many(updates)


async def test_service_stops_even_if_the_store_client_swallows_the_cancellation() -> None:
    clock = ManualClock()
    table = _SwallowingTable()
    entry = new_entry(
        ReminderSpec(due=timedelta(seconds=1), period=timedelta(seconds=1)),
        service_id="default",
        grain_id=GrainId(TYPE, 1),
        name="r",
        now=clock.now(),
        options=ReminderOptions(),
    )
    await table.upsert(entry)
    delivered = asyncio.Event()

    async def deliver(entry: ReminderEntry, status: TickStatus, deadline: float = 0.0) -> None:
        delivered.set()

    stack = AsyncExitStack()
    await table.start(stack)
    service = ReminderService(
        table, deliver=deliver, clock=clock, options=ReminderOptions(adaptive=False)
    )
    await service.start(stack)
    service.set_ranges([RingRange.full()])
    await service.refill_now()
    await clock.advance(timedelta(seconds=1))
    async with asyncio.timeout(5):
        await delivered.wait()
        await table.writing.wait()
    # Stop while the persister is inside the write that ignores cancellation.
    async with asyncio.timeout(5):
        await stack.aclose()


async def test_service_stops_even_if_a_row_read_swallows_the_cancellation() -> None:
    clock = ManualClock()
    table = _SwallowingTable()

    async def deliver(entry: ReminderEntry, status: TickStatus, deadline: float = 0.0) -> None:
        pass

    stack = AsyncExitStack()
    await table.start(stack)
    service = ReminderService(
        table, deliver=deliver, clock=clock, options=ReminderOptions(adaptive=False)
    )
    await service.start(stack)
    service.set_ranges([RingRange.full()])
    await service.refill_now()
    table.slow_reads = True
    # A change of an owned row not held: the loader reads that row.
    service.notify_change(ReminderChange(GrainId(TYPE, 7), "r", clock.now() + timedelta(seconds=1)))
    async with asyncio.timeout(5):
        await table.reading.wait()
    # Stop while the loader is inside the read that ignores cancellation.
    async with asyncio.timeout(5):
        await stack.aclose()
