"""``PostgresReminderTable``: reminder rows in PostgreSQL, woken by LISTEN/NOTIFY.

One table holds every service's rows (``service_id`` leads every key)::

    orleanspy_reminders
        service_id, grain_id, name     PRIMARY KEY (also serves read_grain)
        grain_hash  bigint             the grain's ring position, 0 .. 2**32-1
        bucket      smallint           grain_hash >> 24: 256 slices of the ring
        priority    smallint           -128 .. 127, higher first
        next_due    bigint             ms since the epoch (as start_at, last_fire)
        declared    boolean            made by a @register_reminder declaration
        paused      boolean            out of the due index (see below)
        grace_ms    bigint             the row's missed-tick grace, NULL: the default
        extras      bytea              the optional schedule fields, msgpack of
                                       ``ReminderEntry.extras_record`` (NULL: none)
        fingerprint text               a declared row's declaration (NULL: none)
        version     bigint             the etag; every write takes a fresh value
                                       from the sequence orleanspy_reminder_version
    index (service_id, priority, bucket, next_due) WHERE NOT paused   read_due
    index (service_id, priority, next_due) WHERE NOT paused           upcoming
    index (service_id, grain_hash)                                    read_range
    index (service_id, grain_id "C", name "C")             read_page, count_types

    orleanspy_reminder_history         fire history, newest ``keep`` per row
        service_id, grain_id, name     the row (FOREIGN KEY ... ON DELETE CASCADE)
        batch, i                       order: the append's number (a sequence)
                                       and the record's place in it
        slot, at, outcome, silo, triggered, attempt, final

    orleanspy_reminder_ended_history   histories of ended rows (``end``), kept
        the history's columns, ended_at    ENDED_HISTORY_KEPT; no foreign key

    orleanspy_reminder_fences          fenced writers (``FencingReminderTable``)
        service_id, writer, fenced_at      PK (service_id, writer)

    orleanspy_reminder_audit           the operator audit log (``audit``: its own
                                       schema component, ``reminder_audit``)

    orleanspy_reminder_counters        a row's counters (``CountingReminderTable``;
        the row's key, one bigint per      component reminder_counters; FOREIGN KEY
        counter, last_error, ..._at        ... ON DELETE CASCADE)

    orleanspy_reminder_dead_letters    the service's dead letters (``DeadLetterTable``;
        service_id, id, grain_id, name,    component reminder_dead_letters)
        at, record

    orleanspy_reminder_index, orleanspy_reminder_calendars,
    orleanspy_reminder_backfills       the label index, calendars and backfill
                                       jobs (``stores``: components of their own)

The schema is versioned: ``migrations.STEPS``, one step per version, applied
by ``start`` (that module says what each version added). The statements are
``sql``'s, the row's columns and back ``rows``', the LISTEN connection and its
feeds ``feed``'s.

Paused rows. The due indexes hold only rows that are not paused, and every
due query says ``NOT paused`` (so the planner can use them): a paused row costs
``read_due`` nothing. ``upsert``/``upsert_if``/``upsert_many`` write the flag
with the row; a schedule CAS leaves it. Every published write of a paused row
notifies as a removal (``hash||grain|name``, no priority).

Fire history. ``append_history`` is one statement: it locks the named rows
that exist (``FOR KEY SHARE``, which no upsert or CAS waits for), inserts the
newest ``keep`` new records per row and deletes the old ones past ``keep``.
The foreign key makes history the row's: ``remove`` cascades to it, an upsert
(an update in place) keeps it, and records of a missing row are never inserted.

``read_due(r, before, limit)`` orders by priority (higher first), then
``next_due``. A loose index scan finds the priorities in use (one index
descent each, a handful in practice), and for each priority and each bucket
the range overlaps, an index range scan over ``next_due <= before`` returns its
earliest rows (the hash bounds filter only the two edge buckets, inside the
index). A range of few buckets asks each scan for ``limit`` rows; a range of
many asks for a fair share first and then asks again only the scans that may
hide winners (see ``read_due``). So a read looks at no row that is not due: the
cost follows the rows returned and the buckets touched, never the rows of the
table. A range that wraps is just more buckets. ``upcoming`` is ``read_due`` over the
whole ring; it skips the buckets: per priority in use, one index range scan
of ``(service_id, priority, next_due)``.

Every write is one statement: the change, checked against ``version`` where
the contract asks for a compare-and-swap, and, except for a schedule CAS (the
owner's own write, not published: ``ReminderTable.update_schedule``), a
``pg_notify`` on the service's channel carrying
``hash:priority|next_due_ms|grain|name`` for writes of a whole row (``upsert``,
``upsert_if``, ``upsert_many``) or ``hash||grain|name`` for a removal.
PostgreSQL sends the notification at commit, so a listener never hears of a
write that did not happen.

``changes()`` feeds are served by one LISTEN connection per table. When that
connection is lost the table reconnects and re-LISTENs in the background; once
it listens again, every open feed raises ``StorageUnavailableError`` once, so
its reader (the reminder service) opens a new feed and re-reads its ranges.
Nothing is lost: a write committed before the new LISTEN is in that re-read,
one committed after reaches the new feed.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from orleanspy._postgres import Pool, migrate, open_pool, translate_errors
from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.audit import AuditQuery, AuditRecord, AuditRetention
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import CounterDelta, ReminderCounters
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.model import FireOutcome, FireRecord, ReminderEntry, ScheduleUpdate
from orleanspy.reminders.postgres import sql
from orleanspy.reminders.postgres.audit import AUDIT_COMPONENT, AUDIT_STEPS, PostgresAuditLog
from orleanspy.reminders.postgres.feed import Listener, PostgresChanges
from orleanspy.reminders.postgres.migrations import (
    COMPONENT,
    COUNTERS_COMPONENT,
    COUNTERS_STEPS,
    DEAD_LETTERS_COMPONENT,
    DEAD_LETTERS_STEPS,
    STEPS,
)
from orleanspy.reminders.postgres.records import PostgresRecords
from orleanspy.reminders.postgres.rows import (
    BUCKET_SHIFT,
    channel_of,
    decode_row,
    due_order,
    index_terms,
    ms_or_none,
    raw_rank,
    row_values,
    slices,
    version_of,
)
from orleanspy.reminders.postgres.stores import COMPONENTS, PostgresStores, ix_terms
from orleanspy.reminders.table import (
    ENDED_HISTORY_KEPT,
    ReminderTableBase,
    check_page_limit,
    grain_prefix,
    key_cursor,
    parse_key_cursor,
)
from orleanspy.ring import RingRange
from orleanspy.schema import SchemaVersion

__all__ = ["PostgresReminderTable"]

# read_due's first pass asks each scan for at least this many rows.
_MIN_FIRST_ASK: Final = 16
# upsert_many writes at most this many rows per statement (and commit).
_MANY_CHUNK: Final = 1000
#: History batches from this many records on are planned for their size
#: (``append_history``): below it, the extra round trips and the planning cost
#: more than a generic plan loses (measured: 250 records 19 ms custom, 16 ms
#: generic; 500 records 33 ms custom, 39 ms generic).
_CUSTOM_PLAN_FROM: Final = 400


class PostgresReminderTable(ReminderTableBase):
    """A ``ReminderTable`` in PostgreSQL; also a ``BatchingReminderTable``,
    ``ConditionalReminderTable``, ``BulkReminderTable`` and
    ``PausableReminderTable`` (paused rows and fire history).

    ``url_or_pool``: a ``postgresql://`` URL (the table opens a pool and a
    LISTEN connection, both closed with the start stack) or an ``asyncpg``
    pool (used as is and never closed here; the LISTEN connection is then
    acquired from it and released on close). ``start`` creates or migrates the
    schema.
    """

    schema = SchemaVersion("postgres", COMPONENT, len(STEPS))
    #: Every schema component the table keeps, each migrated on its own.
    schemas = (
        schema,
        SchemaVersion("postgres", COUNTERS_COMPONENT, len(COUNTERS_STEPS)),
        SchemaVersion("postgres", DEAD_LETTERS_COMPONENT, len(DEAD_LETTERS_STEPS)),
        SchemaVersion("postgres", AUDIT_COMPONENT, len(AUDIT_STEPS)),
        *(SchemaVersion("postgres", name, len(steps)) for name, steps in COMPONENTS),
    )

    def __init__(self, url_or_pool: str | Pool, *, service_id: str) -> None:
        self.service_id = service_id
        self._source = url_or_pool
        self._pool: Pool | None = None
        self._channel = channel_of(service_id)
        self._listener: Listener | None = None
        self._audit: PostgresAuditLog | None = None
        self._records: PostgresRecords | None = None
        self._stores: PostgresStores | None = None
        #: The incarnation this instance writes for (``FencingReminderTable``).
        self.writer: SiloAddress | None = None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect, create or migrate the schema, and LISTEN for changes.

        Raises ``StorageUnavailableError`` if the server cannot be reached,
        ``StorageError`` if the stored schema is newer than this release knows.
        A second call does nothing (the first start's stack owns the connections).
        """
        if self._pool is not None:
            return
        pool = await open_pool(self._source, stack)
        self.migration = await migrate(pool, COMPONENT, STEPS)
        # After the rows' component: the counters' and the index's tables refer to the rows'.
        self.migrations = [
            self.migration,
            await migrate(pool, COUNTERS_COMPONENT, COUNTERS_STEPS),
            await migrate(pool, DEAD_LETTERS_COMPONENT, DEAD_LETTERS_STEPS),
            await migrate(pool, AUDIT_COMPONENT, AUDIT_STEPS),
            *[await migrate(pool, name, steps) for name, steps in COMPONENTS],
        ]
        self._pool = pool
        self._records = PostgresRecords(pool, self.service_id)
        self._audit = PostgresAuditLog(pool, self.service_id, self._channel)
        self._stores = PostgresStores(pool, self.service_id)
        listener = Listener(self._source, self._channel)
        await listener.start()
        # Pushed after the pool's close, so it unwinds first.
        stack.push_async_callback(listener.close)
        self._listener = listener

    @property
    def _p(self) -> Pool:
        if self._pool is None:
            raise RuntimeError("PostgresReminderTable used before start()")
        return self._pool

    # -- writes ---------------------------------------------------------------------

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row unconditionally; returns its new etag."""
        with translate_errors("reminder upsert"):
            version = await self._p.fetchval(
                sql.UPSERT, self.service_id, *row_values(entry), self._channel, index_terms(entry)
            )
        return str(version)

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` only if the row is absent (``expected_etag`` ``None``) or has
        ``expected_etag``; the new etag, or ``None`` (nothing written, nothing
        published) when that does not hold. One statement either way: an insert
        that does nothing on conflict, or an update checked against ``version``."""
        extra: tuple[int, ...] = ()
        if expected_etag is None:
            statement = sql.INSERT_IF_ABSENT
        else:
            version = version_of(expected_etag)
            if version is None:
                return None
            statement, extra = sql.REPLACE_IF, (version,)
        with translate_errors("reminder upsert_if"):
            new = await self._p.fetchval(
                statement,
                self.service_id,
                *row_values(entry),
                self._channel,
                *extra,
                index_terms(entry),
            )
        return None if new is None else str(new)

    async def upsert_if_many(
        self, writes: Sequence[tuple[ReminderEntry, str | None]]
    ) -> list[str | None]:
        """Two statements per ``_MANY_CHUNK`` rows: the inserts of rows that must
        be absent (``ON CONFLICT DO NOTHING``) and the replaces of rows that must
        have an etag (an ``UPDATE ... FROM unnest`` checked against ``version``).
        Keys are unique within a batch (the contract), so each returned row
        names its write."""
        out: list[str | None] = [None] * len(writes)
        for start in range(0, len(writes), _MANY_CHUNK):
            absent: list[int] = []
            present: list[int] = []
            for i in range(start, min(start + _MANY_CHUNK, len(writes))):
                etag = writes[i][1]
                if etag is None:
                    absent.append(i)
                elif version_of(etag) is not None:
                    present.append(i)  # an etag that is no version of ours never matches
            for indices, statement in (
                (absent, sql.INSERT_MANY_IF_ABSENT),
                (present, sql.REPLACE_MANY_IF),
            ):
                if not indices:
                    continue
                columns: list[list[Any]] = [[] for _ in range(sql.ROW_WIDTH)]
                for i in indices:
                    for column, value in zip(columns, row_values(writes[i][0]), strict=True):
                        column.append(value)
                extra: list[Any] = []
                if statement is sql.REPLACE_MANY_IF:
                    extra.append([version_of(writes[i][1] or "") for i in indices])
                extra.append([ix_terms(writes[i][0]) for i in indices])
                with translate_errors("reminder upsert_if_many"):
                    records = await self._p.fetch(
                        statement, self.service_id, *columns, self._channel, *extra
                    )
                at = {(writes[i][0].grain_id.canonical, writes[i][0].name): i for i in indices}
                for rec in records:
                    out[at[(rec["grain_id"], rec["name"])]] = str(rec["version"])
        return out

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """One statement: the rows of every grain (primary-key prefix scans)."""
        if not grain_ids:
            return []
        with translate_errors("reminder read_grains"):
            records = await self._p.fetch(
                sql.READ_GRAINS, self.service_id, [g.canonical for g in grain_ids]
            )
        found: dict[str, list[ReminderEntry]] = {}
        for rec in records:
            found.setdefault(rec["grain_id"], []).append(decode_row(rec))
        out = [found.get(g.canonical, []) for g in grain_ids]
        for rows in out:
            rows.sort(key=lambda row: row.name)
        return out

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        """``upsert`` each entry, in order; their new etags in order.

        One ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO UPDATE`` per
        round of at most ``_MANY_CHUNK`` rows. A key repeated in ``entries`` goes
        in a later round (one statement cannot write a row twice), so the last
        entry of a key is what stays, as with single calls. Not a transaction:
        after a ``StorageUnavailableError`` earlier rounds have been written.
        """
        etags = [""] * len(entries)
        pending = list(range(len(entries)))
        while pending:
            seen: set[tuple[str, str]] = set()
            now: list[int] = []
            later: list[int] = []
            for i in pending:
                key = (entries[i].grain_id.canonical, entries[i].name)
                (later if key in seen or len(now) >= _MANY_CHUNK else now).append(i)
                seen.add(key)
            await self._upsert_round(entries, now, etags)
            pending = later
        return etags

    async def _upsert_round(
        self, entries: Sequence[ReminderEntry], indices: list[int], etags: list[str]
    ) -> None:
        columns: list[list[Any]] = [[] for _ in range(sql.ROW_WIDTH)]
        for i in indices:
            for column, value in zip(columns, row_values(entries[i]), strict=True):
                column.append(value)
        with translate_errors("reminder upsert_many"):
            records = await self._p.fetch(
                sql.UPSERT_MANY,
                self.service_id,
                *columns,
                self._channel,
                [ix_terms(entries[i]) for i in indices],
            )
        # Keys are unique within a round, so each returned row names its entry.
        at = {(entries[i].grain_id.canonical, entries[i].name): i for i in indices}
        for rec in records:
            etags[at[(rec["grain_id"], rec["name"])]] = str(rec["version"])
        if len(records) != len(indices):
            raise StorageError(f"reminder upsert_many wrote {len(records)} of {len(indices)} rows")

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        """CAS on the version: the new etag, or ``None`` if the row is gone or moved on."""
        version = version_of(etag)
        if version is None:
            return None
        with translate_errors("reminder update_schedule"):
            new = await self._p.fetchval(
                sql.UPDATE_ONE,
                self.service_id,
                grain_id.canonical,
                name,
                version,
                to_ms(next_due),
                ms_or_none(last_fire),
                self._writer_text,
            )
        return None if new is None else str(new)

    @property
    def _writer_text(self) -> str | None:
        return None if self.writer is None else str(self.writer)

    async def fence(
        self,
        writer: SiloAddress,
        *,
        at: datetime | None = None,
        prune_before: datetime | None = None,
    ) -> None:
        """Insert ``writer`` into the fence table (its time raised if already
        there); with ``prune_before``, delete the service's older fences (never
        ``writer``'s), in the same transaction."""
        member = str(writer)
        with translate_errors("reminder fence"):
            async with self._p.acquire() as conn, conn.transaction():
                await conn.execute(
                    sql.FENCE, self.service_id, member, to_ms(at or datetime.now(UTC))
                )
                if prune_before is not None:
                    await conn.execute(
                        sql.PRUNE_FENCES, self.service_id, to_ms(prune_before), member
                    )

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update, in order: one statement over
        ``unnest`` arrays (a round per repeat of a key within the batch, since
        a later update of a key must see the earlier one's outcome).

        Each statement is atomic; on ``StorageUnavailableError`` an earlier
        round may have applied. Retrying is safe: an applied update then
        reports a lost race.
        """
        results: list[str | None] = [None] * len(updates)
        pending = [i for i, u in enumerate(updates) if version_of(u.etag) is not None]
        while pending:
            seen: set[tuple[str, str]] = set()
            now: list[int] = []
            later: list[int] = []
            for i in pending:
                key = (updates[i].grain_id.canonical, updates[i].name)
                (later if key in seen else now).append(i)
                seen.add(key)
            if later:
                # A repeat of a key that this round updates can only win against
                # the etag this round makes, which its caller cannot know.
                won_keys = await self._update_round(updates, now, results)
                later = [
                    i
                    for i in later
                    if (updates[i].grain_id.canonical, updates[i].name) not in won_keys
                ]
            else:
                await self._update_round(updates, now, results)
            pending = later
        return results

    async def _update_round(
        self, updates: Sequence[ScheduleUpdate], indices: list[int], results: list[str | None]
    ) -> set[tuple[str, str]]:
        # Key order, so two batches touching the same rows lock them in one order.
        indices = sorted(indices, key=lambda i: (updates[i].grain_id.canonical, updates[i].name))
        with translate_errors("reminder update_schedule_many"):
            records = await self._p.fetch(
                sql.UPDATE_MANY,
                self.service_id,
                [updates[i].grain_id.canonical for i in indices],
                [updates[i].name for i in indices],
                [version_of(updates[i].etag) for i in indices],
                [to_ms(updates[i].next_due) for i in indices],
                [ms_or_none(updates[i].last_fire) for i in indices],
                self._writer_text,
            )
        won: set[tuple[str, str]] = set()
        for rec in records:
            i = indices[int(rec["i"]) - 1]
            results[i] = str(rec["version"])
            won.add((updates[i].grain_id.canonical, updates[i].name))
        return won

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if its etag is ``etag``; ``False`` if missing or moved on."""
        version = version_of(etag)
        if version is None:
            return False
        with translate_errors("reminder remove"):
            records = await self._p.fetch(
                sql.REMOVE, self.service_id, grain_id.canonical, name, version, self._channel
            )
        return bool(records)

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """``remove``, keeping the row's history in the ended histories for
        ``ENDED_HISTORY_KEPT`` (``sql.END``: one statement)."""
        version = version_of(etag)
        if version is None:
            return False
        now = to_ms(datetime.now(UTC))
        cutoff = now - ENDED_HISTORY_KEPT // timedelta(milliseconds=1)
        with translate_errors("reminder end"):
            records = await self._p.fetch(
                sql.END,
                self.service_id,
                grain_id.canonical,
                name,
                version,
                self._channel,
                now,
                cutoff,
            )
        return bool(records)

    # -- counters and dead letters (``records``) -------------------------------------

    @property
    def _r(self) -> PostgresRecords:
        if self._records is None:
            raise RuntimeError("PostgresReminderTable used before start()")
        return self._records

    async def add_counts(self, deltas: Sequence[CounterDelta]) -> None:
        await self._r.add_counts(deltas)

    async def read_counts(self, grain_id: GrainId, name: str) -> ReminderCounters:
        return await self._r.read_counts(grain_id, name)

    async def add_dead_letters(
        self, letters: Sequence[DeadLetter], *, keep: int, expire_before: datetime
    ) -> None:
        await self._r.add_letters(letters, keep, expire_before)

    async def read_dead_letters(
        self,
        cursor: str | None,
        limit: int,
        *,
        grain_id: GrainId | None = None,
        name: str | None = None,
    ) -> tuple[list[DeadLetter], str | None]:
        return await self._r.page(cursor, limit, grain_id, name)

    async def read_dead_letter(self, letter_id: str) -> DeadLetter | None:
        return await self._r.get(letter_id)

    async def remove_dead_letter(self, letter_id: str) -> bool:
        return await self._r.remove(letter_id)

    async def count_dead_letters(self) -> int:
        return await self._r.count()

    # -- the audit log (``audit.PostgresAuditLog``; ``AuditedReminderTable``) ---------

    @property
    def _log(self) -> PostgresAuditLog:
        if self._audit is None:
            raise RuntimeError("PostgresReminderTable used before start()")
        return self._audit

    async def upsert_if_audited(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        """``upsert_if`` and the record, in one statement."""
        return await self._log.upsert_if(entry, expected_etag, record, retention)

    async def remove_audited(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        """``remove`` and the record, in one statement."""
        return await self._log.remove(grain_id, name, etag, record, retention)

    async def append_audit(self, record: AuditRecord, retention: AuditRetention) -> None:
        await self._log.append(record, retention)

    async def settle_audit(self, record: AuditRecord) -> bool:
        return await self._log.settle(record)

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        return await self._log.read(query)

    # -- fire history ---------------------------------------------------------------

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """Append ``records`` (oldest first) to their rows' histories, keeping the
        newest ``keep`` per row; records of missing rows are dropped. One
        statement (``sql.APPEND_HISTORY``; from ``_CUSTOM_PLAN_FROM`` records, in a
        transaction that sets its plan mode), atomic: all of it is written or
        none."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        if not records:
            return
        args = (
            self.service_id,
            [r.grain_id.canonical for r in records],
            [r.name for r in records],
            [to_ms(r.slot) for r in records],
            [to_ms(r.at) for r in records],
            [r.outcome.value for r in records],
            [r.silo for r in records],
            [r.triggered for r in records],
            [r.error for r in records],
            [r.attempt for r in records],
            [r.final for r in records],
            keep,
            [r.backfill for r in records],
        )
        with translate_errors("reminder append_history"):
            if len(records) < _CUSTOM_PLAN_FROM:
                await self._p.execute(sql.APPEND_HISTORY, *args)
                return
            async with self._p.acquire() as conn, conn.transaction():
                # A plan for these arrays' sizes: after five runs of a prepared
                # statement PostgreSQL may switch to a generic plan, which for
                # a large batch is several times slower (110 ms against 37 for
                # 1,000 records over full histories). LOCAL: pooled sessions
                # keep no settings.
                await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                await conn.execute(sql.APPEND_HISTORY, *args)

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        """The row's fire history, newest first (empty if none or no row)."""
        with translate_errors("reminder read_history"):
            kept_since = to_ms(datetime.now(UTC)) - ENDED_HISTORY_KEPT // timedelta(milliseconds=1)
            records = await self._p.fetch(
                sql.READ_HISTORY, self.service_id, grain_id.canonical, name, kept_since
            )
        try:
            return [
                FireRecord(
                    grain_id=grain_id,
                    name=name,
                    slot=from_ms(rec["slot"]),
                    at=from_ms(rec["at"]),
                    outcome=FireOutcome(rec["outcome"]),
                    silo=rec["silo"],
                    triggered=bool(rec["triggered"]),
                    error=rec["error"],
                    attempt=int(rec["attempt"]),
                    final=bool(rec["final"]),
                    backfill=bool(rec["backfill"]),
                )
                for rec in records
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed reminder history in postgresql: {exc}") from exc

    # -- reads ----------------------------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        with translate_errors("reminder read"):
            rec = await self._p.fetchrow(sql.READ_ROW, self.service_id, grain_id.canonical, name)
        return None if rec is None else decode_row(rec)

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of the grain in name order (a primary-key prefix scan)."""
        with translate_errors("reminder read_grain"):
            records = await self._p.fetch(sql.READ_GRAIN, self.service_id, grain_id.canonical)
        rows = [decode_row(rec) for rec in records]
        rows.sort(key=lambda row: row.name)
        return rows

    async def read_page(
        self,
        cursor: str | None,
        limit: int,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows in byte order of (grain id, name), one index range scan of the
        "C" grain index from the cursor (the last key, as JSON)."""
        check_page_limit(limit)
        prefix = grain_prefix(type_name, key_prefix)
        after = parse_key_cursor(cursor)
        # The first string after every string with the prefix: its last char + 1.
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else None
        statement = sql.READ_PAGE if upper is not None else sql.READ_PAGE_ALL
        with translate_errors("reminder read_page"):
            records = await self._p.fetch(
                statement, self.service_id, after[0], after[1], prefix, upper, limit + 1
            )
        rows = [decode_row(rec) for rec in records[:limit]]
        if len(records) <= limit:
            return rows, None
        return rows, key_cursor(rows[-1])

    async def count_types(self) -> dict[str, int]:
        with translate_errors("reminder count_types"):
            records = await self._p.fetch(sql.COUNT_TYPES, self.service_id)
        return {rec["type_name"]: int(rec["n"]) for rec in records if rec["n"]}

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (index range scans)."""
        rows: list[ReminderEntry] = []
        with translate_errors("reminder read_range"):
            for lo, hi in r.intervals():
                records = await self._p.fetch(sql.READ_RANGE, self.service_id, lo, hi)
                rows.extend(decode_row(rec) for rec in records)
        rows.sort(key=lambda row: (row.hash, row.key))
        return rows

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
        """Due rows of ``r``: priority descending, then ``next_due`` ascending (ties by
        hash, then key), at most ``limit``, less the rows whose key is in ``skip``
        (``read_due`` is this with nothing to skip). See the module doc for the
        index.

        When the range spans many buckets, a first statement asks each (priority,
        bucket) scan for about twice its fair share of ``limit``. Only a scan that
        returned its full share, ending at or before the ``limit``-th best row seen,
        may hide more winners; only those are asked again, for up to ``limit``
        rows. So a whole-ring read moves about ``2 x limit`` rows, not ``limit``
        per bucket. The scans are ordered on the raw columns, so that skipped
        rows (the ones the reader holds) are never decoded into entries; they
        count towards ``limit``. With ``take`` only the first ``take`` rows not
        skipped are decoded."""
        if limit <= 0:
            return []
        buckets, los, his = slices(r)
        before_ms = to_ms(before)
        after_ms = -1 if after is None else to_ms(after)
        ask = max(_MIN_FIRST_ASK, -(-2 * limit // len(buckets)))
        first = min(ask, limit)
        # Few buckets: each scan asks for all of ``limit`` and one statement-wide
        # LIMIT keeps the answer to ``limit`` rows; many: a fair share per scan.
        with translate_errors("reminder read_due"):
            records = list(
                await self._p.fetch(
                    sql.READ_DUE,
                    self.service_id,
                    before_ms,
                    first,
                    buckets,
                    los,
                    his,
                    limit if ask >= limit else None,
                    after_ms,
                )
            )
        records.sort(key=raw_rank)
        if ask < limit:
            threshold = raw_rank(records[limit - 1])[:2] if len(records) >= limit else None
            groups: dict[tuple[int, int], list[Any]] = {}
            for rec in records:
                group = (rec["priority"], rec["grain_hash"] >> BUCKET_SHIFT)
                groups.setdefault(group, []).append(rec)
            again = [
                group
                for group, found in groups.items()
                if len(found) == ask and (threshold is None or raw_rank(found[-1])[:2] <= threshold)
            ]
            if again:
                bounds = dict(zip(buckets, zip(los, his, strict=True), strict=True))
                with translate_errors("reminder read_due"):
                    more = await self._p.fetch(
                        sql.READ_DUE_GROUPS,
                        self.service_id,
                        before_ms,
                        limit,
                        [p for p, _ in again],
                        [b for _, b in again],
                        [bounds[b][0] for _, b in again],
                        [bounds[b][1] for _, b in again],
                        after_ms,
                    )
                seen = {(rec["grain_id"], rec["name"]) for rec in records}
                records.extend(m for m in more if (m["grain_id"], m["name"]) not in seen)
                records.sort(key=raw_rank)
        kept = (rec for rec in records[:limit] if f"{rec['grain_id']}|{rec['name']}" not in skip)
        return [decode_row(rec) for rec in itertools.islice(kept, take)]

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """``read_due`` over the whole ring: rows with ``next_due <= before``,
        priority descending, then ``next_due`` (ties by hash, then key), at most
        ``limit``. One index range scan per priority in use (the upcoming index)."""
        if limit <= 0:
            return []
        with translate_errors("reminder upcoming"):
            records = await self._p.fetch(sql.UPCOMING, self.service_id, to_ms(before), limit)
        rows = [decode_row(rec) for rec in records]
        rows.sort(key=due_order)
        return rows

    async def count(self) -> int:
        """How many rows the service has (an index-only count: PostgreSQL keeps no
        row count, so this grows with the table; tools only)."""
        with translate_errors("reminder count"):
            n = await self._p.fetchval(sql.COUNT, self.service_id)
        return int(n)

    # -- the label index, calendars, backfills (``stores.PostgresStores``) -------------

    @property
    def _s(self) -> PostgresStores:
        if self._stores is None:
            raise RuntimeError("PostgresReminderTable used before start()")
        return self._stores

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows carrying every term, in key order (the index table's primary key)."""
        return await self._s.read_indexed(terms, cursor, limit)

    async def count_indexed(self, term: str) -> int:
        """An index-only count of the term's entries."""
        return await self._s.count_indexed(term)

    async def write_calendar(self, name: str, calendar: Calendar) -> StoredCalendar:
        return await self._s.write_calendar(name, calendar)

    async def read_calendar(self, name: str) -> StoredCalendar | None:
        return await self._s.read_calendar(name)

    async def read_calendars(self) -> list[StoredCalendar]:
        return await self._s.read_calendars()

    async def remove_calendar(self, name: str, version: int) -> bool:
        return await self._s.remove_calendar(name, version)

    async def add_backfill(self, job: BackfillJob) -> BackfillJob | None:
        return await self._s.add_backfill(job)

    async def read_backfill(self, grain_id: GrainId, name: str) -> BackfillJob | None:
        return await self._s.read_backfill(grain_id, name)

    async def read_backfills(self) -> list[BackfillJob]:
        return await self._s.read_backfills()

    async def update_backfill(self, job: BackfillJob, etag: str) -> str | None:
        return await self._s.update_backfill(job, etag)

    async def remove_backfill(self, grain_id: GrainId, name: str, etag: str | None = None) -> bool:
        return await self._s.remove_backfill(grain_id, name, etag)

    # -- change feed ----------------------------------------------------------------

    def changes(self) -> PostgresChanges:
        """A new subscription, receiving every change from this call on.

        The table's LISTEN connection is already listening, so nothing
        committed after this call is missed while the connection holds. When
        it is lost and listens again, the feed raises
        ``StorageUnavailableError`` once (changes may have been missed: re-read);
        it ends on ``aclose`` or when the table is closed.
        """
        if self._listener is None:
            raise RuntimeError("PostgresReminderTable used before start()")
        return self._listener.subscribe()
