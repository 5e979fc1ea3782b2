"""The fault suite: real silo processes (``fault_silo.py``), real Redis, real gRPC.

Each test breaks something the way an operator or an attacker would (kill -9,
SIGSTOP past the death declaration, a restart on the same port, hostile bytes on
the gateway and silo ports, a flood of requests nobody reads) and asserts the
property that must hold, not merely that something survived. Membership uses
``FAST_MEMBERSHIP`` (death declared in about two seconds) so the suite stays fast;
the response timeout keeps its 30 s default, so a call stalled on a dead silo
would show as such. Measured figures are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import msgpack
import pytest
import redis.asyncio as aioredis

from orleanspy import ClusterClient, GrainId, SerializationError, Silo, SiloOptions, TickStatus
from orleanspy.errors import (
    GrainMethodNotFoundError,
    MessageRejectedError,
    ReminderError,
    SiloUnavailableError,
    UnknownGrainTypeError,
)
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.messaging._generated import messages_pb2 as pb
from orleanspy.messaging.grpc import CLIENT_HEADER, GrpcGatewayConnection
from orleanspy.messaging.message import Message, ResponseStatus
from orleanspy.messaging.remote_errors import rebuild_error
from orleanspy.options import MessagingOptions
from orleanspy.remindable.management import MANAGEMENT_TYPE
from orleanspy.serialization import unpack
from orleanspy.testing.cluster import wait_for
from tests.ready import read_ready, stop_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SILO = Path(__file__).with_name("fault_silo.py")
ROOT = Path(__file__).resolve().parents[2]
GRAIN = "FaultTickGrain"
PERIOD = 1.0  # seconds, of the reminders under load


# ---------------------------------------------------------------- processes


class SiloProc:
    """One ``fault_silo.py`` child; ``address`` and ``gateway`` once READY."""

    def __init__(self, redis_url: str, name: str, *, expect: int, args: tuple[str, ...]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [
                *(sys.executable, str(SILO)),
                *("--redis-url", redis_url, "--name", name, "--expect", str(expect)),
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.address: SiloAddress | None = None
        self.gateway = 0

    def wait_ready(self, timeout: float = 30) -> None:
        address, gateway = read_ready(self.proc, timeout)
        self.address = SiloAddress.parse(address)
        self.gateway = int(gateway)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.gateway}"

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped child cannot terminate
        stop_processes([self.proc], 10)


class Cluster:
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.silos: list[SiloProc] = []

    def start(self, count: int, *args: str, expect: int | None = None) -> list[SiloProc]:
        started = [
            SiloProc(
                self.redis_url,
                f"fault-{len(self.silos) + i}",
                expect=expect if expect is not None else count,
                args=args,
            )
            for i in range(count)
        ]
        self.silos += started
        for silo in started:
            silo.wait_ready()
        return started


@contextmanager
def cluster(redis_url: str) -> Iterator[Cluster]:
    c = Cluster(redis_url)
    try:
        yield c
    finally:
        for silo in c.silos:
            silo.stop()


@asynccontextmanager
async def membership(redis_url: str) -> AsyncIterator[RedisMembershipTable]:
    async with AsyncExitStack() as stack:
        table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
        await table.start(stack)
        yield table


async def status(table: RedisMembershipTable, silo: SiloProc) -> SiloStatus | None:
    assert silo.address is not None
    return (await table.read_all()).status(silo.address)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RawGateway:
    """A gateway stream that sends hand-made messages and collects the answers."""

    def __init__(self, endpoint: str) -> None:
        self.answers: dict[int, Message] = {}
        self.conn = GrpcGatewayConnection(
            endpoint,
            client_id=f"raw-{os.urandom(4).hex()}",
            options=MessagingOptions(),
            on_message=lambda m: self.answers.__setitem__(m.correlation_id, m),
            on_closed=lambda _e: None,
        )

    async def __aenter__(self) -> RawGateway:
        await self.conn.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.conn.aclose()

    async def call(self, message: Message, timeout: float = 10) -> Message:
        self.conn.send(message)
        await wait_for(lambda: message.id in self.answers, timeout, what=f"answer to {message}")
        return self.answers[message.id]


def request(grain: GrainId, method: str, body: bytes, **headers: str) -> Message:
    msg = Message.request(
        grain, method, body, one_way=False, expires_at_ms=int(time.time() * 1000) + 30_000
    )
    msg.headers.update(headers)
    return msg


def args(*values: Any) -> bytes:
    data: bytes = msgpack.packb([list(values), {}])
    return data


# ------------------------------------------------------------- hostile input


def poison_body(levels: int = 200) -> bytes:
    """~8 KB: a registered-dataclass extension value inside another, ``levels`` deep."""
    inner = b"\xc0"
    for _ in range(levels):
        payload = b"\x92\xaalimits.Box\x81\xa5inner" + inner
        inner = b"\xc9" + len(payload).to_bytes(4, "big") + b"\x06" + payload
    return b"\x92\x91" + inner + b"\x80"


async def test_poison_request_gets_a_clear_error_and_the_silo_keeps_serving(
    redis_url: str,
) -> None:
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        body = poison_body()
        assert len(body) < 9 * 1024
        async with RawGateway(silo.endpoint) as raw, ClusterClient(redis_url) as client:
            for _ in range(3):
                answer = await raw.call(request(GrainId(MANAGEMENT_TYPE, ""), "count_all", body))
                error = rebuild_error(unpack(answer.body))
                assert isinstance(error, SerializationError), error
                assert "nested more than" in str(error)
            # Still up, still Active, still serving.
            assert silo.proc.poll() is None
            assert await client.reminders.count_all() == 0
            assert (await client.get_grain(GRAIN, "after").where())[1] == silo.proc.pid
            async with membership(redis_url) as table:
                assert await status(table, silo) is SiloStatus.ACTIVE


async def test_malformed_envelopes_get_typed_rejections(redis_url: str) -> None:
    """Each refusal reaches the client as the error it is, never as a misleading
    ``SerializationError`` (except for a body that really is not msgpack)."""
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        cases: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"grain_type": "No/Slash", "s": "k"}, MessageRejectedError, "bad target grain"),
            ({"grain_type": GRAIN}, MessageRejectedError, "without a key"),
            ({"grain_type": GRAIN, "uuid": b"abc"}, MessageRejectedError, "bad target grain"),
            ({"grain_type": GRAIN, "s": "k", "status": 9}, MessageRejectedError, "status"),
            (
                {"grain_type": GRAIN, "s": "k", "body": b"x" * (4 * 1024 * 1024 + 1)},
                MessageRejectedError,
                "exceeds max_message_size",
            ),
            ({"grain_type": GRAIN, "s": "k", "method": "nope"}, GrainMethodNotFoundError, "nope"),
            ({"grain_type": "NoSuchGrain", "s": "k"}, UnknownGrainTypeError, "NoSuchGrain"),
            ({"grain_type": GRAIN, "s": "k", "body": b"\xc1"}, SerializationError, "deserialize"),
        ]
        async with grpc.aio.insecure_channel(
            silo.endpoint, options=[("grpc.max_send_message_length", -1)]
        ) as channel:
            call = channel.stream_stream("/orleanspy.v1.GatewayService/Connect")(
                metadata=((CLIENT_HEADER, "malformed"),)
            )
            for i, (fields, _, _) in enumerate(cases):
                batch = pb.Batch()
                env: Any = batch.messages.add(id=i + 1, method="get", body=args())
                for name, value in fields.items():
                    setattr(env, name, value)
                await call.write(batch.SerializeToString())
            answers: dict[int, Any] = {}
            async with asyncio.timeout(20):
                while len(answers) < len(cases):
                    frame = await call.read()
                    for answer in pb.Batch.FromString(frame).messages:
                        answers[answer.correlation_id] = answer
            call.cancel()
        for i, (_fields, kind, text) in enumerate(cases):
            error = rebuild_error(unpack(answers[i + 1].body))
            assert type(error) is kind, (i, error)
            assert text in str(error), (i, error)
        assert silo.proc.poll() is None


async def test_forged_call_chain_cannot_interleave_a_non_reentrant_grain(
    redis_url: str,
) -> None:
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        grain = GrainId(GRAIN, "rmw")
        async with ClusterClient(redis_url) as client:
            assert await client.get_grain(GRAIN, "rmw").get() == 0
            async with RawGateway(silo.endpoint) as raw:
                # The chain claims the grain is already waiting on this call, which
                # would let both read-modify-write turns in at once.
                calls = [
                    request(grain, "add_slowly", args(0.3), chain=grain.canonical) for _ in range(2)
                ]
                answers = await asyncio.gather(*(raw.call(m) for m in calls))
            results = sorted(unpack(a.body) for a in answers)
            assert results == [1, 2]  # one after the other: no update lost
            assert await client.get_grain(GRAIN, "rmw").get() == 2


async def test_silo_port_never_dials_an_address_named_by_a_request(redis_url: str) -> None:
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        assert silo.address is not None
        trap = socket.socket()
        trap.bind(("127.0.0.1", 0))
        trap.listen()
        trap.setblocking(False)
        trap_port = trap.getsockname()[1]
        try:
            batch = pb.Batch()
            batch.messages.add(
                id=4242,
                grain_type=GRAIN,
                s="spoof",
                method="where",
                body=args(),
                sender_silo=f"127.0.0.1:{trap_port}@1",
            )
            async with grpc.aio.insecure_channel(silo.address.endpoint) as channel:
                call = channel.stream_stream("/orleanspy.v1.SiloService/Connect")()
                await call.write(batch.SerializeToString())
                # The same grain through the gateway: answered after the spoofed
                # request was read (one stream, read in order).
                async with ClusterClient(redis_url) as client:
                    await client.get_grain(GRAIN, "spoof").get()
                call.cancel()
            # Had the silo answered the spoofed request, it would have connected
            # by now; give a late dial a moment to show itself.
            loop = asyncio.get_running_loop()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(loop.sock_accept(trap), 1.0)
        finally:
            trap.close()


async def test_client_cannot_delete_reminders_without_authentication(redis_url: str) -> None:
    with cluster(redis_url) as c:
        c.start(1)
        async with ClusterClient(redis_url) as client:
            await client.get_grain(GRAIN, "kept").start(60_000)
            gid = GrainId(GRAIN, "kept")
            with pytest.raises(MessageRejectedError, match="allow_client_management"):
                await client.reminders.delete(gid, "tick")
            assert [r.name for r in await client.reminders.list_for_grain(gid)] == ["tick"]


async def test_receive_reminder_refuses_all_but_the_reminder_service(redis_url: str) -> None:
    refused = "reminder ticks come only from the reminder service"
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        redis = aioredis.Redis.from_url(redis_url)
        async with ClusterClient(redis_url) as client:
            forged = client.get_grain(GRAIN, "forged")
            now = datetime.now(UTC)
            status = TickStatus(now, timedelta(seconds=1), None, now, now)
            # A client's call, and another grain's call.
            with pytest.raises(MessageRejectedError, match=refused):
                await forged.receive_reminder("tick", status)
            with pytest.raises(MessageRejectedError, match=refused):
                await forged.tick_other("victim")
            # A client claiming to be the reminder service: the tick header is
            # the service's, but the gateway stamps the call as a client's.
            async with RawGateway(silo.endpoint) as raw:
                answer = await raw.call(
                    request(GrainId(GRAIN, "forged"), "receive_reminder", args("tick"), tick="1")
                )
            assert answer.status is ResponseStatus.REJECTED
            error = rebuild_error(unpack(answer.body))
            assert isinstance(error, MessageRejectedError) and refused in str(error), error
            assert await _ticks(redis) == []
            # The service's own ticks still arrive, and the silo serves on.
            await client.get_grain(GRAIN, "real").start(200)

            async def ticked() -> bool:
                return bool(await _ticks(redis))

            await wait_for(ticked, 20, what="a tick of the reminder service")
            assert {k for k, _, _ in await _ticks(redis)} == {"real"}
            assert silo.proc.poll() is None
        await redis.aclose()


async def test_oversized_schedules_are_refused_by_a_real_silo_and_stored_nowhere(
    redis_url: str,
) -> None:
    """A cron string of 512 KB and a 300-character zone name, sent through the
    gateway: each call fails with a ``ReminderError`` naming the limit, no row is
    written, and the silo stays Active and keeps serving (it never parses the
    oversized expression, so no owner of a row ever does)."""
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        async with ClusterClient(redis_url) as client:
            grain = client.get_grain(GRAIN, "hostile-schedule")
            huge_cron = "0 0 " + ",".join(["1"] * 262_144) + " * * *"
            with pytest.raises(ReminderError, match="limit is 256"):
                await grain.schedule("huge", huge_cron)
            with pytest.raises(ReminderError, match="limit is 64"):
                await grain.schedule("zone", "@hourly", "A" * 300)
            gid = GrainId(GRAIN, "hostile-schedule")
            assert await client.reminders.list_for_grain(gid) == []
            assert await client.get_grain(GRAIN, "bystander").get() == 0
        async with membership(redis_url) as table:
            assert await status(table, silo) is SiloStatus.ACTIVE
        assert silo.proc.poll() is None


@dataclass
class Flood:
    """What a flood of frames did: messages written before the gateway stopped
    reading (``pushed_back``), and the silo's peak RSS, sampled as it went."""

    silo: SiloProc
    peak: float
    written: int = 0
    pushed_back: bool = False
    seconds: float = 0.0

    def sample(self) -> None:
        self.peak = max(self.peak, self.silo.rss_mb())


