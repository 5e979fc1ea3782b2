"""``InMemoryStreamProvider``: streams in this process, for the embedded silo and tests.

Items are kept packed, in a bounded history per stream, and decoded for each
reader, so the memory backend accepts and returns exactly what Redis would.
Ids are decimal sequence numbers per stream, starting at ``"1"``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

from orleanspy.errors import ConfigurationError
from orleanspy.serialization import pack
from orleanspy.streams.provider import (
    ProviderLifecycle,
    StreamItem,
    decode_item,
)

__all__ = ["InMemoryStreamProvider"]

_BATCH = 100


def _parse_id(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise ValueError(f"not a stream id of the memory provider: {value!r}")
    return int(value)


class _Stream:
    """One stream's kept items; their sequence numbers are consecutive."""

    __slots__ = ("entries", "last", "subscribers")

    def __init__(self, max_len: int) -> None:
        self.entries: deque[tuple[int, bytes]] = deque(maxlen=max_len)
        self.last = 0
        self.subscribers: set[_MemorySubscription] = set()

    def after(self, seq: int, limit: int) -> list[tuple[int, bytes]]:
        if not self.entries or self.entries[-1][0] <= seq:
            return []
        start = max(0, seq - self.entries[0][0] + 1)
        return list(itertools.islice(self.entries, start, start + limit))


class _MemorySubscription:
    """Reads its stream from a cursor; publishers wake it, ``aclose`` ends it."""

    def __init__(self, provider: InMemoryStreamProvider, name: str, stream: _Stream, position: int):
        self._provider = provider
        self._name = name
        self._stream = stream
        self._position = position
        self._buffer: deque[StreamItem] = deque()
        self._wake = asyncio.Event()
        self._closed = False
        stream.subscribers.add(self)

    def wake(self) -> None:
        self._wake.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamItem:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            entries = self._stream.after(self._position, _BATCH)
            if not entries:
                # Cleared only now, with no await since the look above, so a
                # publish after that look is sure to wake us.
                self._wake.clear()
                await self._wake.wait()
                continue
            self._position = entries[-1][0]
            for seq, data in entries:
                decoded = decode_item(self._name, str(seq), data)
                if decoded is not None:
                    self._buffer.append(decoded)

    async def aclose(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._stream.subscribers.discard(self)
        self._provider.forget(self)
        self._wake.set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class InMemoryStreamProvider(ProviderLifecycle):
    """Streams held in this process; history bounded to ``max_len`` items per stream.

    Implements ``orleanspy.streams.provider.StreamProvider``. It never raises
    ``StorageUnavailableError``. A subscription's "now" is fixed when
    ``subscribe`` is called.
    """

    def __init__(self, max_len: int = 10_000) -> None:
        if max_len < 1:
            raise ConfigurationError(f"max_len must be at least 1, got {max_len}")
        super().__init__()
        self._max_len = max_len
        self._streams: dict[str, _Stream] = {}

    async def start(self, stack: AsyncExitStack) -> None:
        self._check_startable()
        self._started(stack)

    def _stream(self, name: str) -> _Stream:
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = _Stream(self._max_len)
        return stream

    async def publish(self, stream: str, item: Any) -> str:
        self._state.check_usable("publish")
        data = pack(item)
        s = self._stream(stream)
        s.last += 1
        s.entries.append((s.last, data))
        for sub in s.subscribers:
            sub.wake()
        return str(s.last)

    def subscribe(self, stream: str, *, from_id: str | None = None) -> _MemorySubscription:
        self._state.check_usable("subscribe")
        s = self._stream(stream)
        position = s.last if from_id is None else _parse_id(from_id)
        sub = _MemorySubscription(self, stream, s, position)
        self._subscriptions.add(sub)
        return sub

    async def read(self, stream: str, *, after: str = "0", limit: int = 100) -> list[StreamItem]:
        self._state.check_usable("read")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        position = _parse_id(after)
        s = self._streams.get(stream)
        if s is None:
            return []
        items = (decode_item(stream, str(seq), data) for seq, data in s.after(position, limit))
        return [i for i in items if i is not None]
