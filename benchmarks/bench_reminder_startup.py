"""Reminder service start-up time and memory versus table size, beside the classic
load-everything start-up measured in the same run.

Run: ``python -m benchmarks.bench_reminder_startup [--rows 1000000] [--due-fraction 0.01]
[--backend redis|redis-cluster|postgres] [--no-classic]``.

``--no-classic`` measures the adaptive start-up only: the classic one holds every
row in the process, about 1.5 KB each (15 GB at 10M rows).

``--backend redis-cluster`` fills a private 3-master Redis Cluster (a replica
each) instead of one redis-server; the memory figures are the masters' together.
Every Redis run reports the store's memory per million rows (``used_memory``
after the fill less before it, replicas not counted).

With ``--backend postgres`` the rows go into a throw-away database on the
machine's PostgreSQL (``ORLEANSPY_TEST_POSTGRES_URL``, else the local server) in
the ``PostgresReminderTable`` layout, written with ``COPY``; both start-ups then
read that table.

A private redis-server is filled with ``--rows`` reminder rows in the
``RedisReminderTable`` layout (written directly, shard by shard, with
multi-member commands: the fill is timed separately). About ``--due-fraction``
of them fall due inside the look-ahead window, the earliest right away; the rest
are due a day or more later. Then, each in a fresh child process so that memory
figures do not share an allocator:

- ``adaptive``: a ``ReminderService`` owning the whole ring starts; measured are
  the time until its first tick is delivered and until its window is full, and
  the process RSS growth.
- ``classic``: what Orleans' ``LocalReminderService`` does at start-up: read
  every owned row (``read_range`` of the whole ring) into memory and arm one
  timer (``loop.call_at``) per row; measured are the time until the first timer
  fires and the RSS growth.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, ratio, run
from orleanspy._redis import is_cluster
from orleanspy.clock import SystemClock, to_ms
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import ReminderEntry, TickStatus
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.table import ReminderTable
from orleanspy.ring import RingRange
from orleanspy.serialization import pack
from orleanspy.tables import table_backend
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisClusterServer, RedisServer

SERVICE = "bench-startup"
TYPE = "BenchReminderGrain"
SHARDS = 256
LOOK_AHEAD = timedelta(minutes=5)
OPTIONS = ReminderOptions(
    look_ahead=LOOK_AHEAD, poll_interval=timedelta(seconds=30), base_bucket_size=1024
)
#: Members per Redis command while filling (multi-member HSET / ZADD).
CHUNK = 2000


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def _table(url: str) -> ReminderTable:
    if table_backend(url) == "postgres":
        from orleanspy.reminders.postgres import PostgresReminderTable

        return PostgresReminderTable(url, service_id=SERVICE)
    return RedisReminderTable(url, service_id=SERVICE, shards=SHARDS)


# -- fill ---------------------------------------------------------------------------------


_COPY_COLUMNS = [
    "service_id",
    "grain_id",
    "name",
    "grain_hash",
    "bucket",
    "priority",
    "start_at",
    "next_due",
    "period_ms",
    "action",
    "version",
]


async def fill_postgres(url: str, rows: int, due_fraction: float, seed: int) -> dict[str, Any]:
    """Write ``rows`` rows into the PostgreSQL table with ``COPY``; fill figures."""
    from orleanspy.reminders.postgres import PostgresReminderTable

    rng = random.Random(seed)
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id=SERVICE)
        await table.start(stack)  # creates the schema
        now_ms = to_ms(datetime.now(UTC))
        window_ms = LOOK_AHEAD // timedelta(milliseconds=1)
        started = time.perf_counter()
        records = []
        due_rows = 0
        for i in range(rows):
            gid = GrainId(TYPE, i)
            h = gid.uniform_hash()
            if rng.random() < due_fraction:
                next_due = now_ms + (0 if due_rows < 10 else rng.randrange(window_ms // 2))
                due_rows += 1
            else:
                next_due = now_ms + 86_400_000 + rng.randrange(86_400_000)
            records.append(
                (SERVICE, gid.canonical, "r", h, h >> 24, 0, next_due, next_due, 3_600_000, 2, i)
            )
        built = time.perf_counter()
        async with table._p.acquire() as conn:
            await conn.copy_records_to_table(
                "orleanspy_reminders",
                records=records,
                columns=_COPY_COLUMNS,
            )
            await conn.execute("ANALYZE orleanspy_reminders")
            used_mb = (
                await conn.fetchval("SELECT pg_total_relation_size('orleanspy_reminders')") / 2**20
            )
        done = time.perf_counter()
        stored = await table.count()
    return {
        "rows": stored,
        "due_rows": due_rows,
        "build_s": built - started,
        "write_s": done - built,
        "fill_s": done - started,
        "rows_per_s": rows / (done - started),
        "store_used_mb": used_mb,
    }


async def _used_mb(client: Any) -> float:
    """``used_memory`` in MB: of the one server, or the masters' together."""
    if is_cluster(client):
        infos = await client.info("memory", target_nodes=client.PRIMARIES)
        return sum(float(i["used_memory"]) for i in infos.values()) / 2**20
    return float((await client.info("memory"))["used_memory"]) / 2**20


