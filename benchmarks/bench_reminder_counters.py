"""What the per-reminder counters cost beside the schedule writes they ride along with.

Run: ``python -m benchmarks.bench_reminder_counters [--rows 20000] [--batches 256 64 16]
[--seconds 3]``.

The reminder service writes a batch of schedule CASes (``update_schedule_many``)
per persistence round and, beside it, one ``add_counts`` of the counter deltas of
the rows it ticked (``reminders/_service/counting.py``). For each table (a
private redis-server; a throw-away database on the machine's PostgreSQL, both
seeded with ``--rows`` rows) and each batch size, this runs, back to back for
``--seconds`` each and alternating three rounds: the CAS batch alone (the
baseline, what 0.1 wrote per round), ``add_counts`` alone, and both at once
(``asyncio.gather``, as the persister sends them). Figures: rows per second and
the median call; ``vs_cas``: the round's time against the CAS batch alone.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, ratio, run
from orleanspy.identity import GrainId
from orleanspy.reminders.counters import CounterDelta
from orleanspy.reminders.model import ReminderEntry, ScheduleUpdate
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SERVICE = "bench"
Table = RedisReminderTable | PostgresReminderTable


async def _seed(table: Table, rows: int) -> dict[int, str]:
    entries = [
        ReminderEntry(
            service_id=SERVICE,
            grain_id=GrainId("Count", k),
            name="r",
            start_at=T0,
            next_due=T0 + timedelta(seconds=k % 1000),
            period=timedelta(seconds=1),
        )
        for k in range(rows)
    ]
    etags: dict[int, str] = {}
    for i in range(0, rows, 2000):
        chunk = entries[i : i + 2000]
        for k, etag in zip(range(i, i + len(chunk)), await table.upsert_many(chunk), strict=True):
            etags[k] = etag
    return etags


def _delta(k: int) -> CounterDelta:
    d = CounterDelta(GrainId("Count", k), "r")
    d.counts[0] = 1  # delivered: what nearly every tick adds
    return d


async def _measure(kind: str, table: Table, args: argparse.Namespace) -> list[dict[str, Any]]:
    etags = await _seed(table, args.rows)
    rng = random.Random(11)
    step = {k: 0 for k in etags}

    async def cas(keys: list[int]) -> None:
        updates = []
        for k in keys:
            step[k] += 1
            due = T0 + timedelta(seconds=step[k])
            updates.append(ScheduleUpdate(GrainId("Count", k), "r", etags[k], due, due))
        for k, etag in zip(keys, await table.update_schedule_many(updates), strict=True):
            assert etag is not None
            etags[k] = etag

    async def counts(keys: list[int]) -> None:
        await table.add_counts([_delta(k) for k in keys])

    async def both(keys: list[int]) -> None:
        await asyncio.gather(cas(keys), counts(keys))

    modes = {"cas": cas, "add_counts": counts, "cas+counts": both}
    results: list[dict[str, Any]] = []
    for batch in args.batches:
        timings: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(3):  # alternating rounds
            for mode, call in modes.items():
                end = time.perf_counter() + args.seconds / 3
                while time.perf_counter() < end:
                    keys = rng.sample(range(args.rows), batch)
                    t = time.perf_counter()
                    await call(keys)
                    timings[mode].append(time.perf_counter() - t)
        base = statistics.median(timings["cas"])
        for mode, calls in timings.items():
            median = statistics.median(calls)
            results.append(
                {
                    "table": kind,
                    "batch": batch,
                    "mode": mode,
                    "rows_per_s": batch / median,
                    "call_p50_ms": median * 1000,
                    "vs_cas": ratio(median, base),
                }
            )
    return results


async def main(args: argparse.Namespace, redis_url: str, postgres_url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        redis = RedisReminderTable(redis_url, service_id=SERVICE, shards=256)
        await redis.start(stack)
        rows += await _measure("Redis", redis, args)
        pg = PostgresReminderTable(postgres_url, service_id=SERVICE)
        await pg.start(stack)
        rows += await _measure("PostgreSQL", pg, args)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 64, 16])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with RedisServer() as server, PostgresDatabase() as database:
        results = run(main(args, server.url, database.url))
    print_report(
        "reminder_counters",
        results,
        ["table", "batch", "mode", "rows_per_s", "call_p50_ms", "vs_cas"],
        loop=loop_name(),
        table_rows=args.rows,
    )