def flood_frame(kind: Any, method: str, key: str, body: bytes) -> bytes:
    """One frame of 1,000 messages of ``kind`` to ``GRAIN/key``."""
    batch = pb.Batch()
    for i in range(1000):
        env: Any = batch.messages.add()
        env.id, env.kind, env.grain_type, env.s = i + 1, kind, GRAIN, key
        env.method, env.body = method, body
        env.expires_at_ms = int(time.time() * 1000) + 600_000
    return bytes(batch.SerializeToString())


@asynccontextmanager
async def flooding(silo: SiloProc, frame: bytes, client: str) -> AsyncIterator[Flood]:
    """Write ``frame`` to the gateway up to 1,000 times, without reading answers,
    until a write waits 3 s (the gateway stopped reading). The stream stays open
    inside the block, so what is checked there runs while the flood is held back."""
    flood = Flood(silo, peak=silo.rss_mb())
    async with grpc.aio.insecure_channel(silo.endpoint) as channel:
        call = channel.stream_stream("/orleanspy.v1.GatewayService/Connect")(
            metadata=((CLIENT_HEADER, client),)
        )
        started = time.monotonic()
        for _ in range(1000):
            try:
                await asyncio.wait_for(call.write(frame), 3.0)
            except TimeoutError:
                flood.pushed_back = True
                break
            flood.written += 1000
            flood.sample()
        flood.seconds = time.monotonic() - started
        flood.sample()
        try:
            yield flood
        finally:
            call.cancel()