async def fill(url: str, rows: int, due_fraction: float, seed: int) -> dict[str, Any]:
    """Write ``rows`` rows straight into the table's layout; return fill figures."""
    rng = random.Random(seed)
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=SERVICE, shards=SHARDS)
        await table.start(stack)  # writes the shard-count meta key
        client = table._c
        before_mb = await _used_mb(client)
        now_ms = to_ms(datetime.now(UTC))
        window_ms = LOOK_AHEAD // timedelta(milliseconds=1)
        period_ms = 3_600_000
        started = time.perf_counter()
        per_shard: dict[int, tuple[dict[str, bytes], dict[str, int], dict[str, int]]] = {}
        # The near-due rows, with their offset into the window: written again after the
        # bulk fill, due from then on. A fill of 10M rows takes minutes, and rows due
        # from its start would be more than a grace late at start-up, so SKIP moves
        # them an hour on and the measured start-up would wait for nothing.
        soon: list[tuple[int, str, int, dict[str, Any], int]] = []
        due_rows = 0
        for i in range(rows):
            gid = GrainId(TYPE, i)
            h = gid.uniform_hash()
            if rng.random() < due_fraction:
                # Spread over the first half of the window; the first ones are due now.
                next_due = now_ms + (0 if due_rows < 10 else rng.randrange(window_ms // 2))
                due_rows += 1
            else:
                next_due = now_ms + 86_400_000 + rng.randrange(86_400_000)
            canonical = gid.canonical
            key = f"{canonical}|r"
            record = {
                "s": SERVICE,
                "g": canonical,
                "n": "r",
                "a": next_due,
                "d": next_due,
                "p": period_ms,
                "c": None,
                "z": None,
                "l": None,
                "r": 0,
                "x": 2,
                "e": f"bulk{i}",
            }
            shard = table.shard_of(h)
            if next_due < now_ms + window_ms:
                soon.append((shard, key, h, record, next_due - now_ms))
            hrows, hdue, hgrain = per_shard.setdefault(shard, ({}, {}, {}))
            hrows[key] = pack(record)
            hdue[f"{h:08x}|{key}"] = next_due
            hgrain[key] = 0
        built = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        queued = 0
        for shard, (hrows, hdue, hgrain) in per_shard.items():
            # The table's own key layout (its private helper, so the two cannot drift).
            rows_key, due_key, grain_key = (table._key(shard, k) for k in ("rows", "due", "grain"))
            row_items, due_items, grain_items = (
                list(hrows.items()),
                list(hdue.items()),
                list(hgrain.items()),
            )
            for j in range(0, len(row_items), CHUNK):
                pipe.hset(rows_key, mapping=dict(row_items[j : j + CHUNK]))
                pipe.zadd(due_key, dict(due_items[j : j + CHUNK]))
                pipe.zadd(grain_key, dict(grain_items[j : j + CHUNK]))
                queued += 3
                if queued >= 192:
                    await pipe.execute()
                    queued = 0
        await pipe.execute()
        now_ms = to_ms(datetime.now(UTC))
        for n, (shard, key, h, record, offset) in enumerate(soon, 1):
            record["a"] = record["d"] = now_ms + offset
            pipe.hset(table._key(shard, "rows"), key, pack(record))
            pipe.zadd(table._key(shard, "due"), {f"{h:08x}|{key}": now_ms + offset})
            if n % 500 == 0:
                await pipe.execute()
        await pipe.execute()
        done = time.perf_counter()
        stored = await table.count()
        used_mb = await _used_mb(client)
    return {
        "rows": stored,
        "due_rows": due_rows,
        "build_s": built - started,
        "write_s": done - built,
        "fill_s": done - started,
        "rows_per_s": rows / (done - started),
        "store_used_mb": used_mb,
        "mb_per_million_rows": (used_mb - before_mb) * 1e6 / max(stored, 1),
    }


# -- the two start-ups, each in its own process ---------------------------------------------


async def adaptive(url: str) -> dict[str, Any]:
    gc.collect()
    rss0 = _rss()
    first_tick: list[float] = []
    started = time.perf_counter()

    async def deliver(entry: ReminderEntry, status: TickStatus, deadline: float = 0.0) -> None:
        if not first_tick:
            first_tick.append(time.perf_counter())

    async with AsyncExitStack() as stack:
        table = _table(url)
        await table.start(stack)
        service = ReminderService(
            table, deliver=deliver, clock=SystemClock(), options=OPTIONS, name="bench"
        )
        await service.start(stack)
        service.set_ranges([RingRange.full()])
        while not first_tick:
            await asyncio.sleep(0.001)
        await service.refill_now()
        loaded = time.perf_counter()
        stats = service.stats
        gc.collect()
        rss1 = _rss()
    return {
        "first_tick_s": first_tick[0] - started,
        "window_loaded_s": loaded - started,
        "rows_in_memory": stats.resident,
        "bucket_size": stats.bucket_size,
        "rss_delta_mb": (rss1 - rss0) / 2**20,
    }


async def classic(url: str) -> dict[str, Any]:
    gc.collect()
    rss0 = _rss()
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    first_tick: list[float] = []

    def on_timer(entry: ReminderEntry) -> None:
        if not first_tick:
            first_tick.append(time.perf_counter())
            fired.set()

    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        table = _table(url)
        await table.start(stack)
        rows = await table.read_range(RingRange.full())
        loaded = time.perf_counter()
        now_wall, now_loop = time.time(), loop.time()
        timers = [
            loop.call_at(now_loop + (row.next_due.timestamp() - now_wall), on_timer, row)
            for row in rows
        ]
        await fired.wait()
        gc.collect()
        rss1 = _rss()
        for t in timers:
            t.cancel()
    return {
        "first_tick_s": first_tick[0] - started,
        "window_loaded_s": loaded - started,
        "rows_in_memory": len(rows),
        "bucket_size": None,
        "rss_delta_mb": (rss1 - rss0) / 2**20,
    }


def _child(phase: str, url: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_reminder_startup", "--phase", phase, "--url", url],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(rows: int, due_fraction: float, seed: int, backend: str, classic: bool) -> None:
    server: RedisServer | RedisClusterServer | PostgresDatabase
    if backend == "postgres":
        server = PostgresDatabase()
        filler = fill_postgres
    elif backend == "redis-cluster":
        server = RedisClusterServer()
        filler = fill
    else:
        server = RedisServer()
        filler = fill
    with server:
        fill_stats = run(filler(server.url, rows, due_fraction, seed))
        results = [{"startup": "adaptive (orleanspy)", **_child("adaptive", server.url)}]
        if classic:
            results.append({"startup": "classic: load every row", **_child("classic", server.url)})
    if classic:
        adaptive_row, classic_row = results
        # How many times the classic start-up's figure is the adaptive one's.
        for key in ("first_tick_s", "rss_delta_mb"):
            adaptive_row[f"classic_{key}_ratio"] = ratio(classic_row[key], adaptive_row[key])
    print_report(
        "reminder_startup",
        results,
        [
            "startup",
            "first_tick_s",
            "window_loaded_s",
            "rows_in_memory",
            "rss_delta_mb",
            "classic_first_tick_s_ratio",
            "classic_rss_delta_mb_ratio",
        ],
        loop=loop_name(),
        backend=backend,
        table_rows=fill_stats["rows"],
        due_in_window=fill_stats["due_rows"],
        fill=fill_stats,
    )
    print(
        f"\nfill: {fill_stats['rows']:,} rows in {fill_stats['fill_s']:.1f} s "
        f"({fill_stats['rows_per_s']:,.0f} rows/s; build {fill_stats['build_s']:.1f} s, "
        f"write {fill_stats['write_s']:.1f} s); {backend} used "
        f"{fill_stats['store_used_mb']:.0f} MB"
        + (
            f", {fill_stats['mb_per_million_rows']:.0f} MB per million rows"
            if "mb_per_million_rows" in fill_stats
            else ""
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--due-fraction", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--backend", choices=("redis", "redis-cluster", "postgres"), default="redis"
    )
    parser.add_argument(
        "--no-classic",
        action="store_true",
        help="skip the load-every-row start-up (it holds about 1.5 KB per row: 15 GB at 10M)",
    )
    parser.add_argument("--phase", choices=("adaptive", "classic"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase is not None:
        phase = adaptive if args.phase == "adaptive" else classic
        print(json.dumps(run(phase(args.url))))
    else:
        main(args.rows, args.due_fraction, args.seed, args.backend, not args.no_classic)
