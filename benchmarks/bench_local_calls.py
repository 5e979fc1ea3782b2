"""Local grain calls per second on one embedded silo, beside a plain ``await`` baseline.

Run: ``python -m benchmarks.bench_local_calls [--seconds 2]``. Prints JSON and a
table. The baseline awaits a coroutine doing the same work as the grain method,
in the same process and run, so the ratio shows the runtime's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterator

from orleanspy import Grain, Silo, SiloOptions, run


class BenchCounterGrain(Grain):
    async def on_activate(self) -> None:
        self.n = 0

    async def add(self, k: int) -> int:
        self.n += k
        return self.n


class _Plain:
    def __init__(self) -> None:
        self.n = 0

    async def add(self, k: int) -> int:
        self.n += k
        return self.n


async def _rate(call: Callable[[], Awaitable[object]], callers: int, seconds: float) -> float:
    count = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            for _ in range(100):
                await call()
            count += 100

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(callers)))
    return count / (time.perf_counter() - start)


async def main(seconds: float) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    plain = _Plain()
    async with Silo.local(SiloOptions(tune_gc=True)) as silo:
        for callers in (1, 100):
            # 100 concurrent callers each call their own grain, as independent clients would;
            # with callers=1 one grain takes every call.
            refs = [silo.client.get_grain(BenchCounterGrain, i) for i in range(callers)]
            for r in refs:
                await r.add(0)
            cycle = itertools.cycle(refs)

            async def grain_call(cycle: Iterator[BenchCounterGrain] = cycle) -> object:
                return await next(cycle).add(1)

            base = await _rate(lambda: plain.add(1), callers, seconds)
            grain = await _rate(grain_call, callers, seconds)
            rows.append(
                {
                    "benchmark": "local_grain_calls",
                    "callers": callers,
                    "grain_calls_per_s": round(grain),
                    "baseline_await_per_s": round(base),
                    "ratio": round(grain / base, 4),
                }
            )
    return rows


def report(rows: list[dict[str, object]]) -> None:
    print(json.dumps(rows, indent=2))
    print(f"{'callers':>8} {'grain calls/s':>15} {'plain await/s':>15} {'ratio':>8}")
    for r in rows:
        print(
            f"{r['callers']:>8} {r['grain_calls_per_s']:>15,} "
            f"{r['baseline_await_per_s']:>15,} {r['ratio']:>8.2%}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    report(run(main(args.seconds)))
