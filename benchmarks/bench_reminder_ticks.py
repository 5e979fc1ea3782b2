"""Reminder ticks per second on one silo, with lateness and CPU, beside raw asyncio timers.

Run: ``python -m benchmarks.bench_reminder_ticks [--rates 2000 4000 ...] [--seconds 7]
[--default-window 2000] [--no-gc-compare] [--backend redis|postgres] [--redis-cluster]``.

``--redis-cluster`` also runs each ``window 2N`` rate on a private 3-master Redis
Cluster (a replica each), beside the one-Redis run of the same rate; its
``redis_cpu_us`` is the three masters' CPU together (``per_master_cpu_us`` each).

``--backend postgres`` also runs each ``window 2N`` rate on a
``PostgresReminderTable`` (a throw-away database on the machine's PostgreSQL),
beside the Redis table in the same run; those rows do not enter the sweep.

For each offered rate ``N``, ``N`` reminders with a 1 s period are written into
a Redis reminder table (a private redis-server), their first slots spread evenly
over one period, so the silo is offered ``N`` ticks per second. An embedded silo
with that table (persistence on: every acknowledged tick is written back,
batched) delivers them to ``N`` local grains for ``--seconds``. Lateness is the
grain's receipt time minus the scheduled slot (``TickStatus.current_tick_time``).

- ``window 2N``: ``base_bucket_size = 2N``, so the window can hold every row;
  the rates are swept upwards and the *saturation point* is the highest rate at
  which every tick of the measured span was delivered with p99 lateness <= 50 ms.
- ``first_*``, ``cold_ok``: the first period (slots in the run's first second),
  in which each of the ``N`` grains activates on its first tick, is left out of
  the measured span (it ends inside the warm-up) and reported on its own:
  ``first_share`` delivered, ``first_p99_ms``, ``first_max_ms``,
  ``first_over_20ms`` (ticks more than 20 ms late). ``cold_ok``: the rate
  passed and every tick of the first period was delivered at p99 <= 50 ms
  too; the highest such rate is the saturation point *from a cold start*,
  beside ``loop.call_at``'s, whose first period is like any other.
  ``first_cpu_us``: this process's CPU over the first wall second per tick
  received in it. ``loaded_s``: when the silo first held every row, in seconds
  after the first slot (negative: before it; positive means the first
  period's lateness includes the initial read, not only activations).
- ``window default``: the default ``base_bucket_size`` at ``--default-window``
  reminders: what a silo configured out of the box delivers.
- ``tune_gc off``: the 2N run at the saturation point again with
  ``SiloOptions(tune_gc=False)`` (no ``gc.freeze()``, Python's default collector
  thresholds), beside the same run with it on, to show its effect on p99. Every
  silo run starts from Python's default collector settings.

CPU per tick is process CPU time (user + system, all threads) over the measured
span divided by the ticks delivered in it: ``silo_cpu_us`` for this process,
``redis_cpu_us`` for the private redis-server (read with psutil).

After each silo run stops (gracefully), the table is read back: ``unpersisted``
counts reminders whose stored ``last_fire`` is behind the last slot delivered
to their grain (acknowledged ticks the stop left unwritten; they repeat on the
next owner), ``stop_s`` is how long the stop took, and ``drained_s`` when, in
it, every acknowledged tick had been written (``ReminderService.drain``, the first
step of a cluster silo's stop, returned; the rest deactivates grains). On PostgreSQL,
``commits_per_tick`` is the database's ``xact_commit`` (``pg_stat_database``)
over the run per tick delivered, and ``statements_per_tick`` the statements the
table sent through its pool, counted client-side (``pg_stat_statements`` needs a
library preloaded at server start).

The baseline, in the same run and process: the same schedule fired by raw
``loop.call_at`` timers (one per reminder, re-armed on the grid), with lateness
measured the same way: what the event loop alone achieves. Its saturation point
is found by the same sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psutil

from benchmarks._util import loop_name, print_report, reset_collector, run
from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.ring import RingRange
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisClusterServer, RedisServer

if TYPE_CHECKING:
    from orleanspy.reminders.postgres import PostgresReminderTable

PERIOD = timedelta(seconds=1)
TYPE = "bench_reminder_ticks.Tick"
#: Ticks whose slot falls in the first seconds are warm-up: the first period
#: activates one grain per reminder, and on a slower machine (about three times
#: the CPU per tick of the one these figures were first taken on) catching up
#: from it took until 1.5 s into the run at 10,000 reminders.
WARMUP_S = 2.5
#: The silo's safety-net refill period (``--poll-interval``); look-ahead is twice it.
POLL_INTERVAL = timedelta(seconds=5)
#: Seconds from a silo run's start to its first slot, besides the seeding time.
LEAD_S = 2.0
#: How long after the span a run keeps going, so its last slots can be delivered.
LATE_GRACE_S = 0.5
#: The saturation criterion.
P99_LIMIT_MS = 50.0
#: Rows per ``upsert_many`` while seeding a table.
_SEED_BATCH = 1000
DEFAULT_RATES = [1000, 2000, 4000, 6000, 8000, 10000, *range(15000, 50001, 5000)]

#: (slot, received) in epoch seconds, for ticks of the current run.
RECEIVED: list[tuple[float, float]] = []
#: The latest slot delivered per reminder (grain key) in the current run.
LAST_SLOT: dict[Any, datetime] = {}


class BenchTickGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot = status.current_tick_time
        RECEIVED.append((slot.timestamp(), time.time()))
        LAST_SLOT[self.grain_id.key] = slot


def percentiles(lateness_ms: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) of ``lateness_ms``; NaN when there are fewer than two samples."""
    if len(lateness_ms) < 2:
        return (float("nan"), float("nan"))
    q = statistics.quantiles(lateness_ms, n=100, method="inclusive")
    return q[49], q[98]


