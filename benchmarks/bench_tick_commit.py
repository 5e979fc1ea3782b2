"""What committing a tick with the state costs: ticks per second, lateness and CPU
with ``write(tick=status)`` beside a plain ``write()``, and beside grains without
state, in one run.

Run: ``python -m benchmarks.bench_tick_commit [--rates 2000 5000] [--seconds 7]``.

For each rate ``N``, ``N`` one-second reminders in a Redis reminder table (a
private redis-server) tick ``N`` grains on an embedded silo, persistence on, as
``bench_reminder_ticks`` does; three kinds of grain, one run each:

- ``no state``: the grain records the tick and writes nothing (the tick
  benchmark's grain; the runtime's check before a tick finds no state);
- ``write()``: the grain appends the slot to a persistent state on Redis grain
  storage (the same server) and writes it;
- ``write(tick=)``: the same, committing the tick with the state.

``writes_per_tick`` counts the grain storage's write calls per tick delivered:
a commit must cost no round trip more than a plain write. ``silo_cpu_us`` and
``redis_cpu_us`` are CPU per tick over the measured span. The pass line is the
tick benchmark's: every tick delivered at p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil

from benchmarks._util import loop_name, print_report, ratio, reset_collector, run
from benchmarks.bench_reminder_ticks import (
    LATE_GRACE_S,
    PERIOD,
    CpuMeter,
    measure_cpu,
    per_tick_us,
    seed,
    summary,
)
from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus
from orleanspy import persistent_state as state_of
from orleanspy.grain import definition_of
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.redis_server import RedisServer

#: (slot, received) in epoch seconds, for ticks of the current run.
RECEIVED: list[tuple[float, float]] = []
LEAD_S = 2.0


@dataclass
class Slots:
    last: list[float] = field(default_factory=list)


class NoStateGrain(Grain, Remindable, type_name="bench_tick_commit.NoState"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((status.current_tick_time.timestamp(), time.time()))


class PlainWriteGrain(Grain, Remindable, type_name="bench_tick_commit.Plain"):
    slots = state_of(Slots)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((status.current_tick_time.timestamp(), time.time()))
        self.slots.state.last = [status.current_tick_time.timestamp()]
        await self.slots.write()


class CommitGrain(Grain, Remindable, type_name="bench_tick_commit.Commit"):
    slots = state_of(Slots)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((status.current_tick_time.timestamp(), time.time()))
        self.slots.state.last = [status.current_tick_time.timestamp()]
        await self.slots.write(tick=status)


KINDS: dict[str, type[Grain]] = {
    "no state": NoStateGrain,
    "write()": PlainWriteGrain,
    "write(tick=)": CommitGrain,
}


async def silo_run(server: RedisServer, n: int, seconds: float, kind: str) -> dict[str, Any]:
    RECEIVED.clear()
    grain = KINDS[kind]
    type_name = definition_of(grain).type_name
    service_id = f"bench-commit-{n}-{time.monotonic_ns()}"
    storage = RedisGrainStorage(server.url, service_id=service_id)
    writes = {"n": 0}
    real_write = storage.write

    async def counted(*args: Any, **kwargs: Any) -> str | None:
        writes["n"] += 1
        return await real_write(*args, **kwargs)

    storage.write = counted  # type: ignore[method-assign]
    options = SiloOptions(
        grain_types=(grain,),
        collection_age=timedelta(hours=1),
        reminders=ReminderOptions(
            look_ahead=timedelta(seconds=10),
            poll_interval=timedelta(seconds=5),
            adaptive=False,
            base_bucket_size=2 * n,
        ),
        storage={"default": storage},
    )
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(server.url, service_id=service_id)
        await table.start(stack)
        t0 = time.time() + LEAD_S + n / 10000
        step = PERIOD.total_seconds() / n
        await seed(
            table,
            [
                ReminderEntry(
                    service_id=service_id,
                    grain_id=GrainId(type_name, i),
                    name="r",
                    start_at=(at := datetime.fromtimestamp(t0 + i * step, UTC)),
                    next_due=at,
                    period=PERIOD,
                )
                for i in range(n)
            ],
        )
        reset_collector()
        async with Silo.local(options, reminder_table=table) as silo:
            meter = CpuMeter(silo=psutil.Process().pid, redis=server.pid)
            await measure_cpu(meter, t0, seconds)
            await asyncio.sleep(LATE_GRACE_S)
            service = silo.reminder_service
            assert service is not None
            delivered = service.stats.delivered
            written = writes["n"]
    row = summary(kind, n, RECEIVED, t0, seconds)
    row.update(
        silo_cpu_us=per_tick_us(meter.spent["silo"], row, seconds),
        redis_cpu_us=per_tick_us(meter.spent["redis"], row, seconds),
        writes_per_tick=written / delivered if delivered else float("nan"),
    )
    return row


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with RedisServer() as server:
        for n in args.rates:
            by_kind = {}
            for kind in KINDS:
                by_kind[kind] = row = await silo_run(server, n, args.seconds, kind)
                rows.append(row)
            for kind in ("write()", "write(tick=)"):
                by_kind[kind]["vs_no_state_ticks"] = ratio(
                    by_kind[kind]["ticks_per_s"], by_kind["no state"]["ticks_per_s"]
                )
            commit, plain = by_kind["write(tick=)"], by_kind["write()"]
            commit["vs_plain_cpu"] = ratio(commit["silo_cpu_us"], plain["silo_cpu_us"])
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--seconds", type=float, default=7.0)
    args = parser.parse_args()
    report = run(main(args))
    print_report(
        "tick commit",
        report,
        [
            "kind", "offered_per_s", "ticks_per_s", "delivered_share", "lateness_p50_ms",
            "lateness_p99_ms", "silo_cpu_us", "redis_cpu_us", "writes_per_tick",
            "vs_no_state_ticks", "vs_plain_cpu", "ok",
        ],
        loop=loop_name(),
        seconds=args.seconds,
    )  # fmt: skip