def assert_stops_gracefully(silo: SiloProc, within: float = 8.0) -> None:
    """SIGTERM ``silo`` and check that it exits by itself, with status 0, within
    ``within`` seconds: the calls a flood left queued are refused, not replayed
    into new activations while the silo deactivates its grains."""
    started = time.monotonic()
    silo.proc.terminate()
    try:
        code = silo.proc.wait(within)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the silo had not stopped {within} s after SIGTERM")
    assert code == 0, f"the silo exited with {code}"
    print(f"stopped {time.monotonic() - started:.1f}s after SIGTERM")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("options", [(), ("--default-options",)], ids=["fast", "defaults"])
async def test_a_million_unread_requests_keep_rss_bounded_and_the_silo_active(
    redis_url: str, options: tuple[str, ...]
) -> None:
    """A client writes up to 1,000,000 requests and never reads an answer. The
    gateway stops reading at ``max_in_flight``; RSS stays under the bound; the
    silo still stops by itself on SIGTERM, with the test's fast options and
    with the defaults an operator runs."""
    rss_bound_mb = 300
    with cluster(redis_url) as c:
        (silo,) = c.start(1, *options)
        frame = flood_frame(pb.REQUEST, "get", "flood", args())
        async with flooding(silo, frame, "flooder") as flood:
            async with ClusterClient(redis_url) as client:
                # Another client is served while the flood is held back.
                assert await client.get_grain(GRAIN, "other").get() == 0
            flood.sample()
            async with membership(redis_url) as table:
                assert await status(table, silo) is SiloStatus.ACTIVE
        print(
            f"\nflood: written={flood.written} pushed_back={flood.pushed_back} "
            f"in {flood.seconds:.1f}s peak={flood.peak:.0f}MB bound={rss_bound_mb}MB"
        )
        assert flood.pushed_back and flood.written < 1_000_000
        assert flood.peak < rss_bound_mb
        assert silo.proc.poll() is None
        assert_stops_gracefully(silo)


