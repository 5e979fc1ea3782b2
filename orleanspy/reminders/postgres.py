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

The schema is versioned (``_SCHEMA``, one step per version, applied by
``start``): version 2 added ``declared``, the upcoming index (in place of
v1's ``(service_id, next_due)``) and the notification with a priority;
version 3 added ``paused`` (both due indexes rebuilt as partial indexes) and
the history table; version 4 added ``grace_ms`` and the history's ``error``;
version 5 added ``extras`` (jitter, bounds, payload, retry: one column, since
only the service reads them and no index needs them), the history's
``attempt`` and ``final``, and the ended histories; version 6 added
``fingerprint`` and the grain index in byte order; version 7 added the fence table.

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

import hashlib
import itertools
import json
from collections.abc import Container, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from orleanspy._postgres import Pool, migrate, open_pool, translate_errors
from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders._pg_feed import Listener, PostgresChanges
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    ReminderEntry,
    ScheduleUpdate,
    extras_from_record,
)
from orleanspy.reminders.table import ENDED_HISTORY_KEPT, grain_prefix
from orleanspy.ring import RingRange
from orleanspy.serialization import pack, unpack

__all__ = ["PostgresReminderTable"]

_BUCKET_SHIFT: Final = 24
# read_due's first pass asks each scan for at least this many rows.
_MIN_FIRST_ASK: Final = 16
# upsert_many writes at most this many rows per statement (and commit).
_MANY_CHUNK: Final = 1000
# A notification payload must stay below 8000 bytes; longer ones (huge grain
# keys) are sent as "hash|!" and make every feed re-read, losing nothing.
_MAX_PAYLOAD: Final = 7900

