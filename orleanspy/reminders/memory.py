"""``InMemoryReminderTable``: the reminder table of a single process.

The embedded default and the table of fast tests. Rows live in a dict; the due
index is a list kept sorted by ``(next_due_ms, hash, key)``, so ``read_due`` and
``upcoming`` walk rows in due order and stop at ``before`` or ``limit``; they
never look at rows that are not yet due. Nothing is durable.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from bisect import bisect_left, insort
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import datetime
from typing import Final

from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.ring import RingRange

__all__ = ["InMemoryReminderTable"]

_log = logging.getLogger(__name__)

# (grain canonical, name): a tuple, so a '|' in a key or a name cannot make two
# rows collide here.
_Key = tuple[str, str]
_DueKey = tuple[int, int, _Key]

_QUEUE_LIMIT: Final = 100_000


def _normalise(entry: ReminderEntry, etag: str) -> ReminderEntry:
    """The row as storage would give it back: millisecond times, the new etag."""
    return ReminderEntry.from_record({**entry.to_record(), "e": etag})


class InMemoryReminderTable:
    """A ``ReminderTable`` (and ``BatchingReminderTable``) held in process memory.

    ``service_id`` names the service whose rows the table holds; rows are stored
    as given. ``count`` is O(1); ``read_due``/``upcoming`` cost O(log n + rows
    due before ``before``) and never scan rows that are not due.
    """

    def __init__(self, service_id: str = "default") -> None:
        self.service_id = service_id
        self._rows: dict[_Key, ReminderEntry] = {}
        self._due: list[_DueKey] = []
        self._by_grain: dict[str, dict[str, ReminderEntry]] = {}
        self._etags = itertools.count(1)
        self._subscribers: set[_MemoryChanges] = set()

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to connect; on close, every open ``changes()`` stream ends."""
        stack.callback(self._close_subscriptions)

    # -- writes -------------------------------------------------------------------

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row; returns its new, never reused etag."""
        etag = self._new_etag()
        row = _normalise(entry, etag)
        self._put(row)
        self._publish(row.grain_id, row.name, row.next_due)
        return etag

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        """CAS on the etag: the new etag, or ``None`` if the row is gone or moved on."""
        return self._update(grain_id, name, etag, next_due, last_fire)

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update in order; results line up with ``updates``."""
        return [self._update(u.grain_id, u.name, u.etag, u.next_due, u.last_fire) for u in updates]

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if its etag is ``etag``; ``False`` if missing or moved on."""
        key = (grain_id.canonical, name)
        row = self._rows.get(key)
        if row is None or row.etag != etag:
            return False
        self._drop(key, row)
        self._publish(grain_id, name, None)
        return True

    # -- reads --------------------------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        return self._rows.get((grain_id.canonical, name))

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        rows = self._by_grain.get(grain_id.canonical, {})
        return [rows[name] for name in sorted(rows)]

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (a scan: tools and tests only)."""
        found = [row for row in self._rows.values() if row.hash in r]
        found.sort(key=lambda row: (row.hash, row.grain_id.canonical, row.name))
        return found

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Due rows of ``r`` in ``next_due`` order (ties by hash, then key), at most ``limit``."""
        return self._walk_due(r, to_ms(before), limit)

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        return self._walk_due(None, to_ms(before), limit)

    async def count(self) -> int:
        return len(self._rows)

    def changes(self) -> _MemoryChanges:
        """A new subscription, live from this call on (not from the first ``anext``)."""
        sub = _MemoryChanges(self._subscribers)
        self._subscribers.add(sub)
        return sub

    # -- internals ----------------------------------------------------------------

    def _new_etag(self) -> str:
        return str(next(self._etags))

    @staticmethod
    def _key_of(entry: ReminderEntry) -> _Key:
        return (entry.grain_id.canonical, entry.name)

    def _put(self, row: ReminderEntry) -> None:
        key = self._key_of(row)
        old = self._rows.get(key)
        if old is not None:
            self._unindex_due(key, old)
        self._rows[key] = row
        insort(self._due, (to_ms(row.next_due), row.hash, key))
        self._by_grain.setdefault(key[0], {})[row.name] = row

    def _drop(self, key: _Key, row: ReminderEntry) -> None:
        self._unindex_due(key, row)
        del self._rows[key]
        names = self._by_grain[key[0]]
        del names[row.name]
        if not names:
            del self._by_grain[key[0]]

    def _unindex_due(self, key: _Key, row: ReminderEntry) -> None:
        item = (to_ms(row.next_due), row.hash, key)
        i = bisect_left(self._due, item)
        # The index mirrors the rows exactly; a miss here is a bug, not a race.
        assert i < len(self._due) and self._due[i] == item, "due index out of sync"
        del self._due[i]

    def _update(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        row = self._rows.get((grain_id.canonical, name))
        if row is None or row.etag != etag:
            return None
        new_etag = self._new_etag()
        moved = _normalise(replace(row, next_due=next_due, last_fire=last_fire), new_etag)
        self._put(moved)
        self._publish(grain_id, name, moved.next_due)
        return new_etag

    def _walk_due(self, r: RingRange | None, before_ms: int, limit: int) -> list[ReminderEntry]:
        found: list[ReminderEntry] = []
        if limit <= 0:
            return found
        for due_ms, h, key in self._due:
            if due_ms > before_ms:
                break
            if r is None or h in r:
                found.append(self._rows[key])
                if len(found) >= limit:
                    break
        return found

    def _publish(self, grain_id: GrainId, name: str, next_due: datetime | None) -> None:
        change = ReminderChange(grain_id, name, next_due)
        for sub in self._subscribers:
            sub.offer(change)

    def _close_subscriptions(self) -> None:
        for sub in list(self._subscribers):
            sub.end()


class _MemoryChanges:
    """One subscriber's queue of changes; ``aclose`` (or table close) ends it.

    The queue is bounded: a subscriber that stops reading loses changes beyond
    the bound (logged) instead of growing without limit, which the contract's
    "best effort" allows.
    """

    def __init__(self, registry: set[_MemoryChanges]) -> None:
        self._registry = registry
        self._queue: asyncio.Queue[ReminderChange | None] = asyncio.Queue(_QUEUE_LIMIT)
        self._ended = False

    def offer(self, change: ReminderChange) -> None:
        try:
            self._queue.put_nowait(change)
        except asyncio.QueueFull:
            _log.warning("reminder change dropped: subscriber queue full limit=%d", _QUEUE_LIMIT)

    def end(self) -> None:
        """Stop accepting changes; a reader waiting in ``__anext__`` gets ``StopAsyncIteration``."""
        if self._ended:
            return
        self._ended = True
        self._registry.discard(self)
        # The sentinel must get in even if the queue is full: make room for it.
        if self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    def __aiter__(self) -> _MemoryChanges:
        return self

    async def __anext__(self) -> ReminderChange:
        if self._ended and self._queue.empty():
            raise StopAsyncIteration
        change = await self._queue.get()
        if change is None:
            raise StopAsyncIteration
        return change

    async def aclose(self) -> None:
        self.end()