def summary(
    kind: str, n: int, samples: list[tuple[float, float]], t0: float, seconds: float
) -> dict[str, Any]:
    """Ticks whose slot lies in the measured span ``[t0 + WARMUP_S, t0 + seconds)``
    (steady state), and, as ``first_*``, those of the first period ``[t0, t0 + 1 s)``:
    on a silo, every grain activates on its first tick there (cold start)."""
    window = [(slot, got) for slot, got in samples if t0 + WARMUP_S <= slot < t0 + seconds]
    lateness = [(got - slot) * 1000 for slot, got in window]
    p50, p99 = percentiles(lateness)
    span = seconds - WARMUP_S
    expected = round(n * span / PERIOD.total_seconds())
    period = PERIOD.total_seconds()
    first = [(got - slot) * 1000 for slot, got in samples if t0 <= slot < t0 + period]
    first_p99 = percentiles(first)[1]
    ok = len(window) >= expected and p99 <= P99_LIMIT_MS
    return {
        "kind": kind,
        "offered_per_s": n,
        "ticks_per_s": len(window) / span,
        "delivered_share": len(window) / expected if expected else float("nan"),
        "lateness_p50_ms": p50,
        "lateness_p99_ms": p99,
        "lateness_max_ms": max(lateness, default=float("nan")),
        "ok": ok,
        "first_share": len(first) / n,
        "first_p99_ms": first_p99,
        "first_max_ms": max(first, default=float("nan")),
        "first_over_20ms": sum(1 for late in first if late > 20.0),
        # From a cold start: the steady state holds, and so did the first period.
        "cold_ok": ok and len(first) >= n and first_p99 <= P99_LIMIT_MS,
    }


class CpuMeter:
    """CPU seconds (user + system, all threads) of some processes between two marks."""

    def __init__(self, **pids: int | None) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self._start: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        out = {}
        for name, proc in self._procs.items():
            t = proc.cpu_times()
            out[name] = t.user + t.system
        return out

    def mark_start(self) -> None:
        self._start = self._now()

    def mark_end(self) -> None:
        end = self._now()
        self.spent = {name: end[name] - self._start[name] for name in end}


async def measure_cpu(meter: CpuMeter, t0: float, seconds: float) -> CpuMeter:
    """Mark ``meter`` at the start and end of the measured span (wall clock);
    returns a meter of this process over the first period (``[t0, t0 + 1 s)``)."""
    first = CpuMeter(silo=psutil.Process().pid)
    await asyncio.sleep(max(0.0, t0 - time.time()))
    first.mark_start()
    await asyncio.sleep(max(0.0, t0 + PERIOD.total_seconds() - time.time()))
    first.mark_end()
    await asyncio.sleep(max(0.0, t0 + WARMUP_S - time.time()))
    meter.mark_start()
    await asyncio.sleep(max(0.0, t0 + seconds - time.time()))
    meter.mark_end()
    return first


def per_tick_us(cpu_s: float, row: dict[str, Any], seconds: float) -> float:
    ticks = row["ticks_per_s"] * (seconds - WARMUP_S)
    return cpu_s * 1e6 / ticks if ticks else float("nan")


