"""The transport contract: how messages move between silos (and to clients).

A transport delivers ``Message`` objects to the ``MessageSink`` it was started
with. It never interprets bodies. Sending is non-blocking: ``send`` enqueues
and returns; a message that cannot be delivered (peer unreachable, connection
lost with the message unsent, refused) is handed back through
``MessageSink.undeliverable`` so the dispatcher can fail or re-route it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Protocol, runtime_checkable

from orleanspy.identity import SiloAddress
from orleanspy.messaging.message import Message

__all__ = ["MessageSink", "ProbeOutcome", "Transport"]


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
