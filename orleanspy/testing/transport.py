"""``check_transport``: the conformance suite for ``Transport`` implementations.

A transport starts with the sink it delivers to, so the kit's factory takes
that sink: ``factory(sink)`` returns an async context manager yielding a
started silo transport that delivers to ``sink`` and reaches every other
transport made by the same factory; leaving the context stops it (as a silo
that stopped). Otherwise the shape is every kit's in ``orleanspy.testing``:
``await check_transport(factory)`` runs ``TRANSPORT_CHECKS``, each check takes
the factory, and a failure raises ``AssertionError`` naming the check.

What the checks hold every transport to:

- **ordering**: messages from one silo to another arrive in the order sent;
- **undeliverable**: a message for a silo that has stopped comes back through
  ``MessageSink.undeliverable``, or, if it was already written on the link that
  broke, the sink hears ``connection_lost`` for that silo; never silently lost;
- **disconnect**: after ``disconnect(target)`` each message sent before it was
  either delivered or handed back (exactly one of the two), and later sends
  reach ``target`` again;
- **gossip timing**: a ping carrying a table version has reached the target's
  gossip listener by the time ``ping`` returns ``True``; a plain ping and a
  cleared listener hear nothing; a ping to a stopped silo returns ``False``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.messaging.message import Message, MessageKind, next_message_id
from orleanspy.messaging.transport import MessageSink, Transport
from orleanspy.testing._kit import run_checks
from orleanspy.testing.cluster import wait_for

__all__ = ["TRANSPORT_CHECKS", "Check", "RecordingSink", "TransportFactory", "check_transport"]

TransportFactory = Callable[[MessageSink], AbstractAsyncContextManager[Transport]]
"""``factory(sink)``: a started transport delivering to ``sink``."""

Check = Callable[[TransportFactory], Awaitable[None]]

_DEADLINE = 10.0
_PING_TIMEOUT = 2.0


class RecordingSink:
    """A ``MessageSink`` that records what it is given and can be awaited."""

    def __init__(self) -> None:
        self.received: list[Message] = []
        self.failed: list[tuple[Message, Exception]] = []
        self.lost: list[tuple[SiloAddress, Exception]] = []

    def receive(self, message: Message) -> None:
        self.received.append(message)

    def undeliverable(self, message: Message, error: Exception) -> None:
        self.failed.append((message, error))

    def connection_lost(self, target: SiloAddress, error: Exception) -> None:
        self.lost.append((target, error))


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after the deadline."""
    try:
        await wait_for(condition, _DEADLINE, interval=0.01, what=what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def _request(sender: Transport, target: SiloAddress, n: int) -> Message:
    return Message(
        id=next_message_id(),
        kind=MessageKind.ONE_WAY,
        target_grain=GrainId("KitGrain", "a"),
        method="m",
        body=n.to_bytes(4, "big"),
        sender_silo=sender.address,
        target_silo=target,
    )


def _numbers(messages: list[Message]) -> list[int]:
    return [int.from_bytes(m.body, "big") for m in messages]


async def check_messages_arrive_in_the_order_sent(factory: TransportFactory) -> None:
    a_sink, b_sink = RecordingSink(), RecordingSink()
    async with factory(a_sink) as a, factory(b_sink) as b:
        count = 500
        for n in range(count):
            a.send(b.address, _request(a, b.address, n))
            if n % 50 == 0:
                await asyncio.sleep(0)  # interleave sends with delivery
        await _until(lambda: len(b_sink.received) >= count, "every message delivered")
        if _numbers(b_sink.received) != list(range(count)):
            raise AssertionError(f"out of order: {_numbers(b_sink.received)[:20]}...")
        if a_sink.failed:
            raise AssertionError(f"handed back while the target was up: {a_sink.failed[:3]}")


async def check_a_message_for_a_stopped_silo_is_undeliverable(factory: TransportFactory) -> None:
    a_sink, b_sink = RecordingSink(), RecordingSink()
    async with factory(a_sink) as a:
        async with factory(b_sink) as b:
            gone = b.address
            a.send(gone, _request(a, gone, 0))  # a connection to b exists when b stops
            await _until(lambda: len(b_sink.received) == 1, "the first message delivered")
        message = _request(a, gone, 1)
        lost_before = len(a_sink.lost)
        a.send(gone, message)
        # Either the message is handed back, or it was written on the dying link
        # before the break was noticed: then it is in doubt, and the transport
        # says so with ``connection_lost`` for that silo (the dispatcher fails
        # the calls it tracks). Silence is the one wrong answer.
        await _until(
            lambda: (
                any(m.id == message.id for m, _ in a_sink.failed)
                or any(t == gone for t, _ in a_sink.lost[lost_before:])
            ),
            "the message for the stopped silo handed back, or its link reported lost",
        )
        errors = [e for m, e in a_sink.failed if m.id == message.id]
        errors += [e for t, e in a_sink.lost[lost_before:] if t == gone]
        if not all(isinstance(e, Exception) for e in errors):
            raise AssertionError(f"undeliverable without an error: {errors!r}")


async def check_disconnect_loses_nothing_and_reconnects(factory: TransportFactory) -> None:
    a_sink, b_sink = RecordingSink(), RecordingSink()
    async with factory(a_sink) as a, factory(b_sink) as b:
        before = [_request(a, b.address, n) for n in range(200)]
        for message in before:
            a.send(b.address, message)
        a.disconnect(b.address)
        ids = {m.id for m in before}

        def accounted() -> set[int]:
            got = {m.id for m in b_sink.received if m.id in ids}
            back = {m.id for m, _ in a_sink.failed if m.id in ids}
            both = got & back
            if both:
                raise AssertionError(f"{len(both)} messages both delivered and handed back")
            return got | back

        await _until(lambda: accounted() == ids, "every message delivered or handed back")
        after = _request(a, b.address, 10_000)
        a.send(b.address, after)
        await _until(
            lambda: any(m.id == after.id for m in b_sink.received),
            "a message sent after disconnect reaches the silo again",
        )


async def check_gossip_reaches_the_listener_before_the_ping_returns(
    factory: TransportFactory,
) -> None:
    async with factory(RecordingSink()) as a:
        async with factory(RecordingSink()) as b:
            heard: list[int] = []
            b.on_gossip(heard.append)
            if not await a.ping(b.address, _PING_TIMEOUT):
                raise AssertionError("a ping to a live silo returned False")
            if heard:
                raise AssertionError(f"a plain ping was heard as gossip: {heard}")
            if not await a.ping(b.address, _PING_TIMEOUT, table_version=2**40):
                raise AssertionError("a gossip ping to a live silo returned False")
            if heard != [2**40]:
                raise AssertionError(f"when the ping returned, the listener had heard {heard}")
            b.on_gossip(None)
            await a.ping(b.address, _PING_TIMEOUT, table_version=9)
            if heard != [2**40]:
                raise AssertionError(f"a cleared listener still heard gossip: {heard}")
            gone = b.address
        if await a.ping(gone, _PING_TIMEOUT):
            raise AssertionError("a ping to a stopped silo returned True")


TRANSPORT_CHECKS: tuple[Check, ...] = (
    check_messages_arrive_in_the_order_sent,
    check_a_message_for_a_stopped_silo_is_undeliverable,
    check_disconnect_loses_nothing_and_reconnects,
    check_gossip_reaches_the_listener_before_the_ping_returns,
)
"""Every check, each taking the factory."""


async def check_transport(factory: TransportFactory) -> None:
    """Run every check in ``TRANSPORT_CHECKS``; raises ``AssertionError`` naming the
    first that fails."""
    await run_checks(TRANSPORT_CHECKS, factory)
