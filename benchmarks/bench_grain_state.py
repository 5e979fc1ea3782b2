"""Grain state writes and activations-with-state per second, on Redis and PostgreSQL,
beside the raw store driven the same way in the same run.

Run: ``python -m benchmarks.bench_grain_state [--seconds 3] [--grains 64] [--rounds 3]``.

It starts a private ``redis-server`` and makes a throw-away PostgreSQL database
(``ORLEANSPY_TEST_POSTGRES_URL``, default the machine's server). For each store,
``--grains`` concurrent callers each drive their own grain on an embedded silo
whose "default" storage is that store:

- ``write``: a grain call that changes the state and ``await self.s.write()``
  (an etag-checked Lua script on Redis, ``UPDATE ... WHERE version = $etag`` on
  PostgreSQL); baseline: raw redis-py ``HSET`` / raw asyncpg ``UPDATE`` of the
  same bytes, same concurrency, same connection pool size.
- ``activate``: a call to a grain never activated before, whose state was
  stored beforehand: the activation reads the state, then the call returns it;
  baseline: raw ``HMGET`` / ``SELECT`` of one record.

The providers let operations that arrive together share one round trip
(``storage._batch``): Redis reads and writes go in pipelines, PostgreSQL reads in
one query. The baselines send one command per operation, as a hand-written
store in a grain would.

Orleanspy and the baseline alternate for ``--rounds`` rounds; the median of each
is reported. Target: orleanspy at least 0.5x the raw store.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from benchmarks._util import loop_name, print_report, ratio, run
from orleanspy import Grain, Silo, SiloOptions, persistent_state
from orleanspy._redis import connect
from orleanspy.identity import GrainId
from orleanspy.serialization import Codec
from orleanspy.state import encode_state
from orleanspy.storage.contract import GrainStorage
from orleanspy.storage.postgres import PostgresGrainStorage
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisServer

# PostgreSQL connections, for orleanspy's provider and the baseline alike. On Redis
# both use the project's client defaults (a blocking pool of up to 64 connections).
POOL = 16


@dataclass
class Basket:
    owner: str = ""
    items: list[str] = field(default_factory=list)
    total_cents: int = 0
    version: int = 0


def _basket(key: int) -> Basket:
    return Basket(owner=f"customer-{key}", items=["lamp", "chair", "table"], total_cents=12_345)


class BenchStateGrain(Grain):
    basket = persistent_state(Basket)

    async def bump(self) -> int:
        self.basket.state.version += 1
        await self.basket.write()
        return self.basket.state.version

    async def peek(self) -> int:
        return self.basket.state.total_cents


async def _rate(work: Callable[[int, int], Awaitable[Any]], callers: int, seconds: float) -> float:
    """Operations per second: ``callers`` tasks, caller ``c`` calling ``work(c, i)``
    with its own running count ``i``, until ``seconds`` have passed."""
    # Garbage from the previous phase (tens of thousands of activations) would be
    # collected during this one; collect it now, for orleanspy and baseline alike.
    gc.collect()
    count = 0
    stop = time.perf_counter() + seconds

    async def caller(c: int) -> None:
        nonlocal count
        for i in itertools.count():
            if time.perf_counter() >= stop:
                return
            await work(c, i)
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return count / (time.perf_counter() - start)


async def _seed(storage: GrainStorage, keys: range, codec: Codec) -> None:
    sem = asyncio.Semaphore(64)

    async def one(k: int) -> None:
        async with sem:
            data = encode_state(_basket(k), codec)
            await storage.write(GrainId("BenchStateGrain", k), "basket", data, None)

    await asyncio.gather(*(one(k) for k in keys))


async def _orleanspy(
    url: str, grains: int, seconds: float, seeded: int, fresh: Iterator[int]
) -> dict[str, float]:
    options = SiloOptions(name="bench", storage={"default": url}, tune_gc=True)
    async with Silo.local(options) as silo:
        proxies = [silo.client.get_grain(BenchStateGrain, f"w{c}") for c in range(grains)]
        await asyncio.gather(*(p.bump() for p in proxies))  # activate, first write
        writes = await _rate(lambda c, _: proxies[c].bump(), grains, seconds)

        async def activate(c: int, _: int) -> None:
            key = next(fresh)
            if key >= seeded:
                raise RuntimeError("ran out of seeded grains; raise --seed")
            await silo.client.get_grain(BenchStateGrain, key).peek()

        activations = await _rate(activate, grains, seconds)
    return {"write": writes, "activate": activations}


async def _raw_redis(url: str, grains: int, seconds: float) -> dict[str, float]:
    codec = Codec()
    data = encode_state(_basket(0), codec)
    client = connect(url)
    try:
        keys = [f"raw:{{w{c}}}" for c in range(grains)]
        await asyncio.gather(*(client.hset(k, mapping={"d": data, "e": "0"}) for k in keys))
        writes = await _rate(lambda c, _: client.hset(keys[c], "d", data), grains, seconds)
        reads = await _rate(lambda c, _: client.hmget(keys[c], ["d", "e"]), grains, seconds)
    finally:
        await client.aclose()
    return {"write": writes, "activate": reads}


async def _raw_postgres(url: str, grains: int, seconds: float) -> dict[str, float]:
    codec = Codec()
    data = encode_state(_basket(0), codec)
    pool = await asyncpg.create_pool(url, min_size=POOL, max_size=POOL)
    try:
        await pool.execute(
            "CREATE TABLE IF NOT EXISTS raw_state (id text PRIMARY KEY, data bytea, v bigint)"
        )
        await pool.executemany(
            "INSERT INTO raw_state VALUES ($1, $2, 0) ON CONFLICT DO NOTHING",
            [(f"w{c}", data) for c in range(grains)],
        )
        update = "UPDATE raw_state SET data = $2 WHERE id = $1"
        writes = await _rate(lambda c, _: pool.execute(update, f"w{c}", data), grains, seconds)
        reads = await _rate(
            lambda c, _: pool.fetchrow("SELECT data, v FROM raw_state WHERE id = $1", f"w{c}"),
            grains,
            seconds,
        )
    finally:
        await pool.close()
    return {"write": writes, "activate": reads}


async def _bench(
    store: str, url: str, args: argparse.Namespace, make: Callable[[], GrainStorage]
) -> list[dict[str, Any]]:
    seeded = args.seed
    async with AsyncExitStack() as stack:
        storage = make()
        await storage.start(stack)
        await _seed(storage, range(seeded), Codec())
    ours: dict[str, list[float]] = {"write": [], "activate": []}
    raw: dict[str, list[float]] = {"write": [], "activate": []}
    baseline = _raw_redis if store == "redis" else _raw_postgres
    for _ in range(args.rounds):
        for op, rate in (await baseline(url, args.grains, args.seconds)).items():
            raw[op].append(rate)
        # Every round's silo starts empty, so each round activates the seeded grains anew.
        fresh = itertools.count()
        for op, rate in (await _orleanspy(url, args.grains, args.seconds, seeded, fresh)).items():
            ours[op].append(rate)
    rows = []
    for op, raw_name in (("write", "HSET" if store == "redis" else "UPDATE"),
                         ("activate", "HMGET" if store == "redis" else "SELECT")):  # fmt: skip
        mine, theirs = statistics.median(ours[op]), statistics.median(raw[op])
        rows.append({
            "store": store,
            "operation": "state write" if op == "write" else "activation with state",
            "orleanspy_per_s": mine,
            "baseline": f"raw {raw_name}",
            "baseline_per_s": theirs,
            "ratio": ratio(mine, theirs),
            "orleanspy_rounds": [round(r) for r in ours[op]],
            "baseline_rounds": [round(r) for r in raw[op]],
        })  # fmt: skip
    return rows


async def main(args: argparse.Namespace, redis_url: str, pg_url: str) -> list[dict[str, Any]]:
    rows = await _bench(
        "redis", redis_url, args, lambda: RedisGrainStorage(redis_url, service_id="default")
    )
    rows += await _bench(
        "postgresql",
        pg_url,
        args,
        lambda: PostgresGrainStorage(pg_url, service_id="default", pool_size=POOL),
    )
    return rows


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--grains", type=int, default=64, help="concurrent grains (callers)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=60_000, help="grains with stored state")
    args = parser.parse_args()
    with RedisServer() as redis, PostgresDatabase() as pg:
        rows = run(main(args, redis.url, pg.url))
    print_report(
        "bench_grain_state",
        rows,
        ["store", "operation", "orleanspy_per_s", "baseline", "baseline_per_s", "ratio"],
        loop=loop_name(),
        grains=args.grains,
        seconds=args.seconds,
        rounds=args.rounds,
        pool=POOL,
    )


if __name__ == "__main__":
    cli()