def first_cpu_us(first: CpuMeter, samples: list[tuple[float, float]], t0: float) -> float:
    """This process's CPU over the first period's wall second per tick received
    in it (whatever its slot): what a tick cost while the grains activated."""
    end = t0 + PERIOD.total_seconds()
    ticks = sum(1 for _slot, got in samples if t0 <= got < end)
    return first.spent["silo"] * 1e6 / ticks if ticks else float("nan")


def _table(url: str, service_id: str) -> RedisReminderTable | PostgresReminderTable:
    if url.startswith("postgresql://"):
        from orleanspy.reminders.postgres import PostgresReminderTable

        return PostgresReminderTable(url, service_id=service_id)
    return RedisReminderTable(url, service_id=service_id)


async def silo_run(
    server: RedisServer | RedisClusterServer,
    n: int,
    seconds: float,
    *,
    bucket: int | None,
    kind: str,
    tune_gc: bool = True,
    postgres_url: str | None = None,
) -> dict[str, Any]:
    """``n`` one-second reminders on an embedded silo with a Redis table (or a
    PostgreSQL one when ``postgres_url`` is given)."""
    RECEIVED.clear()
    LAST_SLOT.clear()
    reminders = ReminderOptions(
        look_ahead=2 * POLL_INTERVAL,
        poll_interval=POLL_INTERVAL,
        adaptive=False,
    )
    if bucket is not None:
        reminders = replace(reminders, base_bucket_size=bucket)
    options = SiloOptions(
        grain_types=(BenchTickGrain,),
        collection_age=timedelta(hours=1),
        reminders=reminders,
        tune_gc=tune_gc,
    )
    service_id = f"bench-ticks-{n}-{time.monotonic_ns()}"
    async with AsyncExitStack() as stack:
        table = _table(postgres_url or server.url, service_id)
        redis_pids = _redis_pids(server)
        await table.start(stack)
        # Start two seconds from now, slots spread evenly over one period, plus
        # time to seed and load (on a loaded machine 25,000 rows were still being
        # read 0.4-0.9 s into the first period with 1.25 s: ``loaded_s``).
        # PostgreSQL's larger share dates from seeding one commit per row (about
        # 1 ms with fsync here); ``seed`` now commits per batch.
        t0 = time.time() + LEAD_S + (n / 400 if postgres_url else n / 10000)
        step = PERIOD.total_seconds() / n
        entries = [
            _entry(service_id, i, datetime.fromtimestamp(t0 + i * step, UTC)) for i in range(n)
        ]
        await seed(table, entries)
        commits_before = await _commits(postgres_url) if postgres_url else 0
        counter = _count_statements(table)
        reset_collector()
        silo = Silo.local(options, reminder_table=table)
        async with silo:
            meter = CpuMeter(
                silo=psutil.Process().pid,
                **({} if postgres_url else {f"redis{i}": pid for i, pid in enumerate(redis_pids)}),
            )
            service = silo.reminder_service
            assert service is not None
            loaded = asyncio.create_task(_loaded_at(service, n, t0, seconds))
            first = await measure_cpu(meter, t0, seconds)
            # The last slots of the span are delivered a moment after it ends.
            await asyncio.sleep(LATE_GRACE_S)
            loaded_s = await loaded
            # Still ticking: persistence is measured as written versus delivered.
            stats = service.stats
            # A cluster silo's stop starts with this (``Silo._leave_cluster``);
            # an embedded one flushes when its stack closes: drained here, so
            # both are measured alike.
            stopping = time.perf_counter()
            await service.drain()
            drained_s = time.perf_counter() - stopping
        stop_s = time.perf_counter() - stopping
    statements = counter.get("n", 0)
    commits = (await _commits(postgres_url) - commits_before) if postgres_url else 0
    unpersisted = await _unpersisted(postgres_url or server.url, service_id)
    row = summary(kind, n, RECEIVED, t0, seconds)
    row.update(
        bucket=options.reminders.base_bucket_size,
        loaded_s=loaded_s,
        silo_cpu_us=per_tick_us(meter.spent["silo"], row, seconds),
        first_cpu_us=first_cpu_us(first, RECEIVED, t0),
        redis_cpu_us=per_tick_us(
            sum(v for k, v in meter.spent.items() if k.startswith("redis")) or float("nan"),
            row,
            seconds,
        ),
        per_master_cpu_us=per_tick_us(
            max((v for k, v in meter.spent.items() if k.startswith("redis")), default=float("nan")),
            row,
            seconds,
        ),
        delivered=stats.delivered,
        persisted=stats.persisted,
        missed=stats.missed,
        stop_s=stop_s,
        drained_s=drained_s,
        unpersisted=unpersisted,
    )
    if postgres_url:
        ticks = max(stats.delivered, 1)
        row.update(commits_per_tick=commits / ticks, statements_per_tick=statements / ticks)
    return row


