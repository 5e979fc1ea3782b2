"""Cross-silo grain calls per second over gRPC, beside raw echoes between the same processes.

Run: ``python -m benchmarks.bench_cluster_calls [--seconds 2] [--redis-url URL]``.

Two OS processes: this one runs silo A, the child runs silo B plus a raw
``grpc.aio`` unary echo server and a raw length-prefixed TCP echo server (both
from ``benchmarks.bench_transport``). With 1 and 64 concurrent callers it measures:

- ``silo-to-silo``: silo A calls ``BenchEchoGrain`` activations that live on
  silo B (``HashBasedPlacement``; keys are chosen so the hash picks B, and the
  grain's answer confirms it);
- ``client-gateway``: a ``ClusterClient`` in this process calls grains on B
  through B's gateway;
- ``grpc-unary`` and ``tcp``: raw round trips to the child's echo servers.

Each caller has a grain of its own (as independent callers would), so the 64
callers measure throughput, not one grain's turn queue. Ratios are against the
raw TCP echo. A private redis-server is started unless ``--redis-url`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

from benchmarks._util import launch, loop_name, print_report, ratio, run
from benchmarks.bench_transport import (
    CALLERS,
    _bench_tcp,
    _bench_unary,
    _measure,
    _serve_raw_grpc,
    _TcpEcho,
)
from orleanspy import ClusterClient, Grain, Silo, SiloOptions
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.placement import HashBasedPlacement
from orleanspy.testing.redis_server import RedisServer

CLUSTER_ID = "bench"


class BenchEchoGrain(Grain, placement=HashBasedPlacement()):
    """Returns what it is given; ``where`` names its silo."""

    async def echo(self, payload: bytes) -> bytes:
        return payload

    async def where(self) -> str:
        return str(self._activation.runtime.address)


def _options(redis_url: str, name: str, gateway: bool) -> SiloOptions:
    return SiloOptions(
        cluster_id=CLUSTER_ID,
        redis_url=redis_url,
        name=name,
        gateway_port=0 if gateway else None,
    )


async def _until_active(silo: Silo, count: int) -> None:
    assert silo.membership is not None
    async with asyncio.timeout(20):
        while len((await silo.membership.refresh()).active_silos()) < count:
            await asyncio.sleep(0.05)


# ------------------------------------------------------------------ silo B (child)


async def _serve(redis_url: str) -> None:
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        silo = await stack.enter_async_context(Silo(_options(redis_url, "silo-b", True)))
        tcp = await loop.create_server(_TcpEcho, "127.0.0.1", 0)
        stack.push_async_callback(tcp.wait_closed)
        stack.callback(tcp.close)
        unary = await _serve_raw_grpc(stack)
        where = {
            "silo": str(silo.address),
            "unary": str(unary),
            "tcp": str(tcp.sockets[0].getsockname()[1]),
        }
        print(f"READY {json.dumps(where)}", flush=True)
        # Serve until the parent closes our stdin.
        await loop.run_in_executor(None, sys.stdin.read)


# ------------------------------------------------------------------ silo A (parent)


def _keys_on(target: SiloAddress, silos: tuple[SiloAddress, ...]) -> Iterator[int]:
    """Integer keys whose hash placement picks ``target`` among ``silos``."""
    for key in itertools.count():
        grain_id = GrainId("BenchEchoGrain", key)
        if HashBasedPlacement().choose(grain_id, None, silos) == target:
            yield key


async def _bench_grains(
    grains: list[Any], payload: bytes, seconds: float, warmup: float
) -> list[float]:
    rates = []
    for callers in CALLERS:
        # Each concurrent caller (task) keeps a grain of its own, so no two
        # callers ever queue on one activation, and the harness costs one dict
        # lookup per call (the raw echoes pay nothing comparable).
        spare = iter(grains[:callers])
        owned: dict[asyncio.Task[Any] | None, Any] = {}

        async def call(spare: Iterator[Any] = spare, owned: dict[Any, Any] = owned) -> None:
            task = asyncio.current_task()
            grain = owned.get(task)
            if grain is None:
                grain = owned[task] = next(spare)
            await grain.echo(payload)

        rates.append(await _measure(call, callers, seconds, warmup))
    return rates


async def _drive(
    redis_url: str, where: dict[str, str], payload: bytes, seconds: float, warmup: float
) -> dict[str, list[float]]:
    target = SiloAddress.parse(where["silo"])
    rates: dict[str, list[float]] = {}
    async with Silo(_options(redis_url, "silo-a", False)) as silo:
        await _until_active(silo, 2)
        assert silo.membership is not None
        keys = list(itertools.islice(_keys_on(target, silo.membership.active_silos()), 64))
        grains = [silo.client.get_grain(BenchEchoGrain, k) for k in keys]
        placed = set(await asyncio.gather(*(g.where() for g in grains)))
        if placed != {str(target)}:
            raise RuntimeError(f"grains were placed on {placed}, not only on silo B {target}")
        rates["silo-to-silo"] = await _bench_grains(grains, payload, seconds, warmup)

        async with ClusterClient(redis_url=redis_url, cluster_id=CLUSTER_ID) as client:
            # Silo A runs no gateway, so every client call enters at B.
            far = [client.get_grain(BenchEchoGrain, k) for k in keys]
            placed = set(await asyncio.gather(*(g.where() for g in far)))
            assert placed == {str(target)}, placed
            rates["client-gateway"] = await _bench_grains(far, payload, seconds, warmup)

    rates["grpc-unary"] = await _bench_unary(where["unary"], payload, seconds, warmup)
    rates["tcp"] = await _bench_tcp(where["tcp"], payload, seconds, warmup)
    return rates


# The cluster issue's target: grain calls at a quarter of the raw TCP echo, 64 callers.
TARGET_VS_TCP = 0.25


def _report(rates: dict[str, list[float]], args: argparse.Namespace) -> None:
    rows = []
    for path, values in rates.items():
        for i, callers in enumerate(CALLERS):
            rows.append(
                {
                    "path": path,
                    "callers": callers,
                    "calls_per_s": round(values[i], 1),
                    "vs_tcp": ratio(values[i], rates["tcp"][i]),
                    "vs_grpc_unary": ratio(values[i], rates["grpc-unary"][i]),
                }
            )
    print_report(
        "cluster_calls",
        rows,
        ["path", "callers", "calls_per_s", "vs_tcp", "vs_grpc_unary"],
        loop=loop_name(),
        seconds_per_cell=args.seconds,
        payload_bytes=args.payload,
    )
    many = CALLERS.index(max(CALLERS))
    verdicts = []
    for path in ("silo-to-silo", "client-gateway"):
        share = rates[path][many] / rates["tcp"][many] if rates["tcp"][many] else 0.0
        verdicts.append(f"{path} {share:.2f}x {'met' if share >= TARGET_VS_TCP else 'MISSED'}")
    print(
        f"\ntarget: >= {TARGET_VS_TCP:.2f}x the TCP echo with {max(CALLERS)} callers: "
        + "; ".join(verdicts)
    )


def _with_redis(url: str | None, body: Callable[[str], None]) -> None:
    if url is not None:
        body(url)
        return
    with RedisServer() as redis:
        body(redis.url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measured time per cell")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--payload", type=int, default=64, help="bytes echoed per call")
    parser.add_argument("--redis-url", help="an existing Redis (default: a private one)")
    parser.add_argument("--serve", metavar="REDIS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(_serve(args.serve))
        return
    payload = b"x" * args.payload

    def bench(url: str) -> None:
        with launch(["-m", "benchmarks.bench_cluster_calls", "--serve", url]) as ready:
            where = json.loads(ready)
            rates = run(_drive(url, where, payload, args.seconds, args.warmup))
        _report(rates, args)

    _with_redis(args.redis_url, bench)


if __name__ == "__main__":
    main()
