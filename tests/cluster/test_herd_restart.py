"""Herd control after a full restart: two in-process silos start over overdue
rows in a real Redis and ramp their catch-up ticks, by default (5,000 rows) and
as configured (``ReminderOptions.catch_up_rate`` / ``catch_up_ceiling``, 20,000
rows), critical rows first, losing none."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    MembershipOptions,
    MissedReminderAction,
    Remindable,
    ReminderOptions,
    ReminderPriority,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing.cluster import InProcessCluster

TYPE = "test_herd_restart.Herd"
ROWS = 20_000
# Per silo. The ceiling is below what one silo of this machine delivers
# unthrottled (1,400 to 2,600 first ticks a second, each activating its grain),
# so the bound is the throttle's, not the machine's.
RATE = 200.0  # at the start of the catch-up
CEILING = 800.0

#: (silo, time.monotonic(), key, priority) of every tick received.
TICKS: list[tuple[str, float, int, int]] = []


class HerdGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append(
            (
                str(self._activation.silo_address),
                time.monotonic(),
                int(self.grain_key),
                status.priority,
            )
        )


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def _max_in_a_second(times: list[float]) -> int:
    times = sorted(times)
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] < t - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


async def _outage(redis_url: str, rows: int) -> None:
    """Every row's slot passed ten minutes ago (FIRE_IMMEDIATELY: one catch-up
    tick each), one row in ten critical."""
    now = datetime.now(UTC)
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        entries = [
            new_entry(
                ReminderSpec(
                    due=timedelta(minutes=60),
                    period=timedelta(hours=1),
                    priority=ReminderPriority.CRITICAL if k % 10 == 0 else 0,
                    action=MissedReminderAction.FIRE_IMMEDIATELY,
                ),
                service_id="default",
                grain_id=GrainId(TYPE, k),
                name="r",
                now=now - timedelta(minutes=70),
                options=ReminderOptions(),
            )
            for k in range(rows)
        ]
        for i in range(0, rows, 2000):
            await table.upsert_many(entries[i : i + 2000])


def _critical_first(ticks: list[tuple[float, int]]) -> tuple[int, int]:
    """(critical ticks before the median normal tick, critical ticks) of one silo."""
    critical = sorted(at for at, p in ticks if p == ReminderPriority.CRITICAL)
    normal = sorted(at for at, p in ticks if p != ReminderPriority.CRITICAL)
    if not critical or not normal:
        return len(critical), len(critical)
    median = normal[len(normal) // 2]
    return sum(1 for at in critical if at < median), len(critical)


def _by_silo() -> dict[str, list[tuple[float, int]]]:
    by_silo: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for silo, at, _, priority in TICKS:
        by_silo[silo].append((at, priority))
    return by_silo


@pytest.mark.slow
async def test_a_cluster_restarting_over_overdue_rows_ramps_by_default(redis_url: str) -> None:
    """Herd control is on by default: with ``ReminderOptions()`` as it comes, the
    catch-up of a full restart starts at ``catch_up_rate`` a second per silo and
    doubles at most each second, critical rows first, and every row gets its one
    catch-up tick (benchmarks/bench_herd_restart.py measures 100,000 rows on 3
    silo processes)."""
    rows = 5_000
    await _outage(redis_url, rows)
    defaults = ReminderOptions()
    assert defaults.catch_up_rate > 0
    template = SiloOptions(
        grain_types=(HerdGrain,),
        membership=MembershipOptions(
            table_refresh_interval=timedelta(milliseconds=300),
            probe_interval=timedelta(milliseconds=300),
        ),
    )
    async with InProcessCluster(redis_url, size=2, options=template):
        async with asyncio.timeout(120):
            while len({k for _, _, k, _ in TICKS}) < rows:
                await asyncio.sleep(0.1)
    assert {k for _, _, k, _ in TICKS} == set(range(rows)), "a catch-up tick was lost"
    for silo, ticks in _by_silo().items():
        times = [at for at, _ in ticks]
        first = sum(1 for t in times if t < min(times) + 1.0)
        # Doubling from the rate: at most rate * (2 - 1) / ln 2 in the first second,
        # plus the calls in flight (permits) that land together.
        bound = defaults.catch_up_rate / 0.693 * 1.05 + defaults.permits
        assert first <= bound, f"{silo}: {first} in the first second (bound {bound:.0f})"
        early, critical = _critical_first(ticks)
        assert early >= 0.9 * critical, f"{silo}: {early}/{critical} critical ticks early"
        print(f"{silo}: {len(ticks)} ticks, first second {first}, peak {_max_in_a_second(times)}/s")


@pytest.mark.slow
async def test_a_cluster_restarting_over_overdue_rows_ramps_its_catch_up(redis_url: str) -> None:
    await _outage(redis_url, ROWS)
    reminders = ReminderOptions(
        catch_up_rate=RATE,
        catch_up_ceiling=CEILING,
        # The ramp as configured, without the lag brake (which would hold a busy
        # test machine below the ceiling this checks it reaches).
        catch_up_max_lag=None,
        permits=64,
        base_bucket_size=4096,
        adaptive=False,
    )
    template = SiloOptions(
        grain_types=(HerdGrain,),
        reminders=reminders,
        membership=MembershipOptions(
            table_refresh_interval=timedelta(milliseconds=300),
            probe_interval=timedelta(milliseconds=300),
        ),
    )
    async with InProcessCluster(redis_url, size=2, options=template):
        async with asyncio.timeout(120):
            while len({k for _, _, k, _ in TICKS}) < ROWS:
                await asyncio.sleep(0.1)

    keys = [k for _, _, k, _ in TICKS]
    assert set(keys) == set(range(ROWS)), "a catch-up tick was lost"
    for silo, ticks in _by_silo().items():
        times = [at for at, _ in ticks]
        start = min(times)
        # Bounded as configured: never above the ceiling in any second, and in
        # the first second of the ramp no more than doubling from RATE allows
        # (RATE * (2 - 1) / ln 2). Calls start on the ramp's spacing, but land
        # in the grain after their call's latency: the ``permits`` in flight can
        # land together, hence that much room.
        peak = _max_in_a_second(times)
        first = sum(1 for t in times if t < start + 1.0)
        slack = reminders.permits
        assert peak <= CEILING * 1.05 + slack, f"{silo}: {peak} activations in one second"
        assert peak >= CEILING * 0.5, f"{silo}: the ramp never got near its ceiling ({peak}/s)"
        assert first <= RATE / 0.693 * 1.05 + slack, f"{silo}: {first} in the first second"
        # Critical first: nine in ten of a silo's critical ticks came before
        # its median normal tick.
        early, critical = _critical_first(ticks)
        assert early >= 0.9 * critical, f"{silo}: {early}/{critical} early"
        print(f"{silo}: {len(ticks)} ticks, peak {peak}/s, first second {first}")
