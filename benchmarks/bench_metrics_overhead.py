"""What recording metrics costs: grain calls/s and reminder ticks/s of an
embedded silo with a metrics port, beside the same run without one.

Run: ``python -m benchmarks.bench_metrics_overhead [--rounds 5] [--seconds 1.5]``.

Both measurements run at saturation, so any cost on the hot path shows:

- calls: 100 concurrent callers, each calling its own grain, as fast as they
  can on one silo (``SiloOptions(metrics_port=0)`` vs none);
- ticks: ``--reminders`` rows of the in-memory table over 50 reentrant grains,
  all due at once with a 1 s period, so the silo has more due ticks than it
  can deliver; the rate is what it delivers in ``--seconds`` after a warm-up.

Rounds alternate without/with metrics, in turn order (off-on, then on-off, after
one discarded warm-up pair) with a garbage collection before each run, so drift
on a shared machine and order effects fall on both; medians are reported. Two rates per
measure: per second of wall time, and per second of this process's CPU time.
The CPU-time rate is the one to judge the cost by on a shared machine, since
other processes' load changes the wall rate but not the CPU each operation
needs. Each "with" silo is scraped at the end to show its series are populated.

The end-to-end difference is within the noise of a shared 2-core machine
(several per cent either way between runs), so the run also measures the
recording itself: the recorder calls one grain call or one tick makes, timed
against the no-op recorders over a million repetitions, as a share of the CPU
one operation takes (``recording_share_percent``). That figure is stable.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks._util import loop_name, print_report, run
from orleanspy import (
    Grain,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
    reentrant,
)
from orleanspy.identity import GrainId
from orleanspy.metrics import (
    GrainMetrics,
    RecordingGrainMetrics,
    RecordingReminderMetrics,
    ReminderMetrics,
)
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry

TYPE = "bench_metrics_overhead.Tick"
CALL_TYPE = "bench_metrics_overhead.Call"
WARMUP_S = 0.5


@reentrant
class TickCountGrain(Grain, Remindable, type_name=TYPE):
    received = 0

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TickCountGrain.received += 1


class CallGrain(Grain, type_name=CALL_TYPE):
    async def on_activate(self) -> None:
        self.n = 0

    async def add(self, k: int) -> int:
        self.n += k
        return self.n


def _scrape(port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)
    )


async def calls_per_s(metrics: bool, seconds: float) -> tuple[float, float, float]:
    options = SiloOptions(
        grain_types=(CallGrain,),
        metrics_port=0 if metrics else None,
        name="calls",
        tune_gc=True,
    )
    async with Silo.local(options) as silo:
        refs = [silo.client.get_grain(CallGrain, i) for i in range(100)]
        await asyncio.gather(*(r.add(0) for r in refs))
        count = 0
        stop = time.perf_counter() + seconds

        async def worker(ref: Any) -> None:
            nonlocal count
            while time.perf_counter() < stop:
                for _ in range(50):
                    await ref.add(1)
                count += 50

        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(r) for r in refs))
        rate = count / (time.perf_counter() - start)
        cpu_rate = count / (time.process_time() - cpu)
        recorded = 0.0
        if silo.metrics_port is not None:
            recorded = await asyncio.to_thread(
                _scrape, silo.metrics_port, "orleanspy_grain_calls_total"
            )
    return rate, cpu_rate, recorded


async def ticks_per_s(metrics: bool, n: int, seconds: float) -> tuple[float, float, float]:
    service_id = "bench-metrics"
    table = InMemoryReminderTable(service_id)
    now = datetime.now(UTC)
    for i in range(n):
        await table.upsert(
            ReminderEntry(
                service_id=service_id,
                grain_id=GrainId(TYPE, i % 50),
                name=f"r{i}",
                start_at=now,
                next_due=now,
                period=timedelta(seconds=1),
            )
        )
    options = SiloOptions(
        tune_gc=True,
        service_id=service_id,
        grain_types=(TickCountGrain,),
        collection_age=timedelta(hours=1),
        metrics_port=0 if metrics else None,
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=60),
            poll_interval=timedelta(seconds=30),
            base_bucket_size=2 * n,
            adaptive=False,
        ),
    )
    async with Silo.local(options, reminder_table=table) as silo:
        await asyncio.sleep(WARMUP_S)
        first = TickCountGrain.received
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        ticks = TickCountGrain.received - first
        rate = ticks / (time.perf_counter() - start)
        cpu_rate = ticks / (time.process_time() - cpu)
        recorded = 0.0
        if silo.metrics_port is not None:
            recorded = await asyncio.to_thread(
                _scrape, silo.metrics_port, "orleanspy_reminder_ticks_total"
            )
    return rate, cpu_rate, recorded


def recording_us() -> dict[str, float]:
    """Microseconds the recorders add per grain call and per tick (recording
    minus no-op), measured here rather than inferred from rates."""
    n = 1_000_000
    calls, no_calls = RecordingGrainMetrics(), GrainMetrics()
    ticks, no_ticks = RecordingReminderMetrics(), ReminderMetrics()

    def per_call(m: GrainMetrics) -> float:
        call = m.call
        start = time.perf_counter()
        for _ in range(n):
            call("Bench", 0.00002, False)
        return time.perf_counter() - start

    def per_tick(m: ReminderMetrics) -> float:
        tick = m.tick
        start = time.perf_counter()
        for _ in range(n):
            tick(0, 0.002, False)
        return time.perf_counter() - start

    return {
        "grain calls": 1e6 * (per_call(calls) - per_call(no_calls)) / n,
        "reminder ticks": 1e6 * (per_tick(ticks) - per_tick(no_ticks)) / n,
    }


async def main(rounds: int, seconds: float, reminders: int) -> list[dict[str, Any]]:
    wall: dict[tuple[str, bool], list[float]] = {}
    cpu: dict[tuple[str, bool], list[float]] = {}
    recorded: dict[str, float] = {}
    for r, flip in itertools.product(range(rounds + 1), (False, True)):
        metrics = flip != (r % 2 == 1)
        for what in ("grain calls", "reminder ticks"):
            gc.collect()
            rate, cpu_rate, seen = await (
                calls_per_s(metrics, seconds)
                if what == "grain calls"
                else ticks_per_s(metrics, reminders, seconds)
            )
            if r == 0:
                continue  # warm-up pair: imports, first allocations
            wall.setdefault((what, metrics), []).append(rate)
            cpu.setdefault((what, metrics), []).append(cpu_rate)
            recorded[what] = max(recorded.get(what, 0.0), seen)
    added = recording_us()
    rows = []
    for what in ("grain calls", "reminder ticks"):
        off, on = (statistics.median(cpu[(what, m)]) for m in (False, True))
        op_us = 1e6 / off
        rows.append(
            {
                "measure": what,
                "per_wall_s_without": statistics.median(wall[(what, False)]),
                "per_wall_s_with": statistics.median(wall[(what, True)]),
                "per_cpu_s_without": off,
                "per_cpu_s_with": on,
                "cpu_cost_percent": round(100 * (1 - on / off), 1),
                "recording_us_per_op": round(added[what], 3),
                "recording_share_percent": round(100 * added[what] / op_us, 2),
                "recorded_in_last_scrape": recorded[what],
            }
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--reminders", type=int, default=20000)
    args = parser.parse_args()
    result = run(main(args.rounds, args.seconds, args.reminders))
    print_report(
        "metrics_overhead",
        result,
        [
            "measure",
            "per_wall_s_without",
            "per_wall_s_with",
            "per_cpu_s_without",
            "per_cpu_s_with",
            "cpu_cost_percent",
            "recording_us_per_op",
            "recording_share_percent",
        ],
        loop=loop_name(),
        rounds=args.rounds,
        seconds=args.seconds,
        reminders=args.reminders,
    )
