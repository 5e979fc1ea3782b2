"""The schema of ``PostgresReminderTable``: ``STEPS``, one per version, applied by
``_postgres.migrate`` when the table starts (component ``COMPONENT``).

Step ``i`` (1-based) takes the schema from version ``i - 1`` to ``i``; a step is
only ever appended, never changed (a stored schema is at some step, and the
steps after it are what bring it up to date). Version 2 added ``declared``,
the upcoming index (in place of v1's ``(service_id, next_due)``) and the
notification with a priority; version 3 added ``paused`` (both due indexes
rebuilt as partial indexes) and the history table; version 4 added
``grace_ms`` and the history's ``error``; version 5 added ``extras`` (jitter,
bounds, payload, retry: one column, since only the service reads them and no
index needs them), the history's ``attempt`` and ``final``, and the ended
histories; version 6 added ``fingerprint`` and the grain index in byte order;
version 7 added the fence table.

Two components of their own (0.2), migrated after ``reminders`` and each on
its own, so a 0.1 silo (which knows only ``reminders``) runs beside them:
``reminder_counters`` (``COUNTERS_STEPS``: a row's counters, a child table of
the rows) and ``reminder_dead_letters`` (``DEAD_LETTERS_STEPS``: the
service's dead letters, by id, indexed in their listing order).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "COMPONENT",
    "COUNTERS_COMPONENT",
    "COUNTERS_STEPS",
    "DEAD_LETTERS_COMPONENT",
    "DEAD_LETTERS_STEPS",
    "MAX_PAYLOAD",
    "STEPS",
]

#: The component the schema's version is recorded under (``orleanspy_schema``).
COMPONENT: Final = "reminders"
#: The rows' counters (``reminders.counters``), their own component (0.2).
COUNTERS_COMPONENT: Final = "reminder_counters"
#: The service's dead letters (``reminders.letters``), their own component (0.2).
DEAD_LETTERS_COMPONENT: Final = "reminder_dead_letters"

# A notification payload must stay below 8000 bytes; longer ones (huge grain
# keys) are sent as "hash|!" and make every feed re-read, losing nothing.
MAX_PAYLOAD: Final = 7900

STEPS: Final[tuple[tuple[str, ...], ...]] = (
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
            SELECT pg_notify(channel, CASE WHEN octet_length(p) < {MAX_PAYLOAD}
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
            SELECT pg_notify(channel, CASE WHEN octet_length(p) < {MAX_PAYLOAD}
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

COUNTERS_STEPS: Final[tuple[tuple[str, ...], ...]] = (
    # v1: one row of counters per reminder row (``counters.COUNTS``), removed
    # with it (the foreign key); the last error and its time.
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_counters (
            service_id text NOT NULL,
            grain_id text NOT NULL,
            name text NOT NULL,
            delivered bigint NOT NULL DEFAULT 0,
            failed bigint NOT NULL DEFAULT 0,
            deadline_exceeded bigint NOT NULL DEFAULT 0,
            dead_lettered bigint NOT NULL DEFAULT 0,
            deduplicated bigint NOT NULL DEFAULT 0,
            skipped_paused bigint NOT NULL DEFAULT 0,
            skipped_overlap bigint NOT NULL DEFAULT 0,
            skipped_calendar bigint NOT NULL DEFAULT 0,
            skipped_catchup_window bigint NOT NULL DEFAULT 0,
            skipped_late bigint NOT NULL DEFAULT 0,
            last_error text,
            last_error_at bigint,
            PRIMARY KEY (service_id, grain_id, name),
            FOREIGN KEY (service_id, grain_id, name)
                REFERENCES orleanspy_reminders (service_id, grain_id, name) ON DELETE CASCADE
        )""",
    ),
)

DEAD_LETTERS_STEPS: Final[tuple[tuple[str, ...], ...]] = (
    # v1: letters by id (the occurrence id), their record as msgpack
    # (``DeadLetter.to_record``); the listing order (time, then id, newest
    # first) and a grain's letters in it are index scans.
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_dead_letters (
            service_id text NOT NULL,
            id text NOT NULL,
            grain_id text NOT NULL,
            name text NOT NULL,
            at bigint NOT NULL,
            record bytea NOT NULL,
            PRIMARY KEY (service_id, id)
        )""",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_dead_letters_at "
        "ON orleanspy_reminder_dead_letters (service_id, at DESC, id DESC)",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_dead_letters_grain "
        "ON orleanspy_reminder_dead_letters (service_id, grain_id, name, at DESC, id DESC)",
    ),
)
