"""The in-process transport: delivery, ordering, crashes, gateway clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from orleanspy.errors import ClosedError, SiloUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.memory import (
    InMemoryGatewayConnection,
    InMemoryNetwork,
    InMemoryTransport,
)
from orleanspy.messaging.message import Message, MessageKind, ResponseStatus, next_message_id
from orleanspy.messaging.transport import Transport


class Sink:
    def __init__(self) -> None:
        self.received: list[Message] = []
        self.failed: list[tuple[Message, Exception]] = []


class ReentrancyCheckingSink(Sink):
    """Fails the test if a callback arrives while ``send`` is still running."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = False

    def receive(self, message: Message) -> None:
        assert not self.sending
        self.received.append(message)

    def undeliverable(self, message: Message, error: Exception) -> None:
        assert not self.sending
        self.failed.append((message, error))


async def settle() -> None:
    """Run the callbacks scheduled with call_soon (deliveries are one hop)."""
    for _ in range(3):
        await asyncio.sleep(0)


def request(target: SiloAddress | None = None) -> Message:
    return Message(
        id=next_message_id(),
        kind=MessageKind.REQUEST,
        target_grain=GrainId("Counter", "a"),
        method="add",
        body=b"x",
        target_silo=target,
    )


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def start(
    stack: AsyncExitStack, network: InMemoryNetwork, port: int, *, gateway: bool = False
) -> tuple[InMemoryTransport, ReentrancyCheckingSink]:
    transport = InMemoryTransport(network, port=port, gateway=gateway)
    sink = ReentrancyCheckingSink()
    await transport.start(stack, sink)
    return transport, sink


async def test_implements_the_transport_protocol() -> None:
    assert isinstance(InMemoryTransport(InMemoryNetwork(), port=1), Transport)


async def test_delivers_the_same_object_in_order_never_reentrantly(stack: AsyncExitStack) -> None:
    network = InMemoryNetwork()
    a, a_sink = await start(stack, network, 1)
    b, b_sink = await start(stack, network, 2)
    messages = [request(b.address) for _ in range(50)]

    a_sink.sending = b_sink.sending = True
    for message in messages:
        a.send(b.address, message)
    a_sink.sending = b_sink.sending = False
    assert b_sink.received == []
    await settle()

    assert len(b_sink.received) == 50
    assert all(got is sent for got, sent in zip(b_sink.received, messages, strict=True))


async def test_unknown_or_killed_target_is_undeliverable(stack: AsyncExitStack) -> None:
    network = InMemoryNetwork()
    a, a_sink = await start(stack, network, 1)
    b, b_sink = await start(stack, network, 2)
    assert await a.ping(b.address, 1.0)

    assert network.kill(b.address)
    a_sink.sending = True
    a.send(b.address, first := request())
    a.send(SiloAddress("memory", 2, b.address.generation + 1), second := request())
    a_sink.sending = False
    await settle()

    assert [m for m, _ in a_sink.failed] == [first, second]
    assert all(isinstance(e, SiloUnavailableError) for _, e in a_sink.failed)
    assert not await a.ping(b.address, 1.0)
    assert b_sink.received == []
    assert not network.kill(b.address)


async def test_killed_silo_neither_sends_nor_receives(stack: AsyncExitStack) -> None:
    network = InMemoryNetwork()
    a, a_sink = await start(stack, network, 1)
    b, b_sink = await start(stack, network, 2)
    a.send(b.address, request())  # scheduled before the crash, never delivered
    network.kill(a.address)
    a.send(b.address, request())
    await settle()

    assert b_sink.received == []
    assert a_sink.failed == []
    assert not await a.ping(b.address, 1.0)


async def test_stopped_silo_leaves_the_network() -> None:
    network = InMemoryNetwork()
    async with AsyncExitStack() as stack:
        b, _ = await start(stack, network, 2)
        assert network.alive(b.address)
    assert not network.alive(b.address)


async def test_gateway_client_round_trip_and_crash(stack: AsyncExitStack) -> None:
    network = InMemoryNetwork()
    gw, gw_sink = await start(stack, network, 3, gateway=True)
    assert gw.gateway_port == 3
    arrived: list[Message] = []
    closed: list[Exception | None] = []
    connection = InMemoryGatewayConnection(
        network,
        gw.address.endpoint,
        client_id="client-1",
        on_message=arrived.append,
        on_closed=closed.append,
    )
    await connection.connect()
    forged = request()
    forged.sender_client = "someone-else"

    connection.send(forged)
    await settle()

    seen = gw_sink.received[0]
    assert (seen.sender_client, seen.sender_silo) == ("client-1", gw.address)
    assert forged.sender_client == "someone-else"  # the client's object is untouched
    gw.send_to_client("client-1", seen.response(ResponseStatus.OK, b"done"))
    gw.send_to_client("nobody", seen.response(ResponseStatus.OK, b"lost"))
    await settle()
    assert [m.body for m in arrived] == [b"done"]

    network.kill(gw.address)
    assert connection.closed
    assert len(closed) == 1 and isinstance(closed[0], SiloUnavailableError)
    with pytest.raises(ClosedError):
        connection.send(request())


async def test_gateway_connection_needs_a_live_gateway(stack: AsyncExitStack) -> None:
    network = InMemoryNetwork()
    silo, _ = await start(stack, network, 4, gateway=False)
    connection = InMemoryGatewayConnection(
        network,
        silo.address.endpoint,
        client_id="c",
        on_message=lambda m: None,
        on_closed=lambda e: None,
    )
    with pytest.raises(SiloUnavailableError):
        await connection.connect()


async def test_a_ping_carrying_a_table_version_reaches_the_gossip_listener(
    stack: AsyncExitStack,
) -> None:
    network = InMemoryNetwork()
    a, _ = await start(stack, network, 1)
    b, _ = await start(stack, network, 2)
    heard: list[int] = []
    b.on_gossip(heard.append)

    assert await a.ping(b.address, 1.0)  # a plain probe is no gossip
    assert heard == []
    assert await a.ping(b.address, 1.0, table_version=7)
    assert heard == [7]  # heard before the ping returned, as over gRPC
