"""``RedisStreamProvider``: streams as Redis Streams, shared by every silo of a service.

Layout: one stream key per name,
``orleanspy:<service_id>:stream:{<service_id>:stream:<name>}`` (the hash tag keeps
a stream on one Redis Cluster slot), entries ``{"d": <msgpack item>}`` appended
with ``XADD … MAXLEN ~ max_len``, so the kept history is at least ``max_len``
items and trimmed in whole nodes. Ids are Redis entry ids (``"<ms>-<seq>"``).
Each publish also leaves ``<stream key>:published:<token>`` (its entry's id,
same slot) for two minutes, so that a publish sent again after its reply was
lost (a failover) appends once (``_PUBLISH_ONCE``).

Subscriptions read with ``XREAD BLOCK`` on a connection borrowed from the
client's pool for the duration of each read (each open subscription holds one
pooled connection most of the time; size the pool for them). When Redis is
unreachable a subscription logs once, retries with exponential backoff, and
resumes after the last id it delivered. A Redis that lost its data (restart
without persistence) hands out new ids from its clock, which are later than
the old ones, so subscribers pick up new items after the restart.

The client must return bytes (``decode_responses=False``), as
``orleanspy._redis.connect`` makes it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import deque
from contextlib import AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from orleanspy._redis import (
    Client,
    Redis,
    connect,
    key_prefix,
    resolve,
    retry_failover,
    translate_errors,
)
from orleanspy._redis_schema import adopt, migrate
from orleanspy._retry import Backoff
from orleanspy.errors import ConfigurationError, StorageError
from orleanspy.schema import SchemaVersion
from orleanspy.serialization import pack
from orleanspy.streams.provider import (
    ProviderLifecycle,
    StreamItem,
    decode_item,
)

__all__ = ["RedisStreamProvider"]

_log = logging.getLogger(__name__)

_FIELD = b"d"
# KEYS: the stream, this publish's token key. ARGV: the item, max length, how
# long the token is kept (ms). The new entry's id; or, when the token says this
# very publish ran already (its reply was lost, and redis-py or the failover
# retry sent it again), the id of that entry, appending nothing.
_PUBLISH_ONCE = """
local done = redis.call('GET', KEYS[2])
if done then return done end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'd', ARGV[1])
redis.call('SET', KEYS[2], id, 'PX', ARGV[3])
return id
"""
#: How long a publish's token is kept: longer than any retry of it goes on (a
#: retry stops at its call's deadline, the response timeout).
PUBLISH_TOKEN_TTL_MS = 120_000
_BATCH = 100
# Below connect()'s 10 s socket timeout, so an idle blocking read is never
# mistaken for a dead connection.
_BLOCK_MS = 1_000
_BACKOFF_FIRST = timedelta(milliseconds=50)
_BACKOFF_MAX = timedelta(seconds=2)
_ID = re.compile(r"\d+(-\d+)?")


def _check_id(value: str) -> str:
    if not _ID.fullmatch(value):
        raise ValueError(f"not a Redis stream id: {value!r}")
    return value


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _range_entries(entries: Any) -> list[tuple[str, bytes | None]]:
    """``(id, packed item)`` pairs from XRANGE-shaped entries."""
    return [(_text(entry_id), fields.get(_FIELD)) for entry_id, fields in entries or ()]


def _xread_entries(reply: Any) -> list[tuple[str, bytes | None]]:
    """The entries of a one-stream XREAD reply, whichever shape the client parsed it to."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {key: entries} or {key: [entries]}
        (entries,) = reply.values()
        if len(entries) == 1 and isinstance(entries[0], list):
            entries = entries[0]
    else:  # RESP2: [[key, entries]]
        entries = reply[0][1]
    return _range_entries(entries)


