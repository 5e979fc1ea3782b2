"""The dashboard's reminder search on a large table, beside reading the whole table
(what a reminders page that loads every row does), in the same run.

Run: ``python -m benchmarks.bench_dashboard_search [--rows 1000000]
[--backend redis|postgres]``.

The table is filled as ``bench_reminder_startup`` fills it (``--rows`` rows of
one grain type with int keys, one reminder each). Then, in one process:

- ``first page``: the first 50 rows, no filter;
- ``key prefix``: type and key prefix ``i:4242`` (11 rows at 1M);
- ``no match``: a name nothing has (each request looks at its budget of index
  entries and returns a cursor);
- ``next pages``: 20 pages of 50 walked with the cursor;

each the median latency of its requests, and the process RSS growth over all of
them. The baseline: ``read_range`` of the whole ring (every row into memory),
its time and RSS growth.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from contextlib import AsyncExitStack
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, ratio, run
from benchmarks.bench_reminder_startup import TYPE, _table, fill, fill_postgres
from orleanspy.dashboard._reminder_reads import Query, ReminderPages
from orleanspy.ring import RingRange
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


async def _timed(pages: ReminderPages, query: Query, times: int) -> tuple[float, int, int]:
    """Median ms of ``times`` searches, rows of the last, index entries it looked at."""
    spent = []
    page = None
    for _ in range(times):
        t = time.perf_counter()
        page = await pages.search(query, None, 50, None)
        spent.append((time.perf_counter() - t) * 1000)
    assert page is not None
    return statistics.median(spent), len(page.rows), page.scanned


async def measure(url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        table = _table(url)
        await table.start(stack)
        pages = ReminderPages(table)
        gc.collect()
        before = _rss_mb()
        for name, query in (
            ("first page", Query()),
            ("key prefix", Query(grain_type=TYPE, key_prefix="i:4242")),
            ("no match", Query(name="zzz")),
        ):
            ms, got, scanned = await _timed(pages, query, 10)
            rows.append({"read": name, "median_ms": ms, "rows": got, "looked_at": scanned})
        spent, cursor, got = [], None, 0
        for _ in range(20):
            t = time.perf_counter()
            page = await pages.search(Query(), cursor, 50, None)
            spent.append((time.perf_counter() - t) * 1000)
            cursor, got = page.cursor, got + len(page.rows)
        rows.append({"read": "next pages", "median_ms": statistics.median(spent), "rows": got})
        gc.collect()
        paged_rss = _rss_mb() - before
        for row in rows:
            row["rss_delta_mb"] = paged_rss
        t = time.perf_counter()
        everything = await table.read_range(RingRange.full())
        whole_s = time.perf_counter() - t
        rows.append({"read": "whole table (baseline)", "median_ms": whole_s * 1000,
                     "rows": len(everything), "rss_delta_mb": _rss_mb() - before})  # fmt: skip
    return rows


def main(rows: int, backend: str) -> None:
    server: RedisServer | PostgresDatabase
    server, filler = (PostgresDatabase(), fill_postgres) if backend == "postgres" else (
        RedisServer(), fill)  # fmt: skip
    with server:
        filled = run(filler(server.url, rows, 0.0, 1))
        results = run(measure(server.url))
    whole = results[-1]["median_ms"]
    for row in results[:-1]:
        row["whole_table_ratio"] = ratio(whole, row["median_ms"])
    print_report(
        "dashboard_search", results,
        ["read", "median_ms", "rows", "looked_at", "rss_delta_mb", "whole_table_ratio"],
        loop=loop_name(), backend=backend, table_rows=filled["rows"],
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    args = parser.parse_args()
    main(args.rows, args.backend)
