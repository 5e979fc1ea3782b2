"""Storage faults against a real private redis-server: a frozen Redis and a restart.

A silo (in this process) keeps its membership, directory and reminder table in
a redis-server child process that the tests SIGSTOP/SIGCONT or kill and
restart. The socket timeout comes from the URL (``?socket_timeout=``) so a
freeze longer than it stays short. Real time: every wait is a poll with a
deadline, and the assertions are about delivered slots, not timing, except the
pick-up bound after a restart, which is the promise itself (within 1 s of due).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
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
from orleanspy.reminders.service import ReminderService
from orleanspy.runtime.silo import SiloState
from orleanspy.testing import wait_for
from orleanspy.testing.redis_server import RedisServer

pytestmark = pytest.mark.slow

MS = timedelta(milliseconds=1)
TYPE = "test_redis_faults.Tick"
PERIOD = 200 * MS
SOCKET_TIMEOUT_S = 1.0
KEYS = range(8)

#: (key, reminder name, slot, time.monotonic() at receipt)
TICKS: list[tuple[int, str, datetime, float]] = []


class FaultTickGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((int(self.grain_key), name, status.current_tick_time, time.monotonic()))

    async def start(self, name: str = "r", due: float = 0.2, period: float = 0.2) -> None:
        await self.register_or_update_reminder(name, due=due, period=period)


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def silo_options(redis: RedisServer, reminders: ReminderOptions) -> SiloOptions:
    return SiloOptions(
        redis_url=f"{redis.url}?socket_timeout={SOCKET_TIMEOUT_S}&socket_connect_timeout=1",
        name="faults",
        grain_types=(FaultTickGrain,),
        membership=MembershipOptions(
            table_refresh_interval=timedelta(milliseconds=300),
            probe_interval=timedelta(milliseconds=300),
            probe_timeout=timedelta(milliseconds=300),
            i_am_alive_interval=timedelta(milliseconds=500),
        ),
        reminders=reminders,
    )


def slots_by_key(name: str = "r") -> dict[int, list[datetime]]:
    out: dict[int, list[datetime]] = defaultdict(list)
    for key, n, slot, _ in TICKS:
        if n == name:
            out[key].append(slot)
    return out


def ticks_since(t: float) -> int:
    return sum(1 for *_, at in TICKS if at >= t)


@pytest.fixture
async def frozen_silo(aof_redis: RedisServer) -> AsyncIterator[Silo]:
    reminders = ReminderOptions(
        # The grace covers the whole freeze, so replayed slots would be
        # delivered as "late but on time" if the service took them as missed
        # work: only recognising its own writes keeps them out.
        look_ahead=timedelta(seconds=20),
        poll_interval=timedelta(seconds=10),
        minimum_period=100 * MS,
        base_bucket_size=64,
        permits=8,
        retry_initial=50 * MS,
        retry_max=300 * MS,
        adaptive=False,
    )
    silo = Silo(silo_options(aof_redis, reminders))
    await silo.start()
    try:
        yield silo
    finally:
        aof_redis.thaw()
        await silo.stop()


async def test_redis_frozen_past_the_socket_timeout_replays_no_slot_under_skip(
    frozen_silo: Silo, aof_redis: RedisServer
) -> None:
    silo = frozen_silo
    service = silo.reminder_service
    assert isinstance(service, ReminderService)
    for k in KEYS:
        await silo.client.get_grain(FaultTickGrain, k).start()
    await wait_for(lambda: len(slots_by_key()) == len(KEYS), 10, interval=0.02, what="first ticks")
    await service.wait_persisted()

    aof_redis.freeze()
    frozen_at = time.monotonic()
    # Ticks go on from memory while every write waits for the frozen store,
    # for three socket timeouts.
    await wait_for(
        lambda: time.monotonic() - frozen_at > 3 * SOCKET_TIMEOUT_S and ticks_since(frozen_at),
        20,
        interval=0.02,
        what="ticks while Redis is frozen",
    )
    assert service.stats.persist_failures > 0, "no write timed out: the freeze proved nothing"
    aof_redis.thaw()
    thawed_at = time.monotonic()
    await wait_for(
        lambda: ticks_since(thawed_at) >= 3 * len(KEYS),
        20,
        interval=0.02,
        what="ticks after the thaw",
    )
    async with asyncio.timeout(20):
        await service.wait_persisted()
    await asyncio.sleep(0)

    by_key = slots_by_key()
    assert len(by_key) == len(KEYS)
    for key, slots in by_key.items():
        # No slot delivered twice, and never a slot older than one already
        # delivered (a reload with the old due time would replay them).
        assert len(slots) == len(set(slots)), f"key {key}: a slot was delivered twice"
        assert slots == sorted(slots), f"key {key}: an older slot came after a newer one"
    assert service.stats.cas_conflicts == 0, "an own write was taken for another writer"
    # The stored schedules caught up with what was delivered.
    table = silo.dispatcher.reminders.table
    for key, slots in by_key.items():
        from orleanspy.identity import GrainId

        row = await table.read(GrainId(TYPE, key), "r")
        assert row is not None and row.next_due > max(slots) - PERIOD
    assert silo.state is SiloState.RUNNING


async def test_reminder_registered_after_a_redis_restart_ticks_within_a_second_of_due(
    aof_redis: RedisServer,
) -> None:
    reminders = ReminderOptions(
        # Frequent polls fail during the outage, so the loader's backoff grows.
        look_ahead=timedelta(seconds=20),
        poll_interval=timedelta(seconds=1),
        minimum_period=100 * MS,
        adaptive=False,
        # The defaults: a backoff grown during the outage can reach 10 s.
        retry_initial=timedelta(milliseconds=100),
        retry_max=timedelta(seconds=10),
    )
    silo = Silo(silo_options(aof_redis, reminders))
    await silo.start()
    try:
        await silo.client.get_grain(FaultTickGrain, 0).start(period=1.0)
        await wait_for(lambda: len(TICKS) >= 2, 10, interval=0.02, what="ticks before the restart")

        aof_redis.kill()
        down_at = time.monotonic()
        # Long enough for the loader's and the feed's backoffs to grow.
        await wait_for(lambda: time.monotonic() - down_at > 6, 10, interval=0.02, what="the outage")
        aof_redis.start()

        results: list[float] = []
        for key in (1, 2, 3):
            registered = time.monotonic()
            await silo.client.get_grain(FaultTickGrain, key).start(name="new", due=1.0, period=60)
            await wait_for(
                lambda k=key: any(t[0] == k and t[1] == "new" for t in TICKS),
                15,
                interval=0.02,
                what=f"the first tick of reminder {key} registered after the restart",
            )
            first = next(at for k_, n, _, at in TICKS if k_ == key and n == "new")
            results.append(first - (registered + 1.0))
        assert max(results) < 1.0, f"first ticks came {results} s after their due time"
        assert silo.state is SiloState.RUNNING
    finally:
        await silo.stop()
