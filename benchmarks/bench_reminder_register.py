"""Bulk reminder registration (``ReminderRegistry.register_many``) beside single
registrations, against one private redis-server, in the same run.

Run: ``python -m benchmarks.bench_reminder_register [--rows 20000] [--batch 500]
[--backend redis|postgres]``.

Each phase writes ``--rows`` fresh interval reminders through a
``ReminderRegistry`` over a ``RedisReminderTable`` (validation included), or
with ``--backend postgres`` over a ``PostgresReminderTable`` in a throw-away
database on the machine's PostgreSQL (``ORLEANSPY_TEST_POSTGRES_URL``, else the
local server):

- ``single, one at a time``: ``register`` awaited row after row, as a loop in
  a grain or a script does;
- ``single, 64 concurrent``: ``register`` with 64 calls in flight;
- ``register_many``: pipelined batches of ``--batch`` rows (one script call per
  shard touched on Redis; one ``INSERT ... SELECT FROM unnest`` per 1,000 rows on
  PostgreSQL);
- ``concurrent upserts``: the same batches as concurrent ``upsert`` calls, which is
  what ``register_many`` does on a table without ``upsert_many`` (without the
  registry's validation, so this baseline is a little flattered);
- ``raw single upserts``: ``table.upsert`` of pre-built rows, one at a time and
  with 64 in flight: the baseline of the targets (no validation, no batching);
- ``declared rows at boot``: ``register_declared_reminders`` over a class
  declaring one reminder for ``--rows`` keys, on an empty table (a first boot:
  every row read, then created on its absence), then again (a restart: every
  row read and found unchanged).

Reported: rows per second, the speed-up over one-at-a-time, and over raw
single upserts with 64 in flight (the targets: 64 concurrent registrations
>= 2x, ``register_many`` >= 50,000 rows/s on Redis, declared rows at boot
>= 20,000 rows/s).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack
from typing import Any

from benchmarks._util import loop_name, print_report, ratio, run
from orleanspy import Grain, Remindable, TickStatus, register_reminder
from orleanspy.clock import SystemClock
from orleanspy.grain import GrainDefinition, definition_of
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.declarations import register_declared_reminders
from orleanspy.remindable.registry import Registration, ReminderRegistry
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.reminders.table import ReminderTable
from orleanspy.tables import table_backend
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer

TYPE = "BenchRegisterGrain"
OPTIONS = ReminderOptions()


class _Remindable:
    remindable = True


def _definitions(type_name: str) -> Any:
    return _Remindable() if type_name.startswith(TYPE) else None


def _declared_definition(rows: int) -> GrainDefinition:
    @register_reminder("declared", due=60, period=3600)
    class BenchDeclaredGrain(
        Grain, Remindable, type_name=f"{TYPE}Declared", reminder_keys=tuple(range(rows))
    ):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    return definition_of(BenchDeclaredGrain)


async def _registry(stack: AsyncExitStack, url: str, service: str) -> ReminderRegistry:
    table: ReminderTable
    if table_backend(url) == "postgres":
        table = PostgresReminderTable(url, service_id=service)
    else:
        table = RedisReminderTable(url, service_id=service)
    await table.start(stack)
    return ReminderRegistry(
        table,
        service_id=service,
        clock=SystemClock(),
        options=OPTIONS,
        definitions=_definitions,
    )


def _registrations(rows: int, tag: str) -> list[Registration]:
    return [
        Registration(GrainId(TYPE, f"{tag}-{i}"), "r", due=60 + i % 600, period=3600)
        for i in range(rows)
    ]


async def measure(url: str, rows: int, batch: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        reg = await _registry(stack, url, "bench-register-single")
        todo = _registrations(rows, "one")
        start = time.perf_counter()
        for r in todo:
            await reg.register(r.grain_id, r.name, r)
        elapsed = time.perf_counter() - start
        results.append({"mode": "single, one at a time", "rows": rows, "seconds": elapsed})

        reg = await _registry(stack, url, "bench-register-concurrent")
        todo = _registrations(rows, "conc")
        sem = asyncio.Semaphore(64)

        async def one(r: Registration) -> None:
            async with sem:
                await reg.register(r.grain_id, r.name, r)

        start = time.perf_counter()
        await asyncio.gather(*map(one, todo))
        elapsed = time.perf_counter() - start
        results.append({"mode": "single, 64 concurrent", "rows": rows, "seconds": elapsed})

        reg = await _registry(stack, url, "bench-register-many")
        todo = _registrations(rows, "many")
        start = time.perf_counter()
        written = await reg.register_many(todo, batch=batch)
        elapsed = time.perf_counter() - start
        assert written == rows and await reg.table.count() == rows
        results.append({"mode": f"register_many, batch {batch}", "rows": rows, "seconds": elapsed})

        reg = await _registry(stack, url, "bench-register-fallback")
        todo = _registrations(rows, "fallback")
        now = reg.clock.now()
        entries = [
            new_entry(
                ReminderSpec(due=r.due, period=r.period),
                service_id=reg.service_id,
                grain_id=r.grain_id,
                name=r.name,
                now=now,
                options=OPTIONS,
            )
            for r in todo
        ]
        start = time.perf_counter()
        for i in range(0, rows, batch):
            await asyncio.gather(*map(reg.table.upsert, entries[i : i + batch]))
        elapsed = time.perf_counter() - start
        assert await reg.table.count() == rows
        results.append(
            {"mode": f"concurrent upserts, batch {batch}", "rows": rows, "seconds": elapsed}
        )

        for mode, width in (
            ("raw single upserts, one at a time", 1),
            ("raw single upserts, 64 concurrent", 64),
        ):
            reg = await _registry(stack, url, f"bench-register-raw-{width}")
            todo = _registrations(rows, f"raw{width}")
            now = reg.clock.now()
            entries = [
                new_entry(
                    ReminderSpec(due=r.due, period=r.period),
                    service_id=reg.service_id,
                    grain_id=r.grain_id,
                    name=r.name,
                    now=now,
                    options=OPTIONS,
                )
                for r in todo
            ]
            gate = asyncio.Semaphore(width)
            table = reg.table

            async def raw(
                e: ReminderEntry, gate: asyncio.Semaphore = gate, table: ReminderTable = table
            ) -> None:
                async with gate:
                    await table.upsert(e)

            start = time.perf_counter()
            await asyncio.gather(*map(raw, entries))
            elapsed = time.perf_counter() - start
            assert await table.count() == rows
            results.append({"mode": mode, "rows": rows, "seconds": elapsed})

        reg = await _registry(stack, url, "bench-register-declared")
        defn = _declared_definition(rows)
        for mode in ("declared rows at boot, first", "declared rows at boot, restart"):
            start = time.perf_counter()
            await register_declared_reminders(reg, [defn])
            elapsed = time.perf_counter() - start
            assert await reg.table.count() == rows
            results.append({"mode": mode, "rows": rows, "seconds": elapsed})
    base = rows / results[0]["seconds"]
    raw64 = next(
        rows / r["seconds"] for r in results if r["mode"].startswith("raw single upserts, 64")
    )
    for row in results:
        row["rows_per_s"] = rows / row["seconds"]
        row["vs_one_at_a_time"] = ratio(row["rows_per_s"], base)
        row["vs_raw_64"] = ratio(row["rows_per_s"], raw64)
    return results


def main(rows: int, batch: int, backend: str) -> None:
    server: RedisServer | PostgresDatabase
    server = PostgresDatabase() if backend == "postgres" else RedisServer()
    with server:
        results = run(measure(server.url, rows, batch))
    print_report(
        "reminder_register",
        results,
        ["mode", "rows", "seconds", "rows_per_s", "vs_one_at_a_time", "vs_raw_64"],
        loop=loop_name(),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    args = parser.parse_args()
    main(args.rows, args.batch, args.backend)
