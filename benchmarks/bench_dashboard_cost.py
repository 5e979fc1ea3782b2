"""The dashboard's own load on a silo: 5,000 ticks/s with one page open, beside
the same silo with the dashboard off.

Run: ``python -m benchmarks.bench_dashboard_cost [--rate 5000] [--seconds 8]
[--page timeliness] [--rounds 2]``.

A cluster silo (membership, directory and reminder table in a private
redis-server; gRPC transport) is offered ``--rate`` ticks per second: that many
one-second reminders, their slots spread over the period (as
``bench_reminder_ticks``). Two configurations alternate, ``--rounds`` times each:

- ``dashboard off``: ``SiloOptions()`` without a dashboard (and so without
  metrics recording);
- ``dashboard on``: ``SiloOptions(dashboard_port=0)`` with one page open in
  headless Chromium (Debian's ``/usr/bin/chromium``, driven by playwright in a
  separate process): the page's event stream, its reads of the cluster's
  status, and the silo recording metrics for it.

The figure is the silo process's CPU time (user + system) per delivered tick
over the measured span, and lateness p50/p99, for each; the cost is the
difference of the medians. Chromium's own CPU is not counted (another process).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, reset_collector, run
from benchmarks.bench_reminder_ticks import (
    PERIOD,
    RECEIVED,
    BenchTickGrain,
    CpuMeter,
    _entry,
    measure_cpu,
    per_tick_us,
    seed,
    summary,
)
from orleanspy import ReminderOptions, Silo, SiloOptions
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.testing.redis_server import RedisServer

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def page_process(url: str) -> None:
    """Keep ``url`` open in headless Chromium until stdin closes."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(url)
        page.wait_for_selector("#live.on", timeout=30_000)
        print("READY page", flush=True)
        sys.stdin.read()
        browser.close()


async def open_page(stack: AsyncExitStack, url: str) -> None:
    """The page in another process, waited for without blocking the silo's loop."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_dashboard_cost", "--serve-page", url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip

    def close() -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()

    stack.callback(close)
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    if not line.startswith("READY"):
        raise RuntimeError(f"the page did not open: {line!r}")


async def silo_run(
    server: RedisServer, n: int, seconds: float, *, page: str | None
) -> dict[str, Any]:
    RECEIVED.clear()
    service_id = f"bench-dash-{n}-{time.monotonic_ns()}"
    options = SiloOptions(
        redis_url=server.url,
        service_id=service_id,
        grain_types=(BenchTickGrain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=10),
            poll_interval=timedelta(seconds=5),
            adaptive=False,
            base_bucket_size=2 * n,
        ),
        dashboard_port=0 if page else None,
    )
    async with AsyncExitStack() as stack:
        reset_collector()
        silo = await stack.enter_async_context(Silo(options))
        if page:
            url = f"http://127.0.0.1:{silo.dashboard_port}/{page}"
            await open_page(stack, url)
        table = RedisReminderTable(server.url, service_id=service_id)
        await table.start(stack)
        t0 = time.time() + 2.0 + n / 20000
        step = PERIOD.total_seconds() / n
        await seed(table, [_entry(service_id, i, datetime.fromtimestamp(t0 + i * step, UTC))
                           for i in range(n)])  # fmt: skip
        meter = CpuMeter(silo=psutil.Process().pid)
        await measure_cpu(meter, t0, seconds)
        await asyncio.sleep(0.5)
    row = summary("dashboard on" if page else "dashboard off", n, RECEIVED, t0, seconds)
    row["silo_cpu_us"] = per_tick_us(meter.spent["silo"], row, seconds)
    row["silo_cpu_percent"] = 100 * meter.spent["silo"] / (seconds - 2.5)
    return row


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with RedisServer() as server:
        for _ in range(args.rounds):
            for page in (None, args.page):
                rows.append(await silo_run(server, args.rate, args.seconds, page=page))
    return rows


def _median(rows: list[dict[str, Any]], kind: str, key: str) -> float:
    return float(statistics.median(r[key] for r in rows if r["kind"] == kind))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--page", default="timeliness")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve-page", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_page:
        page_process(args.serve_page)
        sys.exit(0)
    rows = run(main(args))
    off = _median(rows, "dashboard off", "silo_cpu_us")
    on = _median(rows, "dashboard on", "silo_cpu_us")
    print_report(
        "dashboard_cost", rows,
        ["kind", "offered_per_s", "ticks_per_s", "delivered_share", "lateness_p50_ms",
         "lateness_p99_ms", "silo_cpu_us", "silo_cpu_percent"],
        loop=loop_name(), page=args.page, median_cpu_us_off=off, median_cpu_us_on=on,
        cost_us_per_tick=on - off, cost_share=(on - off) / off if off else None,
    )  # fmt: skip
