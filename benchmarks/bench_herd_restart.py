"""A full restart over a table of overdue reminders: 3 silo processes start at once
over 100,000 overdue rows on one Redis, with herd control as configured, beside the
same restart without it, and the same silos with no overdue rows at all.

Run: ``python -m benchmarks.bench_herd_restart [--rows 100000] [--silos 3]
[--settings default off 100:1000 ...] [--calls-per-s 200] [--rounds 1]``.

The outage: ``--rows`` hourly reminders whose slots passed 5 to 55 minutes ago
(spread evenly), one in ten CRITICAL and one in ten BACKGROUND (interleaved with
the normal rows in due order, so only priority can put them first), nine in ten
FIRE_IMMEDIATELY (one catch-up delivery each) and one in ten SKIP (none: the
schedule moves to its next slot). Then ``--silos`` silo processes of one cluster
start together on the table, with the default ``ReminderOptions`` except for
the setting of the row (``default``: the defaults as they stand; ``off``:
``catch_up_rate=0``; ``R:C`` or ``R:C:L``: ``catch_up_rate=R, catch_up_ceiling=C``
and ``catch_up_max_lag=L`` ms (``none``: no brake); ``idle``: no
rows, the calls alone for ``IDLE_S`` once every silo is up: the machine's own call
latency, the floor the other rows compare with). As soon as
the first silo is Active, a client sends ``--calls-per-s`` grain calls a second
(open loop: each call leaves on its own schedule, whatever the ones before it are
doing) to 64 grains, until every row has moved past the restart.

``HERD_TRACE=1`` prints each silo's reminder counters and its loop's worst lag every
2 s on stderr.

Reported per setting:

- ``catch_up_s``: from the processes' start to the last catch-up tick;
  ``first_tick_s`` to the first.
- ``peak_per_silo``: the most ticks one silo delivered in any one second;
  ``first_s_per_silo``: in its first second of ticks; ``peak_cluster``: the most
  in any one second over all silos (the herd every grain activation came in).
- ``critical_done_s`` / ``normal_done_s`` / ``background_done_s``: when the last
  tick of each priority came, from the first tick (``*_p50_s``: the median);
  ``critical_before_normal``: the share of critical ticks that came before the
  median normal tick, on the silo that delivered them.
- ``call_p50_ms`` / ``call_p99_ms`` / ``call_max_ms``: grain-call latency of the
  calls that left between the first and the last catch-up tick (``calls``,
  ``call_errors``).
- A row's catch-up tick is its first tick after the restart (``on_time_ticks``: its
  later ones, the next slots of rows that caught up early, delivered on time
  meanwhile). ``undelivered``: FIRE_IMMEDIATELY rows that got no tick; ``doubled``:
  slots of a row delivered more than once; ``skip_delivered``: slots before the
  restart delivered to SKIP rows (their action says none); ``overdue_left``: rows
  whose stored ``next_due`` is still before the restart, read back after the silos
  stopped; ``declared_dead``: silos the others voted Dead meanwhile (overloaded past
  their probes); ``load_avg``: the machine's 1-minute load average at the start and
  the end (it is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, run
from orleanspy import (
    ClusterClient,
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderOptions,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.ring import RingRange
from orleanspy.testing.redis_server import RedisServer

TYPE = "bench_herd_restart.Herd"
PING = "bench_herd_restart.Ping"
PERIOD = timedelta(hours=1)
PING_KEYS = 64
#: How long the ``idle`` setting's calls run once every silo is up.
IDLE_S = 20.0
_SEED_BATCH = 5_000

#: (wall time, key, priority, slot's wall time) of every tick a silo's grains received.
TICKS: list[tuple[float, int, int, float]] = []


class HerdGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot = status.current_tick_time.timestamp()
        TICKS.append((time.time(), int(self.grain_key), status.priority, slot))


class PingGrain(Grain, type_name=PING):
    async def ping(self, n: int) -> int:
        return n


def _catch_up(setting: str) -> dict[str, Any]:
    """The ``ReminderOptions`` keywords of a setting (module docstring)."""
    if setting in ("default", "idle"):
        return {}
    if setting == "off":
        return {"catch_up_rate": 0.0, "catch_up_ceiling": 0.0}
    rate, _, rest = setting.partition(":")
    ceiling, _, lag = rest.partition(":")
    out: dict[str, Any] = {"catch_up_rate": float(rate), "catch_up_ceiling": float(ceiling or 0)}
    if lag:
        out["catch_up_max_lag"] = None if lag == "none" else float(lag) / 1000
    return out


# ------------------------------------------------------------------ a silo (child)


async def _serve(url: str, service_id: str, name: str, setting: str) -> None:
    options = SiloOptions(
        cluster_id=service_id,
        service_id=service_id,
        redis_url=url,
        name=name,
        gateway_port=0,
        grain_types=(HerdGrain, PingGrain),
        reminders=ReminderOptions(**_catch_up(setting)),
    )
    me = psutil.Process()
    async with Silo(options) as silo:
        print(f"READY {time.time()} {silo.address}", flush=True)
        trace = asyncio.create_task(_trace(silo)) if os.environ.get("HERD_TRACE") else None
        # Serve until the driver closes stdin.
        await asyncio.to_thread(sys.stdin.read)
        if trace is not None:
            trace.cancel()
        service = silo.reminder_service
        stats = service.stats if service is not None else None
        cpu = me.cpu_times()
        record = {
            "name": name,
            "ticks": TICKS,
            "cpu_s": cpu.user + cpu.system,
            "missed": stats.missed if stats is not None else 0,
            "skipped": stats.skipped if stats is not None else 0,
            "declared_dead": silo.declared_dead,
        }
        print("RESULT " + json.dumps(record), flush=True)


async def _trace(silo: Silo) -> None:
    """``HERD_TRACE=1``: the service's counters on stderr every 2 s, with the most
    a 10 ms timer of this loop fired late meanwhile (diagnosis)."""
    loop = asyncio.get_running_loop()
    while True:
        lag = 0.0
        end = loop.time() + 2
        while loop.time() < end:
            t = loop.time()
            await asyncio.sleep(0.01)
            lag = max(lag, loop.time() - t - 0.01)
        service = silo.reminder_service
        if service is None:
            continue
        s = service.stats
        print(
            f"{silo.name} t={time.time():.0f} lag_ms={lag * 1000:.0f} "
            f"bucket={s.bucket_size} loaded={s.loaded} "
            f"queued={s.queued} in_flight={s.in_flight} delivered={s.delivered} "
            f"errors={s.grain_errors} retries={s.retries} missed={s.missed} "
            f"skipped={s.skipped} refills={s.refills} persisted={s.persisted} "
            f"pending={s.persist_pending} evicted={s.evicted} rotated={s.rotated}",
            file=sys.stderr,
            flush=True,
        )


# ------------------------------------------------------------------ the driver


def _row(service_id: str, i: int, restart: datetime, n: int) -> ReminderEntry:
    # Slots passed 5 to 55 minutes before the restart, spread evenly over the keys.
    due = restart - timedelta(minutes=5) - timedelta(minutes=50) * (i / n)
    priority = (
        ReminderPriority.CRITICAL
        if i % 10 == 0
        else ReminderPriority.BACKGROUND
        if i % 10 == 5
        else ReminderPriority.NORMAL
    )
    action = MissedReminderAction.SKIP if i % 10 == 9 else MissedReminderAction.FIRE_IMMEDIATELY
    return ReminderEntry(
        service_id=service_id,
        grain_id=GrainId(TYPE, i),
        name="r",
        start_at=due,
        next_due=due,
        period=PERIOD,
        priority=priority,
        action=action,
    )


async def _seed(url: str, service_id: str, n: int, restart: datetime) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=service_id)
        await table.start(stack)
        rows = [_row(service_id, i, restart, n) for i in range(n)]
        for i in range(0, n, _SEED_BATCH):
            await table.upsert_many(rows[i : i + _SEED_BATCH])


async def _overdue(table: RedisReminderTable, restart: datetime, limit: int) -> int:
    return len(await table.upcoming(restart, limit))


class _Load:
    """Open-loop grain calls: one leaves every ``1 / rate`` s, whatever the others do."""

    def __init__(self, client: ClusterClient, rate: float) -> None:
        self._client = client
        self._gap = 1.0 / rate
        self.calls: list[tuple[float, float, bool]] = []  # (sent at, seconds, ok)
        self._tasks: set[asyncio.Task[None]] = set()

    async def _one(self, n: int) -> None:
        sent = time.time()
        t = time.perf_counter()
        ok = True
        try:
            async with asyncio.timeout(10):
                await self._client.get_grain(PING, str(n % PING_KEYS)).ping(n)
        except Exception:
            ok = False
        self.calls.append((sent, time.perf_counter() - t, ok))

    async def run(self) -> None:
        start = time.perf_counter()
        n = 0
        try:
            while True:
                task = asyncio.create_task(self._one(n))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                n += 1
                await asyncio.sleep(max(0.0, start + n * self._gap - time.perf_counter()))
        finally:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)


async def _restart(url: str, n: int, k: int, setting: str, calls_per_s: float) -> dict[str, Any]:
    service_id = f"bench-herd-{time.monotonic_ns()}"
    restart = datetime.now(UTC)
    idle = setting == "idle"
    if idle:
        n = 0
    await _seed(url, service_id, n, restart)
    load_avg = os.getloadavg()[0]
    started = time.time()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.bench_herd_restart",
            "--serve",
            url,
            service_id,
            f"silo-{i}",
            setting,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 26,
        )
        for i in range(k)
    ]
    results: list[dict[str, Any]] = []
    load: _Load | None = None
    try:
        ready = [asyncio.create_task(_line(p, "READY ")) for p in procs]
        await asyncio.wait(ready, return_when=asyncio.FIRST_COMPLETED)
        async with AsyncExitStack() as stack:
            table = RedisReminderTable(url, service_id=service_id)
            await table.start(stack)
            client = ClusterClient(redis_url=url, cluster_id=service_id, service_id=service_id)
            await stack.enter_async_context(client)
            load = _Load(client, calls_per_s)
            loading = asyncio.create_task(load.run())
            async with asyncio.timeout(900):
                while await _overdue(table, restart, 1):
                    await asyncio.sleep(0.5)
            await asyncio.gather(*ready)
            if idle:
                await asyncio.sleep(IDLE_S)
            await asyncio.sleep(1.0)  # the last acknowledged ticks land in the grains
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            results.append(json.loads(await _line(p, "RESULT ")))
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    async with asyncio.timeout(60):
                        await p.wait()
                except TimeoutError:
                    p.kill()
                    await p.wait()
    rows = await _read_back(url, service_id)
    row = _summary(setting, n, k, started, restart, results, load, rows)
    row["load_avg"] = [round(load_avg, 1), round(os.getloadavg()[0], 1)]
    return row


async def _line(proc: asyncio.subprocess.Process, prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError(f"a silo exited before printing {prefix.strip()}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


async def _read_back(url: str, service_id: str) -> list[ReminderEntry]:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=service_id)
        await table.start(stack)
        return list(await table.read_range(RingRange.full()))


def _shown(o: ReminderOptions) -> dict[str, Any]:
    lag = o.catch_up_max_lag
    return {
        "catch_up_rate": o.catch_up_rate,
        "catch_up_ceiling": o.catch_up_ceiling,
        "catch_up_max_lag_ms": None if lag is None else lag.total_seconds() * 1000,
    }


def _peak(times: list[float]) -> int:
    times = sorted(times)
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] < t - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _summary(
    setting: str,
    n: int,
    k: int,
    started: float,
    restart: datetime,
    results: list[dict[str, Any]],
    load: _Load | None,
    rows: list[ReminderEntry],
) -> dict[str, Any]:
    restart_s = restart.timestamp()
    # A row's catch-up tick is its first one: a run longer than five minutes also
    # delivers, on time, the next slots of the rows that caught up first (hourly rows,
    # due 5-55 min before), and a row caught up after its next slot passed gets one
    # tick for both (the latest slot).
    every = sorted(
        (at, key, p, r["name"], slot) for r in results for at, key, p, slot in r["ticks"]
    )
    first_of: dict[int, tuple[float, int, int, str]] = {}
    for at, key, p, name, _ in every:
        first_of.setdefault(key, (at, key, p, name))
    ticks = sorted(first_of.values())
    on_time = len(every) - len(ticks)
    slots: dict[tuple[int, float], int] = defaultdict(int)
    for _, key, _, _, slot in every:
        slots[(key, slot)] += 1
    times = [at for at, *_ in ticks]
    calls_sent = [c[0] for c in (load.calls if load else [])]
    # No ticks (the idle setting): the calls' whole span.
    first, last = (min(times), max(times)) if times else (min(calls_sent), max(calls_sent))
    per_key = {key: 1 for _, key, _, _ in ticks}
    fire = {i for i in range(n) if i % 10 != 9}
    by_prio: dict[int, list[float]] = defaultdict(list)
    for at, _, p, _ in ticks:
        by_prio[p].append(at - first)
    critical_early = critical_total = 0
    peaks: list[int] = []
    firsts: list[int] = []
    for r in results:
        mine = [(at, p) for at, key, p, name in ticks if name == r["name"]]
        if not mine:
            peaks.append(0)
            firsts.append(0)
            continue
        stamps = [at for at, _ in mine]
        peaks.append(_peak(stamps))
        firsts.append(sum(1 for at in stamps if at < min(stamps) + 1.0))
        normal = sorted(at for at, p in mine if p == ReminderPriority.NORMAL)
        crit = [at for at, p in mine if p == ReminderPriority.CRITICAL]
        if normal:
            median = normal[len(normal) // 2]
            critical_early += sum(1 for at in crit if at < median)
            critical_total += len(crit)
    calls = [c for c in (load.calls if load else []) if first <= c[0] <= last]
    latencies = [s * 1000 for _, s, ok in calls if ok]
    restart_ms = restart.timestamp()

    def done(p: int, q: float) -> float:
        xs = sorted(by_prio.get(int(p), []))
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    return {
        "setting": setting,
        "options": _shown(ReminderOptions(**_catch_up(setting))),
        "rows": n,
        "silos": k,
        "ticks": len(ticks),
        "first_tick_s": first - started if times else float("nan"),
        "catch_up_s": last - started if times else float("nan"),
        "peak_per_silo": peaks,
        "first_s_per_silo": firsts,
        "peak_cluster": _peak(times) if times else 0,
        "critical_p50_s": done(ReminderPriority.CRITICAL, 0.5),
        "critical_done_s": done(ReminderPriority.CRITICAL, 1.0),
        "normal_p50_s": done(ReminderPriority.NORMAL, 0.5),
        "normal_done_s": done(ReminderPriority.NORMAL, 1.0),
        "background_done_s": done(ReminderPriority.BACKGROUND, 1.0),
        "critical_before_normal": critical_early / critical_total if critical_total else 0.0,
        "calls": len(calls),
        "call_errors": sum(1 for c in calls if not c[2]),
        "call_p50_ms": _pct(latencies, 50),
        "call_p99_ms": _pct(latencies, 99),
        "call_max_ms": max(latencies, default=float("nan")),
        "undelivered": sum(1 for i in fire if per_key.get(i, 0) == 0),
        "doubled": sum(1 for n in slots.values() if n > 1),
        "skip_delivered": sum(1 for (key, slot) in slots if key % 10 == 9 and slot < restart_s),
        "overdue_left": sum(1 for r in rows if r.next_due.timestamp() <= restart_ms),
        "on_time_ticks": on_time,
        "silo_cpu_s": [round(r["cpu_s"], 1) for r in results],
        "declared_dead": sum(1 for r in results if r["declared_dead"]),
    }


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with RedisServer() as server:
        for _ in range(args.rounds):
            for setting in args.settings:
                row = run(_restart(server.url, args.rows, args.silos, setting, args.calls_per_s))
                print(json.dumps(row), flush=True)
                out.append(row)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        url, service_id, name, setting = sys.argv[2:6]
        run(_serve(url, service_id, name, setting))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--silos", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["idle", "default", "off"])
    parser.add_argument("--calls-per-s", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = main(args)
    print_report(
        "herd_restart",
        rows,
        [
            "setting",
            "catch_up_s",
            "first_tick_s",
            "peak_per_silo",
            "first_s_per_silo",
            "peak_cluster",
            "critical_done_s",
            "normal_p50_s",
            "normal_done_s",
            "critical_before_normal",
            "calls",
            "call_errors",
            "call_p50_ms",
            "call_p99_ms",
            "call_max_ms",
            "undelivered",
            "doubled",
            "skip_delivered",
            "overdue_left",
            "declared_dead",
            "load_avg",
        ],
        loop=loop_name(),
        rows_total=args.rows,
        silos=args.silos,
        calls_per_s=args.calls_per_s,
    )
