"""Reminder ticks per second on one silo, with lateness, beside raw asyncio timers.

Run: ``python -m benchmarks.bench_reminder_ticks [--reminders 1000 4000] [--seconds 8]
[--backend redis|postgres]``.

``--backend postgres`` runs the silo on a ``PostgresReminderTable`` too (a
throw-away database on the machine's PostgreSQL), beside the Redis table in the
same run.

For each load, ``N`` reminders with a 1 s period are written into a Redis
reminder table (a private redis-server), their first slots spread evenly over
one period, so the silo is offered ``N`` ticks per second. An embedded silo with
that table (persistence on: every acknowledged tick is written back, batched)
delivers them to ``N`` local grains for ``--seconds``. Lateness is the grain's
receipt time minus the scheduled slot (``TickStatus.current_tick_time``).

The baseline, in the same run and process: the same schedule fired by raw
``loop.call_at`` timers (one per reminder, re-armed on the grid), with
lateness measured the same way: what the event loop alone achieves.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, run
from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.table import ReminderTable
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer

PERIOD = timedelta(seconds=1)
TYPE = "bench_reminder_ticks.Tick"
#: Ticks whose slot falls in the first second are warm-up (activations, loading).
WARMUP_S = 1.0

#: (slot, received) in epoch seconds, for ticks of the current run.
RECEIVED: list[tuple[float, float]] = []


class BenchTickGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((status.current_tick_time.timestamp(), time.time()))


def _percentiles(lateness_ms: Sequence[float]) -> tuple[float, float]:
    if len(lateness_ms) < 2:
        return (float("nan"), float("nan"))
    q = statistics.quantiles(lateness_ms, n=100, method="inclusive")
    return q[49], q[98]


def _summary(
    kind: str, n: int, samples: list[tuple[float, float]], t0: float, seconds: float
) -> dict[str, Any]:
    window = [(slot, got) for slot, got in samples if t0 + WARMUP_S <= slot < t0 + seconds]
    lateness = [(got - slot) * 1000 for slot, got in window]
    p50, p99 = _percentiles(lateness)
    span = seconds - WARMUP_S
    return {
        "kind": kind,
        "offered_per_s": n,
        "ticks_per_s": len(window) / span,
        "lateness_p50_ms": p50,
        "lateness_p99_ms": p99,
        "lateness_max_ms": max(lateness, default=float("nan")),
    }


def _table(url: str, service_id: str) -> ReminderTable:
    if url.startswith("postgresql://"):
        from orleanspy.reminders.postgres import PostgresReminderTable

        return PostgresReminderTable(url, service_id=service_id)
    return RedisReminderTable(url, service_id=service_id)


async def silo_run(url: str, n: int, seconds: float, label: str) -> dict[str, Any]:
    RECEIVED.clear()
    options = SiloOptions(
        grain_types=(BenchTickGrain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=10),
            poll_interval=timedelta(seconds=5),
            base_bucket_size=max(1024, 2 * n),
            adaptive=False,
        ),
    )
    service_id = f"bench-ticks-{n}"
    async with AsyncExitStack() as stack:
        table = _table(url, service_id)
        await table.start(stack)
        # Start two seconds from now, slots spread evenly over one period. A
        # PostgreSQL upsert is a commit of its own (about 1 ms with fsync here), so
        # seeding takes longer there: start later, so that no slot passes unseeded.
        lead = 2.0 if label == "Redis" else 2.0 + n / 400
        t0 = time.time() + lead
        step = PERIOD.total_seconds() / n
        await asyncio.gather(
            *(
                table.upsert(_entry(service_id, i, datetime.fromtimestamp(t0 + i * step, UTC)))
                for i in range(n)
            )
        )
        gc.collect()
        silo = Silo.local(options, reminder_table=table)
        async with silo:
            await asyncio.sleep(max(0.0, t0 + seconds - time.time()))
            service = silo.reminder_service
            assert service is not None
            # Still ticking: persistence is measured as written versus delivered.
            stats = service.stats
            stopping = time.perf_counter()
        stop_s = time.perf_counter() - stopping
    row = _summary(f"silo + {label} table", n, RECEIVED, t0, seconds)
    row.update(
        delivered=stats.delivered,
        persisted=stats.persisted,
        persist_pending=stats.persist_pending,
        missed=stats.missed,
        stop_s=stop_s,
    )
    return row


def _entry(service_id: str, i: int, start: datetime) -> ReminderEntry:
    return ReminderEntry(
        service_id=service_id,
        grain_id=GrainId(TYPE, i),
        name="r",
        start_at=start,
        next_due=start,
        period=PERIOD,
    )


async def timers_run(n: int, seconds: float) -> dict[str, Any]:
    """The same schedule on raw ``loop.call_at`` timers, one per reminder."""
    loop = asyncio.get_running_loop()
    samples: list[tuple[float, float]] = []
    t0 = time.time() + 1.0
    step = PERIOD.total_seconds() / n
    offset = loop.time() - time.time()  # wall -> loop clock
    end = t0 + seconds

    def fire(slot: float) -> None:
        samples.append((slot, time.time()))
        nxt = slot + PERIOD.total_seconds()
        if nxt < end:
            loop.call_at(nxt + offset, fire, nxt)

    for i in range(n):
        slot = t0 + i * step
        loop.call_at(slot + offset, fire, slot)
    await asyncio.sleep(max(0.0, end - time.time()) + 0.1)
    return _summary("baseline: loop.call_at", n, samples, t0, seconds)


async def main(loads: Sequence[int], seconds: float, backend: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with RedisServer() as server:
        database = PostgresDatabase() if backend == "postgres" else None
        if database is not None:
            # Its own loop: create() must not run inside this one.
            await asyncio.to_thread(database.create)
        try:
            for n in loads:
                rows.append(await timers_run(n, seconds))
                rows.append(await silo_run(server.url, n, seconds, "Redis"))
                if database is not None:
                    rows.append(await silo_run(database.url, n, seconds, "PostgreSQL"))
        finally:
            if database is not None:
                await asyncio.to_thread(database.drop)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reminders", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    args = parser.parse_args()
    result = run(main(args.reminders, args.seconds, args.backend))
    print_report(
        "reminder_ticks",
        result,
        [
            "kind",
            "offered_per_s",
            "ticks_per_s",
            "lateness_p50_ms",
            "lateness_p99_ms",
            "lateness_max_ms",
            "missed",
            "delivered",
            "persisted",
            "stop_s",
        ],
        loop=loop_name(),
        period_s=PERIOD.total_seconds(),
        seconds=args.seconds,
        warmup_s=WARMUP_S,
    )
