"""Cross-silo grain calls per second over gRPC, beside raw echoes between the same processes.

Run: ``python -m benchmarks.bench_cluster_calls [--seconds 2] [--callers 1 64]
[--max-batch N] [--redis-url URL]``.

Two OS processes: this one runs silo A, the child runs silo B plus a raw
``grpc.aio`` unary echo server and a raw length-prefixed TCP echo server (both
from ``benchmarks.bench_transport``). With 1 and 64 concurrent callers (or
``--callers``) it measures:

- ``silo-to-silo``: silo A calls ``BenchEchoGrain`` activations that live on
  silo B (``HashBasedPlacement``; keys are chosen so the hash picks B, and the
  grain's answer confirms it);
- ``client-gateway``: a ``ClusterClient`` in this process calls grains on B
  through B's gateway;
- ``grpc-unary``, ``grpc-bidi`` (a bare bidi stream per caller, one message per
  frame) and ``tcp``: raw round trips to the child's echo servers.

Each caller has a grain of its own (as independent callers would), so the 64
callers measure throughput, not one grain's turn queue. Ratios are against the
raw TCP echo. For the grain paths it also prints the CPU each process spends
per call (``cpu_us_a``: this process, ``cpu_us_b``: silo B's), every thread
counted, over warm-up and measurement alike. ``--max-batch`` sets
``MessagingOptions.max_batch`` on both silos and the client. A private
redis-server is started unless ``--redis-url`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from typing import Any, NamedTuple

from benchmarks._util import launch, loop_name, print_report, ratio, run
from benchmarks.bench_transport import (
    CALLERS,
    _bench_bidi,
    _bench_tcp,
    _bench_unary,
    _measure,
    _serve_raw_grpc,
    _TcpEcho,
)
from orleanspy import ClusterClient, Grain, MessagingOptions, Silo, SiloOptions
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.placement import HashBasedPlacement
from orleanspy.testing.redis_server import RedisServer

CLUSTER_ID = "bench"


class BenchEchoGrain(Grain, placement=HashBasedPlacement()):
    """Returns what it is given; ``where`` names its silo."""

    async def echo(self, payload: bytes) -> bytes:
        return payload

    async def where(self) -> str:
        return str(self._activation.silo_address)


def _messaging(max_batch: int | None) -> MessagingOptions:
    return MessagingOptions() if max_batch is None else MessagingOptions(max_batch=max_batch)


def _options(redis_url: str, name: str, gateway: bool, max_batch: int | None) -> SiloOptions:
    return SiloOptions(
        cluster_id=CLUSTER_ID,
        redis_url=redis_url,
        name=name,
        gateway_port=0 if gateway else None,
        messaging=_messaging(max_batch),
    )


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system, all threads) of process ``pid``; ``None`` off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until_active(silo: Silo, count: int) -> None:
    assert silo.membership is not None
    async with asyncio.timeout(20):
        while len((await silo.membership.refresh()).active_silos()) < count:
            await asyncio.sleep(0.05)


# ------------------------------------------------------------------ silo B (child)


async def _serve(redis_url: str, max_batch: int | None) -> None:
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        options = _options(redis_url, "silo-b", True, max_batch)
        silo = await stack.enter_async_context(Silo(options))
        tcp = await loop.create_server(_TcpEcho, "127.0.0.1", 0)
        stack.push_async_callback(tcp.wait_closed)
        stack.callback(tcp.close)
        unary = await _serve_raw_grpc(stack)
        where = {
            "silo": str(silo.address),
            "unary": str(unary),
            "tcp": str(tcp.sockets[0].getsockname()[1]),
            "pid": str(os.getpid()),
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


class _Cell(NamedTuple):
    rate: float
    cpu_us_a: float | None  # per call, this process
    cpu_us_b: float | None  # per call, silo B's process


async def _bench_grains(
    grains: list[Any],
    payload: bytes,
    seconds: float,
    warmup: float,
    callers_list: Sequence[int],
    child: int,
) -> list[_Cell]:
    cells = []
    for callers in callers_list:
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

        a0, b0 = time.process_time(), _cpu_seconds(child)
        rate = await _measure(call, callers, seconds, warmup)
        a1, b1 = time.process_time(), _cpu_seconds(child)
        # The CPU window spans warm-up too: assume the warm-up ran at the same rate.
        calls = rate * (seconds + warmup)
        cells.append(
            _Cell(
                rate,
                (a1 - a0) / calls * 1e6 if calls else None,
                (b1 - b0) / calls * 1e6 if calls and b0 is not None and b1 is not None else None,
            )
        )
    return cells


async def _drive(
    redis_url: str, where: dict[str, str], payload: bytes, args: argparse.Namespace
) -> dict[str, list[_Cell]]:
    target = SiloAddress.parse(where["silo"])
    child = int(where["pid"])
    seconds, warmup, callers = args.seconds, args.warmup, args.callers
    cells: dict[str, list[_Cell]] = {}
    async with Silo(_options(redis_url, "silo-a", False, args.max_batch)) as silo:
        await _until_active(silo, 2)
        assert silo.membership is not None
        wanted = max(callers)
        keys = list(itertools.islice(_keys_on(target, silo.membership.active_silos()), wanted))
        grains = [silo.client.get_grain(BenchEchoGrain, k) for k in keys]
        placed = set(await asyncio.gather(*(g.where() for g in grains)))
        if placed != {str(target)}:
            raise RuntimeError(f"grains were placed on {placed}, not only on silo B {target}")
        cells["silo-to-silo"] = await _bench_grains(
            grains, payload, seconds, warmup, callers, child
        )

        async with ClusterClient(
            redis_url=redis_url, cluster_id=CLUSTER_ID, options=_messaging(args.max_batch)
        ) as client:
            # Silo A runs no gateway, so every client call enters at B.
            far = [client.get_grain(BenchEchoGrain, k) for k in keys]
            placed = set(await asyncio.gather(*(g.where() for g in far)))
            assert placed == {str(target)}, placed
            cells["client-gateway"] = await _bench_grains(
                far, payload, seconds, warmup, callers, child
            )

    for path, server, bench in (
        ("grpc-unary", "unary", _bench_unary),
        ("grpc-bidi", "unary", _bench_bidi),
        ("tcp", "tcp", _bench_tcp),
    ):
        rates = await bench(where[server], payload, seconds, warmup, callers)
        cells[path] = [_Cell(rate, None, None) for rate in rates]
    return cells


# Targets: with 64 callers, grain calls at half the raw TCP echo; with 1 caller, a
# quarter of it, or within 1.2x of a bare gRPC bidi-stream echo (one message per
# frame, what gRPC's Python runtime itself allows) where that echo is below it.
TARGET_VS_TCP = {64: 0.5, 1: 0.25}
TARGET_VS_BIDI = 1 / 1.2


def _report(cells: dict[str, list[_Cell]], args: argparse.Namespace) -> None:
    rows = []
    for path, values in cells.items():
        for i, callers in enumerate(args.callers):
            cell, tcp, bidi = values[i], cells["tcp"][i], cells["grpc-bidi"][i]
            row: dict[str, Any] = {
                "path": path,
                "callers": callers,
                "calls_per_s": round(cell.rate, 1),
                "vs_tcp": ratio(cell.rate, tcp.rate),
                "vs_grpc_bidi": ratio(cell.rate, bidi.rate),
            }
            for column in ("cpu_us_a", "cpu_us_b"):
                value = getattr(cell, column)
                if value is not None:
                    row[column] = round(value, 1)
            rows.append(row)
    print_report(
        "cluster_calls",
        rows,
        ["path", "callers", "calls_per_s", "vs_tcp", "vs_grpc_bidi", "cpu_us_a", "cpu_us_b"],
        loop=loop_name(),
        seconds_per_cell=args.seconds,
        payload_bytes=args.payload,
        max_batch=args.max_batch or MessagingOptions().max_batch,
    )
    verdicts = []
    for callers, share_of_tcp in TARGET_VS_TCP.items():
        if callers not in args.callers:
            continue
        at = args.callers.index(callers)
        tcp, bidi = cells["tcp"][at].rate, cells["grpc-bidi"][at].rate
        for path in ("silo-to-silo", "client-gateway"):
            rate = cells[path][at].rate
            vs_tcp = rate / tcp if tcp else 0.0
            vs_bidi = rate / bidi if bidi else 0.0
            met = vs_tcp >= share_of_tcp or (
                bidi < share_of_tcp * tcp and vs_bidi >= TARGET_VS_BIDI
            )
            verdicts.append(
                f"{path} x{callers}: {vs_tcp:.2f}x tcp, {vs_bidi:.2f}x bidi "
                f"{'met' if met else 'MISSED'}"
            )
    if verdicts:
        print(
            "\ntargets (>= 0.5x tcp at 64 callers, >= 0.25x at 1; or >= 1/1.2 of the bare "
            "bidi echo when that echo is below the tcp target):\n  " + "\n  ".join(verdicts)
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
    parser.add_argument(
        "--callers", type=int, nargs="+", default=list(CALLERS), help="concurrent callers per cell"
    )
    parser.add_argument("--max-batch", type=int, help="MessagingOptions.max_batch everywhere")
    parser.add_argument("--redis-url", help="an existing Redis (default: a private one)")
    parser.add_argument("--serve", metavar="REDIS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(_serve(args.serve, args.max_batch))
        return
    payload = b"x" * args.payload
    serve = ["-m", "benchmarks.bench_cluster_calls"]
    if args.max_batch is not None:
        serve += ["--max-batch", str(args.max_batch)]

    def bench(url: str) -> None:
        with launch([*serve, "--serve", url]) as ready:
            where = json.loads(ready)
            cells = run(_drive(url, where, payload, args))
        _report(cells, args)

    _with_redis(args.redis_url, bench)


if __name__ == "__main__":
    main()
