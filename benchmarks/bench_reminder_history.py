"""Fire-history appends per second on the PostgreSQL reminder table, beside the Redis
table in the same run.

Run: ``python -m benchmarks.bench_reminder_history [--rows 20000] [--keep 20]
[--batches 1000 100 10] [--seconds 3]``.

Each table (a private redis-server; a throw-away database on the machine's
PostgreSQL) gets ``--rows`` reminder rows, each with a full history (``--keep``
records), so every append also trims: the steady state of a silo that has been
running a while. Then for each batch size, ``append_history`` calls of that
many records (one per row, rows drawn at random, as the service's history
writer sends them) run back to back for ``--seconds``; the figure is records
appended per second and the median call. ``read_history`` of one row is timed
too. The baseline is the Redis table, whose appends are one Lua script per row
pipelined in one round trip.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, ratio, run
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome, FireRecord, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.table import BulkReminderTable, PausableReminderTable
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SERVICE = "bench"


def _record(key: int, n: int) -> FireRecord:
    slot = T0 + timedelta(seconds=n)
    return FireRecord(
        GrainId("Hist", key), "r", slot, slot + timedelta(milliseconds=3), FireOutcome.OK, "silo-a"
    )


async def _seed(table: PausableReminderTable, rows: int, keep: int) -> None:
    entries = [
        ReminderEntry(
            service_id=SERVICE,
            grain_id=GrainId("Hist", k),
            name="r",
            start_at=T0,
            next_due=T0 + timedelta(days=1),
            period=timedelta(seconds=1),
        )
        for k in range(rows)
    ]
    assert isinstance(table, BulkReminderTable)  # every table the benchmark runs on is
    for i in range(0, rows, 2000):
        await table.upsert_many(entries[i : i + 2000])
    per_call = max(1, 1000 // keep)
    for i in range(0, rows, per_call):
        keys = range(i, min(i + per_call, rows))
        await table.append_history([_record(k, n) for k in keys for n in range(keep)], keep)


async def _measure(
    kind: str, table: PausableReminderTable, args: argparse.Namespace
) -> list[dict[str, Any]]:
    await _seed(table, args.rows, args.keep)
    rng = random.Random(7)
    n = args.keep
    results = []
    for batch in args.batches:
        calls: list[float] = []
        records = 0
        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            n += 1
            keys = rng.sample(range(args.rows), batch)
            t = time.perf_counter()
            await table.append_history([_record(k, n) for k in keys], args.keep)
            calls.append(time.perf_counter() - t)
            records += batch
        results.append(
            {
                "table": kind,
                "batch": batch,
                "records_per_s": records / sum(calls),
                "call_p50_ms": statistics.median(calls) * 1000,
            }
        )
    reads = []
    for _ in range(200):
        t = time.perf_counter()
        got = await table.read_history(GrainId("Hist", rng.randrange(args.rows)), "r")
        reads.append(time.perf_counter() - t)
        assert len(got) == args.keep, len(got)
    results.append({"table": kind, "batch": "read", "call_p50_ms": statistics.median(reads) * 1000})
    return results


async def main(args: argparse.Namespace, redis_url: str, postgres_url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        redis = RedisReminderTable(redis_url, service_id=SERVICE, shards=8)
        await redis.start(stack)
        rows += await _measure("Redis", redis, args)
        pg = PostgresReminderTable(postgres_url, service_id=SERVICE)
        await pg.start(stack)
        rows += await _measure("PostgreSQL", pg, args)
    base = {r["batch"]: r for r in rows if r["table"] == "Redis"}
    for row in rows:
        b = base[row["batch"]]
        if "records_per_s" in row:
            row["vs_redis"] = ratio(row["records_per_s"], b["records_per_s"])
        else:
            row["vs_redis"] = ratio(b["call_p50_ms"], row["call_p50_ms"])
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--keep", type=int, default=20)
    parser.add_argument("--batches", type=int, nargs="+", default=[1000, 100, 10])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with RedisServer() as server, PostgresDatabase() as database:
        results = run(main(args, server.url, database.url))
    print_report(
        "reminder_history",
        results,
        ["table", "batch", "records_per_s", "call_p50_ms", "vs_redis"],
        loop=loop_name(),
        table_rows=args.rows,
        keep=args.keep,
    )
