"""Priority lanes under overload: lateness per priority with due work at twice
the silo's capacity, beside the same run with ``enable_priority=False``.

Run: ``python -m benchmarks.bench_reminder_overload [--seconds 10] [--capacity 200]``.

Capacity is fixed by construction: ``permits`` deliveries at a time, and a
``receive_reminder`` that takes ``--work-ms``; so the silo can deliver
``permits * 1000 / work_ms`` ticks per second. Reminders (1 s period, slots
spread evenly) offer twice that: 20 % CRITICAL, 20 % NORMAL, 60 % BACKGROUND.
Ticks that cannot be reached within ``missed_tick_grace`` are skipped (SKIP),
so lateness is bounded by the grace; the share of slots delivered per priority
shows who absorbed the overload. An embedded silo with the in-memory table, so
only scheduling is measured.

A second pair of runs makes the due backlog ``--backlog-factor`` (20) times
the window: ``base_bucket_size`` is the reminder count over that factor, so
the window must rotate. It runs with priority-first admission (the window
holds the highest-priority near-due rows first, the table answers in that
order) and, as the baseline, with admission by due time alone (the window
sorted by due, the table read in due order), which is what the service did
before.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, run
from orleanspy import (
    Grain,
    Remindable,
    ReminderOptions,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
    reentrant,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry

TYPE = "bench_reminder_overload.Busy"
PERIOD = timedelta(seconds=1)
GRACE = timedelta(seconds=2)
MIX = ((ReminderPriority.CRITICAL, 0.2), (ReminderPriority.NORMAL, 0.2))  # rest BACKGROUND
WARMUP_S = 2.0

#: (priority, slot, received) in epoch seconds.
RECEIVED: list[tuple[int, float, float]] = []


@reentrant
class BusyGrain(Grain, Remindable, type_name=TYPE):
    #: Seconds each tick takes: with ``permits`` this fixes the silo's capacity.
    work_s = 0.01

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((status.priority, status.current_tick_time.timestamp(), time.time()))
        await asyncio.sleep(self.work_s)


def _priority(i: int, n: int) -> int:
    # Interleaved, so every priority's slots are spread over the whole period.
    frac = (i * 0.6180339887) % 1.0
    edge = 0.0
    for p, share in MIX:
        edge += share
        if frac < edge:
            return int(p)
    return int(ReminderPriority.BACKGROUND)


class DueOrderTable(InMemoryReminderTable):
    """The in-memory table answering ``read_due`` by due time alone (the order
    before priority-first admission), for the baseline."""

    async def read_due(self, r: Any, before: datetime, limit: int) -> list[ReminderEntry]:
        rows = await super().read_due(r, before, 1 << 30)
        rows.sort(key=lambda e: e.next_due)
        return rows[:limit]


async def one_run(
    n: int,
    permits: int,
    seconds: float,
    enable_priority: bool,
    *,
    bucket: int | None = None,
    priority_first: bool = True,
    mode: str | None = None,
) -> list[dict[str, Any]]:
    RECEIVED.clear()
    table = (DueOrderTable if not priority_first else InMemoryReminderTable)("bench-overload")
    t0 = time.time() + 1.5
    step = PERIOD.total_seconds() / n
    prios = [_priority(i, n) for i in range(n)]
    for i in range(n):
        start = datetime.fromtimestamp(t0 + i * step, UTC)
        await table.upsert(
            ReminderEntry(
                service_id="bench-overload",
                grain_id=GrainId(TYPE, i),
                name="r",
                start_at=start,
                next_due=start,
                period=PERIOD,
                priority=prios[i],
            )
        )
    options = SiloOptions(
        tune_gc=True,
        service_id="bench-overload",
        grain_types=(BusyGrain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=10),
            poll_interval=timedelta(seconds=5),
            missed_tick_grace=GRACE,
            base_bucket_size=bucket or 2 * n,
            permits=permits,
            enable_priority=enable_priority,
            adaptive=False,
        ),
    )
    async with Silo.local(options, reminder_table=table) as silo:
        service = silo.reminder_service
        assert service is not None
        if not priority_first:
            service._window.priority_first = False
            await service.refill_now()
        await asyncio.sleep(max(0.0, t0 + seconds - time.time()))
        stats = service.stats
    offered: dict[int, int] = defaultdict(int)
    for p in prios:
        offered[p] += 1
    lo, hi = t0 + WARMUP_S, t0 + seconds - GRACE.total_seconds()
    late: dict[int, list[float]] = defaultdict(list)
    for p, slot, got in RECEIVED:
        if lo <= slot < hi:
            late[p].append((got - slot) * 1000)
    rows = []
    span = hi - lo
    for p in (ReminderPriority.CRITICAL, ReminderPriority.NORMAL, ReminderPriority.BACKGROUND):
        values = late[int(p)]
        p50, p99 = _percentiles(values)
        rows.append(
            {
                "mode": mode or ("priority lanes" if enable_priority else "baseline: no priority"),
                "priority": p.name,
                "offered_per_s": offered[int(p)],
                "delivered_per_s": len(values) / span,
                "delivered_share": len(values) / (offered[int(p)] * span),
                "lateness_p50_ms": p50,
                "lateness_p99_ms": p99,
                "missed_all": stats.missed,
            }
        )
    return rows


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[98]


async def main(
    capacity: int, permits: int, seconds: float, backlog_factor: int
) -> list[dict[str, Any]]:
    BusyGrain.work_s = permits / capacity
    n = 2 * capacity  # reminders with a 1 s period: twice the capacity per second
    rows = await one_run(n, permits, seconds, enable_priority=True)
    rows += await one_run(n, permits, seconds, enable_priority=False)
    bucket = max(1, n // backlog_factor)
    rows += await one_run(
        n,
        permits,
        seconds,
        enable_priority=True,
        bucket=bucket,
        mode=f"backlog {backlog_factor}x bucket {bucket}: priority-first",
    )
    rows += await one_run(
        n,
        permits,
        seconds,
        enable_priority=True,
        bucket=bucket,
        priority_first=False,
        mode=f"backlog {backlog_factor}x bucket {bucket}: due-first (before)",
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--capacity", type=int, default=200, help="ticks per second")
    parser.add_argument("--permits", type=int, default=4)
    parser.add_argument("--backlog-factor", type=int, default=20)
    args = parser.parse_args()
    result = run(main(args.capacity, args.permits, args.seconds, args.backlog_factor))
    print_report(
        "reminder_overload",
        result,
        [
            "mode",
            "priority",
            "offered_per_s",
            "delivered_per_s",
            "delivered_share",
            "lateness_p50_ms",
            "lateness_p99_ms",
        ],
        loop=loop_name(),
        capacity_per_s=args.capacity,
        permits=args.permits,
        work_ms=1000 * args.permits / args.capacity,
        offered_per_s=2 * args.capacity,
        grace_s=GRACE.total_seconds(),
        seconds=args.seconds,
        backlog_factor=args.backlog_factor,
    )
