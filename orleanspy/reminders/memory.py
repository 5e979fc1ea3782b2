"""``InMemoryReminderTable``: the reminder table of a single process.

The embedded default and the table of fast tests. Rows live in a dict; the due
index is one binary min-heap of ``(next_due_ms, hash, key, seq)`` per shard of
the hash space (top 8 bits) and priority lane, as in the Redis layout. A write
pushes a new heap item and leaves the old one behind, stale (its ``seq`` is no
longer the row's), so every write is O(log n) even with millions of rows; the
heaps are rebuilt from the live rows when stale items outnumber them.
``read_due`` and ``upcoming`` walk the lane heaps of the shards overlapping the
range in the contract's order (priority descending, then due) without popping
them (a small frontier heap merges them), skip stale items, and stop a lane at
``before`` and the walk at ``limit``: they never look at rows that are not yet
due, nor at due rows of shards outside the range. The label index is a dict of
term to keys, kept by whole-row writes and removals; calendars and backfill
jobs are dicts (``stores``). Nothing is durable.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Container, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from heapq import heapify, heappop, heappush
from typing import Any, Final, cast

from orleanspy.clock import from_ms, to_ms
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.audit import AuditQuery, AuditRecord, AuditRetention, MemoryAuditLog
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import (
    COUNT_CODES,
    CounterDelta,
    ReminderCounters,
    counters_from_record,
)
from orleanspy.reminders.letters import (
    DeadLetter,
    after_cursor,
    letter_cursor,
    newest_first,
    parse_letter_cursor,
)
from orleanspy.reminders.model import FireRecord, ReminderChange, ReminderEntry, ScheduleUpdate
from orleanspy.reminders.table import (
    ReminderTableBase,
    check_page_limit,
    grain_prefix,
    key_cursor,
    parse_key_cursor,
)
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.schema import MEMORY_SCHEMA, SchemaVersion

__all__ = ["InMemoryReminderTable"]

_log = logging.getLogger(__name__)

# (grain canonical, name): a tuple, so a '|' in a key or a name cannot make two
# rows collide here.
_Key = tuple[str, str]
# (next_due_ms, hash, key, seq): seq is unique per write, so items never tie and
# an item is live only while its seq is the row's.
_DueItem = tuple[int, int, _Key, int]

_QUEUE_LIMIT: Final = 100_000
#: Ended rows whose histories the table keeps (``end``), the most recent ones.
ENDED_HISTORIES: Final = 10_000
_SHARD_BITS: Final = 8
_SHIFT: Final = 32 - _SHARD_BITS
# Stale heap items tolerated before a rebuild (and at least as many as live rows).
_MIN_STALE_FOR_REBUILD: Final = 1024


def _normalise(entry: ReminderEntry, etag: str) -> ReminderEntry:
    """The row as storage would give it back: millisecond times, the new etag."""
    return ReminderEntry.from_record({**entry.to_record(), "e": etag})


def _stored(when: datetime) -> datetime:
    """``when`` as storage gives it back: UTC, whole milliseconds."""
    return from_ms(to_ms(when))


class InMemoryReminderTable(ReminderTableBase):
    """A ``ReminderTable`` (and ``BatchingReminderTable``) held in process memory;
    the bulk calls, ``read_due``, ``upcoming`` and ``update_schedule`` are
    ``ReminderTableBase``'s.

    ``service_id`` names the service whose rows the table holds; rows are stored
    as given. Writes are O(log n) (amortised); ``count`` is O(1);
    ``read_due``/``upcoming`` cost O((k + s) log (k + s)) for the k rows due before
    ``before`` walked and the s stale index items met among them.
    """

    schema = SchemaVersion("memory", "reminders", MEMORY_SCHEMA)

    def __init__(self, service_id: str = "default") -> None:
        self.service_id = service_id
        self._rows: dict[_Key, tuple[ReminderEntry, int]] = {}
        # Per shard, one heap per priority present (lanes emptied by writes stay
        # until the next rebuild; they are cheap to skip).
        self._due: list[dict[int, list[_DueItem]]] = [{} for _ in range(1 << _SHARD_BITS)]
        self._stale = 0
        self._by_grain: dict[str, dict[str, ReminderEntry]] = {}
        self._etags = itertools.count(1)
        self._subscribers: set[_MemoryChanges] = set()
        # Fire records in storage form (``FireRecord.to_record``), newest first,
        # decoded when read: a record is written per tick and rarely read.
        self._history: dict[_Key, deque[dict[str, Any]]] = {}
        # Histories of ended rows (``end``), oldest ending first, at most
        # ENDED_HISTORIES of them: this table has no clock to expire them by.
        self._ended: OrderedDict[_Key, deque[dict[str, Any]]] = OrderedDict()
        #: The incarnation this instance writes for (``FencingReminderTable``).
        self.writer: SiloAddress | None = None
        # Fenced writers -> when fenced (ms). Shared with every ``writer_view``.
        self._fenced: dict[SiloAddress, int] = {}
        self._audit = MemoryAuditLog()
        # Per row, its counters in storage form (``counters.COUNT_CODES``).
        self._counts: dict[_Key, dict[str, Any]] = {}
        # Dead letters by id (``DeadLetterTable``).
        self._letters: dict[str, DeadLetter] = {}
        # The label index (``stores.IndexedReminderTable``): term -> keys, and
        # each indexed row's terms.
        self._by_term: dict[str, set[_Key]] = {}
        self._terms: dict[_Key, list[str]] = {}
        self._calendars: dict[str, StoredCalendar] = {}
        self._versions = itertools.count(1)
        # Backfill jobs by row: the job (storage form) and its etag.
        self._backfills: dict[_Key, tuple[dict[str, Any], str]] = {}

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to connect; on close, every open ``changes()`` stream ends."""
        stack.callback(self._close_subscriptions)

    # -- writes -------------------------------------------------------------------

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row; returns its new, never reused etag."""
        seq = next(self._etags)
        etag = str(seq)
        row = _normalise(entry, etag)
        ended = self._ended.pop(self._key_of(row), None)
        if ended is not None:  # the row is back: its history continues
            self._history[self._key_of(row)] = ended
        self._put(row, seq)
        self._reindex(self._key_of(row), row.index_terms())
        if row.paused:  # a paused row left the schedule: told as a removal
            self._publish(row.grain_id, row.name, None, None)
        else:
            self._publish(row.grain_id, row.name, row.next_due, row.priority)
        return etag

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` only if the row is absent (``expected_etag`` ``None``) or has
        ``expected_etag``; the new etag, or ``None`` when it did not hold."""
        found = self._rows.get(self._key_of(entry))
        current = None if found is None else found[0].etag
        if (found is not None or expected_etag is not None) and current != expected_etag:
            return None
        return await self.upsert(entry)

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update in order; results line up with ``updates``."""
        return await self.update_schedule_many_as(self.writer, updates)

    async def update_schedule_many_as(
        self, writer: SiloAddress | None, updates: Sequence[ScheduleUpdate]
    ) -> list[str | None]:
        """``update_schedule_many`` written for ``writer`` (a ``writer_view``'s)."""
        if writer is not None and writer in self._fenced:
            return [None] * len(updates)
        return [self._update(u.grain_id, u.name, u.etag, u.next_due, u.last_fire) for u in updates]

    async def fence(
        self,
        writer: SiloAddress,
        *,
        at: datetime | None = None,
        prune_before: datetime | None = None,
    ) -> None:
        """Refuse ``writer``'s schedule writes from now on (``FencingReminderTable``)."""
        at_ms = to_ms(at or datetime.now(UTC))
        self._fenced[writer] = max(at_ms, self._fenced.get(writer, at_ms))
        if prune_before is not None:
            cutoff = to_ms(prune_before)
            self._fenced = {w: t for w, t in self._fenced.items() if t >= cutoff or w == writer}

    def writer_view(self, writer: SiloAddress) -> InMemoryReminderTable:
        """This table as written by ``writer``: the same rows, feeds and fences;
        only its schedule writes carry ``writer``. For several silos of one
        process sharing one table, each with its own incarnation."""
        return cast(InMemoryReminderTable, _WriterView(self, writer))

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if its etag is ``etag``; ``False`` if missing or moved on."""
        key = (grain_id.canonical, name)
        found = self._rows.get(key)
        if found is None or found[0].etag != etag:
            return False
        self._drop(key, found[0])
        self._reindex(key, [])
        self._backfills.pop(key, None)
        self._history.pop(key, None)
        self._counts.pop(key, None)
        self._ended.pop(key, None)
        self._publish(grain_id, name, None)
        return True

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """``remove``, keeping the row's history readable (the newest
        ``ENDED_HISTORIES`` ended rows' histories are kept)."""
        key = (grain_id.canonical, name)
        history = self._history.get(key)
        if not await self.remove(grain_id, name, etag):
            return False
        if history:
            self._ended[key] = history
            while len(self._ended) > ENDED_HISTORIES:
                self._ended.popitem(last=False)
        return True

    # -- the audit log (AuditedReminderTable) --------------------------------------
    # Each write below runs without suspending, so the row and its record change
    # in one step of the event loop: nothing sees one without the other.

    async def upsert_if_audited(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        etag = await self.upsert_if(entry, expected_etag)
        if etag is not None:
            self._audit.append(record, retention)
        return etag

    async def remove_audited(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        removed = await self.remove(grain_id, name, etag)
        if removed:
            self._audit.append(record, retention)
        return removed

    async def append_audit(self, record: AuditRecord, retention: AuditRetention) -> None:
        self._audit.append(record, retention)

    async def settle_audit(self, record: AuditRecord) -> bool:
        return self._audit.settle(record)

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        return self._audit.read(query)

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """Newest ``keep`` per row; records of missing rows are dropped."""
        for rec in records:
            key = (rec.grain_id.canonical, rec.name)
            if key not in self._rows:
                continue
            kept = self._history.get(key)
            if kept is None or kept.maxlen != keep:
                kept = self._history[key] = deque(kept or (), maxlen=keep)
            kept.appendleft(rec.to_record())

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        key = (grain_id.canonical, name)
        kept = self._history.get(key) or self._ended.get(key) or ()
        return [FireRecord.from_record(grain_id, name, rec) for rec in kept]

    async def add_counts(self, deltas: Sequence[CounterDelta]) -> None:
        """Add each delta to its row's counters; deltas of missing rows are dropped."""
        for delta in deltas:
            key = (delta.grain_id.canonical, delta.name)
            if key not in self._rows:
                continue
            rec = self._counts.setdefault(key, {})
            for code, n in zip(COUNT_CODES, delta.counts, strict=True):
                if n:
                    rec[code] = rec.get(code, 0) + n
            if delta.last_error is not None:
                rec["e"] = delta.last_error
                if delta.last_error_at is not None:
                    rec["t"] = to_ms(delta.last_error_at)

    async def read_counts(self, grain_id: GrainId, name: str) -> ReminderCounters:
        return counters_from_record(self._counts.get((grain_id.canonical, name), {}))

    async def add_dead_letters(
        self, letters: Sequence[DeadLetter], *, keep: int, expire_before: datetime
    ) -> None:
        """Store, then drop the expired and all but the newest ``keep`` (a sort
        per call: this table is for tests and embedding)."""
        for letter in letters:
            self._letters[letter.id] = letter
        cutoff = to_ms(expire_before)
        kept = [d for d in newest_first(list(self._letters.values())) if to_ms(d.at) >= cutoff]
        self._letters = {d.id: d for d in kept[:keep]}

    async def read_dead_letters(
        self,
        cursor: str | None,
        limit: int,
        *,
        grain_id: GrainId | None = None,
        name: str | None = None,
    ) -> tuple[list[DeadLetter], str | None]:
        check_page_limit(limit)
        after = parse_letter_cursor(cursor)
        found = [
            d
            for d in newest_first(list(self._letters.values()))
            if after_cursor(d, after)
            and (grain_id is None or d.grain_id == grain_id)
            and (name is None or d.name == name)
        ]
        page = found[:limit]
        return page, letter_cursor(page[-1]) if len(found) > limit else None

    async def read_dead_letter(self, letter_id: str) -> DeadLetter | None:
        return self._letters.get(letter_id)

    async def remove_dead_letter(self, letter_id: str) -> bool:
        return self._letters.pop(letter_id, None) is not None

    async def count_dead_letters(self) -> int:
        return len(self._letters)

    # -- reads --------------------------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        found = self._rows.get((grain_id.canonical, name))
        return None if found is None else found[0]

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        rows = self._by_grain.get(grain_id.canonical, {})
        return [rows[name] for name in sorted(rows)]

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (a scan: tools and tests only)."""
        found = [row for row, _ in self._rows.values() if row.hash in r]
        found.sort(key=lambda row: (row.hash, row.grain_id.canonical, row.name))
        return found

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
        """Due rows of ``r``, highest priority first, then earliest ``next_due`` (ties
        by hash, then key), at most ``limit``, less the rows whose key is in
        ``skip`` (they count towards ``limit``), of rows due after ``after`` only
        (the walk still visits the earlier ones: this table is for tests and
        embedding), the first ``take``. ``read_due`` and ``upcoming`` are this."""
        after_ms = -1 if after is None else to_ms(after)
        rows = self._walk_due(r, to_ms(before), limit, skip, after_ms)
        return rows if take is None else rows[: max(0, take)]

    async def count(self) -> int:
        return len(self._rows)

    async def read_page(
        self,
        cursor: str | None,
        limit: int,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows in key order (grain canonical, then name) after ``cursor`` (the
        last key returned, as JSON). Sorts the grains on each call: this table is
        for tests and embedding."""
        check_page_limit(limit)
        prefix = grain_prefix(type_name, key_prefix)
        after: _Key = parse_key_cursor(cursor)
        grains = sorted(g for g in self._by_grain if g.startswith(prefix) and g >= after[0])
        out: list[ReminderEntry] = []
        for g in grains:
            rows = self._by_grain[g]
            for name in sorted(rows):
                if (g, name) <= after:
                    continue
                out.append(rows[name])
                if len(out) == limit:
                    return out, key_cursor(out[-1])
        return out, None

    async def count_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for g, rows in self._by_grain.items():
            t = g.partition("/")[0]
            counts[t] = counts.get(t, 0) + len(rows)
        return {t: n for t, n in counts.items() if n}

    # -- the label index, calendars, backfills (``stores``) ------------------------------

    def _reindex(self, key: _Key, terms: list[str]) -> None:
        for term in self._terms.pop(key, ()):
            keys = self._by_term.get(term)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_term[term]
        if terms:
            self._terms[key] = terms
            for term in terms:
                self._by_term.setdefault(term, set()).add(key)

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows carrying every term, in key order after ``cursor`` (the last key,
        as JSON). Sorts the first term's keys on each call (tests, embedding)."""
        check_page_limit(limit)
        if not terms:
            raise ValueError("read_indexed needs at least one term")
        after: _Key = parse_key_cursor(cursor)
        sets = sorted((self._by_term.get(t, set()) for t in terms), key=len)
        keys = sorted(k for k in sets[0] if k > after and all(k in s for s in sets[1:]))
        out = [self._rows[k][0] for k in keys[:limit]]
        return out, (key_cursor(out[-1]) if len(keys) > limit else None)

    async def count_indexed(self, term: str) -> int:
        return len(self._by_term.get(term, ()))

    async def write_calendar(self, name: str, calendar: Calendar) -> StoredCalendar:
        stored = StoredCalendar(name, calendar, next(self._versions))
        self._calendars[name] = stored
        return stored

    async def read_calendar(self, name: str) -> StoredCalendar | None:
        return self._calendars.get(name)

    async def read_calendars(self) -> list[StoredCalendar]:
        return [self._calendars[n] for n in sorted(self._calendars)]

    async def remove_calendar(self, name: str, version: int) -> bool:
        found = self._calendars.get(name)
        if found is None or found.version != version:
            return False
        del self._calendars[name]
        return True

    async def add_backfill(self, job: BackfillJob) -> BackfillJob | None:
        key = (job.grain_id.canonical, job.name)
        if key in self._backfills:
            return None
        etag = str(next(self._etags))
        self._backfills[key] = (job.to_record(), etag)
        return BackfillJob.from_record(job.to_record(), etag)

    async def read_backfill(self, grain_id: GrainId, name: str) -> BackfillJob | None:
        found = self._backfills.get((grain_id.canonical, name))
        return None if found is None else BackfillJob.from_record(*found)

    async def read_backfills(self) -> list[BackfillJob]:
        return [BackfillJob.from_record(*self._backfills[k]) for k in sorted(self._backfills)]

    async def update_backfill(self, job: BackfillJob, etag: str) -> str | None:
        key = (job.grain_id.canonical, job.name)
        found = self._backfills.get(key)
        if found is None or found[1] != etag:
            return None
        new = str(next(self._etags))
        self._backfills[key] = (job.to_record(), new)
        return new

    async def remove_backfill(self, grain_id: GrainId, name: str, etag: str | None = None) -> bool:
        key = (grain_id.canonical, name)
        found = self._backfills.get(key)
        if found is None or (etag is not None and found[1] != etag):
            return False
        del self._backfills[key]
        return True

    def changes(self) -> _MemoryChanges:
        """A new subscription, live from this call on (not from the first ``anext``)."""
        sub = _MemoryChanges(self._subscribers)
        self._subscribers.add(sub)
        return sub

    # -- internals ----------------------------------------------------------------

    @staticmethod
    def _key_of(entry: ReminderEntry) -> _Key:
        return (entry.grain_id.canonical, entry.name)

    def _put(self, row: ReminderEntry, seq: int, due_ms: int | None = None) -> None:
        """Store ``row`` at ``seq`` and index it (``due_ms``: its ``next_due`` in
        ms, when the caller has it)."""
        key = self._key_of(row)
        if key in self._rows:
            self._stale += 1
        self._rows[key] = (row, seq)
        if not row.paused:  # paused rows stay out of the due index
            self._index(row, key, seq, to_ms(row.next_due) if due_ms is None else due_ms)
        self._by_grain.setdefault(key[0], {})[row.name] = row
        self._maybe_rebuild()

    def _index(self, row: ReminderEntry, key: _Key, seq: int, due_ms: int) -> None:
        """Add the due-index item of ``row`` (stored under ``key`` at ``seq``).

        Stale items at the head of the lane go first: a row moved to its next
        slot leaves its old item behind, and that item is the earliest due of
        its lane, so under a stream of ticks the lanes stay clean in O(log n)
        per write and ``_maybe_rebuild``'s full pass never comes due.
        """
        h = row.grain_id.uniform_hash()
        lanes = self._due[h >> _SHIFT]
        priority = int(row.priority)
        lane = lanes.get(priority)
        if lane is None:
            lane = lanes[priority] = []
        rows = self._rows
        while lane:
            head = lane[0]
            live = rows.get(head[2])
            if live is not None and live[1] == head[3]:
                break
            heappop(lane)
            self._stale -= 1
        heappush(lane, (due_ms, h, key, seq))

    def _drop(self, key: _Key, row: ReminderEntry) -> None:
        del self._rows[key]
        self._stale += 1
        names = self._by_grain[key[0]]
        del names[row.name]
        if not names:
            del self._by_grain[key[0]]
        self._maybe_rebuild()

    def _maybe_rebuild(self) -> None:
        stale = self._stale
        if stale <= _MIN_STALE_FOR_REBUILD or stale <= len(self._rows):
            return
        shards: list[dict[int, list[_DueItem]]] = [{} for _ in range(1 << _SHARD_BITS)]
        for key, (row, seq) in self._rows.items():
            if row.paused:
                continue
            h = row.hash
            lanes = shards[h >> _SHIFT]
            lanes.setdefault(int(row.priority), []).append((to_ms(row.next_due), h, key, seq))
        for lanes in shards:
            for heap in lanes.values():
                heapify(heap)
        self._due = shards
        self._stale = 0

    def _update(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        found = self._rows.get((grain_id.canonical, name))
        if found is None or found[0].etag != etag:
            return None
        seq = next(self._etags)
        new_etag = str(seq)
        # The stored row is already in storage form; only these three change, so
        # they are normalised alone (a full record round trip per tick cost more
        # than the rest of the CAS).
        due_ms = to_ms(next_due)
        moved = found[0].rescheduled(
            from_ms(due_ms), None if last_fire is None else _stored(last_fire), new_etag
        )
        self._put(moved, seq, due_ms)
        return new_etag

    def _walk_due(
        self,
        r: RingRange | None,
        before_ms: int,
        limit: int,
        skip: Container[str] = (),
        after_ms: int = -1,
    ) -> list[ReminderEntry]:
        found: list[ReminderEntry] = []
        taken = 0
        if limit <= 0:
            return found
        if r is not None and r.size == HASH_SPACE:
            r = None  # the whole ring: no hash to check
        # Visit heap items in order without popping: a node's children are never
        # smaller than it, so a frontier heap of ((-priority, item), heap, index)
        # seeded with the lane roots yields items in the contract's order,
        # touching only those visited. A lane stops at its first item past
        # ``before`` (its children are later still); other lanes go on.
        frontier: list[tuple[int, _DueItem, int, list[_DueItem]]] = []
        for s in _shards_of(r):
            for priority, heap in self._due[s].items():
                if heap and heap[0][0] <= before_ms:
                    frontier.append((-priority, heap[0], 0, heap))
        heapify(frontier)
        while frontier:
            neg_priority, item, i, heap = heappop(frontier)
            due_ms, h, key, seq = item
            live = self._rows.get(key)
            if live is not None and live[1] == seq and due_ms > after_ms and (r is None or h in r):
                taken += 1
                if not skip or live[0].key not in skip:
                    found.append(live[0])
                if taken >= limit:
                    break
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap) and heap[child][0] <= before_ms:
                    heappush(frontier, (neg_priority, heap[child], child, heap))
        return found

    def _publish(
        self,
        grain_id: GrainId,
        name: str,
        next_due: datetime | None,
        priority: int | None = None,
    ) -> None:
        change = ReminderChange(grain_id, name, next_due, priority)
        for sub in self._subscribers:
            sub.offer(change)

    def _close_subscriptions(self) -> None:
        for sub in list(self._subscribers):
            sub.end()


class _WriterView:
    """``InMemoryReminderTable.writer_view``: every attribute is the table's,
    except ``writer`` and the schedule writes, which carry this view's writer."""

    def __init__(self, table: InMemoryReminderTable, writer: SiloAddress) -> None:
        self._table = table
        self.writer = writer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    async def start(self, stack: AsyncExitStack) -> None:
        """Nothing to do: the table itself is started (and closed) by its owner."""

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        update = ScheduleUpdate(grain_id, name, etag, next_due, last_fire)
        return (await self._table.update_schedule_many_as(self.writer, [update]))[0]

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        return await self._table.update_schedule_many_as(self.writer, updates)


def _delegate(name: str) -> Any:
    def method(self: _WriterView, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._table, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


# Every other public method is the table's, as a real attribute of the view: from
# Python 3.12 on, ``isinstance`` against a runtime-checkable protocol (how the service
# finds out a table can fence, page or batch) ignores ``__getattr__``.
for _name in dir(InMemoryReminderTable):
    if (
        not _name.startswith("_")
        and callable(getattr(InMemoryReminderTable, _name))
        and _name not in _WriterView.__dict__
    ):
        setattr(_WriterView, _name, _delegate(_name))


def _shards_of(r: RingRange | None) -> range | list[int]:
    """The shards holding hashes of ``r`` (``None``: the whole ring)."""
    if r is None or r.size == HASH_SPACE:
        return range(1 << _SHARD_BITS)
    if r.begin < r.end:
        return range((r.begin + 1) >> _SHIFT, (r.end >> _SHIFT) + 1)
    # Wraps past the top: 0..end, and begin+1..top unless begin is the top (a
    # shard holding both ends appears once).
    shards = set(range((r.end >> _SHIFT) + 1))
    if r.begin + 1 < HASH_SPACE:
        shards.update(range((r.begin + 1) >> _SHIFT, 1 << _SHARD_BITS))
    return sorted(shards)


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
