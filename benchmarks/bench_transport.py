"""Request/response round trips per second between two OS processes.

Run: ``python -m benchmarks.bench_transport [--seconds 2] [--payload 64]``.

Four ways to echo a small body, each measured with 1 and 64 concurrent callers
in the same run on the same machine:

- ``grpc-transport``: ``GrpcTransport`` to ``GrpcTransport``; the server's sink
  answers every request with a response carrying the same body.
- ``grpc-unary``: a raw ``grpc.aio`` unary echo (raw bytes, no protobuf).
- ``grpc-bidi``: a raw ``grpc.aio`` bidi stream per caller, one message per frame.
- ``tcp``: length-prefixed frames over one asyncio TCP connection, pipelined;
  the floor any transport pays. Ratios are against it.

The server of each cell runs in a child process (``--serve KIND``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import grpc
import grpc.aio

from benchmarks._util import launch, loop_name, print_report, ratio, run
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.grpc import GrpcTransport
from orleanspy.messaging.message import Message, MessageKind, ResponseStatus, next_message_id
from orleanspy.options import MessagingOptions

KINDS = ("grpc-transport", "grpc-unary", "grpc-bidi", "tcp")
CALLERS = (1, 64)
_UNARY = "/bench.Echo/Unary"
_STREAM = "/bench.Echo/Stream"
_HEADER = struct.Struct("!IQ")  # body length, request id


# ------------------------------------------------------------------ servers


class _EchoSink:
    def __init__(self) -> None:
        self.transport: GrpcTransport | None = None

    def receive(self, message: Message) -> None:
        assert self.transport is not None and message.sender_silo is not None
        self.transport.send(message.sender_silo, message.response(ResponseStatus.OK, message.body))

    def undeliverable(self, message: Message, error: Exception) -> None:
        print(f"undeliverable: {error}", file=sys.stderr)


class _TcpEcho(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Echo whole frames only; a partial one waits for the rest.
        buffer = self._buffer
        buffer += data
        end = 0
        while len(buffer) - end >= _HEADER.size:
            length, _ = _HEADER.unpack_from(buffer, end)
            if len(buffer) - end < _HEADER.size + length:
                break
            end += _HEADER.size + length
        if end:
            assert self._transport is not None
            self._transport.write(bytes(buffer[:end]))
            del buffer[:end]


async def _serve(kind: str) -> None:
    loop = asyncio.get_running_loop()
    async with AsyncExitStack() as stack:
        if kind == "grpc-transport":
            sink = _EchoSink()
            transport = GrpcTransport(
                host="127.0.0.1", port=0, gateway_port=None, options=MessagingOptions()
            )
            sink.transport = transport
            await transport.start(stack, sink)
            where = str(transport.address)
        elif kind == "tcp":
            server = await loop.create_server(_TcpEcho, "127.0.0.1", 0)
            stack.push_async_callback(server.wait_closed)
            stack.callback(server.close)
            where = str(server.sockets[0].getsockname()[1])
        else:
            where = str(await _serve_raw_grpc(stack))
        print(f"READY {where}", flush=True)
        # Serve until the parent closes our stdin.
        await loop.run_in_executor(None, sys.stdin.read)


async def _serve_raw_grpc(stack: AsyncExitStack) -> int:
    async def unary(request: bytes, context: Any) -> bytes:
        return request

    async def stream(requests: Any, context: Any) -> None:
        while True:
            frame = await context.read()
            if frame is grpc.aio.EOF:  # type: ignore[attr-defined]
                return
            await context.write(frame)

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo",
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(unary),
                    "Stream": grpc.stream_stream_rpc_method_handler(stream),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, None)
    return port


# ------------------------------------------------------------------ clients


async def _measure(
    call: Callable[[], Awaitable[None]], callers: int, seconds: float, warmup: float
) -> float:
    """Round trips per second over ``seconds`` after ``warmup``, ``callers`` at once."""
    done = 0
    stopping = False

    async def caller() -> None:
        nonlocal done
        while not stopping:
            await call()
            done += 1

    tasks = [asyncio.create_task(caller()) for _ in range(callers)]
    try:
        await asyncio.sleep(warmup)
        start, before = time.perf_counter(), done
        await asyncio.sleep(seconds)
        elapsed, count = time.perf_counter() - start, done - before
    finally:
        stopping = True
        await asyncio.gather(*tasks, return_exceptions=True)
    return count / elapsed


class _TransportClient:
    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[Message]] = {}

    def receive(self, message: Message) -> None:
        future = self.pending.pop(message.correlation_id, None)
        if future is not None and not future.done():
            future.set_result(message)

    def undeliverable(self, message: Message, error: Exception) -> None:
        future = self.pending.pop(message.id, None)
        if future is not None and not future.done():
            future.set_exception(error)


async def _bench_transport(
    where: str, payload: bytes, seconds: float, warmup: float
) -> list[float]:
    server = SiloAddress.parse(where)
    sink = _TransportClient()
    async with AsyncExitStack() as stack:
        me = GrpcTransport(host="127.0.0.1", port=0, gateway_port=None, options=MessagingOptions())
        await me.start(stack, sink)
        loop = asyncio.get_running_loop()
        keys = itertools.count()

        async def call() -> None:
            message = Message(
                id=next_message_id(),
                kind=MessageKind.REQUEST,
                target_grain=GrainId("Echo", next(keys) % 1024),
                method="echo",
                body=payload,
                sender_silo=me.address,
                target_silo=server,
            )
            future: asyncio.Future[Message] = loop.create_future()
            sink.pending[message.id] = future
            me.send(server, message)
            await future

        rates = [await _measure(call, n, seconds, warmup) for n in CALLERS]
        frames, messages = me.stats.frames_sent, me.stats.messages_sent
        print(
            f"grpc-transport: {messages / max(frames, 1):.1f} messages per frame", file=sys.stderr
        )
        return rates


async def _bench_unary(
    where: str, payload: bytes, seconds: float, warmup: float, callers: Sequence[int] = CALLERS
) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{where}") as channel:
        stub = channel.unary_unary(_UNARY, None, None)

        async def call() -> None:
            await stub(payload)

        return [await _measure(call, n, seconds, warmup) for n in callers]


async def _bench_bidi(
    where: str, payload: bytes, seconds: float, warmup: float, callers: Sequence[int] = CALLERS
) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{where}") as channel:
        rates = []
        for n in callers:
            streams = [channel.stream_stream(_STREAM, None, None)(None) for _ in range(n)]
            free: asyncio.Queue[Any] = asyncio.Queue()
            for s in streams:
                free.put_nowait(s)

            async def call(free: asyncio.Queue[Any] = free) -> None:
                # Each caller holds a stream for one exchange: one message per frame.
                stream = await free.get()
                await stream.write(payload)
                await stream.read()
                free.put_nowait(stream)

            rates.append(await _measure(call, n, seconds, warmup))
            for s in streams:
                s.cancel()
        return rates


class _TcpClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[None]] = {}
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        end = 0
        while len(buffer) - end >= _HEADER.size:
            length, request_id = _HEADER.unpack_from(buffer, end)
            if len(buffer) - end < _HEADER.size + length:
                break
            end += _HEADER.size + length
            future = self.pending.pop(request_id)
            if not future.done():
                future.set_result(None)
        del buffer[:end]


async def _bench_tcp(
    where: str, payload: bytes, seconds: float, warmup: float, callers: Sequence[int] = CALLERS
) -> list[float]:
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_connection(_TcpClient, "127.0.0.1", int(where))
    ids = itertools.count()
    try:

        async def call() -> None:
            request_id = next(ids)
            future = loop.create_future()
            client.pending[request_id] = future
            transport.write(_HEADER.pack(len(payload), request_id) + payload)
            await future

        return [await _measure(call, n, seconds, warmup) for n in callers]
    finally:
        transport.close()


_CLIENTS: dict[str, Callable[[str, bytes, float, float], Awaitable[list[float]]]] = {
    "grpc-transport": _bench_transport,
    "grpc-unary": _bench_unary,
    "grpc-bidi": _bench_bidi,
    "tcp": _bench_tcp,
}


async def _measure_all(payload: bytes, seconds: float, warmup: float) -> dict[str, list[float]]:
    # One event loop for every cell: grpc.aio does not survive a loop change.
    rates: dict[str, list[float]] = {}
    for kind in KINDS:
        with launch(["-m", "benchmarks.bench_transport", "--serve", kind]) as where:
            rates[kind] = await _CLIENTS[kind](where, payload, seconds, warmup)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measured time per cell")
    parser.add_argument("--warmup", type=float, default=0.3)
    parser.add_argument("--payload", type=int, default=64, help="body bytes per message")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(_serve(args.serve))
        return

    rates = run(_measure_all(b"x" * args.payload, args.seconds, args.warmup))
    rows = []
    for kind in KINDS:
        for i, callers in enumerate(CALLERS):
            value, baseline = rates[kind][i], rates["tcp"][i]
            rows.append(
                {
                    "transport": kind,
                    "callers": callers,
                    "round_trips_per_s": round(value, 1),
                    "vs_tcp": ratio(value, baseline),
                }
            )
    print_report(
        "transport",
        rows,
        ["transport", "callers", "round_trips_per_s", "vs_tcp"],
        loop=loop_name(),
        seconds_per_cell=args.seconds,
        payload_bytes=args.payload,
    )


if __name__ == "__main__":
    main()