@pytest.mark.timeout(180)
async def test_a_flood_of_one_way_messages_keeps_rss_bounded_and_the_silo_serving(
    redis_url: str,
) -> None:
    """A client writes up to 1,000,000 one-way messages without pause, all to one
    grain whose turns take half a second each. A one-way message holds its
    in-flight slot until its turn has run, so the gateway stops reading at
    ``max_in_flight``: RSS stays under the bound, the silo stays Active and
    another client is served meanwhile."""
    rss_bound_mb = 300
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        frame = flood_frame(pb.ONE_WAY, "add_slowly", "sink", args(0.5))
        async with flooding(silo, frame, "one-way-flooder") as flood:
            async with ClusterClient(redis_url) as client:
                assert await client.get_grain(GRAIN, "bystander").add_slowly(0) == 1
            flood.sample()
            async with membership(redis_url) as table:
                assert await status(table, silo) is SiloStatus.ACTIVE
        print(
            f"\none-way flood: written={flood.written} pushed_back={flood.pushed_back} "
            f"in {flood.seconds:.1f}s peak={flood.peak:.0f}MB bound={rss_bound_mb}MB"
        )
        assert flood.pushed_back and flood.written < 1_000_000
        assert flood.peak < rss_bound_mb
        assert silo.proc.poll() is None
        assert_stops_gracefully(silo)


