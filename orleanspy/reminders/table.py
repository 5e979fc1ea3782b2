"""The reminder table contract. Every backend implements ``ReminderTable``.

Rows are identified by ``(grain_id, name)`` within the table's service id. A
row's ring position is ``grain_id.uniform_hash()``. Range arguments are
``RingRange`` values: hashes in ``(begin, end]``, wrapping when
``begin >= end`` (so ``RingRange(0, 0)`` is the whole ring).

Lost races are values, not exceptions: a CAS against a stale etag returns
``None``/``False``. Exceptions mean the store is unreachable
(``StorageUnavailableError``) or misbehaving (``StorageError``).

Timestamps go in and come out as timezone-aware UTC datetimes, stored with
millisecond precision.

Paused rows (``ReminderEntry.paused``). A table stores the flag with the row
and returns it from ``read``, ``read_grain`` and ``read_range``; ``count``
counts paused rows. A paused row is *not in the due index*: ``read_due`` and
``upcoming`` never return it, whatever its ``next_due``. ``upsert`` of a row
with ``paused=True`` takes it out of the index, and ``upsert`` with
``paused=False`` puts it back at its ``next_due``. ``update_schedule`` (and
``update_schedule_many``) keep the stored flag: on a paused row it changes
``next_due``/``last_fire`` and the etag but leaves the row out of the index.
Every change of a paused row is published with ``next_due=None``, as for a
removal: to the change feed's readers the row left the schedule. Storage of the
flag is up to the backend (Redis: the record field ``"u"``, present only when
true; SQL: a boolean column, with paused rows excluded from the due index, e.g.
a partial index ``WHERE NOT paused``). Rows written before the flag existed
read as not paused.

Fire history. A table keeps, per row, the newest fire records
(``FireRecord``: slot, when, outcome, silo, triggered) appended with
``append_history``, at most ``keep`` of them (the caller's bound, the same on
every call in practice: ``ReminderOptions.history_size``). History belongs to
the row: ``upsert`` keeps it, ``remove`` deletes it, records for a row that does
not exist are dropped. Appends are not compare-and-swap, not published on the
change feed, and may be lost with a failed call (history is best effort).
Storage is up to the backend (Redis: a list per row beside the shard's keys,
newest first, trimmed on append; SQL: a child table keyed by the row with the
records' time, trimmed to the newest ``keep`` per row on append).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Protocol, runtime_checkable

from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireRecord, ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.ring import RingRange

__all__ = ["BatchingReminderTable", "ChangeFeed", "ReminderTable"]


@runtime_checkable
class ChangeFeed(Protocol):
    """What ``ReminderTable.changes`` returns: an ``AsyncIterator[ReminderChange]``
    that ``aclose`` ends."""

    def __aiter__(self) -> AsyncIterator[ReminderChange]: ...

    async def __anext__(self) -> ReminderChange: ...

    async def aclose(self) -> None:
        """End the subscription, also for a reader waiting in another task. Idempotent."""
        ...


@runtime_checkable
class ReminderTable(Protocol):
    """Durable reminder rows with a due index and a change feed."""

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect and prepare; push cleanup onto ``stack``. Called once before use."""
        ...

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row unconditionally (last writer wins).

        The ``etag`` of ``entry`` is ignored. Returns the row's new etag, distinct
        from every etag the row had before (parallel upserts of one key each get
        their own). Publishes a change with the row's ``next_due``.
        """
        ...

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        """The row with its current etag, or ``None``."""
        ...

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of one grain, in name order."""
        ...

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row whose grain hash lies in ``r``. For tools and tests: it reads
        the whole range, so the service never calls it on a hot path."""
        ...

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Rows in ``r`` with ``next_due <= before``, earliest ``next_due`` first,
        at most ``limit``. Answered from the due index: the cost grows with the
        rows returned (and those due in overlapping shards), never with the table.
        Ties in ``next_due`` come back in a stable but unspecified order."""
        ...

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        """Compare-and-swap ``next_due``/``last_fire`` on the row.

        Returns the new etag, or ``None`` if the row is gone or its etag is not
        ``etag`` (another writer moved it). Publishes a change on success.
        """
        ...

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if it exists and its etag is ``etag``; ``True`` if deleted.

        Publishes a change with ``next_due=None`` on success."""
        ...

    async def count(self) -> int:
        """How many rows the table holds (O(shards), not a scan of rows)."""
        ...

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """Rows across the whole ring with ``next_due <= before``, earliest first,
        at most ``limit`` (uses the due index)."""
        ...

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """Append ``records`` (oldest first) to their rows' histories, keeping
        the newest ``keep`` (>= 1) per row; records of missing rows are dropped."""
        ...

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        """The row's fire history, newest first (empty if none or no row)."""
        ...

    def changes(self) -> ChangeFeed:
        """An endless stream of changes made by any writer, from subscription on.

        Best effort: a change may be lost while the store is unreachable (the
        service's poll is the safety net). Each call returns a new subscription;
        closing the iterator (``aclose``) ends it.
        """
        ...


@runtime_checkable
class BatchingReminderTable(ReminderTable, Protocol):
    """A table that can apply many schedule CASes in one round trip (optional).

    The service uses it when a table provides it, and falls back to concurrent
    ``update_schedule`` calls otherwise.
    """

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update, in order, as one batch; each result
        is the new etag or ``None`` (lost race), exactly as for single calls."""
        ...
