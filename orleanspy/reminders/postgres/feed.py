"""The change feed of ``PostgresReminderTable``: one LISTEN connection per table,
fanned out to any number of subscriptions.

A subscription (``PostgresChanges``) is a queue registered with the table's
``Listener`` when ``changes()`` is called, so it receives every notification
from then on. When the LISTEN connection is lost (or fails its periodic health
query), the listener reconnects with backoff; only once it listens again does
every open subscription raise ``StorageUnavailableError`` once, so its reader
opens a new one and re-reads. See the table's module doc for why nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Final

from orleanspy._postgres import Pool, connect, translate_errors
from orleanspy.clock import from_ms
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange

__all__ = ["Listener", "PostgresChanges"]

_log = logging.getLogger(__name__)

# A feed whose reader fell this far behind drops its backlog and asks for a re-read.
_MAX_BACKLOG: Final = 100_000
# How often the LISTEN connection is checked for a silent loss.
_HEALTH_S: Final = 5.0
_BACKOFF_MIN_S: Final = 0.05
_BACKOFF_MAX_S: Final = 2.0

_GAP: Final = object()
# Longest first field ("4294967295:-128") and next_due ("-" and 19 digits) of a payload.
_MAX_HEAD: Final = 15
_MAX_DUE: Final = 20


class PostgresChanges:
    """One subscriber's queue of changes, filled by the table's listener."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._queue: deque[object] = deque()
        self._ready = asyncio.Event()
        self._closed = False

    def push(self, item: object) -> None:
        if self._closed:
            return
        if len(self._queue) >= _MAX_BACKLOG:
            # The reader is far behind: a re-read replaces the backlog.
            self._queue.clear()
            item = _GAP
        self._queue.append(item)
        self._ready.set()

    def __aiter__(self) -> PostgresChanges:
        return self

    async def __anext__(self) -> ReminderChange:
        while not self._closed:
            if self._queue:
                item = self._queue.popleft()
                if item is _GAP:
                    raise StorageUnavailableError(
                        "reminder change feed was interrupted; changes may have been missed"
                    )
                assert isinstance(item, ReminderChange)
                return item
            self._ready.clear()
            await self._ready.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """End the subscription, also for a reader waiting in another task."""
        self._closed = True
        self._queue.clear()
        self._ready.set()
        self._listener.unsubscribe(self)


class Listener:
    """The table's LISTEN connection: fans notifications out to the feeds, and
    reconnects when the connection is lost, then tells every feed to re-read."""

    def __init__(self, source: str | Pool, channel: str) -> None:
        self._source = source
        self._channel = channel
        self._feeds: set[PostgresChanges] = set()
        self._conn: Any = None
        self._lost = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._listen()
        self._task = asyncio.create_task(self._watch(), name=f"reminder-listen-{self._channel}")

    def subscribe(self) -> PostgresChanges:
        feed = PostgresChanges(self)
        if self._closed:
            feed._closed = True
        else:
            self._feeds.add(feed)
        return feed

    def unsubscribe(self, feed: PostgresChanges) -> None:
        self._feeds.discard(feed)

    async def _listen(self) -> None:
        conn = await connect(self._source)
        try:
            with translate_errors("reminder LISTEN"):
                await conn.add_listener(self._channel, self._on_notify)
            conn.add_termination_listener(self._on_terminated)
        except BaseException:
            await self._release(conn)
            raise
        self._conn = conn
        self._lost.clear()

    def _on_terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._lost.set()

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        change = _decode(payload)
        if change is None:
            return
        for feed in list(self._feeds):
            feed.push(change)

    async def _watch(self) -> None:
        """Check the connection every few seconds (a silent network loss raises
        no event); on loss, reconnect with backoff, then flag a gap."""
        delay = _BACKOFF_MIN_S
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), _HEALTH_S)
            if not self._lost.is_set():
                try:
                    with translate_errors("reminder LISTEN health check"):
                        await self._conn.fetchval("SELECT 1", timeout=_HEALTH_S)
                    continue
                except StorageError as exc:
                    _log.warning("reminder LISTEN connection failed its check error=%s", exc)
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._release(conn)
            while not self._closed:
                try:
                    await self._listen()
                    break
                except Exception as exc:  # keep following whatever the failure
                    _log.warning(
                        "reminder LISTEN connection lost; reconnecting error=%r delay_s=%.2f",
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _BACKOFF_MAX_S)
            delay = _BACKOFF_MIN_S
            _log.info("reminder LISTEN connection restored; feeds will re-read")
            for feed in list(self._feeds):
                feed.push(_GAP)

    async def _release(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            if isinstance(self._source, str):
                await asyncio.wait_for(conn.close(), 5)
            else:
                with contextlib.suppress(Exception):
                    await conn.remove_listener(self._channel, self._on_notify)
                await self._source.release(conn)

    async def close(self) -> None:
        self._closed = True
        for feed in list(self._feeds):
            await feed.aclose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._release(conn)


def _decode(payload: str) -> object:
    """``hash[:priority]|next_due_ms|grain|name`` as a ``ReminderChange``; ``hash|!``
    (a write whose payload was too long to send) as ``_GAP``, so feeds re-read;
    ``None`` (logged) if malformed.

    Only the first field may carry ``:priority`` (a whole-row write), an int in
    -128..127; ``next_due`` is empty for a removal. Every field is checked
    before use, and the short ones for length before they are converted.
    """
    if payload.endswith("|!") and payload.count("|") == 1:
        return _GAP
    try:
        head, due, rest = payload.split("|", 2)
        canonical, sep, name = rest.rpartition("|")
        if not sep or len(head) > _MAX_HEAD or len(due) > _MAX_DUE:
            raise ValueError("malformed fields")
        _, colon, prio = head.partition(":")
        priority = _priority(prio) if colon else None
        return ReminderChange(
            GrainId.parse(canonical), name, from_ms(int(due)) if due else None, priority
        )
    except (ValueError, TypeError, OverflowError):
        _log.warning("reminder change ignored: malformed payload %.100r", payload)
        return None


def _priority(text: str) -> int:
    if not 1 <= len(text) <= 4 or not text.lstrip("-").isdigit() or not text.isascii():
        raise ValueError(f"bad priority {text!r}")
    priority = int(text)
    if not -128 <= priority <= 127:
        raise ValueError(f"priority {priority} is outside -128..127")
    return priority