async def _loaded_at(service: Any, n: int, t0: float, seconds: float) -> float:
    """When the silo first held all ``n`` rows, in seconds after the first slot
    (negative: before it), polled every 10 ms; NaN if it never did. Positive
    values mean the first period's lateness includes the initial read."""
    while time.time() < t0 + seconds:
        if service.stats.resident >= n:
            return time.time() - t0
        await asyncio.sleep(0.01)
    return float("nan")


async def _unpersisted(url: str, service_id: str) -> int:
    """Reminders whose stored ``last_fire`` is behind the last slot delivered to
    their grain (read back after the silo stopped): acknowledged ticks a graceful
    stop left unwritten, which the next owner delivers again."""
    async with AsyncExitStack() as stack:
        table = _table(url, service_id)
        await table.start(stack)
        stored = {
            row.grain_id.key: row.last_fire for row in await table.read_range(RingRange.full())
        }
    return sum(
        1 for key, slot in LAST_SLOT.items() if (last := stored.get(key)) is None or last < slot
    )


async def _commits(url: str | None) -> int:
    """``xact_commit`` of the benchmark's database (``pg_stat_database``)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        # Ended backends report at exit; a fresh snapshot sees them.
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        )
    finally:
        await conn.close()


class _CountingPool:
    """A pool proxy counting the statements sent through it."""

    _STATEMENTS = frozenset({"fetch", "fetchrow", "fetchval", "execute", "executemany"})

    def __init__(self, pool: Any, counter: dict[str, int]) -> None:
        self._pool, self._counter = pool, counter

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if name not in self._STATEMENTS:
            return attr

        async def counted(*a: Any, **kw: Any) -> Any:
            self._counter["n"] += 1
            return await attr(*a, **kw)

        return counted


def _count_statements(table: Any) -> dict[str, int]:
    """Count the statements a PostgreSQL table sends through its pool (the
    server's ``pg_stat_statements`` needs a preloaded library this server may
    lack): every ``fetch``/``fetchrow``/``fetchval``/``execute``/``executemany``."""
    counter = {"n": 0}
    if getattr(table, "_pool", None) is not None:
        table._pool = _CountingPool(table._pool, counter)
    return counter


def _redis_pids(server: RedisServer | RedisClusterServer) -> list[int]:
    """The server's pid, or the cluster's masters' (the replicas' CPU is left out)."""
    if isinstance(server, RedisServer):
        return [server.pid] if server.pid else []
    return [pid for port in server.master_ports() if (pid := server.node(port).pid)]


async def seed(
    table: RedisReminderTable | PostgresReminderTable, entries: Sequence[ReminderEntry]
) -> None:
    """Write ``entries`` in pipelined batches: one upsert per round trip took
    longer than a run's lead on a slower machine (8,000 rows: 2.7 s), so the
    first slots passed unseeded."""
    for i in range(0, len(entries), _SEED_BATCH):
        await table.upsert_many(entries[i : i + _SEED_BATCH])


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
    # The silo runs before this leave garbage: a full collection of it inside
    # the span cost the baseline 170-250 ms pauses at 15,000/s. Start it as
    # clean as silo_run starts.
    reset_collector()
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
    meter = CpuMeter(silo=psutil.Process().pid)
    first = await measure_cpu(meter, t0, seconds)
    await asyncio.sleep(max(0.0, end - time.time()) + LATE_GRACE_S)
    row = summary("loop.call_at", n, samples, t0, seconds)
    row["silo_cpu_us"] = per_tick_us(meter.spent["silo"], row, seconds)
    row["first_cpu_us"] = first_cpu_us(first, samples, t0)
    return row


async def main(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    saturation = {"window 2N": 0, "loop.call_at": 0, "window 2N cold": 0, "loop.call_at cold": 0}
    with RedisServer() as server:
        database = PostgresDatabase() if args.backend == "postgres" else None
        cluster = RedisClusterServer() if args.redis_cluster else None
        if database is not None:
            # Its own loop: create() must not run inside this one.
            await asyncio.to_thread(database.create)
        if cluster is not None:
            await asyncio.to_thread(cluster.start)
        try:
            await _sweep(args, server, database, rows, saturation, cluster)
        finally:
            if database is not None:
                await asyncio.to_thread(database.drop)
            if cluster is not None:
                cluster.close()
    return rows, saturation


async def _sweep(
    args: argparse.Namespace,
    server: RedisServer,
    database: PostgresDatabase | None,
    rows: list[dict[str, Any]],
    saturation: dict[str, int],
    cluster: RedisClusterServer | None = None,
) -> None:
    failed = {"window 2N": 0, "loop.call_at": 0}
    for n in sorted(args.rates):
        if failed["window 2N"] < 2:
            row = await silo_run(server, n, args.seconds, bucket=2 * n, kind="window 2N")
            rows.append(row)
            _tally(row, "window 2N", n, saturation, failed)
            if database is not None:
                rows.append(
                    await silo_run(
                        server,
                        n,
                        args.seconds,
                        bucket=2 * n,
                        kind="window 2N (PostgreSQL)",
                        postgres_url=database.url,
                    )
                )
            if cluster is not None:
                rows.append(
                    await silo_run(
                        cluster, n, args.seconds, bucket=2 * n, kind="window 2N (Redis Cluster)"
                    )
                )
        if failed["loop.call_at"] < 2:
            row = await timers_run(n, args.seconds)
            rows.append(row)
            _tally(row, "loop.call_at", n, saturation, failed)
        if min(failed.values()) >= 2:
            break
    if args.default_window:
        rows.append(
            await silo_run(
                server, args.default_window, args.seconds, bucket=None, kind="window default"
            )
        )
    if not args.no_gc_compare and saturation["window 2N"]:
        n = saturation["window 2N"]
        for tune_gc in (True, False):
            rows.append(
                await silo_run(
                    server,
                    n,
                    args.seconds,
                    bucket=2 * n,
                    kind=f"tune_gc {'on' if tune_gc else 'off'}",
                    tune_gc=tune_gc,
                )
            )


def _tally(
    row: dict[str, Any], kind: str, n: int, saturation: dict[str, int], failed: dict[str, int]
) -> None:
    # A rate that passes after one that failed still counts (the machine is noisy),
    # but two failures in a row (of the steady state) end the sweep.
    if row["cold_ok"]:
        saturation[f"{kind} cold"] = max(saturation[f"{kind} cold"], n)
    if row["ok"]:
        saturation[kind] = max(saturation[kind], n)
        failed[kind] = 0
    else:
        failed[kind] += 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=int, nargs="+", default=DEFAULT_RATES)
    parser.add_argument("--seconds", type=float, default=7.0)
    parser.add_argument("--default-window", type=int, default=2000)
    parser.add_argument("--no-gc-compare", action="store_true")
    parser.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    parser.add_argument("--redis-cluster", action="store_true")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=POLL_INTERVAL.total_seconds(),
        help="refill period in s; above --seconds no refill runs during the span "
        "(isolates the tick path from refill stalls)",
    )
    args = parser.parse_args()
    POLL_INTERVAL = timedelta(seconds=args.poll_interval)
    rows, saturation = run(main(args))
    print_report(
        "reminder_ticks",
        rows,
        [
            "kind",
            "offered_per_s",
            "bucket",
            "loaded_s",
            "ticks_per_s",
            "delivered_share",
            "lateness_p50_ms",
            "lateness_p99_ms",
            "lateness_max_ms",
            "first_share",
            "first_p99_ms",
            "first_max_ms",
            "first_over_20ms",
            "first_cpu_us",
            "silo_cpu_us",
            "redis_cpu_us",
            "per_master_cpu_us",
            "ok",
            "cold_ok",
            "missed",
            "stop_s",
            "drained_s",
            "unpersisted",
            "commits_per_tick",
            "statements_per_tick",
        ],
        loop=loop_name(),
        period_s=PERIOD.total_seconds(),
        poll_interval_s=args.poll_interval,
        seconds=args.seconds,
        warmup_s=WARMUP_S,
        saturation=saturation,
    )
    print(
        f"\nsaturation (every tick delivered, p99 <= {P99_LIMIT_MS:.0f} ms): "
        f"silo + Redis table {saturation['window 2N']:,}/s, "
        f"loop.call_at {saturation['loop.call_at']:,}/s (highest rate tried: {max(args.rates):,}/s)"
        f"\nfrom a cold start (the first period too): "
        f"silo + Redis table {saturation['window 2N cold']:,}/s, "
        f"loop.call_at {saturation['loop.call_at cold']:,}/s"
    )
