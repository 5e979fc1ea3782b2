"""The gRPC transport on loopback: round trips, batching, failures, security."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import grpc.aio
import pytest

from orleanspy.errors import (
    AuthenticationError,
    MessageRejectedError,
    SiloRestartedError,
    SiloUnavailableError,
)
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging._generated import messages_pb2 as pb
from orleanspy.messaging.grpc import GrpcGatewayConnection, GrpcTransport
from orleanspy.messaging.message import (
    Message,
    MessageKind,
    ResponseStatus,
    next_message_id,
    settle,
)
from orleanspy.messaging.remote_errors import rebuild_error
from orleanspy.options import MessagingOptions, TlsOptions
from orleanspy.serialization import unpack
from orleanspy.testing.cluster import wait_for
from tests.certs import issue

DEADLINE = 10.0


class RecordingSink:
    """Records what a transport delivers; optionally echoes requests back."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.failed: list[tuple[Message, Exception]] = []
        self.echo_via: GrpcTransport | None = None
        self._changed = asyncio.Event()

    def receive(self, message: Message) -> None:
        self.received.append(message)
        self._changed.set()
        if self.echo_via is not None and message.kind is MessageKind.REQUEST:
            assert message.sender_silo is not None
            self.echo_via.send(
                message.sender_silo, message.response(ResponseStatus.OK, message.body)
            )

    def undeliverable(self, message: Message, error: Exception) -> None:
        self.failed.append((message, error))
        self._changed.set()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(DEADLINE):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


async def start(
    stack: AsyncExitStack,
    options: MessagingOptions | None = None,
    *,
    port: int = 0,
    gateway: bool = False,
    generation: int | None = None,
) -> tuple[GrpcTransport, RecordingSink]:
    transport = GrpcTransport(
        host="127.0.0.1",
        port=port,
        gateway_port=0 if gateway else None,
        options=options or MessagingOptions(),
        generation=generation,
    )
    sink = RecordingSink()
    await transport.start(stack, sink)
    return transport, sink