async def test_one_way_slots_are_freed_as_turns_run(redis_url: str) -> None:
    """With ``max_in_flight`` 50, a client's 5,000 one-way messages all run: each
    frees its slot when its turn has run, so the gateway keeps reading."""
    total = 5000
    with cluster(redis_url) as c:
        (silo,) = c.start(1, "--max-in-flight", "50")
        batch = pb.Batch()
        for i in range(total):
            env: Any = batch.messages.add()
            env.id, env.kind, env.grain_type, env.s = i + 1, pb.ONE_WAY, GRAIN, "counted"
            env.method, env.body = "add_slowly", args(0)
            env.expires_at_ms = int(time.time() * 1000) + 600_000
        async with grpc.aio.insecure_channel(silo.endpoint) as channel:
            call = channel.stream_stream("/orleanspy.v1.GatewayService/Connect")(
                metadata=((CLIENT_HEADER, "one-way-sender"),)
            )
            await asyncio.wait_for(call.write(batch.SerializeToString()), 30)
            async with ClusterClient(redis_url) as client:
                grain = client.get_grain(GRAIN, "counted")
                ran = 0

                async def all_ran() -> bool:
                    nonlocal ran
                    ran = await grain.get()
                    return ran == total

                await wait_for(all_ran, 60, what="every one-way turn to run")
            call.cancel()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tiny_envelopes_frame(size: int) -> bytes:
    """A Batch of ``size`` bytes holding ``size // 4`` empty-ish envelopes."""
    return b"\x0a\x02\x08\x01" * (size // 4)


def many_headers_frame(size: int) -> bytes:
    """A Batch with one envelope whose headers map has distinct entries filling ``size``."""
    entries = bytearray()
    i = 0
    while len(entries) < size - 16:
        key = b"%06d" % i  # distinct and valid UTF-8, or the parser refuses the frame
        entry = b"\x0a\x06" + key + b"\x12\x00"
        entries += b"\x82\x01" + _varint(len(entry)) + entry
        i += 1
    return b"\x0a" + _varint(len(entries)) + bytes(entries)


@pytest.mark.timeout(180)
async def test_hostile_frames_are_refused_within_a_per_connection_budget(redis_url: str) -> None:
    """One connection's frame is bounded twice: gRPC refuses a frame over
    ``max_message_size`` plus headroom (RESOURCE_EXHAUSTED), and a frame within
    that size but holding more than ``max_frame_items`` envelopes and header
    entries is refused before it is decoded (INVALID_ARGUMENT): decoded, 4 MB
    of tiny envelopes would take hundreds of MB. Several such connections at
    once keep RSS under the bound; the silo stays Active and serving."""
    rss_bound_mb = 200
    size = MessagingOptions().max_message_size
    hostile = [
        ("/orleanspy.v1.GatewayService/Connect", tiny_envelopes_frame(size)),
        ("/orleanspy.v1.GatewayService/Connect", tiny_envelopes_frame(size)),
        ("/orleanspy.v1.GatewayService/Connect", many_headers_frame(size)),
        ("/orleanspy.v1.SiloService/Connect", tiny_envelopes_frame(size)),
        ("/orleanspy.v1.SiloService/Connect", many_headers_frame(size)),
        ("/orleanspy.v1.GatewayService/Connect", b"\x0a\x00" * (size // 2 + (2 << 20))),
    ]
    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        assert silo.address is not None
        baseline = silo.rss_mb()
        peak = baseline
        codes: list[grpc.StatusCode | None] = []
        async with AsyncExitStack() as stack:
            calls = []
            for i, (path, frame) in enumerate(hostile):
                endpoint = silo.endpoint if "Gateway" in path else silo.address.endpoint
                channel = await stack.enter_async_context(
                    grpc.aio.insecure_channel(
                        endpoint, options=[("grpc.max_send_message_length", -1)]
                    )
                )
                call = channel.stream_stream(path)(metadata=((CLIENT_HEADER, f"hostile-{i}"),))
                with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                    await asyncio.wait_for(call.write(frame), 10)
                calls.append(call)

            async def all_ended() -> bool:
                nonlocal peak
                peak = max(peak, silo.rss_mb())
                return all(call.done() for call in calls)

            with contextlib.suppress(TimeoutError):
                await wait_for(all_ended, 20, interval=0.1, what="hostile streams to be refused")
            peak = max(peak, silo.rss_mb())
            for call in calls:
                codes.append(await call.code() if call.done() else None)
                call.cancel()
        async with ClusterClient(redis_url) as client:
            assert await client.get_grain(GRAIN, "after-hostile-frames").add_slowly(0) == 1
        async with membership(redis_url) as table:
            assert await status(table, silo) is SiloStatus.ACTIVE
        print(
            f"\nhostile frames: codes={[c.name if c else None for c in codes]} "
            f"rss baseline={baseline:.0f}MB peak={peak:.0f}MB bound={rss_bound_mb}MB"
        )
        assert codes[:-1] == [grpc.StatusCode.INVALID_ARGUMENT] * (len(hostile) - 1)
        assert codes[-1] is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert peak < rss_bound_mb
        assert silo.proc.poll() is None


@pytest.mark.parametrize(
    "window",
    ["9-12", "0-0", "garbage", "2-1", "1" * 40],
    ids=["newer", "zero", "text", "backwards", "long"],
)
async def test_a_protocol_window_the_silo_cannot_speak_is_refused_by_name(
    redis_url: str, window: str
) -> None:
    """A client or silo stream that declares protocols this release does not
    speak (a release too far ahead, or bytes that are no window at all) is
    refused before anything is read from it, with FAILED_PRECONDITION and a
    message naming this release's window; the silo keeps serving, Active."""
    from orleanspy.messaging.grpc import PROTOCOL_HEADER
    from orleanspy.versions import ProtocolWindow

    with cluster(redis_url) as c:
        (silo,) = c.start(1)
        assert silo.address is not None
        for path, endpoint in (
            ("/orleanspy.v1.GatewayService/Connect", silo.endpoint),
            ("/orleanspy.v1.SiloService/Connect", silo.address.endpoint),
        ):
            async with grpc.aio.insecure_channel(endpoint) as channel:
                metadata = ((CLIENT_HEADER, "versions"), (PROTOCOL_HEADER, window))
                call = channel.stream_stream(path)(metadata=metadata)
                # Refused on its headers: nothing is written, since a frame sent
                # while the refusal arrives can end the stream with a reset that
                # the client reports as INTERNAL instead of the refusal.
                assert await call.code() is grpc.StatusCode.FAILED_PRECONDITION
                details = await call.details()
                assert details.startswith("protocol: ")
                if window == "9-12":
                    assert f"speaks {ProtocolWindow.mine().describe()}" in details
                    assert "speaks protocols 9-12" in details
                else:
                    assert "malformed protocol window" in details
        async with ClusterClient(redis_url) as client:
            assert await client.get_grain(GRAIN, "after-versions").add_slowly(0) == 1
        async with membership(redis_url) as table:
            assert await status(table, silo) is SiloStatus.ACTIVE
        assert silo.proc.poll() is None


# ------------------------------------------------------------------- crashes


async def _ticks(redis: Any) -> list[tuple[str, float, int]]:
    return [(key, at, pid) for key, at, pid, _ in await _slots(redis)]


async def _slots(redis: Any) -> list[tuple[str, float, int, int]]:
    """Every tick: key, when (unix time), the delivering pid, the slot (ms)."""
    rows = await redis.lrange("fault:ticks", 0, -1)
    out = []
    for row in rows:
        key, at, pid, slot = row.decode().split()
        out.append((key, float(at), int(pid), int(slot)))
    return out


@pytest.mark.timeout(240)
async def test_sigterm_under_reminder_load_delivers_no_slot_twice(redis_url: str) -> None:
    """A graceful stop finishes its ticks in flight and persists them before it
    releases its ranges: no slot of 300 one-second reminders is delivered twice,
    and none is stranded."""
    keys = [f"t{i}" for i in range(300)]
    with cluster(redis_url) as c:
        silos = c.start(3)
        redis = aioredis.Redis.from_url(redis_url)
        async with ClusterClient(redis_url) as client:
            for i in range(0, len(keys), 50):
                await asyncio.gather(
                    *(client.get_grain(GRAIN, k).start(1000) for k in keys[i : i + 50])
                )

            async def steady() -> bool:
                return {k for k, _, _, _ in await _slots(redis)} >= set(keys)

            await wait_for(steady, 60, what="every reminder ticking")
            victim = silos[0]
            victim.proc.send_signal(signal.SIGTERM)
            stopped = time.time()
            assert victim.proc.wait(30) == 0
            exited = time.time() - stopped

            async def all_ticked_after() -> bool:
                after = {k for k, at, _, _ in await _slots(redis) if at > stopped + exited + 1}
                return after >= set(keys)

            await wait_for(all_ticked_after, 60, what="every reminder ticking after the stop")
            ticks = await _slots(redis)
        await redis.aclose()
    seen = Counter((k, slot) for k, _, _, slot in ticks)
    twice = {ks: n for ks, n in seen.items() if n > 1}
    by_pid = Counter(pid for _, _, pid, _ in ticks)
    # Slots no one delivered, between each reminder's first and last delivered.
    per_key: dict[str, set[int]] = {}
    for k, _, _, slot in ticks:
        per_key.setdefault(k, set()).add(slot)
    skipped = sum((max(v) - min(v)) // 1000 + 1 - len(v) for v in per_key.values())
    print(
        f"\nSIGTERM under 300 x 1 s reminders: exit after {exited:.2f}s, "
        f"duplicate slots={len(twice)} of {len(seen)}, skipped slots={skipped}, "
        f"ticks by pid={dict(by_pid)}"
    )
    assert twice == {}, f"{len(twice)} slots delivered twice, e.g. {list(twice)[:5]}"


async def test_kill9_under_reminder_load_strands_no_reminder(redis_url: str) -> None:
    keys = [f"r{i}" for i in range(60)]
    with cluster(redis_url) as c:
        silos = c.start(3)
        redis = aioredis.Redis.from_url(redis_url)
        async with ClusterClient(redis_url) as client, membership(redis_url) as table:
            hosts = await asyncio.gather(*(client.get_grain(GRAIN, k).start(1000) for k in keys))
            victim = silos[0]
            on_victim = [k for k, h in zip(keys, hosts, strict=True) if h == str(victim.address)]
            assert on_victim

            async def steady() -> bool:
                seen = {k for k, _, _ in await _ticks(redis)}
                return seen >= set(keys)

            await wait_for(steady, 20, what="every reminder ticking")
            victim.proc.send_signal(signal.SIGKILL)
            killed = time.time()
            victim.proc.wait(5)

            async def dead() -> bool:
                return await status(table, victim) is SiloStatus.DEAD

            await wait_for(dead, 20, interval=0.02, what="the killed silo Dead")
            detection = time.time() - killed
            bound = detection + 2 * PERIOD

            async def all_ticked_again() -> bool:
                after = {k for k, at, _ in await _ticks(redis) if at > killed}
                return after >= set(keys)

            await wait_for(all_ticked_again, 60, what="every reminder ticking after the kill")
            first: dict[str, float] = {}
            for k, at, pid in await _ticks(redis):
                if at > killed and k not in first:
                    assert pid != victim.proc.pid
                    first[k] = at - killed
            stranded = {k: first[k] for k in keys}
            victim_worst = max(stranded[k] for k in on_victim)
            worst = max(stranded.values())
            print(
                f"\nkill -9: detection={detection:.2f}s grains_on_victim={len(on_victim)} "
                f"worst_on_victim={victim_worst:.2f}s worst={worst:.2f}s bound={bound:.2f}s"
            )
            late = {
                k: (round(v, 2), "grain on victim" if k in on_victim else "")
                for k, v in stranded.items()
                if v > bound
            }
            if late:
                for k, at, pid in await _ticks(redis):
                    if k in late and at > killed - 3:
                        print(f"  {k} {at - killed:+.2f}s pid={pid}")
            assert not late, f"stranded beyond detection + 2 periods: {late}"
            # Catch-up is never a burst: no tick is delivered once the slot after
            # it has passed (a SKIP row skips the slots the outage took), and no
            # reminder gets two deliveries within a tenth of its period.
            after = sorted((k, at, slot) for k, at, _, slot in await _slots(redis) if at > killed)
            stale = [(k, round(at - slot / 1000, 2)) for k, at, slot in after
                     if at >= slot / 1000 + PERIOD]  # fmt: skip
            bursts = [(k, round(b - a, 3)) for (k, a, _), (k2, b, _) in itertools.pairwise(after)
                      if k == k2 and b - a < PERIOD / 10]  # fmt: skip
            print(f"  stale deliveries={len(stale)} bursts={len(bursts)}")
            assert stale == [] and bursts == [], (stale[:5], bursts[:5])
        await redis.aclose()


async def test_calls_in_flight_to_a_killed_silo_fail_at_once(redis_url: str) -> None:
    with cluster(redis_url) as c:
        gateway, victim = c.start(2)
        async with ClusterClient(gateways=[gateway.endpoint]) as client:
            keys = [f"k{i}" for i in range(30)]
            where = await asyncio.gather(*(client.get_grain(GRAIN, k).where() for k in keys))
            on_victim = [
                k for k, (_, pid) in zip(keys, where, strict=True) if pid == victim.proc.pid
            ]
            assert on_victim
            calls = [asyncio.ensure_future(client.get_grain(GRAIN, k).hold(20)) for k in on_victim]
            redis = aioredis.Redis.from_url(redis_url)

            async def all_held() -> bool:
                return int(await redis.llen("fault:holding")) == len(on_victim)

            await wait_for(all_held, 10, what="every call running inside the victim")
            await redis.aclose()
            victim.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            took = time.monotonic() - killed
            print(f"\nkill -9: {len(calls)} calls in flight failed {took:.2f}s after the kill")
            assert all(isinstance(o, SiloUnavailableError) for o in outcomes), outcomes
            assert took < 5  # the link broke: no waiting for the 30 s response timeout


async def test_sigstopped_silo_past_its_death_fails_calls_fast_and_then_leaves(
    redis_url: str,
) -> None:
    with cluster(redis_url) as c:
        silos = c.start(3)
        victim, gateway = silos[0], silos[1]
        async with (
            ClusterClient(gateways=[gateway.endpoint]) as client,
            membership(redis_url) as table,
        ):
            keys = [f"s{i}" for i in range(30)]
            where = await asyncio.gather(*(client.get_grain(GRAIN, k).where() for k in keys))
            on_victim = [
                k for k, (_, pid) in zip(keys, where, strict=True) if pid == victim.proc.pid
            ]
            assert on_victim
            victim.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            # Calls sent to the frozen silo now: they cannot be answered.
            stuck = [
                asyncio.ensure_future(client.get_grain(GRAIN, k).add_slowly(0)) for k in on_victim
            ]

            async def dead() -> bool:
                return await status(table, victim) is SiloStatus.DEAD

            await wait_for(dead, 20, interval=0.02, what="the frozen silo Dead")
            declared = time.monotonic()
            outcomes = await asyncio.gather(*stuck, return_exceptions=True)
            settled = time.monotonic()
            for outcome in outcomes:
                assert isinstance(outcome, SiloUnavailableError | int), outcome
            print(
                f"\nSIGSTOP: declared dead after {declared - stopped:.2f}s; "
                f"{len(stuck)} calls in flight settled {settled - declared:.2f}s after that"
            )
            assert settled - declared < 5  # not the 30 s response timeout
            # The grains live on elsewhere at once.
            again = await asyncio.gather(*(client.get_grain(GRAIN, k).where() for k in on_victim))
            assert all(pid != victim.proc.pid for _, pid in again)
            # Woken, the silo reads itself Dead and stops on its own.
            victim.proc.send_signal(signal.SIGCONT)
            await asyncio.to_thread(victim.proc.wait, 30)
            assert victim.proc.returncode is not None


async def test_a_tick_stuck_on_a_frozen_peer_gives_its_permit_back_at_its_deadline(
    redis_url: str,
) -> None:
    """A silo owns a 1 s reminder of a grain that lives on a peer, which freezes
    (SIGSTOP: the connection stays up, nothing answers). The tick's call gives up
    at the row's deadline (2 s: its period, raised to minimum_tick_timeout), not
    the 30 s response timeout, and its permit is free again at once."""
    from tests.cluster import fault_silo

    with cluster(redis_url) as c:
        (frozen,) = c.start(1, "--slow-detection")  # a child before this process's gRPC
        fault_silo._redis = aioredis.Redis.from_url(redis_url)
        options = SiloOptions(
            redis_url=redis_url,
            name="holder",
            gateway_port=0,
            membership=fault_silo.SLOW_DETECTION,
            reminders=replace(fault_silo.REMINDERS, permits=2),
            grain_types=(fault_silo.FaultTickGrain,),
        )
        try:
            async with Silo(options) as holder:
                service = holder.reminder_service
                assert service is not None and holder.membership is not None
                await wait_for(
                    lambda: len(holder.membership.active_silos()) == 2, 20, what="two silos"
                )
                # The ranges this silo took over from the live peer are its own
                # once their handover delay has passed.
                await wait_for(lambda: service.ranges, 5, what="ranges owned here")
                assert frozen.address is not None
                client = holder.client
                key = None
                for i in range(400):
                    k = f"frz{i}"
                    gid = GrainId(GRAIN, k)
                    if not any(gid.uniform_hash() in r for r in service.ranges):
                        continue
                    if (await client.get_grain(GRAIN, k).where())[1] == frozen.proc.pid:
                        key = k
                        break
                assert key is not None, "no grain on the peer with a row owned here"
                await client.get_grain(GRAIN, key).start(1000)
                await wait_for(lambda: service.stats.delivered >= 1, 20, what="a first tick")
                frozen.proc.send_signal(signal.SIGSTOP)
                try:
                    await wait_for(lambda: service.stats.in_flight == 1, 10, interval=0.01)
                    stuck_at = time.monotonic()
                    retries = service.stats.retries
                    await wait_for(
                        lambda: service.stats.retries > retries and service.stats.in_flight == 0,
                        40,
                        interval=0.01,
                        what="the stuck tick giving its permit back",
                    )
                    held = time.monotonic() - stuck_at
                finally:
                    frozen.proc.send_signal(signal.SIGCONT)
                response_timeout = options.messaging.response_timeout.total_seconds()
                print(
                    f"\nfrozen peer: permit held {held:.2f}s "
                    f"(deadline 2 s; response timeout {response_timeout:g} s)"
                )
                assert 1.5 < held < 4.0, held
        finally:
            await fault_silo._redis.aclose()
            fault_silo._redis = None


async def test_same_port_restart_costs_at_most_one_failed_call(redis_url: str) -> None:
    port = free_port()
    with cluster(redis_url) as c:
        # Detection takes ~10 s here: the restart happens long before the
        # crashed incarnation could be declared dead by probing.
        (stable,) = c.start(1, "--slow-detection")
        (restarting,) = c.start(1, "--slow-detection", "--port", str(port), expect=2)
        async with ClusterClient(gateways=[stable.endpoint]) as client:
            on_it: list[str] = []
            batches = iter(range(1000))

            async def some_on_it() -> bool:
                # The stable silo may place a few batches before it sees the
                # second silo Active; new keys are placed afresh each round.
                b = next(batches)
                keys = [f"p{b}-{i}" for i in range(40)]
                where = await asyncio.gather(*(client.get_grain(GRAIN, k).where() for k in keys))
                on_it.extend(
                    k for k, (_, pid) in zip(keys, where, strict=True) if pid == restarting.proc.pid
                )
                return bool(on_it)

            await wait_for(some_on_it, 20, interval=0.1, what="grains placed on the second silo")
            restarting.proc.send_signal(signal.SIGKILL)
            restarting.proc.wait(5)
            (reborn,) = c.start(1, "--slow-detection", "--port", str(port), expect=2)
            assert reborn.address is not None and reborn.address.port == port
            failures: list[BaseException] = []
            started = time.monotonic()
            for _ in range(3):
                for k in on_it:
                    try:
                        await client.get_grain(GRAIN, k).where()
                    except Exception as exc:
                        failures.append(exc)
            took = time.monotonic() - started
            print(
                f"\nsame-port restart: {3 * len(on_it)} calls, {len(failures)} failed "
                f"({sorted({type(f).__name__ for f in failures})}) in {took:.2f}s"
            )
            assert not any(isinstance(f, SerializationError) for f in failures)
            assert len(failures) <= 1


# ------------------------------------------------------- default options


async def test_kill9_with_default_options_fails_over_and_resumes_within_3s(
    redis_url: str,
) -> None:
    """Default membership and reminder options, as an operator runs them. After
    kill -9 the port refuses connections at once: the survivors declare the
    victim Dead on that evidence, calls to its grains go elsewhere and every
    reminder ticks again within 3 s."""
    keys = [f"d{i}" for i in range(30)]
    with cluster(redis_url) as c:
        silos = c.start(3, "--default-options")
        victim = silos[0]
        redis = aioredis.Redis.from_url(redis_url)
        async with ClusterClient(redis_url) as client, membership(redis_url) as table:
            await asyncio.gather(*(client.get_grain(GRAIN, k).start(1000) for k in keys))
            where = await asyncio.gather(*(client.get_grain(GRAIN, k).where() for k in keys))
            on_victim = [
                k for k, (_, pid) in zip(keys, where, strict=True) if pid == victim.proc.pid
            ]
            assert on_victim

            async def steady() -> bool:
                return {k for k, _, _ in await _ticks(redis)} >= set(keys)

            await wait_for(steady, 20, what="every reminder ticking")
            victim.proc.send_signal(signal.SIGKILL)
            killed = time.time()
            victim.proc.wait(5)

            async def dead() -> bool:
                return await status(table, victim) is SiloStatus.DEAD

            await wait_for(dead, 30, interval=0.02, what="the killed silo Dead")
            detection = time.time() - killed

            served: dict[str, float] = {}

            async def all_served() -> bool:
                for k in [k for k in on_victim if k not in served]:
                    try:
                        _, pid = await client.get_grain(GRAIN, k).where()
                    except SiloUnavailableError:
                        continue
                    assert pid != victim.proc.pid
                    served[k] = time.time() - killed
                return len(served) == len(on_victim)

            await wait_for(all_served, 30, interval=0.02, what="calls to the victim's grains")

            async def all_ticked_again() -> bool:
                return {k for k, at, _ in await _ticks(redis) if at > killed} >= set(keys)

            await wait_for(all_ticked_again, 30, what="every reminder ticking after the kill")
            resumed: dict[str, float] = {}
            for k, at, _pid in await _ticks(redis):
                if at > killed and k not in resumed:
                    resumed[k] = at - killed
            failover, worst = max(served.values()), max(resumed.values())
            print(
                f"\nkill -9, default options: declared dead after {detection:.2f}s, calls to "
                f"{len(on_victim)} grains served elsewhere after {failover:.2f}s, every "
                f"reminder ticked again after {worst:.2f}s"
            )
            assert failover < 3.0
            assert worst < 3.0
        await redis.aclose()