class _RedisSubscription:
    """Follows one stream with XREAD BLOCK from a position; survives outages."""

    def __init__(self, provider: RedisStreamProvider, stream: str, position: str | None) -> None:
        self._provider = provider
        self._stream = stream
        self._key = provider.key(stream)
        self._position = position
        self._buffer: deque[StreamItem] = deque()
        self._closed = False
        self._inflight: asyncio.Task[None] | None = None
        self._backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX)
        self._failing = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> StreamItem:
        while not self._buffer:
            if self._closed or not await self._interruptibly(read=True):
                raise StopAsyncIteration
        return self._buffer.popleft()

    async def __aenter__(self) -> Self:
        while self._position is None and not self._closed:
            await self._interruptibly(read=False)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._provider.forget(self)
        task = self._inflight
        if task is not None and not task.done():
            task.cancel()
            # Waiting lets the read give its connection back before the
            # provider closes a client it owns.
            await asyncio.wait({task})

    async def _interruptibly(self, *, read: bool) -> bool:
        """One round in a task of its own, so ``aclose`` from another task can
        cancel a blocking read. False when the subscription was closed meanwhile."""
        task = asyncio.ensure_future(self._round(read=read))
        self._inflight = task
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closed and task.cancelled() and (current is None or not current.cancelling()):
                return False
            raise
        finally:
            self._inflight = None
        return not self._closed

    async def _round(self, *, read: bool) -> None:
        client = self._provider.client
        reply: Any = None
        try:
            with translate_errors(f"subscription to stream {self._stream}"):
                if self._position is None:
                    last = await client.xrevrange(self._key, "+", "-", count=1)
                    entries = _range_entries(last)
                    self._position = entries[0][0] if entries else "0-0"
                if read:
                    reply = await client.xread(
                        {self._key: self._position}, count=_BATCH, block=_BLOCK_MS
                    )
        except StorageError as exc:
            if not self._failing:
                _log.warning(
                    "stream subscription interrupted stream=%s after=%s error=%s; retrying",
                    self._stream,
                    self._position,
                    exc,
                )
                self._failing = True
            await asyncio.sleep(self._backoff.next())
            return
        if self._failing:
            _log.info(
                "stream subscription resumed stream=%s after=%s", self._stream, self._position
            )
            self._failing = False
            self._backoff.reset()
        for entry_id, data in _xread_entries(reply):
            self._position = entry_id
            decoded = None if data is None else decode_item(self._stream, entry_id, data)
            if decoded is not None:
                self._buffer.append(decoded)


#: The schema steps of this layout (``orleanspy._redis_schema``).
SCHEMA_STEPS = (adopt(),)


class RedisStreamProvider(ProviderLifecycle):
    """Streams in Redis, for a cluster. Implements ``StreamProvider``.

    ``url_or_client`` is a Redis URL (the provider creates a client at ``start``
    and closes it when the stack unwinds) or a client (used as is, never
    closed). ``max_len`` bounds each stream's history approximately (never
    below it). A subscription's "now" is fixed when it is entered with
    ``async with`` or first iterated.
    """

    schema = SchemaVersion("redis", "streams", len(SCHEMA_STEPS))

    def __init__(
        self, url_or_client: str | Redis, *, service_id: str, max_len: int = 100_000
    ) -> None:
        if not service_id:
            raise ConfigurationError("service_id must not be empty")
        if max_len < 1:
            raise ConfigurationError(f"max_len must be at least 1, got {max_len}")
        super().__init__()
        self._source = url_or_client
        self._client: Client | None = None
        self._service_id = service_id
        self._max_len = max_len
        self._publish_once: Any = None

    @property
    def client(self) -> Client:
        """The client in use; only valid after ``start``."""
        if self._client is None:
            raise RuntimeError("the stream provider has not been started")
        return self._client

    def key(self, stream: str) -> str:
        """The Redis key of ``stream``."""
        sid = self._service_id
        return f"{key_prefix(sid)}stream:{{{sid}:stream:{stream}}}"

    async def start(self, stack: AsyncExitStack) -> None:
        self._check_startable()
        if isinstance(self._source, str):
            source: Redis = connect(self._source)
            stack.push_async_callback(source.aclose)
        else:
            source = self._source
        with translate_errors("stream provider start"):
            self._client = await resolve(source)
        self.migration = await migrate(self._client, "streams", SCHEMA_STEPS)
        self._publish_once = self._client.register_script(_PUBLISH_ONCE)
        self._started(stack)

    async def publish(self, stream: str, item: Any) -> str:
        """Append ``item`` (one script: the entry and a token key of this publish
        beside the stream, kept ``PUBLISH_TOKEN_TTL_MS``). Retried through a
        failover within the deadline of the call it serves
        (``retry_failover``); a publish sent again after its reply was lost
        finds its token and returns its entry's id instead of appending twice."""
        self._state.check_usable("publish")
        data = pack(item)
        key = self.key(stream)
        keys = [key, f"{key}:published:{secrets.token_hex(8)}"]
        args = [data, self._max_len, PUBLISH_TOKEN_TTL_MS]
        entry_id = await retry_failover(
            self.client,
            f"publish to stream {stream}",
            lambda _attempt: self._publish_once(keys=keys, args=args),
        )
        return _text(entry_id)

    def subscribe(self, stream: str, *, from_id: str | None = None) -> _RedisSubscription:
        self._state.check_usable("subscribe")
        sub = _RedisSubscription(self, stream, None if from_id is None else _check_id(from_id))
        self._subscriptions.add(sub)
        return sub

    async def read(self, stream: str, *, after: str = "0", limit: int = 100) -> list[StreamItem]:
        self._state.check_usable("read")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        key = self.key(stream)
        position: dict[Any, Any] = {key: _check_id(after)}
        client = self.client
        reply = await retry_failover(
            client, f"read of stream {stream}", lambda _n: client.xread(position, count=limit)
        )
        items = (
            None if data is None else decode_item(stream, entry_id, data)
            for entry_id, data in _xread_entries(reply)
        )
        return [i for i in items if i is not None]
