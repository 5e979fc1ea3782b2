"""The change feed of ``RedisReminderTable``: sharded pub/sub, one channel per shard.

A change message is ``<writer: 8 hex><hash: 8 hex><msgpack [grain, name,
next_due_ms | nil]>`` or, from upserts, ``... [grain, name, next_due_ms,
priority]`` (``change_payload``; the table's Lua scripts build the same form).
The fixed-width head lets a reader drop its own writes and rows outside its
ranges before decoding anything.

``RedisChanges`` is one subscription: it subscribes to the channels its scope's
ranges map to (the table says which: ``channels_of``), re-subscribes when the
scope changes, reconnects with backoff when Redis goes away (logging, never
raising), and ends on ``aclose``. The PostgreSQL feed lives beside it in
``_pg_feed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, Final

from orleanspy._redis import Redis, translate_errors
from orleanspy._retry import Backoff
from orleanspy.clock import from_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange
from orleanspy.reminders.table import FeedScope
from orleanspy.ring import RingRange
from orleanspy.serialization import pack, unpack

__all__ = ["HEAD", "RedisChanges", "change_payload", "decode_change"]

_log = logging.getLogger(__name__)

# The change feed polls its socket this often so a close from another task is
# noticed; between polls it blocks in Redis, it does not busy-wait.
FEED_POLL_S: Final = 0.5
_BACKOFF_MIN: Final = timedelta(milliseconds=50)
_BACKOFF_MAX: Final = timedelta(seconds=2)

#: Bytes of a change message's head: writer id, then the row's hash, 8 hex digits each.
HEAD: Final = 16


def change_payload(
    writer: bytes,
    h: int,
    grain_id: GrainId,
    name: str,
    next_due_ms: int | None,
    *,
    priority: int | None = None,
) -> bytes:
    """A change message: the 16-byte head (writer, hash), then msgpack
    ``[grain, name, next_due_ms]`` and, from upserts, the priority."""
    fields: list[Any] = [grain_id.canonical, name, next_due_ms]
    if priority is not None:
        fields.append(priority)
    return b"%s%08x%s" % (writer, h, pack(fields))


def decode_change(data: bytes) -> ReminderChange:
    """A change message (head included) as a ``ReminderChange``."""
    fields = unpack(data[HEAD:])
    if not isinstance(fields, list) or len(fields) not in (3, 4):
        raise ValueError("a change is [grain, name, next_due_ms] or with a priority")
    canonical, name, due_ms = fields[:3]
    priority = fields[3] if len(fields) == 4 else None
    if priority is not None and (type(priority) is not int or not -128 <= priority <= 127):
        raise ValueError(f"bad priority in change: {priority!r}")
    return ReminderChange(
        GrainId.parse(canonical), name, None if due_ms is None else from_ms(due_ms), priority
    )


class RedisChanges:
    """One sharded pub/sub subscription to the change channels a scope wants,
    resubscribing as needed."""

    def __init__(
        self,
        client: Redis,
        scope: FeedScope,
        *,
        writer: bytes,
        channels_of: Callable[[Iterable[RingRange] | None], set[str]],
        registry: set[RedisChanges],
    ) -> None:
        self._client = client
        self._scope = scope
        self._skip = writer if scope.skip_own_writes else None
        self._channels_of = channels_of
        self._registry = registry
        self._pubsub: Any = None
        self._channels: set[str] = set()
        self._version = -1
        self._closed = asyncio.Event()
        self._scope_changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._busy = False
        self._backoff = Backoff(_BACKOFF_MIN, _BACKOFF_MAX)
        self._following: asyncio.Task[None] | None = None
        scope.add_listener(self._on_scope_change)

    def _on_scope_change(self) -> None:
        """Re-subscribe at once, beside a reader blocked on the socket (redis-py
        lets one task send subscriptions while another reads)."""
        self._scope_changed.set()
        if self._pubsub is not None and self._following is None and not self._closed.is_set():
            self._following = asyncio.get_running_loop().create_task(self._follow_now())

    async def _follow_now(self) -> None:
        try:
            await self._follow_scope()
        except Exception as exc:
            # E.g. the reader dropped the connection meanwhile: it reconnects and
            # follows the scope then.
            _log.debug("reminder change feed could not re-subscribe yet error=%s", exc)
        finally:
            self._following = None

    def __aiter__(self) -> RedisChanges:
        return self

    async def __anext__(self) -> ReminderChange:
        self._busy = True
        skip, scope = self._skip, self._scope
        try:
            while not self._closed.is_set():
                data = await self._receive()
                if data is None:
                    continue
                # The head is fixed-width ASCII: filter before decoding anything.
                if skip is not None and data[:8] == skip:
                    continue
                try:
                    if scope.ranges is not None and not scope.wants_hash(int(data[8:HEAD], 16)):
                        continue
                    return decode_change(data)
                except (SerializationError, ValueError, TypeError) as exc:
                    _log.warning("reminder change ignored: malformed payload error=%s", exc)
        except BaseException:
            # Cancelled while reading (the reader's task is stopped, e.g. by a silo
            # that stops itself): ``aclose`` found the reader busy and left the
            # connection to it, so it is released here or never.
            self._busy = False
            await self._drop()
            raise
        self._busy = False
        await self._drop()
        raise StopAsyncIteration

    async def _follow_scope(self) -> None:
        """Subscribe to the channels the scope wants now (and only those)."""
        if self._pubsub is not None and self._scope.version == self._version:
            return  # the common case, checked before taking the lock
        async with self._lock:
            with translate_errors("reminder change feed"):
                await self._follow_scope_locked()

    async def _follow_scope_locked(self) -> None:
        self._scope_changed.clear()
        version = self._scope.version
        if self._pubsub is not None and version == self._version:
            return
        wanted = self._channels_of(self._scope.ranges)
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
            self._channels = set()
        pubsub = self._pubsub
        gone, new = self._channels - wanted, wanted - self._channels
        if gone:
            await pubsub.sunsubscribe(*sorted(gone))
        if new:
            await pubsub.ssubscribe(*sorted(new))
        self._channels = wanted
        self._version = version

    async def _receive(self) -> bytes | None:
        """The next change message's payload, or ``None`` after a timeout, a
        message of another kind, or a failure (which has been logged, backed off
        from, and will be reconnected)."""
        try:
            with translate_errors("reminder change feed"):
                await self._follow_scope()
                if not self._channels:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._scope_changed.wait(), FEED_POLL_S)
                    return None
                pubsub = self._pubsub
                response = await pubsub.parse_response(block=False, timeout=FEED_POLL_S)
                if response is None:
                    return None
                # A change is ["smessage", channel, payload]: taken straight from the
                # reply, skipping redis-py's per-message dict and bookkeeping.
                if isinstance(response, list) and len(response) == 3:
                    kind = response[0]
                    if kind in (b"smessage", "smessage"):
                        self._backoff.reset()
                        data = response[2]
                        if isinstance(data, bytes):
                            return data
                        return None
                # Subscription confirmations and the like keep redis-py's state right.
                await pubsub.handle_message(response, ignore_subscribe_messages=True)
                return None
        except StorageError as exc:
            if self._closed.is_set():
                return None
            delay = self._backoff.next()
            _log.warning(
                "reminder change feed lost redis; resubscribing error=%s delay_s=%.2f", exc, delay
            )
            await self._drop()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), delay)
            return None

    async def _drop(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        self._channels = set()
        self._version = -1
        if pubsub is not None:
            with contextlib.suppress(StorageError), translate_errors("reminder feed close"):
                await pubsub.aclose()

    async def aclose(self) -> None:
        """End the subscription. A reader blocked in another task stops within
        about half a second; otherwise the connection is released at once."""
        self._closed.set()
        self._scope_changed.set()
        self._scope.remove_listener(self._on_scope_change)
        self._registry.discard(self)
        following, self._following = self._following, None
        if following is not None:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        if not self._busy:
            await self._drop()
