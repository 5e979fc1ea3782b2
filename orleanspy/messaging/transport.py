"""The transport contract: how messages move between silos, and to and from clients.

A transport delivers ``Message`` objects (``message.py``) to the ``MessageSink``
it was started with. It never interprets bodies. Sending is non-blocking:
``send`` enqueues and returns; a message that cannot be delivered (peer
unreachable, connection lost with the message unsent, refused) is handed back
through ``MessageSink.undeliverable`` so the dispatcher can fail or re-route it.

The parts, and where each lives:

- ``Transport``: silo to silo, plus the gateway side of client connections
  (``grpc.GrpcTransport``; ``memory.InMemoryTransport`` in one process).
- ``GatewayConnection``: a client's connection to one gateway, which
  ``ClusterClient`` is typed against (``grpc.GrpcGatewayConnection``;
  ``memory.InMemoryGatewayConnection``); ``GatewayConnector`` makes one.
- Optional extras a transport or sink may offer, each a protocol of its own,
  checked with ``isinstance`` (they are ``runtime_checkable``):
  ``AnswersOnly`` (``answer_only``), ``ConnectionLossListener``
  (``connection_lost``, on the sink), ``WireCounters`` (``stats``),
  ``PeerCounters`` (``peer_stats``) and ``QueueDepths`` (``queue_depths``).

The wire form (``Message`` <-> protobuf frames, the batching outbox) lives in
``frames.py``; ``grpc.py`` owns the connections and is the only ``grpc``
importer; the protobuf definitions are under ``messaging/protos/``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from orleanspy.identity import SiloAddress
from orleanspy.messaging.message import Message

if TYPE_CHECKING:
    from orleanspy.messaging.frames import WireStats
    from orleanspy.options import MessagingOptions

__all__ = [
    "AnswersOnly",
    "ConnectionLossListener",
    "GatewayConnection",
    "GatewayConnector",
    "MessageSink",
    "PeerCounters",
    "ProbeOutcome",
    "QueueDepths",
    "Transport",
    "WireCounters",
]


class ProbeOutcome(enum.Enum):
    """What one probe of a peer silo found (a transport's optional ``probe``).

    ``ANSWERED``: that very incarnation answered. ``REFUSED``: the peer's host
    refused the connection (nothing listens on the port: the process is gone
    from a live host). ``GONE``: another incarnation answered on its address.
    ``UNAUTHORIZED``: the peer refused this silo's credentials. ``SILENT``: no
    answer within the timeout, or any other failure. ``REFUSED`` and ``GONE``
    are strong evidence of death and prove this silo's network works;
    ``SILENT`` proves nothing either way.
    """

    ANSWERED = "answered"
    REFUSED = "refused"
    GONE = "gone"
    UNAUTHORIZED = "unauthorized"
    SILENT = "silent"


class MessageSink(Protocol):
    """What a transport delivers to: the silo's dispatcher."""

    def receive(self, message: Message) -> None:
        """A message arrived (from a silo, or from a gateway client)."""
        ...

    def undeliverable(self, message: Message, error: Exception) -> None:
        """``message`` could not be delivered; ``error`` says why."""
        ...


@runtime_checkable
class Transport(Protocol):
    """Silo-to-silo messaging plus the gateway side of client connections."""

    @property
    def address(self) -> SiloAddress:
        """This silo's address (known once ``start`` returned; port 0 is resolved)."""
        ...

    @property
    def gateway_port(self) -> int | None:
        """The port clients connect to, or ``None`` when there is no gateway."""
        ...

    async def start(self, stack: AsyncExitStack, sink: MessageSink) -> None:
        """Listen and get ready to send; push shutdown onto ``stack``."""
        ...

    def send(self, target: SiloAddress, message: Message) -> None:
        """Queue ``message`` for the silo ``target`` (connecting if needed)."""
        ...

    def send_to_client(self, client_id: str, message: Message) -> None:
        """Queue ``message`` for a gateway client connected to this silo."""
        ...

    async def ping(self, target: SiloAddress, timeout: float, table_version: int = 0) -> bool:
        """Probe ``target``: ``True`` if it answered within ``timeout`` seconds.

        A non-zero ``table_version`` is gossip: the newest membership table
        version this silo has written, handed to ``target``'s gossip listener.
        """
        ...

    def on_gossip(self, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(table_version)`` for every ping that carries a version
        (``None`` stops it). It runs on the event loop and must not block."""
        ...

    def disconnect(self, target: SiloAddress) -> None:
        """Drop connections to ``target`` (declared dead); queued messages are
        handed back as undeliverable."""
        ...


# -- client side ---------------------------------------------------------------------


@runtime_checkable
class GatewayConnection(Protocol):
    """A client's connection to one gateway.

    ``connect`` opens it once (``AuthenticationError`` if the gateway refuses the
    client's credentials, ``SiloUnavailableError`` if it cannot be reached, and
    ``ClosedError`` when called again). ``send`` queues a message (``ClosedError``
    once closed, ``MessageRejectedError`` for one that cannot travel). Every
    message arriving goes to the ``on_message`` it was made with; when the
    connection ends, ``on_closed`` is called once, with the error or ``None``
    for a local ``aclose``. A closed connection does not reopen.
    """

    @property
    def closed(self) -> bool:
        """Whether the connection has ended (locally or not)."""
        ...

    @property
    def gateway(self) -> SiloAddress | None:
        """The silo behind the gateway, once connected (``None`` if unknown)."""
        ...

    async def connect(self) -> None:
        """Open the connection and wait for the gateway to accept it."""
        ...

    def send(self, message: Message) -> None:
        """Queue ``message`` for the gateway."""
        ...

    def take_unsent(self) -> list[Message]:
        """Once closed: the messages queued but never written, handed over once
        (the client sends them another way; whatever may have been written is
        the client's to fail, never to send twice)."""
        ...

    async def aclose(self) -> None:
        """Close; ``on_closed(None)`` if it was still open."""
        ...


class GatewayConnector(Protocol):
    """Makes an unopened ``GatewayConnection`` to ``endpoint`` (``host:port`` for
    gRPC, ``address.endpoint`` in memory); ``ClusterClient(connector=...)``."""

    def __call__(
        self,
        endpoint: str,
        *,
        client_id: str,
        options: MessagingOptions,
        on_message: Callable[[Message], None],
        on_closed: Callable[[Exception | None], None],
    ) -> GatewayConnection: ...


# -- optional extras -----------------------------------------------------------------


@runtime_checkable
class AnswersOnly(Protocol):
    """A transport that opens links for responses only to silos a predicate
    accepts (the silo hands it the membership's members): the address a
    response goes to is named by the request, and a request may lie."""

    def answer_only(self, predicate: Callable[[SiloAddress], bool] | None) -> None: ...


@runtime_checkable
class ConnectionLossListener(Protocol):
    """A sink that wants to hear when a link to a peer silo broke (the
    dispatcher fails the calls waiting on it at once, not at their timeout).
    The transport calls it on the event loop and logs anything it raises."""

    def connection_lost(self, silo: SiloAddress, error: Exception) -> None: ...


@runtime_checkable
class WireCounters(Protocol):
    """A transport (or connection) that counts frames and messages (``stats``)."""

    @property
    def stats(self) -> WireStats: ...


@runtime_checkable
class PeerCounters(Protocol):
    """A transport that counts frames and messages per peer silo."""

    @property
    def peer_stats(self) -> Mapping[SiloAddress, WireStats]: ...


@runtime_checkable
class QueueDepths(Protocol):
    """A transport that reports the messages waiting to be written, per peer
    silo and for all gateway clients together (``"clients"``)."""

    def queue_depths(self) -> dict[str, int]: ...
