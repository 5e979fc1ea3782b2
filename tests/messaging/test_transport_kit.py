"""``check_transport`` on both transports: in-memory and gRPC (real sockets)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

import pytest

from orleanspy.identity import SiloAddress
from orleanspy.messaging.grpc import GrpcTransport
from orleanspy.messaging.memory import InMemoryNetwork, InMemoryTransport
from orleanspy.messaging.message import Message
from orleanspy.messaging.transport import MessageSink, Transport
from orleanspy.options import MessagingOptions
from orleanspy.testing.transport import (
    TRANSPORT_CHECKS,
    Check,
    TransportFactory,
    check_transport,
)


def memory_factory() -> TransportFactory:
    network = InMemoryNetwork()
    ports = itertools.count(1)

    @asynccontextmanager
    async def factory(sink: MessageSink) -> AsyncIterator[Transport]:
        transport = InMemoryTransport(network, port=next(ports))
        async with AsyncExitStack() as stack:
            await transport.start(stack, sink)
            yield transport

    return factory


def grpc_factory() -> TransportFactory:
    @asynccontextmanager
    async def factory(sink: MessageSink) -> AsyncIterator[Transport]:
        transport = GrpcTransport(
            host="127.0.0.1", port=0, gateway_port=None, options=MessagingOptions()
        )
        async with AsyncExitStack() as stack:
            await transport.start(stack, sink)
            yield transport

    return factory


FACTORIES: dict[str, Callable[[], TransportFactory]] = {
    "memory": memory_factory,
    "grpc": grpc_factory,
}


@pytest.mark.parametrize("kind", list(FACTORIES))
@pytest.mark.parametrize("check", TRANSPORT_CHECKS, ids=lambda c: c.__name__)
async def test_contract(kind: str, check: Check) -> None:
    await check(FACTORIES[kind]())


async def test_check_transport_runs_the_whole_suite() -> None:
    await check_transport(memory_factory())


async def test_check_transport_catches_a_transport_that_reorders() -> None:
    class Reordering(InMemoryTransport):
        """Sends every other message one loop iteration late."""

        def send(self, target: SiloAddress, message: Message) -> None:
            if message.id % 2:
                asyncio.get_running_loop().call_soon(super().send, target, message)
            else:
                super().send(target, message)

    network = InMemoryNetwork()
    ports = itertools.count(1)

    def factory(sink: MessageSink) -> AbstractAsyncContextManager[Transport]:
        @asynccontextmanager
        async def run() -> AsyncIterator[Transport]:
            transport = Reordering(network, port=next(ports))
            async with AsyncExitStack() as stack:
                await transport.start(stack, sink)
                yield transport

        return run()

    with pytest.raises(AssertionError, match="check_messages_arrive_in_the_order_sent"):
        await check_transport(factory)
