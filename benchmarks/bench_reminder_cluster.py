"""Reminder ticks per second with 1, 2 and 3 silo processes on one Redis (and on a
Redis Cluster).

Run: ``python -m benchmarks.bench_reminder_cluster [--reminders 3000] [--silos 1 2 3]
[--seconds 10] [--redis-cluster] [--hashed-ring]``.

``--redis-cluster`` runs every K-silo row again on a private 3-master Redis Cluster
(a replica each) beside the one-Redis rows; its ``redis_cpu_us`` is the masters'
CPU together. The silos run the default, balanced ring; ``--hashed-ring`` runs
the K-silo rows again with ``MembershipOptions(balanced_ring=False)``. Every row
reports the ticks each silo delivered as owner (``ticks_per_silo``) and their
spread (busiest / mean): the busiest silo saturates first and caps the cluster.
Side by side, at no extra run, every row also gives the busiest silo's ring
share over its fair share for the row's silo addresses on both rings
(``busiest_balanced``, ``busiest_hashed``): the bound the spread follows.

``--reminders`` one-second reminders (first slots spread evenly over a period)
are written into the Redis reminder table of a fresh service; then ``K`` silo
processes of one cluster start on the same private redis-server with the
default placement of their grain class, ring ownership splitting the rows
between them, persistence on, window ``2N``. Each silo records the ticks its
grains receive (a grain may live on a silo other than the reminder's owner;
then the tick crosses gRPC) and its own CPU time over the measured span.

Reported per ``K``: total delivered ticks/s over all silos, p50/p99 lateness
over all ticks, CPU per delivered tick of each silo (its CPU time divided by
its fair share of the delivered ticks, total / K; ``cpu_us_mean`` is all silos'
CPU over all ticks), and the redis-server's CPU per tick. The 1-silo row is the baseline of the
ratios. Reference rows run one silo at ``N/K``, a K-silo cluster's per-silo
share: a silo's fixed costs (membership probes, table polls) weigh more per tick
at a lower rate, whatever the cluster does. The ``loop.call_at`` rows fire the
same schedules, at ``N/K``, on bare event-loop timers in this process (as
``bench_reminder_ticks``' baseline does; their ratios are to ``N/1``): the CPU a
process spends per event grows as events thin out (fewer per wake-up) before any
silo work is done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, ratio, run
from benchmarks.bench_reminder_ticks import (
    RECEIVED,
    TYPE,
    BenchTickGrain,
    CpuMeter,
    percentiles,
    seed,
    timers_run,
)
from orleanspy import MembershipOptions, ReminderOptions, Silo, SiloOptions
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.ring import HASH_SPACE, ConsistentRing, ranges_size
from orleanspy.testing.redis_server import RedisClusterServer, RedisServer

PERIOD = timedelta(seconds=1)
#: Seconds between writing the rows and the first slot: the silos start meanwhile.
LEAD_S = 6.0
#: Slots in the first seconds are warm-up (ring settling, activations).
WARMUP_S = 3.0


def _options(url: str, service_id: str, name: str, n: int, balanced: bool) -> SiloOptions:
    return SiloOptions(
        cluster_id=service_id,
        service_id=service_id,
        redis_url=url,
        name=name,
        membership=MembershipOptions(balanced_ring=balanced),
        grain_types=(BenchTickGrain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=10),
            poll_interval=timedelta(seconds=5),
            base_bucket_size=2 * n,
            adaptive=False,
        ),
    )


# ------------------------------------------------------------------ a silo (child)


async def _serve(
    url: str,
    service_id: str,
    name: str,
    n: int,
    k: int,
    t0: float,
    seconds: float,
    balanced: bool,
) -> None:
    async with Silo(_options(url, service_id, name, n, balanced)) as silo:
        assert silo.membership is not None
        async with asyncio.timeout(60):
            while len((await silo.membership.refresh()).active_silos()) < k:
                await asyncio.sleep(0.05)
        print(f"READY {time.time()} {silo.address}", flush=True)
        meter = CpuMeter(silo=psutil.Process().pid)
        await asyncio.sleep(max(0.0, t0 + WARMUP_S - time.time()))
        meter.mark_start()
        owner = silo.reminder_service
        fired_before = owner.stats.delivered if owner is not None else 0
        await asyncio.sleep(max(0.0, t0 + seconds - time.time()))
        meter.mark_end()
        service = silo.reminder_service
        fired_in_span = (service.stats.delivered if service is not None else 0) - fired_before
        lateness = [
            (got - slot) * 1000 for slot, got in RECEIVED if t0 + WARMUP_S <= slot < t0 + seconds
        ]
        fired = service.stats.delivered if service is not None else 0
        record = {
            "cpu_s": meter.spent["silo"],
            "lateness": lateness,
            "fired": fired,
            "fired_in_span": fired_in_span,
        }
        print("RESULT " + json.dumps(record), flush=True)


# ------------------------------------------------------------------ the driver


def _entry(service_id: str, i: int, start: datetime) -> ReminderEntry:
    return ReminderEntry(
        service_id=service_id,
        grain_id=GrainId(TYPE, i),
        name="r",
        start_at=start,
        next_due=start,
        period=PERIOD,
    )


async def _write_rows(url: str, service_id: str, n: int, t0: float) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=service_id)
        await table.start(stack)
        step = PERIOD.total_seconds() / n
        entries = [
            _entry(service_id, i, datetime.fromtimestamp(t0 + i * step, UTC)) for i in range(n)
        ]
        await seed(table, entries)


def _redis_pids(server: RedisServer | RedisClusterServer) -> dict[str, int]:
    if isinstance(server, RedisServer):
        assert server.pid is not None
        return {"redis": server.pid}
    pids = (server.node(port).pid for port in server.master_ports())
    return {f"redis{i}": pid for i, pid in enumerate(pids) if pid}


def _one(
    server: RedisServer | RedisClusterServer,
    n: int,
    k: int,
    seconds: float,
    balanced: bool = True,
) -> dict[str, Any]:
    service_id = f"bench-cluster-{k}-{time.monotonic_ns()}"
    t0 = time.time() + LEAD_S + n / 20000
    run(_write_rows(server.url, service_id, n, t0))
    redis = CpuMeter(**_redis_pids(server))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_reminder_cluster",
                "--serve",
                server.url,
                service_id,
                f"silo-{i}",
                str(n),
                str(k),
                repr(t0),
                repr(seconds),
                "1" if balanced else "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(k)
    ]
    results: list[dict[str, Any]] = []
    ready_at: list[float] = []
    addresses: list[SiloAddress] = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("READY "):
                    _, at, address = line.split()
                    ready_at.append(float(at))
                    addresses.append(SiloAddress.parse(address))
                    break
        time.sleep(max(0.0, t0 + WARMUP_S - time.time()))
        redis.mark_start()
        time.sleep(max(0.0, t0 + seconds - time.time()))
        redis.mark_end()
        for proc in procs:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("RESULT "):
                    results.append(json.loads(line[len("RESULT ") :]))
                    break
    finally:
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    span = seconds - WARMUP_S
    per_silo = [r["fired_in_span"] / span for r in results]
    mean = sum(per_silo) / len(per_silo) if per_silo else 0.0
    lateness = [x for r in results for x in r["lateness"]]
    p50, p99 = percentiles(lateness)
    ticks = len(lateness)
    share = ticks / k if k else 0
    return {
        "silos": k,
        "ring": "balanced" if balanced else "hashed",
        "busiest_balanced": _busiest(addresses, balanced=True),
        "busiest_hashed": _busiest(addresses, balanced=False),
        "offered_per_s": n,
        "ticks_per_s": ticks / span,
        "lateness_p50_ms": p50,
        "lateness_p99_ms": p99,
        "cpu_us_per_tick_per_silo": [
            round(r["cpu_s"] * 1e6 / share, 1) if share else None for r in results
        ],
        "cpu_us_mean": (sum(r["cpu_s"] for r in results) * 1e6 / ticks if ticks else float("nan")),
        "redis_cpu_us": sum(redis.spent.values()) * 1e6 / ticks if ticks else float("nan"),
        "ticks_per_silo": [round(x) for x in per_silo],
        "spread": max(per_silo) / mean if mean else float("nan"),
        "ready_late_s": max(0.0, max(ready_at, default=t0) - (t0 + WARMUP_S)),
    }


def _busiest(silos: list[SiloAddress], *, balanced: bool) -> float:
    """The busiest silo's ring share over its fair share, on that ring."""
    if not silos:
        return float("nan")
    ring = ConsistentRing.build(silos, balanced=balanced)
    return max(ranges_size(ring.ranges_of(s)) for s in silos) * len(silos) / HASH_SPACE


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with RedisServer() as server:
        for k in args.silos:
            row = _one(server, args.reminders, k, args.seconds)
            row["kind"] = f"{k} silo(s), N={args.reminders}"
            rows.append(row)
        if args.hashed_ring:
            for k in args.silos:
                row = _one(server, args.reminders, k, args.seconds, balanced=False)
                row["kind"] = f"{k} silo(s), hashed ring"
                rows.append(row)
        if args.redis_cluster:
            with RedisClusterServer() as cluster:
                for k in args.silos:
                    row = _one(cluster, args.reminders, k, args.seconds)
                    row["kind"] = f"{k} silo(s), Redis Cluster"
                    rows.append(row)
        if args.reference:
            # One silo at a K-silo cluster's per-silo share: what a silo's fixed
            # costs (membership, probes, polls) weigh at that rate on its own.
            for k in args.silos:
                if k > 1:
                    row = _one(server, args.reminders // k, 1, args.seconds)
                    row["kind"] = f"reference: 1 silo, N/{k}"
                    rows.append(row)
            # The event loop alone at the same rates: how much CPU per event a
            # process spends at a lower rate before any silo work is done.
            for k in args.silos:
                row = run(timers_run(args.reminders // k, args.seconds))
                row["kind"] = f"loop.call_at, N/{k}"
                row["cpu_us_mean"] = row.pop("silo_cpu_us")
                rows.append(row)
    base = rows[0] if rows and rows[0]["silos"] == 1 else None
    loop_base = next((r for r in rows if r["kind"] == "loop.call_at, N/1"), None)
    for row in rows:
        baseline = loop_base if row["kind"].startswith("loop.call_at") else base
        if baseline is not None:
            row["cpu_vs_1"] = ratio(row["cpu_us_mean"], baseline["cpu_us_mean"])
            row["ticks_vs_1"] = ratio(row["ticks_per_s"], baseline["ticks_per_s"])
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        url, service_id, name, n, k, t0, seconds, balanced = sys.argv[2:10]
        run(
            _serve(
                url, service_id, name, int(n), int(k), float(t0), float(seconds), balanced == "1"
            )
        )
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reminders", type=int, default=3000)
    parser.add_argument("--silos", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--no-reference", dest="reference", action="store_false", help="skip the 1-silo N/K rows"
    )
    parser.add_argument("--redis-cluster", action="store_true")
    parser.add_argument(
        "--hashed-ring",
        action="store_true",
        help="run the K-silo rows again on the hashed ring (balanced_ring=False)",
    )
    args = parser.parse_args()
    rows = main(args)
    print_report(
        "reminder_cluster",
        rows,
        [
            "kind",
            "ring",
            "offered_per_s",
            "ticks_per_s",
            "ticks_vs_1",
            "lateness_p50_ms",
            "lateness_p99_ms",
            "cpu_us_mean",
            "cpu_vs_1",
            "cpu_us_per_tick_per_silo",
            "redis_cpu_us",
            "ticks_per_silo",
            "spread",
            "busiest_balanced",
            "busiest_hashed",
            "ready_late_s",
        ],
        loop=loop_name(),
        seconds=args.seconds,
        warmup_s=WARMUP_S,
    )