_SCHEMA: Final[tuple[tuple[str, ...], ...]] = (
    (
        "CREATE SEQUENCE IF NOT EXISTS orleanspy_reminder_version",
        """CREATE TABLE IF NOT EXISTS orleanspy_reminders (
            service_id text NOT NULL,
            grain_id text NOT NULL,
            name text NOT NULL,
            grain_hash bigint NOT NULL,
            bucket smallint NOT NULL,
            priority smallint NOT NULL,
            start_at bigint NOT NULL,
            next_due bigint NOT NULL,
            period_ms bigint,
            cron text,
            tz text,
            last_fire bigint,
            action smallint NOT NULL,
            version bigint NOT NULL,
            PRIMARY KEY (service_id, grain_id, name)
        )""",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminders_due "
        "ON orleanspy_reminders (service_id, priority, bucket, next_due)",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminders_hash "
        "ON orleanspy_reminders (service_id, grain_hash)",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminders_next_due "
        "ON orleanspy_reminders (service_id, next_due)",
        f"""CREATE OR REPLACE FUNCTION orleanspy_reminder_notify(
                channel text, h bigint, due bigint, g text, n text) RETURNS void
            LANGUAGE sql AS $$
            SELECT pg_notify(channel, CASE WHEN octet_length(p) < {_MAX_PAYLOAD}
                                           THEN p ELSE h || '|!' END)
            FROM (SELECT h || '|' || coalesce(due::text, '') || '|' || g || '|' || n AS p) x
            $$""",
    ),
    # v2: the declared flag; upcoming in the due order (priority first) gets an
    # index of its own in place of (service_id, next_due); changes of whole-row
    # writes carry the priority. The priority rides in the first field, which
    # v1 readers skip, so silos of both versions read each other's payloads;
    # the v1 function stays for v1 silos still writing during an upgrade.
    (
        "ALTER TABLE orleanspy_reminders "
        "ADD COLUMN IF NOT EXISTS declared boolean NOT NULL DEFAULT false",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminders_upcoming "
        "ON orleanspy_reminders (service_id, priority, next_due)",
        "DROP INDEX IF EXISTS orleanspy_reminders_next_due",
        f"""CREATE OR REPLACE FUNCTION orleanspy_reminder_notify(
                channel text, h bigint, due bigint, g text, n text, prio smallint)
            RETURNS void
            LANGUAGE sql AS $$
            SELECT pg_notify(channel, CASE WHEN octet_length(p) < {_MAX_PAYLOAD}
                                           THEN p ELSE h || '|!' END)
            FROM (SELECT h || coalesce(':' || prio::text, '') || '|'
                         || coalesce(due::text, '') || '|' || g || '|' || n AS p) x
            $$""",
    ),
    # v3: paused rows and fire history. The due and upcoming indexes become
    # partial (paused rows are not in them; every due query says NOT paused so
    # the planner may use them); history rows hang off their reminder row and
    # go with it. v2 silos still running during an upgrade neither set nor
    # read the flag: their upserts keep it, their due reads scan the table.
    (
        "ALTER TABLE orleanspy_reminders "
        "ADD COLUMN IF NOT EXISTS paused boolean NOT NULL DEFAULT false",
        "DROP INDEX IF EXISTS orleanspy_reminders_due",
        "CREATE INDEX orleanspy_reminders_due "
        "ON orleanspy_reminders (service_id, priority, bucket, next_due) WHERE NOT paused",
        "DROP INDEX IF EXISTS orleanspy_reminders_upcoming",
        "CREATE INDEX orleanspy_reminders_upcoming "
        "ON orleanspy_reminders (service_id, priority, next_due) WHERE NOT paused",
        "CREATE SEQUENCE IF NOT EXISTS orleanspy_reminder_history_batch",
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_history (
            service_id text NOT NULL,
            grain_id text NOT NULL,
            name text NOT NULL,
            batch bigint NOT NULL,
            i bigint NOT NULL,
            slot bigint NOT NULL,
            at bigint NOT NULL,
            outcome text NOT NULL,
            silo text NOT NULL,
            triggered boolean NOT NULL,
            PRIMARY KEY (service_id, grain_id, name, batch, i),
            FOREIGN KEY (service_id, grain_id, name)
                REFERENCES orleanspy_reminders (service_id, grain_id, name) ON DELETE CASCADE
        )""",
    ),
    # v4: a row's own missed-tick grace; a failed tick's exception in its fire
    # record. Both nullable: v3 silos still running during an upgrade neither
    # write nor read them (their upserts leave grace_ms as it was).
    (
        "ALTER TABLE orleanspy_reminders ADD COLUMN IF NOT EXISTS grace_ms bigint",
        "ALTER TABLE orleanspy_reminder_history ADD COLUMN IF NOT EXISTS error text",
    ),
    # v5: the optional schedule fields of a row (one-shot rows need no column:
    # period_ms and cron are both NULL), and a history record's attempt and
    # final flag. v4 silos still running during an upgrade neither write nor
    # read them: their whole-row writes leave extras as they are.
    (
        "ALTER TABLE orleanspy_reminders ADD COLUMN IF NOT EXISTS extras bytea",
        "ALTER TABLE orleanspy_reminder_history "
        "ADD COLUMN IF NOT EXISTS attempt smallint NOT NULL DEFAULT 1",
        "ALTER TABLE orleanspy_reminder_history "
        "ADD COLUMN IF NOT EXISTS final boolean NOT NULL DEFAULT false",
        # The histories of ended rows (``end``), kept for ENDED_HISTORY_KEPT after
        # their rows went: no foreign key, swept by ended_at as rows end.
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_ended_history (
            service_id text NOT NULL,
            grain_id text NOT NULL,
            name text NOT NULL,
            batch bigint NOT NULL,
            i bigint NOT NULL,
            slot bigint NOT NULL,
            at bigint NOT NULL,
            outcome text NOT NULL,
            silo text NOT NULL,
            triggered boolean NOT NULL,
            error text,
            attempt smallint NOT NULL,
            final boolean NOT NULL,
            ended_at bigint NOT NULL,
            PRIMARY KEY (service_id, grain_id, name, batch, i)
        )""",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_ended_history_at "
        "ON orleanspy_reminder_ended_history (service_id, ended_at)",
    ),
    # v6: declared rows keep the fingerprint of their declaration; paging and
    # per-type counts walk an index of the grain id in byte order ("C"), so a
    # type or key prefix is a range whatever the database's collation.
    (
        "ALTER TABLE orleanspy_reminders ADD COLUMN IF NOT EXISTS fingerprint text",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminders_grain "
        'ON orleanspy_reminders (service_id, grain_id COLLATE "C", name COLLATE "C")',
    ),
    # v7: fenced writers (``FencingReminderTable``): a schedule CAS from a
    # writer listed here for the service changes nothing. v6 silos still
    # running during an upgrade neither read nor write it (they are not fenced).
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_fences (
            service_id text NOT NULL,
            writer text NOT NULL,
            fenced_at bigint NOT NULL,
            PRIMARY KEY (service_id, writer)
        )""",
    ),
)

_COLUMNS: Final = (
    "service_id, grain_id, name, start_at, next_due, period_ms, cron, tz, "
    "last_fire, priority, action, declared, paused, grace_ms, extras, fingerprint, version"
)

# The columns a whole-row write sets, in the order of its parameters $2..$18.
_ROW_COLUMNS: Final = (
    "grain_id, name, grain_hash, bucket, priority, start_at, next_due, "
    "period_ms, cron, tz, last_fire, action, declared, paused, grace_ms, extras, fingerprint"
)
_ROW_VALUES: Final = "$2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18"
#: The channel parameter of a whole-row write, after the row's; then the etag
#: parameter of a conditional one.
_CH: Final = "$19"
_ETAG: Final = "$20"
#: How many parameters a row takes ($2..$18).
_ROW_WIDTH: Final = 17
_SET_ROW: Final = """
        grain_hash = EXCLUDED.grain_hash, bucket = EXCLUDED.bucket,
        priority = EXCLUDED.priority, start_at = EXCLUDED.start_at,
        next_due = EXCLUDED.next_due, period_ms = EXCLUDED.period_ms,
        cron = EXCLUDED.cron, tz = EXCLUDED.tz, last_fire = EXCLUDED.last_fire,
        action = EXCLUDED.action, declared = EXCLUDED.declared, paused = EXCLUDED.paused,
        grace_ms = EXCLUDED.grace_ms, extras = EXCLUDED.extras,
        fingerprint = EXCLUDED.fingerprint, version = EXCLUDED.version"""
# A paused row left the schedule: its changes are told as removals (no next_due,
# no priority), whatever the write.
_DUE_OR_NULL: Final = "CASE WHEN w.paused THEN NULL ELSE w.next_due END"
_PRIORITY_OR_NULL: Final = "CASE WHEN w.paused THEN NULL ELSE w.priority END"
# Every statement writing whole rows ends with this: the notification with the
# row's priority, for the rows written (none when a condition failed).
_NOTIFY_ROWS: Final = f"""
SELECT w.version, orleanspy_reminder_notify(
    {_CH}, w.grain_hash, {_DUE_OR_NULL}, w.grain_id, w.name, {_PRIORITY_OR_NULL})
FROM w
"""
_RETURNING_ROW: Final = (
    "RETURNING t.version, t.grain_hash, t.next_due, t.grain_id, t.name, t.priority, t.paused"
)

# $1 service, $2..$18 the row (_ROW_COLUMNS), $19 channel.
_UPSERT: Final = f"""
WITH w AS (
    INSERT INTO orleanspy_reminders AS t (service_id, {_ROW_COLUMNS}, version)
    VALUES ($1, {_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    ON CONFLICT (service_id, grain_id, name) DO UPDATE SET {_SET_ROW}
    {_RETURNING_ROW}
)
{_NOTIFY_ROWS}
"""

# upsert_if with no etag: insert only where no row is (a racing insert that
# commits first wins; this one then writes nothing).
_INSERT_IF_ABSENT: Final = f"""
WITH w AS (
    INSERT INTO orleanspy_reminders AS t (service_id, {_ROW_COLUMNS}, version)
    VALUES ($1, {_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    ON CONFLICT (service_id, grain_id, name) DO NOTHING
    {_RETURNING_ROW}
)
{_NOTIFY_ROWS}
"""

# upsert_if with an etag: replace the row only while its version is $20.
_REPLACE_IF: Final = f"""
WITH w AS (
    UPDATE orleanspy_reminders AS t
    SET ({_ROW_COLUMNS}, version) =
        ({_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    WHERE t.service_id = $1 AND t.grain_id = $2 AND t.name = $3 AND t.version = {_ETAG}
    {_RETURNING_ROW}
)
{_NOTIFY_ROWS}
"""

# upsert_many: $2..$18 parallel arrays of the rows' columns (no key twice), in
# key order so two batches lock shared rows in one order; $19 channel.
_UPSERT_MANY: Final = f"""
WITH w AS (
    INSERT INTO orleanspy_reminders AS t (service_id, {_ROW_COLUMNS}, version)
    SELECT $1, u.*, nextval('orleanspy_reminder_version')
    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::smallint[], $6::smallint[],
                $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[],
                $12::bigint[], $13::smallint[], $14::boolean[], $15::boolean[],
                $16::bigint[], $17::bytea[], $18::text[]) AS u
    ORDER BY 2, 3
    ON CONFLICT (service_id, grain_id, name) DO UPDATE SET {_SET_ROW}
    {_RETURNING_ROW}
)
SELECT w.grain_id, w.name, w.version, orleanspy_reminder_notify(
    {_CH}, w.grain_hash, {_DUE_OR_NULL}, w.grain_id, w.name, {_PRIORITY_OR_NULL})
FROM w
"""

# upsert_if_many, rows that must be absent: _UPSERT_MANY that does nothing on
# a conflict (a row written first by another writer stays; this one is refused).
_INSERT_MANY_IF_ABSENT: Final = _UPSERT_MANY.replace(f"DO UPDATE SET {_SET_ROW}", "DO NOTHING")

# upsert_if_many, rows that must have an etag: $2..$18 the rows' columns as in
# _UPSERT_MANY, $19 channel, $20 the versions they must have; only rows still
# at their version are replaced.
_REPLACE_MANY_IF: Final = f"""
WITH u AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::smallint[], $6::smallint[],
                         $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::text[],
                         $12::bigint[], $13::smallint[], $14::boolean[], $15::boolean[],
                         $16::bigint[], $17::bytea[], $18::text[], {_ETAG}::bigint[])
        AS u(grain_id, name, grain_hash, bucket, priority, start_at, next_due, period_ms,
             cron, tz, last_fire, action, declared, paused, grace_ms, extras, fingerprint,
             expected)
), w AS (
    UPDATE orleanspy_reminders AS t
    SET grain_hash = u.grain_hash, bucket = u.bucket, priority = u.priority,
        start_at = u.start_at, next_due = u.next_due, period_ms = u.period_ms, cron = u.cron,
        tz = u.tz, last_fire = u.last_fire, action = u.action, declared = u.declared,
        paused = u.paused, grace_ms = u.grace_ms, extras = u.extras,
        fingerprint = u.fingerprint,
        version = nextval('orleanspy_reminder_version')
    FROM u
    WHERE t.service_id = $1 AND t.grain_id = u.grain_id AND t.name = u.name
        AND t.version = u.expected
    {_RETURNING_ROW}
)
SELECT w.grain_id, w.name, w.version, orleanspy_reminder_notify(
    {_CH}, w.grain_hash, {_DUE_OR_NULL}, w.grain_id, w.name, {_PRIORITY_OR_NULL})
FROM w
"""

# A schedule CAS from a fenced writer changes nothing (``FencingReminderTable``);
# a NULL writer (an instance without one) is never fenced.
_NOT_FENCED: Final = """
    AND NOT EXISTS (SELECT 1 FROM orleanspy_reminder_fences f
        WHERE f.service_id = $1 AND f.writer = {writer}::text)"""

# Parallel arrays, one element per update; the ordinal says which update won.
_UPDATE_MANY: Final = f"""
WITH u AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
        WITH ORDINALITY AS u(grain_id, name, version, next_due, last_fire, i)
)
UPDATE orleanspy_reminders t
SET next_due = u.next_due, last_fire = u.last_fire,
    version = nextval('orleanspy_reminder_version')
FROM u
WHERE t.service_id = $1 AND t.grain_id = u.grain_id AND t.name = u.name
    AND t.version = u.version{_NOT_FENCED.format(writer="$7")}
RETURNING u.i, t.version
"""

_UPDATE_ONE: Final = f"""
UPDATE orleanspy_reminders
SET next_due = $5, last_fire = $6, version = nextval('orleanspy_reminder_version')
WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND version = $4{
    _NOT_FENCED.format(writer="$7")
}
RETURNING version
"""

_FENCE: Final = """
INSERT INTO orleanspy_reminder_fences (service_id, writer, fenced_at) VALUES ($1, $2, $3)
ON CONFLICT (service_id, writer) DO UPDATE
SET fenced_at = GREATEST(orleanspy_reminder_fences.fenced_at, EXCLUDED.fenced_at)
"""

_PRUNE_FENCES: Final = """
DELETE FROM orleanspy_reminder_fences WHERE service_id = $1 AND fenced_at < $2 AND writer <> $3
"""

_REMOVE: Final = """
WITH w AS (
    DELETE FROM orleanspy_reminders
    WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND version = $4
    RETURNING grain_hash, grain_id, name
), e AS (
    DELETE FROM orleanspy_reminder_ended_history
    WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND EXISTS (SELECT 1 FROM w)
)
SELECT orleanspy_reminder_notify($5, w.grain_hash, NULL, w.grain_id, w.name) FROM w
"""

# end: remove, copying the row's history (which the foreign key's cascade
# deletes) to the ended histories, stamped $6 (now, ms); ended histories older
# than $7 are swept. Every part reads the statement's snapshot, so the copy sees
# the history the cascade removes.
_END: Final = """
WITH w AS (
    DELETE FROM orleanspy_reminders
    WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND version = $4
    RETURNING grain_hash, grain_id, name
), old AS (
    DELETE FROM orleanspy_reminder_ended_history
    WHERE service_id = $1 AND (ended_at < $7
        OR (grain_id = $2 AND name = $3 AND EXISTS (SELECT 1 FROM w)))
), kept AS (
    INSERT INTO orleanspy_reminder_ended_history (service_id, grain_id, name, batch, i,
        slot, at, outcome, silo, triggered, error, attempt, final, ended_at)
    SELECT h.service_id, h.grain_id, h.name, h.batch, h.i, h.slot, h.at, h.outcome, h.silo,
        h.triggered, h.error, h.attempt, h.final, $6
    FROM orleanspy_reminder_history h JOIN w ON h.grain_id = w.grain_id AND h.name = w.name
    WHERE h.service_id = $1
)
SELECT orleanspy_reminder_notify($5, w.grain_hash, NULL, w.grain_id, w.name) FROM w
"""

# The priorities in use by unpaused rows of service $1, highest first, one
# index probe each (a loose index scan): the lanes the due reads visit.
_PRIORITIES_IN_USE: Final = """WITH RECURSIVE prio(p) AS (
    SELECT max(priority) FROM orleanspy_reminders WHERE service_id = $1 AND NOT paused
    UNION ALL
    SELECT (SELECT max(priority) FROM orleanspy_reminders
            WHERE service_id = $1 AND NOT paused AND priority < prio.p)
    FROM prio WHERE prio.p IS NOT NULL
)
"""

# $1 service, $2 before (ms), $3 rows per scan, then the planned slices as
# parallel arrays: bucket, lowest and highest hash inside it (inclusive); $7 rows
# in all (NULL: every row the scans return); $8 the exclusive lower bound of
# next_due (ms; -1: none).
_READ_DUE: Final = f"""
{_PRIORITIES_IN_USE}SELECT r.* FROM prio
CROSS JOIN unnest($4::smallint[], $5::bigint[], $6::bigint[]) AS s(bucket, lo, hi)
CROSS JOIN LATERAL (
    SELECT {_COLUMNS}, grain_hash FROM orleanspy_reminders
    WHERE service_id = $1 AND NOT paused AND priority = prio.p AND bucket = s.bucket
        AND next_due <= $2 AND next_due > $8 AND grain_hash BETWEEN s.lo AND s.hi
    ORDER BY next_due, grain_hash
    LIMIT $3
) r
WHERE prio.p IS NOT NULL
ORDER BY r.priority DESC, r.next_due, r.grain_hash
LIMIT $7
"""

# The second pass of read_due: named (priority, bucket) scans, $3 rows each,
# next_due above $8.
_READ_DUE_GROUPS: Final = f"""
SELECT r.* FROM unnest($4::smallint[], $5::smallint[], $6::bigint[], $7::bigint[])
    AS s(priority, bucket, lo, hi)
CROSS JOIN LATERAL (
    SELECT {_COLUMNS}, grain_hash FROM orleanspy_reminders
    WHERE service_id = $1 AND NOT paused AND priority = s.priority AND bucket = s.bucket
        AND next_due <= $2 AND next_due > $8 AND grain_hash BETWEEN s.lo AND s.hi
    ORDER BY next_due, grain_hash
    LIMIT $3
) r
"""

# read_due over the whole ring, without buckets: per priority in use (the
# loose scan of _READ_DUE), the earliest due rows from the upcoming index.
_UPCOMING: Final = f"""
{_PRIORITIES_IN_USE}SELECT r.* FROM prio
CROSS JOIN LATERAL (
    SELECT {_COLUMNS}, grain_hash FROM orleanspy_reminders
    WHERE service_id = $1 AND NOT paused AND priority = prio.p AND next_due <= $2
    ORDER BY next_due, grain_hash
    LIMIT $3
) r
WHERE prio.p IS NOT NULL
ORDER BY r.priority DESC, r.next_due, r.grain_hash
LIMIT $3
"""

#: History batches from this many records on are planned for their size
#: (``append_history``): below it, the extra round trips and the planning cost
#: more than a generic plan loses (measured: 250 records 19 ms custom, 16 ms
#: generic; 500 records 33 ms custom, 39 ms generic).
_CUSTOM_PLAN_FROM: Final = 400

# append_history: $2..$11 parallel arrays of the records (oldest first), $12 keep.
# Only rows that exist take records (locked FOR KEY SHARE, so a racing remove
# waits or wins, and its cascade never meets a record it did not see); each
# row keeps the newest ``keep``: its newest new records, and of the old ones
# as many as still fit: ``cut`` finds, walking the key's index entries newest
# first, the first old record past that many, and the delete takes it and every
# older one (a range of the primary key, no sort). One statement: the insert and
# the trim see the same snapshot, so the trim counts the new records in rather
# than seeing them. ``cut`` is MATERIALIZED: inlined (it is used once), the
# planner may run its lateral walk once per old record instead of once per row
# (``keep`` times the work: 166 ms instead of 37 for 1,000 records over full
# histories of 20, on a table not yet analyzed).
_APPEND_HISTORY: Final = """
WITH u AS (
    SELECT u.*, row_number() OVER (PARTITION BY u.grain_id, u.name ORDER BY u.i DESC) AS rn
    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[],
                $8::boolean[], $9::text[], $10::smallint[], $11::boolean[])
        WITH ORDINALITY AS u(grain_id, name, slot, at, outcome, silo, triggered, error,
                             attempt, final, i)
), k AS (
    SELECT grain_id, name, count(*) AS cnt FROM u GROUP BY grain_id, name
), r AS (
    SELECT t.grain_id, t.name, k.cnt FROM orleanspy_reminders t
    JOIN k ON t.grain_id = k.grain_id AND t.name = k.name
    WHERE t.service_id = $1
    ORDER BY t.grain_id, t.name
    FOR KEY SHARE OF t
), b AS MATERIALIZED (
    SELECT nextval('orleanspy_reminder_history_batch') AS batch
), ins AS (
    INSERT INTO orleanspy_reminder_history
        (service_id, grain_id, name, batch, i, slot, at, outcome, silo, triggered, error,
         attempt, final)
    SELECT $1, u.grain_id, u.name, b.batch, u.i, u.slot, u.at, u.outcome, u.silo, u.triggered,
           u.error, u.attempt, u.final
    FROM u JOIN r ON u.grain_id = r.grain_id AND u.name = r.name CROSS JOIN b
    WHERE u.rn <= $12
), cut AS MATERIALIZED (
    SELECT r.grain_id, r.name, c.batch, c.i FROM r
    CROSS JOIN LATERAL (
        SELECT h.batch, h.i FROM orleanspy_reminder_history h
        WHERE h.service_id = $1 AND h.grain_id = r.grain_id AND h.name = r.name
        ORDER BY h.batch DESC, h.i DESC
        OFFSET greatest($12 - r.cnt, 0) LIMIT 1
    ) c
)
DELETE FROM orleanspy_reminder_history h USING cut
WHERE h.service_id = $1 AND h.grain_id = cut.grain_id AND h.name = cut.name
    AND (h.batch, h.i) <= (cut.batch, cut.i)
"""

# A row's history, with what an ended row of that key left (kept since $4).
_READ_HISTORY: Final = """
SELECT slot, at, outcome, silo, triggered, error, attempt, final FROM (
    SELECT batch, i, slot, at, outcome, silo, triggered, error, attempt, final
    FROM orleanspy_reminder_history
    WHERE service_id = $1 AND grain_id = $2 AND name = $3
    UNION ALL
    SELECT batch, i, slot, at, outcome, silo, triggered, error, attempt, final
    FROM orleanspy_reminder_ended_history
    WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND ended_at >= $4
) h
ORDER BY batch DESC, i DESC
"""

# read_page: rows in byte order of (grain_id, name) from the "C" index; $2, $3
# the last key of the previous page, $4 <= grain_id < $5 the filter's prefix
# range, $6 rows. Without a filter, $4 is '' and the upper bound is dropped.
_PAGE_WHERE: Final = """
WHERE service_id = $1
    AND (grain_id COLLATE "C", name COLLATE "C") > ($2::text COLLATE "C", $3::text COLLATE "C")
    AND grain_id COLLATE "C" >= $4::text COLLATE "C"
"""
_PAGE_ORDER: Final = 'ORDER BY grain_id COLLATE "C", name COLLATE "C" LIMIT $6'
_READ_PAGE: Final = f"""SELECT {_COLUMNS} FROM orleanspy_reminders {_PAGE_WHERE}
    AND grain_id COLLATE "C" < $5::text COLLATE "C" {_PAGE_ORDER}"""
_READ_PAGE_ALL: Final = f"""SELECT {_COLUMNS} FROM orleanspy_reminders {_PAGE_WHERE}
    AND $5::text IS NULL {_PAGE_ORDER}"""

# count_types: a loose index scan of the "C" grain index for the types present
# (one descent each), then per type an index-only count of its range.
_COUNT_TYPES: Final = """
WITH RECURSIVE t(g) AS (
    SELECT min(grain_id COLLATE "C") FROM orleanspy_reminders WHERE service_id = $1
    UNION ALL
    SELECT (SELECT min(grain_id COLLATE "C") FROM orleanspy_reminders
            WHERE service_id = $1
                AND grain_id COLLATE "C" >= (split_part(t.g, '/', 1) || '0') COLLATE "C")
    FROM t WHERE t.g IS NOT NULL
)
SELECT split_part(t.g, '/', 1) AS type_name,
    (SELECT count(*) FROM orleanspy_reminders
     WHERE service_id = $1
        AND grain_id COLLATE "C" >= (split_part(t.g, '/', 1) || '/') COLLATE "C"
        AND grain_id COLLATE "C" < (split_part(t.g, '/', 1) || '0') COLLATE "C") AS n
FROM t WHERE t.g IS NOT NULL
"""

_READ_RANGE: Final = f"""
SELECT {_COLUMNS}, grain_hash FROM orleanspy_reminders
WHERE service_id = $1 AND grain_hash BETWEEN $2 AND $3
"""


def _slices(r: RingRange) -> tuple[list[int], list[int], list[int]]:
    """The buckets ``r`` overlaps, each with ``r``'s inclusive hash bounds inside it."""
    buckets: list[int] = []
    los: list[int] = []
    his: list[int] = []
    for a, b in r.intervals():
        for bucket in range(a >> _BUCKET_SHIFT, (b >> _BUCKET_SHIFT) + 1):
            buckets.append(bucket)
            los.append(max(a, bucket << _BUCKET_SHIFT))
            his.append(min(b, ((bucket + 1) << _BUCKET_SHIFT) - 1))
    return buckets, los, his


def _channel(service_id: str) -> str:
    # A channel is an identifier (at most 63 bytes); a digest fits any service id.
    return "orleanspy_rem_" + hashlib.blake2b(service_id.encode(), digest_size=12).hexdigest()


def _version(etag: str) -> int | None:
    """The version an etag names, or ``None`` for an etag no row can have."""
    if not etag.isascii() or not etag.isdigit() or len(etag) > 19:
        return None
    version = int(etag)
    return version if version < 1 << 63 else None


def _ms_or_none(at: datetime | None) -> int | None:
    return None if at is None else to_ms(at)


def _row_values(entry: ReminderEntry) -> tuple[Any, ...]:
    """``entry`` as the values of ``_ROW_COLUMNS``, in order. A priority outside
    -128..127 is refused (``StorageError``), as the Redis table refuses it: no
    reader could order or announce such a row."""
    if not -128 <= int(entry.priority) <= 127:
        raise StorageError(f"priority {entry.priority} is outside -128..127")
    h = entry.hash
    return (
        entry.grain_id.canonical,
        entry.name,
        h,
        h >> _BUCKET_SHIFT,
        int(entry.priority),
        to_ms(entry.start_at),
        to_ms(entry.next_due),
        None if entry.period is None else entry.period // timedelta(milliseconds=1),
        entry.cron,
        entry.tz,
        _ms_or_none(entry.last_fire),
        int(entry.action),
        entry.declared,
        entry.paused,
        None if entry.grace is None else entry.grace // timedelta(milliseconds=1),
        _extras(entry),
        entry.fingerprint,
    )


def _extras(entry: ReminderEntry) -> bytes | None:
    extras = entry.extras_record()
    return pack(extras) if extras else None


def _row(rec: Any) -> ReminderEntry:
    try:
        period = rec["period_ms"]
        last = rec["last_fire"]
        extras = rec["extras"]
        return ReminderEntry(
            service_id=rec["service_id"],
            grain_id=GrainId.parse(rec["grain_id"]),
            name=rec["name"],
            start_at=from_ms(rec["start_at"]),
            next_due=from_ms(rec["next_due"]),
            period=None if period is None else timedelta(milliseconds=period),
            cron=rec["cron"],
            tz=rec["tz"],
            last_fire=None if last is None else from_ms(last),
            priority=int(rec["priority"]),
            action=MissedReminderAction(rec["action"]),
            etag=str(rec["version"]),
            declared=bool(rec["declared"]),
            paused=bool(rec["paused"]),
            grace=None if rec["grace_ms"] is None else timedelta(milliseconds=rec["grace_ms"]),
            fingerprint=rec["fingerprint"],
            **({} if extras is None else extras_from_record(unpack(extras))),
        )
    except (KeyError, TypeError, ValueError, SerializationError) as exc:
        raise StorageError(f"malformed reminder row in postgresql: {exc}") from exc


def _due_order(row: ReminderEntry) -> tuple[int, int, int, str]:
    return (-int(row.priority), to_ms(row.next_due), row.hash, row.key)


def _raw_rank(rec: Any) -> tuple[int, int, int, str, str]:
    """``_due_order`` on a record's raw columns (no decoding); its first two items
    are what a scan orders by across scans (priority, higher first, then due)."""
    return (-rec["priority"], rec["next_due"], rec["grain_hash"], rec["grain_id"], rec["name"])


class PostgresReminderTable:
    """A ``ReminderTable`` in PostgreSQL; also a ``BatchingReminderTable``,
    ``ConditionalReminderTable``, ``BulkReminderTable`` and
    ``PausableReminderTable`` (paused rows and fire history).

    ``url_or_pool``: a ``postgresql://`` URL (the table opens a pool and a
    LISTEN connection, both closed with the start stack) or an ``asyncpg``
    pool (used as is and never closed here; the LISTEN connection is then
    acquired from it and released on close). ``start`` creates or migrates the
    schema.
    """

    def __init__(self, url_or_pool: str | Pool, *, service_id: str) -> None:
        self.service_id = service_id
        self._source = url_or_pool
        self._pool: Pool | None = None
        self._channel = _channel(service_id)
        self._listener: Listener | None = None
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
        await migrate(pool, "reminders", _SCHEMA)
        self._pool = pool
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
                _UPSERT, self.service_id, *_row_values(entry), self._channel
            )
        return str(version)

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` only if the row is absent (``expected_etag`` ``None``) or has
        ``expected_etag``; the new etag, or ``None`` (nothing written, nothing
        published) when that does not hold. One statement either way: an insert
        that does nothing on conflict, or an update checked against ``version``."""
        extra: tuple[int, ...] = ()
        if expected_etag is None:
            statement = _INSERT_IF_ABSENT
        else:
            version = _version(expected_etag)
            if version is None:
                return None
            statement, extra = _REPLACE_IF, (version,)
        with translate_errors("reminder upsert_if"):
            new = await self._p.fetchval(
                statement, self.service_id, *_row_values(entry), self._channel, *extra
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
                elif _version(etag) is not None:
                    present.append(i)  # an etag that is no version of ours never matches
            for indices, statement in (
                (absent, _INSERT_MANY_IF_ABSENT),
                (present, _REPLACE_MANY_IF),
            ):
                if not indices:
                    continue
                columns: list[list[Any]] = [[] for _ in range(_ROW_WIDTH)]
                for i in indices:
                    for column, value in zip(columns, _row_values(writes[i][0]), strict=True):
                        column.append(value)
                extra: list[Any] = []
                if statement is _REPLACE_MANY_IF:
                    extra.append([_version(writes[i][1] or "") for i in indices])
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
                f"SELECT {_COLUMNS} FROM orleanspy_reminders "
                "WHERE service_id = $1 AND grain_id = ANY($2::text[])",
                self.service_id,
                [g.canonical for g in grain_ids],
            )
        found: dict[str, list[ReminderEntry]] = {}
        for rec in records:
            found.setdefault(rec["grain_id"], []).append(_row(rec))
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
        columns: list[list[Any]] = [[] for _ in range(_ROW_WIDTH)]
        for i in indices:
            for column, value in zip(columns, _row_values(entries[i]), strict=True):
                column.append(value)
        with translate_errors("reminder upsert_many"):
            records = await self._p.fetch(_UPSERT_MANY, self.service_id, *columns, self._channel)
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
        version = _version(etag)
        if version is None:
            return None
        with translate_errors("reminder update_schedule"):
            new = await self._p.fetchval(
                _UPDATE_ONE,
                self.service_id,
                grain_id.canonical,
                name,
                version,
                to_ms(next_due),
                _ms_or_none(last_fire),
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
                await conn.execute(_FENCE, self.service_id, member, to_ms(at or datetime.now(UTC)))
                if prune_before is not None:
                    await conn.execute(_PRUNE_FENCES, self.service_id, to_ms(prune_before), member)

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update, in order: one statement over
        ``unnest`` arrays (a round per repeat of a key within the batch, since
        a later update of a key must see the earlier one's outcome).

        Each statement is atomic; on ``StorageUnavailableError`` an earlier
        round may have applied. Retrying is safe: an applied update then
        reports a lost race.
        """
        results: list[str | None] = [None] * len(updates)
        pending = [i for i, u in enumerate(updates) if _version(u.etag) is not None]
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
                _UPDATE_MANY,
                self.service_id,
                [updates[i].grain_id.canonical for i in indices],
                [updates[i].name for i in indices],
                [_version(updates[i].etag) for i in indices],
                [to_ms(updates[i].next_due) for i in indices],
                [_ms_or_none(updates[i].last_fire) for i in indices],
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
        version = _version(etag)
        if version is None:
            return False
        with translate_errors("reminder remove"):
            records = await self._p.fetch(
                _REMOVE, self.service_id, grain_id.canonical, name, version, self._channel
            )
        return bool(records)

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """``remove``, keeping the row's history in the ended histories for
        ``ENDED_HISTORY_KEPT`` (``_END``: one statement)."""
        version = _version(etag)
        if version is None:
            return False
        now = to_ms(datetime.now(UTC))
        cutoff = now - ENDED_HISTORY_KEPT // timedelta(milliseconds=1)
        with translate_errors("reminder end"):
            records = await self._p.fetch(
                _END, self.service_id, grain_id.canonical, name, version, self._channel, now, cutoff
            )
        return bool(records)

    # -- fire history ---------------------------------------------------------------

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """Append ``records`` (oldest first) to their rows' histories, keeping the
        newest ``keep`` per row; records of missing rows are dropped. One
        statement (``_APPEND_HISTORY``; from ``_CUSTOM_PLAN_FROM`` records, in a
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
        )
        with translate_errors("reminder append_history"):
            if len(records) < _CUSTOM_PLAN_FROM:
                await self._p.execute(_APPEND_HISTORY, *args)
                return
            async with self._p.acquire() as conn, conn.transaction():
                # A plan for these arrays' sizes: after five runs of a prepared
                # statement PostgreSQL may switch to a generic plan, which for
                # a large batch is several times slower (110 ms against 37 for
                # 1,000 records over full histories). LOCAL: pooled sessions
                # keep no settings.
                await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
                await conn.execute(_APPEND_HISTORY, *args)

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        """The row's fire history, newest first (empty if none or no row)."""
        with translate_errors("reminder read_history"):
            kept_since = to_ms(datetime.now(UTC)) - ENDED_HISTORY_KEPT // timedelta(milliseconds=1)
            records = await self._p.fetch(
                _READ_HISTORY, self.service_id, grain_id.canonical, name, kept_since
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
                )
                for rec in records
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed reminder history in postgresql: {exc}") from exc

    # -- reads ----------------------------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        with translate_errors("reminder read"):
            rec = await self._p.fetchrow(
                f"SELECT {_COLUMNS} FROM orleanspy_reminders "
                "WHERE service_id = $1 AND grain_id = $2 AND name = $3",
                self.service_id,
                grain_id.canonical,
                name,
            )
        return None if rec is None else _row(rec)

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of the grain in name order (a primary-key prefix scan)."""
        with translate_errors("reminder read_grain"):
            records = await self._p.fetch(
                f"SELECT {_COLUMNS} FROM orleanspy_reminders "
                "WHERE service_id = $1 AND grain_id = $2",
                self.service_id,
                grain_id.canonical,
            )
        rows = [_row(rec) for rec in records]
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
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        prefix = grain_prefix(type_name, key_prefix)
        after = ("", "")
        if cursor is not None:
            try:
                grain, name = json.loads(cursor)
                after = (str(grain), str(name))
            except (ValueError, TypeError):
                raise ValueError(f"not a page cursor of this table: {cursor!r}") from None
        # The first string after every string with the prefix: its last char + 1.
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else None
        statement = _READ_PAGE if upper is not None else _READ_PAGE_ALL
        with translate_errors("reminder read_page"):
            records = await self._p.fetch(
                statement, self.service_id, after[0], after[1], prefix, upper, limit + 1
            )
        rows = [_row(rec) for rec in records[:limit]]
        if len(records) <= limit:
            return rows, None
        return rows, json.dumps([rows[-1].grain_id.canonical, rows[-1].name])

    async def count_types(self) -> dict[str, int]:
        with translate_errors("reminder count_types"):
            records = await self._p.fetch(_COUNT_TYPES, self.service_id)
        return {rec["type_name"]: int(rec["n"]) for rec in records if rec["n"]}

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (index range scans)."""
        rows: list[ReminderEntry] = []
        with translate_errors("reminder read_range"):
            for lo, hi in r.intervals():
                records = await self._p.fetch(_READ_RANGE, self.service_id, lo, hi)
                rows.extend(_row(rec) for rec in records)
        rows.sort(key=lambda row: (row.hash, row.key))
        return rows

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Due rows of ``r``: priority descending, then ``next_due`` ascending (ties by
        hash, then key), at most ``limit``. See the module doc for the index.

        When the range spans many buckets, a first statement asks each (priority,
        bucket) scan for about twice its fair share of ``limit``. Only a scan that
        returned its full share, ending at or before the ``limit``-th best row seen,
        may hide more winners; only those are asked again, for up to ``limit``
        rows. So a whole-ring read moves about ``2 x limit`` rows, not ``limit``
        per bucket.
        """
        return await self.read_due_skipping(r, before, limit, ())

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
        """``read_due`` less the rows whose key is in ``skip``: the same two-pass
        scans, ordered on the raw columns, so that skipped rows (the ones the
        reader holds) are never decoded into entries; they count towards ``limit``.
        With ``take`` only the first ``take`` rows not skipped are decoded."""
        if limit <= 0:
            return []
        buckets, los, his = _slices(r)
        before_ms = to_ms(before)
        after_ms = -1 if after is None else to_ms(after)
        ask = max(_MIN_FIRST_ASK, -(-2 * limit // len(buckets)))
        first = min(ask, limit)
        # Few buckets: each scan asks for all of ``limit`` and one statement-wide
        # LIMIT keeps the answer to ``limit`` rows; many: a fair share per scan.
        with translate_errors("reminder read_due"):
            records = list(
                await self._p.fetch(
                    _READ_DUE,
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
        records.sort(key=_raw_rank)
        if ask < limit:
            threshold = _raw_rank(records[limit - 1])[:2] if len(records) >= limit else None
            groups: dict[tuple[int, int], list[Any]] = {}
            for rec in records:
                group = (rec["priority"], rec["grain_hash"] >> _BUCKET_SHIFT)
                groups.setdefault(group, []).append(rec)
            again = [
                group
                for group, found in groups.items()
                if len(found) == ask
                and (threshold is None or _raw_rank(found[-1])[:2] <= threshold)
            ]
            if again:
                bounds = dict(zip(buckets, zip(los, his, strict=True), strict=True))
                with translate_errors("reminder read_due"):
                    more = await self._p.fetch(
                        _READ_DUE_GROUPS,
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
                records.sort(key=_raw_rank)
        kept = (rec for rec in records[:limit] if f"{rec['grain_id']}|{rec['name']}" not in skip)
        return [_row(rec) for rec in itertools.islice(kept, take)]

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """``read_due`` over the whole ring: rows with ``next_due <= before``,
        priority descending, then ``next_due`` (ties by hash, then key), at most
        ``limit``. One index range scan per priority in use (the upcoming index)."""
        if limit <= 0:
            return []
        with translate_errors("reminder upcoming"):
            records = await self._p.fetch(_UPCOMING, self.service_id, to_ms(before), limit)
        rows = [_row(rec) for rec in records]
        rows.sort(key=_due_order)
        return rows

    async def count(self) -> int:
        """How many rows the service has (an index-only count: PostgreSQL keeps no
        row count, so this grows with the table; tools only)."""
        with translate_errors("reminder count"):
            n = await self._p.fetchval(
                "SELECT count(*) FROM orleanspy_reminders WHERE service_id = $1", self.service_id
            )
        return int(n)

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
