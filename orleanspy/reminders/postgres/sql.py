"""The SQL of ``PostgresReminderTable``: every statement it runs, with the
parameters each takes. The tables and indexes they read are drawn in
``table``'s module docstring and made by ``migrations``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "APPEND_HISTORY",
    "COLUMNS",
    "COUNT",
    "COUNT_TYPES",
    "END",
    "FENCE",
    "INSERT_IF_ABSENT",
    "INSERT_MANY_IF_ABSENT",
    "PRUNE_FENCES",
    "READ_DUE",
    "READ_DUE_GROUPS",
    "READ_GRAIN",
    "READ_GRAINS",
    "READ_HISTORY",
    "READ_PAGE",
    "READ_PAGE_ALL",
    "READ_RANGE",
    "READ_ROW",
    "REMOVE",
    "REPLACE_IF",
    "REPLACE_MANY_IF",
    "ROW_WIDTH",
    "UPCOMING",
    "UPDATE_MANY",
    "UPDATE_ONE",
    "UPSERT",
    "UPSERT_MANY",
]

COLUMNS: Final = (
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
ROW_WIDTH: Final = 17
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
# The label index of the rows written (``stores``): entries of terms a row no
# longer carries go, new ones come (the two never share a key, so one statement
# does both). ``{terms}`` is the row's terms as a text[] (single-row writes).
_INDEX_ROW: Final = """, ix_gone AS (
    DELETE FROM orleanspy_reminder_index x USING w
    WHERE x.service_id = $1 AND x.grain_id = w.grain_id AND x.name = w.name
        AND x.term <> ALL ({terms}::text[])
), ix_new AS (
    INSERT INTO orleanspy_reminder_index (service_id, term, grain_id, name)
    SELECT $1, t.term, w.grain_id, w.name FROM w CROSS JOIN unnest({terms}::text[]) AS t(term)
    ON CONFLICT DO NOTHING
)"""
# The same for bulk writes: ``{terms}`` is a text[] of each row's terms joined
# by line breaks, beside the keys in $2 and $3.
_INDEX_ROWS: Final = """, tt AS (
    SELECT * FROM unnest($2::text[], $3::text[], {terms}::text[]) AS tt(grain_id, name, terms)
), ix_gone AS (
    DELETE FROM orleanspy_reminder_index x
    USING w JOIN tt ON tt.grain_id = w.grain_id AND tt.name = w.name
    WHERE x.service_id = $1 AND x.grain_id = w.grain_id AND x.name = w.name
        AND x.term <> ALL (string_to_array(tt.terms, E'\\n'))
), ix_new AS (
    INSERT INTO orleanspy_reminder_index (service_id, term, grain_id, name)
    SELECT $1, t.term, w.grain_id, w.name
    FROM w JOIN tt ON tt.grain_id = w.grain_id AND tt.name = w.name
    CROSS JOIN unnest(string_to_array(tt.terms, E'\\n')) AS t(term)
    ON CONFLICT DO NOTHING
)"""

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

# $1 service, $2..$18 the row (_ROW_COLUMNS), $19 channel, $20 its index terms.
UPSERT: Final = f"""
WITH w AS (
    INSERT INTO orleanspy_reminders AS t (service_id, {_ROW_COLUMNS}, version)
    VALUES ($1, {_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    ON CONFLICT (service_id, grain_id, name) DO UPDATE SET {_SET_ROW}
    {_RETURNING_ROW}
){_INDEX_ROW.format(terms="$20")}
{_NOTIFY_ROWS}
"""

# upsert_if with no etag: insert only where no row is (a racing insert that
# commits first wins; this one then writes nothing). $20: the row's index terms.
INSERT_IF_ABSENT: Final = f"""
WITH w AS (
    INSERT INTO orleanspy_reminders AS t (service_id, {_ROW_COLUMNS}, version)
    VALUES ($1, {_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    ON CONFLICT (service_id, grain_id, name) DO NOTHING
    {_RETURNING_ROW}
){_INDEX_ROW.format(terms="$20")}
{_NOTIFY_ROWS}
"""

# upsert_if with an etag: replace the row only while its version is $20; $21 the
# row's index terms.
REPLACE_IF: Final = f"""
WITH w AS (
    UPDATE orleanspy_reminders AS t
    SET ({_ROW_COLUMNS}, version) =
        ({_ROW_VALUES}, nextval('orleanspy_reminder_version'))
    WHERE t.service_id = $1 AND t.grain_id = $2 AND t.name = $3 AND t.version = {_ETAG}
    {_RETURNING_ROW}
){_INDEX_ROW.format(terms="$21")}
{_NOTIFY_ROWS}
"""

# upsert_many: $2..$18 parallel arrays of the rows' columns (no key twice), in
# key order so two batches lock shared rows in one order; $19 channel; $20 the
# rows' index terms (``stores.ix_terms``).
UPSERT_MANY: Final = f"""
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
){_INDEX_ROWS.format(terms="$20")}
SELECT w.grain_id, w.name, w.version, orleanspy_reminder_notify(
    {_CH}, w.grain_hash, {_DUE_OR_NULL}, w.grain_id, w.name, {_PRIORITY_OR_NULL})
FROM w
"""

# upsert_if_many, rows that must be absent: UPSERT_MANY that does nothing on
# a conflict (a row written first by another writer stays; this one is refused).
INSERT_MANY_IF_ABSENT: Final = UPSERT_MANY.replace(f"DO UPDATE SET {_SET_ROW}", "DO NOTHING")

# upsert_if_many, rows that must have an etag: $2..$18 the rows' columns as in
# UPSERT_MANY, $19 channel, $20 the versions they must have, $21 the rows' index
# terms; only rows still at their version are replaced.
REPLACE_MANY_IF: Final = f"""
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
){_INDEX_ROWS.format(terms="$21")}
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
UPDATE_MANY: Final = f"""
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

UPDATE_ONE: Final = f"""
UPDATE orleanspy_reminders
SET next_due = $5, last_fire = $6, version = nextval('orleanspy_reminder_version')
WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND version = $4{
    _NOT_FENCED.format(writer="$7")
}
RETURNING version
"""

FENCE: Final = """
INSERT INTO orleanspy_reminder_fences (service_id, writer, fenced_at) VALUES ($1, $2, $3)
ON CONFLICT (service_id, writer) DO UPDATE
SET fenced_at = GREATEST(orleanspy_reminder_fences.fenced_at, EXCLUDED.fenced_at)
"""

PRUNE_FENCES: Final = """
DELETE FROM orleanspy_reminder_fences WHERE service_id = $1 AND fenced_at < $2 AND writer <> $3
"""

REMOVE: Final = """
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
END: Final = """
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
        slot, at, outcome, silo, triggered, error, attempt, final, backfill, ended_at)
    SELECT h.service_id, h.grain_id, h.name, h.batch, h.i, h.slot, h.at, h.outcome, h.silo,
        h.triggered, h.error, h.attempt, h.final, h.backfill, $6
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
READ_DUE: Final = f"""
{_PRIORITIES_IN_USE}SELECT r.* FROM prio
CROSS JOIN unnest($4::smallint[], $5::bigint[], $6::bigint[]) AS s(bucket, lo, hi)
CROSS JOIN LATERAL (
    SELECT {COLUMNS}, grain_hash FROM orleanspy_reminders
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
READ_DUE_GROUPS: Final = f"""
SELECT r.* FROM unnest($4::smallint[], $5::smallint[], $6::bigint[], $7::bigint[])
    AS s(priority, bucket, lo, hi)
CROSS JOIN LATERAL (
    SELECT {COLUMNS}, grain_hash FROM orleanspy_reminders
    WHERE service_id = $1 AND NOT paused AND priority = s.priority AND bucket = s.bucket
        AND next_due <= $2 AND next_due > $8 AND grain_hash BETWEEN s.lo AND s.hi
    ORDER BY next_due, grain_hash
    LIMIT $3
) r
"""

# read_due over the whole ring, without buckets: per priority in use (the
# loose scan of READ_DUE), the earliest due rows from the upcoming index.
UPCOMING: Final = f"""
{_PRIORITIES_IN_USE}SELECT r.* FROM prio
CROSS JOIN LATERAL (
    SELECT {COLUMNS}, grain_hash FROM orleanspy_reminders
    WHERE service_id = $1 AND NOT paused AND priority = prio.p AND next_due <= $2
    ORDER BY next_due, grain_hash
    LIMIT $3
) r
WHERE prio.p IS NOT NULL
ORDER BY r.priority DESC, r.next_due, r.grain_hash
LIMIT $3
"""

# append_history: $2..$11 parallel arrays of the records (oldest first), $12 keep,
# $13 the records' backfill flags (the column of component reminder_backfills).
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
APPEND_HISTORY: Final = """
WITH u AS (
    SELECT u.*, row_number() OVER (PARTITION BY u.grain_id, u.name ORDER BY u.i DESC) AS rn
    FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[],
                $8::boolean[], $9::text[], $10::smallint[], $11::boolean[], $13::boolean[])
        WITH ORDINALITY AS u(grain_id, name, slot, at, outcome, silo, triggered, error,
                             attempt, final, backfill, i)
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
         attempt, final, backfill)
    SELECT $1, u.grain_id, u.name, b.batch, u.i, u.slot, u.at, u.outcome, u.silo, u.triggered,
           u.error, u.attempt, u.final, u.backfill
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
READ_HISTORY: Final = """
SELECT slot, at, outcome, silo, triggered, error, attempt, final, backfill FROM (
    SELECT batch, i, slot, at, outcome, silo, triggered, error, attempt, final, backfill
    FROM orleanspy_reminder_history
    WHERE service_id = $1 AND grain_id = $2 AND name = $3
    UNION ALL
    SELECT batch, i, slot, at, outcome, silo, triggered, error, attempt, final, backfill
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
READ_PAGE: Final = f"""SELECT {COLUMNS} FROM orleanspy_reminders {_PAGE_WHERE}
    AND grain_id COLLATE "C" < $5::text COLLATE "C" {_PAGE_ORDER}"""
READ_PAGE_ALL: Final = f"""SELECT {COLUMNS} FROM orleanspy_reminders {_PAGE_WHERE}
    AND $5::text IS NULL {_PAGE_ORDER}"""

# count_types: a loose index scan of the "C" grain index for the types present
# (one descent each), then per type an index-only count of its range.
COUNT_TYPES: Final = """
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

READ_RANGE: Final = f"""
SELECT {COLUMNS}, grain_hash FROM orleanspy_reminders
WHERE service_id = $1 AND grain_hash BETWEEN $2 AND $3
"""

# Point reads and the count (``read``, ``read_grain``, ``read_grains``, ``count``).
READ_ROW: Final = f"""SELECT {COLUMNS} FROM orleanspy_reminders
WHERE service_id = $1 AND grain_id = $2 AND name = $3"""
READ_GRAIN: Final = f"""SELECT {COLUMNS} FROM orleanspy_reminders
WHERE service_id = $1 AND grain_id = $2"""
READ_GRAINS: Final = f"""SELECT {COLUMNS} FROM orleanspy_reminders
WHERE service_id = $1 AND grain_id = ANY($2::text[])"""
COUNT: Final = "SELECT count(*) FROM orleanspy_reminders WHERE service_id = $1"
