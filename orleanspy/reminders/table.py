"""The reminder table contract. Every backend implements ``ReminderTable``.

Rows are identified by ``(grain_id, name)`` within the table's service id. A
row's ring position is ``grain_id.uniform_hash()``. Range arguments are
``RingRange`` values: hashes in ``(begin, end]``, wrapping when
``begin >= end`` (so ``RingRange(0, 0)`` is the whole ring).

The operations that follow from others (``read_due`` from
``read_due_skipping``, ``upcoming`` from ``read_due``, ``update_schedule``
from ``update_schedule_many``, the bulk calls from the single ones) are
written once, in ``ReminderTableBase``: a backend subclasses it and overrides
one only where its store does it better. ``ReminderTable`` stays the contract
(a table need not subclass anything).

Lost races are values, not exceptions: a CAS against a stale etag returns
``None``/``False``. Exceptions mean the store is unreachable
(``StorageUnavailableError``) or misbehaving (``StorageError``).

Timestamps go in and come out as timezone-aware UTC datetimes, stored with
millisecond precision. Every field of ``ReminderEntry`` round-trips, including
``declared`` (whether a ``@register_reminder`` declaration created the row);
``ReminderEntry.to_record``/``from_record`` give a storage form of plain values.

The due order. ``read_due`` (and ``upcoming``, which is ``read_due`` over the
whole ring) answers with the rows of the range whose ``next_due <= before``,
ordered by ``priority`` *descending* (the higher int first: CRITICAL=100 before
NORMAL=0 before BACKGROUND=-100; any int in -128..127), then by ``next_due``
ascending, at most ``limit`` of them. So the answer is always a prefix of that
order: no row left out comes before a row returned. Ties in
``(priority, next_due)`` come back in a stable but unspecified order. This is
what lets the service hold the highest-priority rows first when the due
backlog is larger than its window, without reading the whole backlog.

Conditional writes. ``upsert_if(entry, expected_etag)`` is ``upsert`` guarded
by the row's etag: it writes only if the row is absent (``expected_etag`` is
``None``) or still has ``expected_etag``, and otherwise writes and publishes
nothing and returns ``None``. Every read-modify-write of a whole row (the
management operations, ``@register_reminder`` at start-up) goes through it, so
a write based on a row that another writer has moved since (a tick's schedule
CAS, an operator, another silo) loses instead of undoing the other write. Of
concurrent ``upsert_if`` calls with one condition exactly one wins.

Paging. ``read_page(cursor, limit, type_name=..., key_prefix=...)`` walks the
table's rows in a stable order of the table's choosing (Redis: shard by shard,
each shard in key order; SQL: key order), at most ``limit`` rows a call, and
returns the cursor of the next page (``None`` when the walk is done). The
cursor is an opaque string; a walk holds nothing in the table or the client
between pages, and one page costs what it returns (plus, on Redis, the empty
shards it steps over), never the table. A row present for the whole walk is
returned exactly once; a row written or removed during the walk may or may not
be. ``type_name`` keeps the rows of one grain type; ``key_prefix`` (with
``type_name``) those whose string key starts with it (int and UUID keys never
match a prefix). Both are answered from an index (Redis: the shard's grain
ZSET by lex range; SQL: an index on the grain id in byte order).
``count_types()`` says how many rows each grain type holds, without reading
rows (Redis: ``ZLEXCOUNT`` per type and shard; SQL: a loose index scan).

Scoped change feeds (optional). A table may also offer
``scoped_changes(scope: FeedScope) -> ChangeFeed`` (``ScopedChangesTable``):
a feed that may leave out what the reader said it does not want, so that it is
not even received or decoded. The service subscribes through ``subscribe``,
which uses ``scoped_changes`` when the table has it and ``changes()`` otherwise,
so a table without it keeps working unchanged. Readers still filter what they
receive: a scope is a hint a table may honour, never a guarantee of filtering.

Skipping held rows (optional). A table may also offer
``read_due_skipping(r, before, limit, skip)`` (``SkippingReminderTable``): the
answer of ``read_due(r, before, limit)`` less the rows whose key
(``ReminderEntry.key``) is in ``skip``, which are neither fetched nor decoded.
The service's refill passes the rows it already holds, so a poll costs what is
new, not the whole window. Skipped rows still count towards ``limit`` (the
answer is the same prefix of the due order, thinned). The service falls back
to ``read_due`` on a table without it.

Paused rows (``ReminderEntry.paused``; tables that are a
``PausableReminderTable``). A table stores the flag with the row
and returns it from ``read``, ``read_grain`` and ``read_range``; ``count``
counts paused rows. A paused row is *not in the due index*: ``read_due`` and
``upcoming`` never return it, whatever its ``next_due``. ``upsert`` of a row
with ``paused=True`` takes it out of the index, and ``upsert`` with
``paused=False`` puts it back at its ``next_due``. ``update_schedule`` (and
``update_schedule_many``) keep the stored flag: on a paused row it changes
``next_due``/``last_fire`` and the etag but leaves the row out of the index.
Every published change of a paused row carries ``next_due=None``, as for a
removal: to the change feed's readers the row left the schedule. Storage of the
flag is up to the backend (Redis: the record field ``"u"``, present only when
true; SQL: a boolean column, with paused rows excluded from the due index, e.g.
a partial index ``WHERE NOT paused``). Rows written before the flag existed
read as not paused.

Fire history (``PausableReminderTable`` only). A table keeps, per row, the newest fire records
(``FireRecord``: slot, when, outcome, silo, triggered) appended with
``append_history``, at most ``keep`` of them (the caller's bound, the same on
every call in practice: ``ReminderOptions.history_size``). History belongs to
the row: ``upsert`` keeps it, ``remove`` deletes it, records for a row that does
not exist are dropped. Appends are not compare-and-swap, not published on the
change feed, and may be lost with a failed call (history is best effort).
Storage is up to the backend (Redis: a list per row beside the shard's keys,
newest first, trimmed on append; SQL: a child table keyed by the row with the
records' time, trimmed to the newest ``keep`` per row on append).

Ended rows (``EndingReminderTable``, optional). When a row's schedule ends (a
one-shot after its tick, a bounded reminder after its last slot) the owner
removes it with ``end`` where the table offers it: the same compare-and-swap
and the same published removal as ``remove``, but the row's fire history stays
readable (``read_history``) for a while afterwards (``ENDED_HISTORY_KEPT``, or
as the backend bounds it), so the final delivery can be looked up. If a row is
written again under the same key meanwhile, its history may continue the ended
one. ``remove`` still deletes the history at once (an operator's delete).

Fencing deposed owners (``FencingReminderTable``, optional). A table instance
may know its *writer*, the incarnation of the silo it writes for
(``SiloAddress`` with its generation), set once before the service starts.
``fence(writer)`` refuses that incarnation's schedule writes from then on:
an ``update_schedule`` (and each update of ``update_schedule_many``) from a
table instance whose writer is fenced answers ``None``, as a lost CAS, and
changes nothing, whatever the etag. Fencing is durable as the rows are,
idempotent, and never affects another writer (another generation on the same
host and port included) nor a table instance without a writer. A silo that
sees another Dead fences it *before* it reads the rows it takes over, so a
tick the deposed owner delivers late (it has not yet learnt it is Dead) is
never persisted as progress, and the new owner's reads and writes are
ordered after every schedule write the old one got in. Storage is up to the
backend (Redis: per shard a sorted set ``fenced`` under the shard's own hash
tag, writer -> time fenced, checked inside the schedule CAS script; SQL: a
fence table checked in the CAS's ``UPDATE ... AND NOT EXISTS``). Entries fenced
before ``prune_before`` (the caller's bound: a defunct incarnation's, e.g.
``MembershipOptions.defunct_silo_expiration`` ago) may be dropped on a later
``fence``. Only schedule writes are fenced: whole-row writes (registration,
management) and removals stay any silo's.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Container, Iterable, Sequence
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.model import FireRecord, ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.ring import RingRange

__all__ = [
    "ENDED_HISTORY_KEPT",
    "BatchingReminderTable",
    "BulkReminderTable",
    "ChangeFeed",
    "ConditionalReminderTable",
    "EndingReminderTable",
    "FeedScope",
    "FencingReminderTable",
    "PausableReminderTable",
    "ReminderTable",
    "ReminderTableBase",
    "ScopedChangesTable",
    "SkippingReminderTable",
    "check_page_limit",
    "grain_prefix",
    "key_cursor",
    "parse_key_cursor",
    "subscribe",
]


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
        their own). Publishes a change with the row's ``next_due`` *and its
        priority* (``ReminderChange.priority``): that is how the service tells a
        registration or management write of a row it holds (a new priority,
        action or schedule to apply at once) from the echo of a schedule CAS.
        """
        ...

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` if the row is absent (``expected_etag`` is ``None``) or its
        etag is ``expected_etag``; returns the new etag, or ``None`` (nothing
        written, nothing published) when the condition does not hold. Publishes
        like ``upsert`` on success. Atomic: of concurrent calls whose condition
        holds when they start, exactly one writes."""
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

    async def read_page(
        self,
        cursor: str | None,
        limit: int,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> tuple[list[ReminderEntry], str | None]:
        """One page of the walk over every row (module docstring, "Paging"):
        at most ``limit`` (>= 1) rows after ``cursor`` (``None``: from the
        start), only of ``type_name`` when given, and of string keys starting
        with ``key_prefix`` when given (needs ``type_name``: ``ValueError``
        otherwise). Returns the rows and the next cursor, ``None`` when no row
        is left; a short page does not by itself mean the end."""
        ...

    async def count_types(self) -> dict[str, int]:
        """How many rows each grain type that has any holds (from the index,
        never by reading rows)."""
        ...

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Rows in ``r`` with ``next_due <= before``, in the due order (module
        docstring: priority descending, then ``next_due`` ascending), at most
        ``limit``. Answered from the due index: the cost grows with the rows
        returned, those due in overlapping shards and the priorities present,
        never with the table. Ties in ``(priority, next_due)`` come back in a
        stable but unspecified order."""
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
        ``etag`` (another writer moved it).

        Publishes nothing. A schedule CAS is the owner advancing its own row
        after a tick: the owner knows, and nobody else holds the row. A reader
        that held it anyway (an ownership hand-over) learns of the move when its
        own CAS on the row loses, and reads the row again then. Announcing every
        tick would cost each tick a publish in the store and a message the only
        subscriber, its writer, throws away.
        """
        ...

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if it exists and its etag is ``etag``; ``True`` if deleted.

        Publishes a change with ``next_due=None`` (and ``priority`` ``None``) on success."""
        ...

    async def count(self) -> int:
        """How many rows the table holds (O(shards), not a scan of rows)."""
        ...

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """``read_due`` over the whole ring: rows with ``next_due <= before`` in the
        due order (priority descending, then ``next_due``), at most ``limit``."""
        ...

    def changes(self) -> ChangeFeed:
        """An endless stream of changes made by any writer, from subscription on.

        Best effort: a change may be lost while the store is unreachable (the
        service's poll is the safety net). Each call returns a new subscription;
        closing the iterator (``aclose``) ends it.
        """
        ...


@runtime_checkable
class PausableReminderTable(ReminderTable, Protocol):
    """A table that keeps paused rows out of its due index and keeps fire
    history, as the module docstring says (optional; the two come together).

    Pausing a row and reading or recording fire history need it: on a table
    without it ``pause``/``resume`` raise ``ReminderError``, history reads are
    empty and nothing is recorded.
    """

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """Append ``records`` (oldest first) to their rows' histories, keeping
        the newest ``keep`` (>= 1) per row; records of missing rows are dropped."""
        ...

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        """The row's fire history, newest first (empty if none or no row)."""
        ...


#: How long an ended row's fire history stays readable (``EndingReminderTable``).
ENDED_HISTORY_KEPT = timedelta(days=7)


@runtime_checkable
class EndingReminderTable(PausableReminderTable, Protocol):
    """A table that keeps an ended row's fire history readable (optional; the
    module docstring). The service ends rows with ``end`` on such a table and
    with ``remove`` otherwise (their history then goes with them)."""

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """``remove`` (same CAS, same published change), keeping the row's fire
        history readable for ``ENDED_HISTORY_KEPT``; ``True`` if the row was removed."""
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


@runtime_checkable
class FencingReminderTable(ReminderTable, Protocol):
    """A table that refuses the schedule writes of fenced writers (optional;
    the module docstring). The service fences a silo it sees Dead before it
    reads that silo's rows; on a table without it a deposed owner's late
    ticks may be persisted (at least once, as before)."""

    #: The incarnation this instance writes for, or ``None`` (never fenced).
    #: Read at every schedule write; a silo sets its own before its service starts.
    writer: SiloAddress | None

    async def fence(
        self,
        writer: SiloAddress,
        *,
        at: datetime | None = None,
        prune_before: datetime | None = None,
    ) -> None:
        """Refuse ``writer``'s schedule writes from now on (idempotent; fencing
        again only raises the fence's time to ``at``). Returns once every part
        of the store (every shard) holds the fence. ``at`` is the fence time
        (the caller's clock; default: now); with ``prune_before``, fences whose
        time is before it may be dropped (never ``writer``'s own). Raises
        ``StorageUnavailableError`` if the store cannot be reached (the fence
        may then be partly set: call again)."""
        ...


@runtime_checkable
class BulkReminderTable(ReminderTable, Protocol):
    """A table that can upsert many rows in one round trip (optional).

    ``ReminderRegistry.register_many`` uses it to seed or migrate a table, the
    registry to write concurrent registrations in one round trip, and start-up
    to read and write ``@register_reminder`` rows in bulk; each falls back to
    concurrent single calls otherwise.
    """

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        """``upsert`` each entry, in order, as one batch; the new etags in order.
        Not a transaction: after a ``StorageUnavailableError`` some may have been
        written (upserting them again is harmless)."""
        ...

    async def upsert_if_many(
        self, writes: Sequence[tuple[ReminderEntry, str | None]]
    ) -> list[str | None]:
        """``upsert_if(entry, expected_etag)`` for each pair, in order, as one
        batch; each result is what the single call would return (a row's own
        condition decides it alone). No key twice in one batch. Not a
        transaction, as ``upsert_many``."""
        ...

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``read_grain`` of each grain, in order, as one batch (Redis: two
        pipelined round trips whatever the number of grains)."""
        ...


@runtime_checkable
class SkippingReminderTable(ReminderTable, Protocol):
    """A table that can leave rows the reader holds out of a due read (optional).

    The service's refill uses it when a table provides it, and ``read_due``
    (then drops the held rows itself) otherwise.
    """

    async def read_due_skipping(
        self,
        r: RingRange,
        before: datetime,
        limit: int,
        skip: Container[str],
        *,
        after: datetime | None = None,
        take: int | None = None,
    ) -> list[ReminderEntry]:
        """``read_due(r, before, limit)`` without the rows whose key is in ``skip``
        (they are not fetched or decoded, but count towards ``limit``). ``skip``
        is consulted during the call; it may be a live view such as the window.
        With ``after``, only rows with ``after < next_due`` are read at all
        (they neither come back nor count): the index is scanned from there, so
        rows due before it cost nothing. With ``take``, only the first ``take``
        rows not skipped come back (the rest are not fetched or decoded)."""
        ...


class FeedScope:
    """What a change-feed reader wants to receive; shared, mutable, read by its feeds.

    ``ranges``: the ring ranges whose rows' changes the reader wants, or ``None``
    for the whole ring. ``set_ranges`` replaces them (a ring change); a feed
    that honours the scope re-subscribes at once (one round trip to the store),
    may deliver changes outside the new ranges until then, and may miss changes
    of newly added rows made before then (the service reads newly owned ranges
    anyway, and its poll is the safety net, as for a feed that was down).
    ``skip_own_writes``: leave out the changes written through the same table
    instance the feed came from (the reader learns of those locally). Only
    correct when that table instance serves this reader alone.
    ``version`` grows with every ``set_ranges``; feeds that must act on a
    change register a callback with ``add_listener`` (called synchronously
    inside ``set_ranges``).
    """

    __slots__ = ("_listeners", "_ranges", "skip_own_writes", "version")

    def __init__(
        self, ranges: Iterable[RingRange] | None = None, *, skip_own_writes: bool = False
    ) -> None:
        self._ranges = None if ranges is None else tuple(ranges)
        self.skip_own_writes = skip_own_writes
        self.version = 0
        self._listeners: list[Callable[[], None]] = []

    @property
    def ranges(self) -> tuple[RingRange, ...] | None:
        return self._ranges

    def set_ranges(self, ranges: Iterable[RingRange] | None) -> None:
        self._ranges = None if ranges is None else tuple(ranges)
        self.version += 1
        for listener in list(self._listeners):
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def wants_hash(self, h: int) -> bool:
        """Whether a row of ring hash ``h`` is inside the scope's ranges."""
        ranges = self._ranges
        return ranges is None or any(h in r for r in ranges)


@runtime_checkable
class ScopedChangesTable(Protocol):
    """A table whose change feed can leave out what a reader does not want (optional)."""

    def scoped_changes(self, scope: FeedScope) -> ChangeFeed:
        """Like ``changes()``, but the feed may omit changes of rows outside
        ``scope.ranges`` and, with ``scope.skip_own_writes``, changes written
        through this table instance; it must deliver every other change that
        ``changes()`` would. It follows later ``scope.set_ranges`` calls."""
        ...


#: Former name of the optional protocol that offered ``upsert_if``; every
#: ``ReminderTable`` offers it now.
ConditionalReminderTable = ReminderTable

_WHOLE_RING = RingRange(0, 0)


class ReminderTableBase(ABC):
    """The contract's operations that follow from others, written once.

    A backend that subclasses it implements the primitives (the abstract
    methods: the skipping due read, the batched schedule CAS, the single
    whole-row writes and the grain read) and gets the rest as the contract
    defines them from those:

    - ``read_due(r, before, limit)`` is ``read_due_skipping(r, before, limit, ())``;
    - ``upcoming(before, limit)`` is ``read_due`` over the whole ring
      (``RingRange(0, 0)``);
    - ``update_schedule(...)`` is ``update_schedule_many`` of that one update;
    - ``upsert_many``, ``upsert_if_many`` and ``read_grains`` are the single
      calls, one after another, in order (a ``BulkReminderTable`` that saves no
      round trip: a store that batches overrides them).

    So a subclass is a ``SkippingReminderTable``, a ``BatchingReminderTable``
    and a ``BulkReminderTable``. It overrides a default only where its store
    does better (PostgreSQL: ``upcoming`` from its own index, ``update_schedule``
    as one statement; Redis and PostgreSQL: the bulk calls in one round trip).
    Everything else of ``ReminderTable`` (and of the optional protocols it
    offers) the subclass writes itself. Shared behaviour only: no state.
    """

    __slots__ = ()

    @abstractmethod
    async def read_due_skipping(
        self,
        r: RingRange,
        before: datetime,
        limit: int,
        skip: Container[str],
        *,
        after: datetime | None = None,
        take: int | None = None,
    ) -> list[ReminderEntry]:
        """``SkippingReminderTable.read_due_skipping``."""

    @abstractmethod
    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``BatchingReminderTable.update_schedule_many``."""

    @abstractmethod
    async def upsert(self, entry: ReminderEntry) -> str:
        """``ReminderTable.upsert``."""

    @abstractmethod
    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``ReminderTable.upsert_if``."""

    @abstractmethod
    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """``ReminderTable.read_grain``."""

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Due rows of ``r`` in the due order, at most ``limit`` (``ReminderTable``):
        ``read_due_skipping`` with nothing to skip."""
        return await self.read_due_skipping(r, before, limit, ())

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """``read_due`` over the whole ring."""
        return await self.read_due(_WHOLE_RING, before, limit)

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        """CAS on the etag: the new etag, or ``None`` if the row is gone or moved on
        (``update_schedule_many`` of the one update)."""
        update = ScheduleUpdate(grain_id, name, etag, next_due, last_fire)
        return (await self.update_schedule_many([update]))[0]

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        """``upsert`` each entry in order; their etags in order."""
        return [await self.upsert(e) for e in entries]

    async def upsert_if_many(
        self, writes: Sequence[tuple[ReminderEntry, str | None]]
    ) -> list[str | None]:
        """``upsert_if`` of each pair in order; the results in order."""
        return [await self.upsert_if(e, etag) for e, etag in writes]

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``read_grain`` of each grain in order."""
        return [await self.read_grain(g) for g in grain_ids]


def check_page_limit(limit: int) -> None:
    """``ValueError`` unless ``limit`` is a page size ``read_page`` takes (>= 1)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")


def key_cursor(row: ReminderEntry) -> str:
    """The ``read_page`` cursor after ``row`` of a table that pages in key order
    (grain canonical, then name): the key as JSON."""
    return json.dumps([row.grain_id.canonical, row.name])


def parse_key_cursor(cursor: str | None) -> tuple[str, str]:
    """The key a ``key_cursor`` names (``("", "")`` before the first row for
    ``None``); ``ValueError`` for a string that is not such a cursor."""
    if cursor is None:
        return ("", "")
    try:
        grain, name = json.loads(cursor)
        return (str(grain), str(name))
    except (ValueError, TypeError):
        raise ValueError(f"not a page cursor of this table: {cursor!r}") from None


def grain_prefix(type_name: str | None, key_prefix: str | None) -> str:
    """What the canonical grain ids (``GrainId.canonical``) of the rows a page
    filter selects start with: ``""`` for every row, ``"T/"`` for type ``T``,
    ``"T/s:P"`` for its string keys starting with ``P``. ``ValueError`` for a
    prefix without a type, or a type with ``/`` in it."""
    if type_name is None:
        if key_prefix is not None:
            raise ValueError("a key prefix needs a grain type")
        return ""
    if not type_name or "/" in type_name:
        raise ValueError(f"not a grain type name: {type_name!r}")
    return f"{type_name}/" if key_prefix is None else f"{type_name}/s:{key_prefix}"


def subscribe(table: ReminderTable, scope: FeedScope) -> ChangeFeed:
    """``table.scoped_changes(scope)`` when the table offers it, else ``table.changes()``."""
    if isinstance(table, ScopedChangesTable):
        return table.scoped_changes(scope)
    return table.changes()


#: How many lost etag races in a row ``remove_current`` takes before it gives up.
REMOVE_ATTEMPTS = 5


async def remove_current(table: ReminderTable, grain_id: GrainId, name: str) -> bool:
    """Remove the row whatever its etag: read it, remove it with the etag read, and
    read again when the remove loses to a write in between (a tick moves
    ``next_due``). ``False`` if there is no row; ``ReminderError`` after
    ``REMOVE_ATTEMPTS`` lost races in a row."""
    for _ in range(REMOVE_ATTEMPTS):
        row = await table.read(grain_id, name)
        if row is None or row.etag is None:
            return False
        if await table.remove(grain_id, name, row.etag):
            return True
    raise ReminderError(
        f"could not remove reminder {name!r} of {grain_id}: it kept changing "
        f"({REMOVE_ATTEMPTS} attempts)"
    )
