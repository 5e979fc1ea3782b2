"""The stream provider contract. Every backend implements ``StreamProvider``.

A stream is a named, append-only sequence of items. Each item gets an id from
the provider when it is published; ids are opaque strings, ordered within one
stream by the provider, and ``"0"`` means "before the first item". Items are
encoded with ``orleanspy.serialization.pack`` on publish and decoded for every
reader, so a subscriber never shares an object with the publisher and only
what can travel is accepted.

History is bounded (``max_len`` per stream): a reader that falls further behind
than that misses the trimmed items. Delivery to a subscriber is in id order,
without duplicates, from the subscriber's position onwards.

Failures: ``SerializationError`` for an item that cannot travel,
``StorageUnavailableError`` when the backend cannot be reached. A subscription
never raises for an unreachable backend; it waits and resumes where it was.
An item that cannot be decoded on the reading side (a dataclass registered
with ``register_type`` by the publisher but not here) is logged and skipped,
so one bad item does not stop every reader of the stream.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from orleanspy.errors import ClosedError, SerializationError
from orleanspy.serialization import unpack

__all__ = [
    "MISSED_REMINDERS_STREAM",
    "ProviderState",
    "StreamItem",
    "StreamProvider",
    "Subscription",
    "decode_item",
]

_log = logging.getLogger(__name__)

MISSED_REMINDERS_STREAM = "orleanspy.reminders.missed"
"""Where the reminder service publishes ``MissedReminder`` events (action NOTIFY)."""


@dataclass(frozen=True, slots=True)
class StreamItem:
    """One item read from ``stream``: its provider-assigned ``id`` and the decoded value."""

    id: str
    stream: str
    item: Any


@runtime_checkable
class Subscription(Protocol):
    """An ``AsyncIterator[StreamItem]`` that is also closable and an async context manager.

    Iteration yields the items after the subscription's position, waiting for
    new ones, and stops (``StopAsyncIteration``) once ``aclose()`` has been
    called, also when ``aclose()`` comes from another task while an iteration
    waits. It never raises because the backend is unreachable: it logs, backs
    off and resumes after the last item it delivered.
    """

    def __aiter__(self) -> AsyncIterator[StreamItem]: ...

    async def __anext__(self) -> StreamItem: ...

    async def aclose(self) -> None:
        """End the subscription and release its connection. Idempotent."""
        ...

    async def __aenter__(self) -> Self:
        """Fix the subscription's position (see ``StreamProvider.subscribe``); returns self."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """``aclose()``."""
        ...


@runtime_checkable
class StreamProvider(Protocol):
    """Named streams of msgpack-encoded items with bounded history."""

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and prepare; push cleanup onto ``stack``. Called once before use.

        Unwinding the stack ends every open subscription and closes what the
        provider created (never a client it was given). A provider does not
        start twice and is not used after its stack unwound (``ClosedError``).
        """
        ...

    async def publish(self, stream: str, item: Any) -> str:
        """Append ``item`` to ``stream`` and return its id.

        The id is greater than every id the stream handed out before. Raises
        ``SerializationError`` (nothing is appended) if ``item`` cannot be
        packed, ``StorageUnavailableError`` if the backend cannot be reached;
        in that case the item may or may not have been appended.
        """
        ...

    def subscribe(self, stream: str, *, from_id: str | None = None) -> Subscription:
        """Follow ``stream``: every subscription sees every item after its position.

        With ``from_id=None`` the position is "now": items published after the
        subscription was created (memory) or entered with ``async with`` / first
        iterated (backends that must ask the server) are delivered; enter it
        before publishing when the first item matters. With ``from_id`` the
        subscription first replays the kept history after that id (``"0"`` =
        from the oldest kept item), then follows. The returned object must be
        closed (``aclose()`` or ``async with``).
        """
        ...

    async def read(self, stream: str, *, after: str = "0", limit: int = 100) -> list[StreamItem]:
        """At most ``limit`` kept items with ids after ``after``, oldest first.

        Returns ``[]`` for an unknown stream or when nothing follows ``after``;
        page on with the last returned id. Raises ``ValueError`` for a malformed
        id or a ``limit`` below 1, ``StorageUnavailableError`` when the backend
        cannot be reached.
        """
        ...


class ProviderState(enum.Enum):
    """Lifecycle of a provider: created, started once, closed for good."""

    CREATED = "created"
    STARTED = "started"
    CLOSED = "closed"

    def check_usable(self, what: str) -> None:
        """Raise unless started: ``RuntimeError`` before ``start``, ``ClosedError`` after."""
        if self is ProviderState.CREATED:
            raise RuntimeError(f"{what}: the stream provider has not been started")
        if self is ProviderState.CLOSED:
            raise ClosedError(f"{what}: the stream provider is closed")


class ProviderLifecycle:
    """What both backends share: the state, the open subscriptions, and use as
    ``async with provider`` (started on a stack of its own).

    A backend calls ``_started(stack)`` from its ``start`` and registers every
    subscription it hands out in ``_subscriptions``.
    """

    def __init__(self) -> None:
        self._state = ProviderState.CREATED
        self._subscriptions: set[Subscription] = set()
        self._own_stack = AsyncExitStack()

    async def start(self, stack: AsyncExitStack) -> None:
        """Each backend starts itself and then calls ``_started``."""
        raise NotImplementedError

    def _check_startable(self) -> None:
        if self._state is not ProviderState.CREATED:
            raise RuntimeError(f"the stream provider cannot start: it is {self._state.value}")

    def _started(self, stack: AsyncExitStack) -> None:
        # Pushed last, so it runs first on unwind: subscriptions give their
        # connections back before an owned client is closed.
        stack.push_async_callback(self._close)
        self._state = ProviderState.STARTED

    async def _close(self) -> None:
        self._state = ProviderState.CLOSED
        for sub in list(self._subscriptions):
            await sub.aclose()

    def forget(self, sub: Subscription) -> None:
        """Called by a subscription that closed itself."""
        self._subscriptions.discard(sub)

    async def __aenter__(self) -> Self:
        await self.start(self._own_stack)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._own_stack.aclose()


def decode_item(stream: str, item_id: str, data: bytes) -> StreamItem | None:
    """The decoded item, or ``None`` (logged) when it cannot be decoded here."""
    try:
        return StreamItem(item_id, stream, unpack(data))
    except SerializationError as exc:
        _log.error(
            "stream item skipped: cannot decode stream=%s id=%s error=%s", stream, item_id, exc
        )
        return None