def request(sender: GrpcTransport, target: SiloAddress, body: bytes = b"ping") -> Message:
    return Message(
        id=next_message_id(),
        kind=MessageKind.REQUEST,
        target_grain=GrainId("Counter", "a"),
        method="add",
        body=body,
        sender_silo=sender.address,
        target_silo=target,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def test_request_and_response_round_trip_every_field(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    b, b_sink = await start(stack)
    b_sink.echo_via = b
    grains = [
        GrainId("Counter", "key/with|odd:chars"),
        GrainId("Counter", -(2**63)),
        GrainId("Counter", uuid.uuid4()),
    ]
    sent = []
    for i, grain in enumerate(grains):
        message = Message(
            id=next_message_id(),
            kind=MessageKind.REQUEST,
            target_grain=grain,
            method="add",
            body=bytes(range(256)) * (i + 1),
            sender_silo=a.address,
            sender_client="client-7",
            target_silo=b.address,
            correlation_id=99,
            expires_at_ms=1_900_000_000_123,
            forward_count=2,
            status=ResponseStatus.ERROR,
            headers={"chain": "Counter/a\nCounter/b", "ünï": "çødé"},
        )
        sent.append(message)
        a.send(b.address, message)

    await a_sink.wait_for(lambda: len(a_sink.received) == 3)

    assert b_sink.received == sent
    for request_, response in zip(sent, a_sink.received, strict=True):
        assert response.kind is MessageKind.RESPONSE
        assert response.correlation_id == request_.id
        assert response.body == request_.body
        assert response.target_grain is None and response.method == ""  # responses name no grain
        assert response.sender_client == "client-7"
    assert a_sink.failed == [] and b_sink.failed == []


async def test_messages_under_load_share_frames(stack: AsyncExitStack) -> None:
    a, _ = await start(stack)
    b, b_sink = await start(stack)
    n = 3000
    for _ in range(n):
        a.send(b.address, request(a, b.address))

    await b_sink.wait_for(lambda: len(b_sink.received) == n)
    # The sender counts a frame once its write returned, which may be after the
    # receiver had it: wait for the sender's count too.
    await wait_for(lambda: a.stats.messages_sent == n, 5, what="the sender's count")

    assert b.stats.messages_received == n
    assert b.stats.frames_received < n // 10
    assert a.stats.frames_sent == b.stats.frames_received
    assert [m.id for m in b_sink.received] == sorted(m.id for m in b_sink.received)


async def test_send_to_dead_port_is_undeliverable(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    dead = SiloAddress("127.0.0.1", free_port(), 1)
    messages = [request(a, dead) for _ in range(3)]
    for message in messages:
        a.send(dead, message)

    await a_sink.wait_for(lambda: len(a_sink.failed) == 3)

    assert [m for m, _ in a_sink.failed] == messages
    assert all(isinstance(e, SiloUnavailableError) for _, e in a_sink.failed)
    assert not await a.ping(dead, 0.5)


async def test_disconnect_hands_back_queued_messages(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    # A listener that never speaks HTTP/2: the handshake hangs, messages stay queued.
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen()
    stack.callback(mute.close)
    target = SiloAddress("127.0.0.1", mute.getsockname()[1], 1)
    messages = [request(a, target) for _ in range(5)]
    for message in messages:
        a.send(target, message)
    await asyncio.sleep(0)  # let the link task start connecting

    a.disconnect(target)

    assert [m for m, _ in a_sink.failed] == messages
    assert all(isinstance(e, SiloUnavailableError) for _, e in a_sink.failed)


async def test_restarted_peer_rejects_messages_for_old_generation(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    async with AsyncExitStack() as first_run:
        old, old_sink = await start(first_run, generation=1)
        old_sink.echo_via = old
        a.send(old.address, request(a, old.address))
        await a_sink.wait_for(lambda: len(a_sink.received) == 1)
    new, new_sink = await start(stack, port=old.address.port, generation=2)
    assert await a.ping(new.address, 2.0)
    assert not await a.ping(old.address, 2.0)

    stale = request(a, old.address)
    a.send(old.address, stale)
    await a_sink.wait_for(
        lambda: (
            any(m.correlation_id == stale.id for m in a_sink.received)
            or any(m is stale for m, _ in a_sink.failed)
        )
    )
    if any(m is stale for m, _ in a_sink.failed):
        # The old link's failure was still being noticed; the retry reconnects.
        a.send(old.address, stale)
        await a_sink.wait_for(lambda: any(m.correlation_id == stale.id for m in a_sink.received))

    rejection = next(m for m in a_sink.received if m.correlation_id == stale.id)
    assert rejection.status is ResponseStatus.REJECTED
    # Encoded like every other error, and typed: the sender re-resolves the grain.
    error = rebuild_error(unpack(rejection.body))
    assert isinstance(error, SiloRestartedError)
    assert "earlier incarnation" in str(error)
    assert new_sink.received == []


@pytest.mark.parametrize("client_secret", [None, "wrong"])
async def test_silo_without_the_cluster_secret_is_refused(
    stack: AsyncExitStack, client_secret: str | None
) -> None:
    a, a_sink = await start(stack, MessagingOptions(cluster_secret=client_secret))
    b, b_sink = await start(stack, MessagingOptions(cluster_secret="s3cret"))
    message = request(a, b.address)
    a.send(b.address, message)

    await a_sink.wait_for(lambda: len(a_sink.failed) == 1)

    assert a_sink.failed[0][0] is message
    assert isinstance(a_sink.failed[0][1], AuthenticationError)
    assert b_sink.received == []
    assert not await a.ping(b.address, 2.0)


async def test_silos_with_the_cluster_secret_talk(stack: AsyncExitStack) -> None:
    options = MessagingOptions(cluster_secret="s3cret")
    a, a_sink = await start(stack, options)
    b, b_sink = await start(stack, options)
    b_sink.echo_via = b
    a.send(b.address, request(a, b.address))

    await a_sink.wait_for(lambda: len(a_sink.received) == 1)

    assert a_sink.received[0].status is ResponseStatus.OK
    assert await a.ping(b.address, 2.0)


@pytest.mark.parametrize("client_secret", [None, "wrong"])
async def test_gateway_client_without_the_cluster_secret_is_refused(
    stack: AsyncExitStack, client_secret: str | None
) -> None:
    b, _ = await start(stack, MessagingOptions(cluster_secret="s3cret"), gateway=True)
    connection = GrpcGatewayConnection(
        f"127.0.0.1:{b.gateway_port}",
        client_id="c1",
        options=MessagingOptions(cluster_secret=client_secret),
        on_message=lambda m: None,
        on_closed=lambda e: None,
    )
    with pytest.raises(AuthenticationError):
        await connection.connect()
    assert connection.closed


async def test_garbage_frame_aborts_only_that_stream(stack: AsyncExitStack) -> None:
    a, _ = await start(stack)
    b, b_sink = await start(stack)
    async with grpc.aio.insecure_channel(b.address.endpoint) as channel:
        call = channel.stream_stream("/orleanspy.v1.SiloService/Connect")()
        # Field 1, length-delimited, with a length far past the end: cannot parse.
        await call.write(b"\x0a\xff\xff\xff\x0fgarbage")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    a.send(b.address, request(a, b.address))
    await b_sink.wait_for(lambda: len(b_sink.received) == 1)
    assert b_sink.received[0].sender_silo == a.address


async def test_invalid_envelopes_get_rejected_responses(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    b, b_sink = await start(stack)
    batch = pb.Batch()
    batch.messages.add(id=7001, grain_type="No/Slash", s="k", sender_silo=str(a.address))
    batch.messages.add(id=7002, sender_silo=str(a.address)).kind = 9  # type: ignore[assignment]
    batch.messages.add(id=7003, grain_type="Counter", sender_silo=str(a.address))
    async with grpc.aio.insecure_channel(b.address.endpoint) as channel:
        call = channel.stream_stream("/orleanspy.v1.SiloService/Connect")()
        await call.write(batch.SerializeToString())
        await a_sink.wait_for(lambda: len(a_sink.received) == 2)
        call.cancel()

    by_id = {m.correlation_id: m for m in a_sink.received}
    assert set(by_id) == {7001, 7003}  # the unknown kind is not a request: dropped
    assert all(m.status is ResponseStatus.REJECTED for m in by_id.values())
    error = rebuild_error(unpack(by_id[7001].body))
    assert isinstance(error, MessageRejectedError)
    assert "bad target grain" in str(error)
    assert b_sink.received == []


async def test_oversized_body_gets_a_rejected_response(stack: AsyncExitStack) -> None:
    a, a_sink = await start(stack)
    b, b_sink = await start(stack, MessagingOptions(max_message_size=1024))
    b_sink.echo_via = b
    big = request(a, b.address, body=b"x" * 4096)
    small = request(a, b.address, body=b"y" * 100)
    a.send(b.address, big)
    a.send(b.address, small)

    await a_sink.wait_for(lambda: len(a_sink.received) == 2)

    by_id = {m.correlation_id: m for m in a_sink.received}
    assert by_id[big.id].status is ResponseStatus.REJECTED
    error = rebuild_error(unpack(by_id[big.id].body))
    assert isinstance(error, MessageRejectedError)
    assert "exceeds max_message_size" in str(error)
    assert by_id[small.id].status is ResponseStatus.OK
    assert [m.id for m in b_sink.received] == [small.id]


async def test_gateway_stamps_the_client_and_answers_down_its_stream(
    stack: AsyncExitStack,
) -> None:
    b, b_sink = await start(stack, gateway=True)
    arrived: list[Message] = []
    got_reply = asyncio.Event()
    closed: list[Exception | None] = []

    def on_message(message: Message) -> None:
        arrived.append(message)
        got_reply.set()

    async with GrpcGatewayConnection(
        f"127.0.0.1:{b.gateway_port}",
        client_id="client-42",
        options=MessagingOptions(),
        on_message=on_message,
        on_closed=closed.append,
    ) as connection:
        assert connection.gateway == b.address
        forged = Message(
            id=next_message_id(),
            kind=MessageKind.REQUEST,
            target_grain=GrainId("Counter", 3),
            method="add",
            body=b"\x01",
            sender_client="someone-else",
        )
        connection.send(forged)
        await b_sink.wait_for(lambda: len(b_sink.received) == 1)
        seen = b_sink.received[0]
        assert seen.sender_client == "client-42"
        assert seen.sender_silo == b.address
        assert seen.body == b"\x01"

        b.send_to_client("client-42", seen.response(ResponseStatus.OK, b"done"))
        b.send_to_client("nobody", seen.response(ResponseStatus.OK, b"lost"))
        async with asyncio.timeout(DEADLINE):
            await got_reply.wait()

    assert [(m.correlation_id, m.body) for m in arrived] == [(forged.id, b"done")]
    assert closed == [None]
    assert connection.closed


async def test_gateway_connection_to_dead_port_fails() -> None:
    connection = GrpcGatewayConnection(
        f"127.0.0.1:{free_port()}",
        client_id="c",
        options=MessagingOptions(),
        on_message=lambda m: None,
        on_closed=lambda e: None,
    )
    with pytest.raises(SiloUnavailableError):
        await connection.connect()


async def test_ping(stack: AsyncExitStack) -> None:
    a, _ = await start(stack)
    b, _ = await start(stack)

    assert await a.ping(b.address, 2.0)
    assert not await a.ping(SiloAddress("127.0.0.1", free_port(), 1), 0.5)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return issue(tmp_path_factory.mktemp("tls"), dns_name="silo.test")


async def test_mutual_tls_round_trip(
    stack: AsyncExitStack, tls_files: tuple[Path, Path, Path]
) -> None:
    cert, key, ca = (str(p) for p in tls_files)
    tls = TlsOptions(cert_file=cert, key_file=key, ca_file=ca, server_name="silo.test")
    options = MessagingOptions(tls=tls, cluster_secret="s3cret")
    a, a_sink = await start(stack, options)
    b, b_sink = await start(stack, options, gateway=True)
    b_sink.echo_via = b
    a.send(b.address, request(a, b.address, body=b"over tls"))

    await a_sink.wait_for(lambda: len(a_sink.received) == 1)
    assert a_sink.received[0].body == b"over tls"
    assert await a.ping(b.address, 2.0)

    # A plaintext peer cannot talk to a TLS silo.
    plain, plain_sink = await start(stack, MessagingOptions(cluster_secret="s3cret"))
    plain.send(b.address, request(plain, b.address))
    await plain_sink.wait_for(lambda: len(plain_sink.failed) == 1)
    assert isinstance(plain_sink.failed[0][1], SiloUnavailableError)

    # A gateway client presenting the certificate gets through.
    b_sink.echo_via = None
    replies: list[Message] = []
    async with GrpcGatewayConnection(
        f"127.0.0.1:{b.gateway_port}",
        client_id="tls-client",
        options=options,
        on_message=replies.append,
        on_closed=lambda e: None,
    ) as connection:
        connection.send(request(a, b.address, body=b"via gateway"))
        await b_sink.wait_for(lambda: any(m.sender_client == "tls-client" for m in b_sink.received))


async def test_a_ping_carrying_a_table_version_reaches_the_gossip_listener(
    stack: AsyncExitStack,
) -> None:
    a, _ = await start(stack)
    b, _ = await start(stack)
    heard: list[int] = []
    b.on_gossip(heard.append)

    assert await a.ping(b.address, 2.0)  # a plain probe is no gossip
    assert await a.ping(b.address, 2.0, table_version=2**40)
    assert heard == [2**40]
    b.on_gossip(None)
    assert await a.ping(b.address, 2.0, table_version=9)
    assert heard == [2**40]


# -- untrusted senders: bounded in-flight requests, client claims overridden


def client_request(i: int, **headers: str) -> Message:
    msg = Message.request(
        GrainId("Counter", f"k{i}"),
        "add",
        b"\x92\x90\x80",
        one_way=False,
        expires_at_ms=int(time.time() * 1000) + 60_000,
    )
    msg.headers.update(headers)
    return msg


async def test_gateway_stops_reading_a_client_at_max_in_flight(stack: AsyncExitStack) -> None:
    gateway, sink = await start(stack, MessagingOptions(max_in_flight=5), gateway=True)
    answers: list[Message] = []
    conn = GrpcGatewayConnection(
        f"127.0.0.1:{gateway.gateway_port}",
        client_id="greedy",
        options=MessagingOptions(),
        on_message=answers.append,
        on_closed=lambda _e: None,
    )
    await stack.enter_async_context(conn)
    for i in range(100):
        conn.send(client_request(i))

    await sink.wait_for(lambda: len(sink.received) == 5)
    # Nothing is answered, so nothing more is read however long we look; the
    # answers below are what lets the next requests in.
    for message in sink.received[:3]:
        gateway.send_to_client("greedy", message.response(ResponseStatus.OK, b"\xc0"))
    await sink.wait_for(lambda: len(sink.received) == 8)
    await wait_for(lambda: len(answers) == 3, 10)
    assert len(sink.received) == 8


async def test_gateway_overrides_what_a_client_claims(stack: AsyncExitStack) -> None:
    gateway, sink = await start(stack, gateway=True)
    conn = GrpcGatewayConnection(
        f"127.0.0.1:{gateway.gateway_port}",
        client_id="liar",
        options=MessagingOptions(),
        on_message=lambda _m: None,
        on_closed=lambda _e: None,
    )
    await stack.enter_async_context(conn)
    forged = client_request(1, chain="Counter/k1")
    forged.target_silo = SiloAddress("10.9.9.9", 1, 1)
    forged.sender_silo = SiloAddress("10.9.9.9", 2, 1)
    forged.forward_count = 7
    forged.expires_at_ms = 0  # "never"
    # A "response" from a client could only complete somebody else's call.
    fake_answer = Message(
        id=next_message_id(),
        kind=MessageKind.RESPONSE,
        correlation_id=12345,
        target_silo=gateway.address,
        body=b"\xc0",
    )
    conn.send(fake_answer)
    conn.send(forged)

    await sink.wait_for(lambda: len(sink.received) == 1)
    got = sink.received[0]
    assert got.kind is MessageKind.REQUEST  # the stream is ordered: the answer was dropped
    assert got.headers == {}
    assert got.target_silo is None
    assert got.sender_silo == gateway.address
    assert got.sender_client == "liar"
    assert got.forward_count == 0
    assert 0 < got.expires_at_ms <= time.time() * 1000 + 30_000


async def test_a_peer_past_max_in_flight_gets_overloaded_rejections(
    stack: AsyncExitStack,
) -> None:
    a, a_sink = await start(stack)
    b, b_sink = await start(stack, MessagingOptions(max_in_flight=3))
    sent = [request(a, b.address) for _ in range(5)]
    for message in sent:
        a.send(b.address, message)

    await a_sink.wait_for(lambda: len(a_sink.received) == 2)
    assert len(b_sink.received) == 3
    for rejection in a_sink.received:
        assert rejection.kind is MessageKind.RESPONSE
        assert rejection.status is ResponseStatus.REJECTED
        error = rebuild_error(unpack(rejection.body))
        assert isinstance(error, MessageRejectedError)
        assert "overloaded" in str(error)
    # An answer written back frees a place.
    b.send(a.address, b_sink.received[0].response(ResponseStatus.OK, b"\xc0"))
    await a_sink.wait_for(lambda: len(a_sink.received) == 3)
    extra = request(a, b.address)
    a.send(b.address, extra)
    await b_sink.wait_for(lambda: any(m.id == extra.id for m in b_sink.received))


def client_one_way(i: int) -> Message:
    return Message.request(
        GrainId("Counter", f"k{i}"),
        "add",
        b"\x92\x90\x80",
        one_way=True,
        expires_at_ms=int(time.time() * 1000) + 60_000,
    )


async def test_a_client_one_way_message_holds_its_slot_until_settled(
    stack: AsyncExitStack,
) -> None:
    """Settled here (its turn ran) or written to the silo that runs it: either
    frees the client's slot, and nothing else does."""
    gateway, sink = await start(stack, MessagingOptions(max_in_flight=4), gateway=True)
    peer, peer_sink = await start(stack)
    conn = GrpcGatewayConnection(
        f"127.0.0.1:{gateway.gateway_port}",
        client_id="one-way",
        options=MessagingOptions(),
        on_message=lambda _m: None,
        on_closed=lambda _e: None,
    )
    await stack.enter_async_context(conn)
    for i in range(12):
        conn.send(client_one_way(i))

    await sink.wait_for(lambda: len(sink.received) == 4)
    assert all(m.on_settled is not None for m in sink.received)
    settle(sink.received[0])
    settle(sink.received[0])  # once only: a second call frees nothing more
    await sink.wait_for(lambda: len(sink.received) == 5)
    # Passed on to another silo: the slot is free once the frame is written.
    for message in sink.received[1:3]:
        gateway.send(peer.address, message)
    await peer_sink.wait_for(lambda: len(peer_sink.received) == 2)
    await sink.wait_for(lambda: len(sink.received) == 7)
    # The receiving silo counts them again, against the gateway silo that sent them.
    assert all(m.on_settled is not None for m in peer_sink.received)
    assert len(sink.received) == 7  # nothing else was settled


async def test_a_peer_past_max_in_flight_loses_its_excess_one_way_messages(
    stack: AsyncExitStack,
) -> None:
    a, _a_sink = await start(stack)
    b, b_sink = await start(stack, MessagingOptions(max_in_flight=3))
    for _ in range(5):
        message = request(a, b.address)
        message.kind = MessageKind.ONE_WAY
        a.send(b.address, message)

    await wait_for(lambda: b.one_way_refused == 2, DEADLINE)
    assert len(b_sink.received) == 3
    settle(b_sink.received[0])  # its turn ran: the sender may send another
    extra = request(a, b.address)
    extra.kind = MessageKind.ONE_WAY
    a.send(b.address, extra)
    await b_sink.wait_for(lambda: any(m.id == extra.id for m in b_sink.received))
    assert b.one_way_refused == 2


async def test_responses_are_never_dialled_to_addresses_outside_the_table(
    stack: AsyncExitStack,
) -> None:
    a, a_sink = await start(stack)
    b, b_sink = await start(stack)
    b.answer_only(lambda silo: False)
    b_sink.echo_via = b
    a.send(b.address, request(a, b.address))
    await b_sink.wait_for(lambda: len(b_sink.received) == 1)
    # b knows no member to answer: it opened no link, so a hears nothing.
    assert b.stats.frames_sent == 0
    assert a_sink.received == []


# -- probes and peer-link logging ----------------------------------------------------


async def test_probe_tells_a_refused_port_from_an_answer_and_another_incarnation(
    stack: AsyncExitStack,
) -> None:
    from orleanspy.messaging.transport import ProbeOutcome

    a, _ = await start(stack)
    b, _ = await start(stack)
    assert await a.probe(b.address, 2.0) is ProbeOutcome.ANSWERED
    # Another incarnation answering on b's address: the one probed is gone.
    earlier = SiloAddress(b.address.host, b.address.port, b.address.generation - 1)
    assert await a.probe(earlier, 2.0) is ProbeOutcome.GONE
    # Nothing listens: the host refuses the connection (a killed process).
    closed = SiloAddress("127.0.0.1", free_port(), 1)
    started = time.monotonic()
    assert await a.probe(closed, 2.0) is ProbeOutcome.REFUSED
    assert time.monotonic() - started < 1.5  # evidence at once, not after the timeout
    assert not await a.ping(closed, 2.0)
    # A peer that refuses this silo's secret.
    guarded, _ = await start(stack, MessagingOptions(cluster_secret="s3cret"))
    assert await a.probe(guarded.address, 2.0) is ProbeOutcome.UNAUTHORIZED


async def test_a_peer_link_logs_once_when_down_and_once_when_up_with_the_failed_count(
    stack: AsyncExitStack, caplog: pytest.LogCaptureFixture
) -> None:
    """Twenty sends to a peer that is not there: one WARNING, not twenty lines;
    once it listens again, one INFO line that says how many messages failed."""
    import logging

    a, a_sink = await start(stack)
    port = free_port()
    target = SiloAddress("127.0.0.1", port, 7)
    with caplog.at_level(logging.DEBUG, logger="orleanspy.messaging.grpc"):
        for _ in range(20):
            a.send(target, request(a, target))
            await a_sink.wait_for(lambda n=len(a_sink.failed): len(a_sink.failed) > n)
        _b, b_sink = await start(stack, port=port, generation=7)
        a.send(target, request(a, target))
        await b_sink.wait_for(lambda: len(b_sink.received) == 1)
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.levelno >= logging.INFO and "peer link" in r.getMessage()
    ]
    assert len(a_sink.failed) == 20
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "peer link down" in lines[0][1]
    assert "peer link up again" in lines[1][1] and "failed_messages=20" in lines[1][1]


def test_grpc_core_logging_is_quiet_unless_asked_for() -> None:
    """A bind failure makes gRPC's C core print an ``add_port`` error on stderr;
    importing orleanspy's transport silences it, and GRPC_VERBOSITY still wins."""
    code = (
        "import asyncio, socket\n"
        "from orleanspy.messaging.grpc import GrpcTransport\n"
        "from orleanspy.options import MessagingOptions\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "port = s.getsockname()[1]\n"
        "async def main():\n"
        "    from contextlib import AsyncExitStack\n"
        "    async with AsyncExitStack() as stack:\n"
        "        t = GrpcTransport(host='127.0.0.1', port=port, gateway_port=None,\n"
        "                          options=MessagingOptions())\n"
        "        try:\n"
        "            await t.start(stack, None)\n"
        "        except Exception as exc:\n"
        "            print('refused', type(exc).__name__)\n"
        "asyncio.run(main())\n"
    )
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    quiet = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert "refused" in quiet.stdout, quiet.stderr
    assert "add_port" not in quiet.stderr, quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(env, GRPC_VERBOSITY="ERROR"),
        timeout=60,
        check=False,
    )
    assert "add_port" in loud.stderr, loud.stderr


async def _fake_gateway(stack: AsyncExitStack, served: tuple[tuple[str, str], ...]) -> int:
    """A gRPC server whose GatewayService/Connect answers with ``served`` as its
    initial metadata, then holds the stream open: a gateway of another release."""

    async def connect(_requests: object, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        await context.send_initial_metadata(served)
        await asyncio.Event().wait()

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "orleanspy.v1.GatewayService",
        {"Connect": grpc.stream_stream_rpc_method_handler(connect)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, None)
    return port


def _connection(port: int) -> GrpcGatewayConnection:
    return GrpcGatewayConnection(
        f"127.0.0.1:{port}",
        client_id="versions",
        options=MessagingOptions(),
        on_message=lambda m: None,
        on_closed=lambda e: None,
    )


async def test_a_client_refuses_a_gateway_of_a_release_it_cannot_speak(
    stack: AsyncExitStack,
) -> None:
    from orleanspy.messaging.grpc import PROTOCOL_HEADER, SILO_HEADER
    from orleanspy.versions import IncompatibleVersionError

    port = await _fake_gateway(stack, ((SILO_HEADER, "127.0.0.1:1@1"), (PROTOCOL_HEADER, "7-9")))
    connection = _connection(port)
    with pytest.raises(IncompatibleVersionError, match="speaks protocols 7-9") as caught:
        await connection.connect()
    assert "run a release that speaks protocol 7 or newer here" in str(caught.value)
    assert connection.closed


async def test_a_gateway_of_the_previous_release_speaks_protocol_1(stack: AsyncExitStack) -> None:
    """0.1.x sends no protocol header: it is protocol 1, which this release speaks."""
    from orleanspy.messaging.grpc import SILO_HEADER

    port = await _fake_gateway(stack, ((SILO_HEADER, "127.0.0.1:1@1"),))
    connection = _connection(port)
    await connection.connect()
    try:
        assert connection.protocol == 1
    finally:
        await connection.aclose()


async def test_two_transports_of_this_release_speak_its_newest_protocol(
    stack: AsyncExitStack,
) -> None:
    from orleanspy.versions import PROTOCOL

    b, _ = await start(stack, gateway=True)
    connection = _connection(b.gateway_port or 0)
    await connection.connect()
    try:
        assert connection.protocol == PROTOCOL
    finally:
        await connection.aclose()
