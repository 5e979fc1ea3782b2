"""``PostgresReminderTable``'s label index, calendars and backfill jobs (``reminders.stores``).

Three schema components, each migrating on its own (``orleanspy.schema``), so a
store that has them is still one a 0.1 silo starts on (it checks only the
``reminders`` component it knows)::

    orleanspy_reminder_index       component reminder_index
        service_id, term, grain_id, name   PRIMARY KEY (walks a term in key order)
        FOREIGN KEY (service_id, grain_id, name) -> orleanspy_reminders ON DELETE CASCADE
    index (service_id, grain_id, name)     a row's own terms (rewrites, the cascade)

    orleanspy_reminder_calendars   component reminder_calendars
        service_id, name PRIMARY KEY; record bytea (msgpack ``Calendar.to_record``);
        version bigint from the sequence orleanspy_reminder_calendar_version

    orleanspy_reminder_backfills   component reminder_backfills
        service_id, grain_id, name PRIMARY KEY; record bytea (msgpack
        ``BackfillJob.to_record``); version bigint (the etag) from the sequence
        orleanspy_reminder_backfill_version; FOREIGN KEY to the row ON DELETE CASCADE;
        and the fire history's ``backfill`` column (a record of a backfilled slot)

The index is written by the same statement as the row (``sql``'s whole-row
writes take the row's terms and keep the index to them, ``ix_terms``); a
removal's cascade drops the row's entries. A 0.1 silo's whole-row writes leave
the index as it was: ``read_indexed`` checks the terms of the rows it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from orleanspy._postgres import Pool, translate_errors
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.postgres.rows import decode_row
from orleanspy.reminders.postgres.sql import COLUMNS
from orleanspy.reminders.stores import has_terms
from orleanspy.reminders.table import check_page_limit, key_cursor, parse_key_cursor
from orleanspy.serialization import pack, unpack

__all__ = ["COMPONENTS", "PostgresStores", "ix_terms"]

#: The components of this module and their steps (``_postgres.migrate``).
COMPONENTS: Final[tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]] = (
    (
        "reminder_index",
        (
            (
                """CREATE TABLE IF NOT EXISTS orleanspy_reminder_index (
                    service_id text NOT NULL,
                    term text NOT NULL,
                    grain_id text NOT NULL,
                    name text NOT NULL,
                    PRIMARY KEY (service_id, term, grain_id, name),
                    FOREIGN KEY (service_id, grain_id, name)
                        REFERENCES orleanspy_reminders (service_id, grain_id, name)
                        ON DELETE CASCADE
                )""",
                "CREATE INDEX IF NOT EXISTS orleanspy_reminder_index_row "
                "ON orleanspy_reminder_index (service_id, grain_id, name)",
            ),
        ),
    ),
    (
        "reminder_calendars",
        (
            (
                "CREATE SEQUENCE IF NOT EXISTS orleanspy_reminder_calendar_version",
                """CREATE TABLE IF NOT EXISTS orleanspy_reminder_calendars (
                    service_id text NOT NULL,
                    name text NOT NULL,
                    record bytea NOT NULL,
                    version bigint NOT NULL,
                    PRIMARY KEY (service_id, name)
                )""",
            ),
        ),
    ),
    (
        "reminder_backfills",
        (
            (
                "CREATE SEQUENCE IF NOT EXISTS orleanspy_reminder_backfill_version",
                # Fire records of backfilled slots say so (0.1 writes false).
                "ALTER TABLE orleanspy_reminder_history "
                "ADD COLUMN IF NOT EXISTS backfill boolean NOT NULL DEFAULT false",
                "ALTER TABLE orleanspy_reminder_ended_history "
                "ADD COLUMN IF NOT EXISTS backfill boolean NOT NULL DEFAULT false",
                """CREATE TABLE IF NOT EXISTS orleanspy_reminder_backfills (
                    service_id text NOT NULL,
                    grain_id text NOT NULL,
                    name text NOT NULL,
                    record bytea NOT NULL,
                    version bigint NOT NULL,
                    PRIMARY KEY (service_id, grain_id, name),
                    FOREIGN KEY (service_id, grain_id, name)
                        REFERENCES orleanspy_reminders (service_id, grain_id, name)
                        ON DELETE CASCADE
                )""",
            ),
        ),
    ),
)

# $1 service, $2 the first term, $3, $4 the key after which to start, $5 the
# other terms, $6 rows. The primary key walks the first term in key order; the
# other terms are probed per row on the row's own index.
_READ_INDEXED: Final = f"""
SELECT {", ".join("r." + c.strip() for c in COLUMNS.split(","))}
FROM orleanspy_reminder_index x
JOIN orleanspy_reminders r
    ON r.service_id = x.service_id AND r.grain_id = x.grain_id AND r.name = x.name
WHERE x.service_id = $1 AND x.term = $2 AND (x.grain_id, x.name) > ($3::text, $4::text)
    AND (SELECT count(*) FROM orleanspy_reminder_index y
         WHERE y.service_id = $1 AND y.grain_id = x.grain_id AND y.name = x.name
             AND y.term = ANY($5::text[])) = cardinality($5::text[])
ORDER BY x.grain_id, x.name
LIMIT $6
"""
_COUNT_INDEXED: Final = (
    "SELECT count(*) FROM orleanspy_reminder_index WHERE service_id = $1 AND term = $2"
)
_WRITE_CALENDAR: Final = """
INSERT INTO orleanspy_reminder_calendars (service_id, name, record, version)
VALUES ($1, $2, $3, nextval('orleanspy_reminder_calendar_version'))
ON CONFLICT (service_id, name) DO UPDATE
SET record = EXCLUDED.record, version = EXCLUDED.version
RETURNING version
"""
_READ_CALENDAR: Final = """
SELECT name, record, version FROM orleanspy_reminder_calendars
WHERE service_id = $1 AND name = $2
"""
_READ_CALENDARS: Final = """
SELECT name, record, version FROM orleanspy_reminder_calendars
WHERE service_id = $1 ORDER BY name
"""
_REMOVE_CALENDAR: Final = """
DELETE FROM orleanspy_reminder_calendars WHERE service_id = $1 AND name = $2 AND version = $3
RETURNING 1
"""
# Insert where the row exists and has no job (nothing otherwise).
_ADD_BACKFILL: Final = """
INSERT INTO orleanspy_reminder_backfills (service_id, grain_id, name, record, version)
SELECT $1, $2, $3, $4, nextval('orleanspy_reminder_backfill_version')
WHERE EXISTS (SELECT 1 FROM orleanspy_reminders
              WHERE service_id = $1 AND grain_id = $2 AND name = $3)
ON CONFLICT (service_id, grain_id, name) DO NOTHING
RETURNING version
"""
_UPDATE_BACKFILL: Final = """
UPDATE orleanspy_reminder_backfills
SET record = $4, version = nextval('orleanspy_reminder_backfill_version')
WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND version = $5
RETURNING version
"""
_READ_BACKFILL: Final = """
SELECT record, version FROM orleanspy_reminder_backfills
WHERE service_id = $1 AND grain_id = $2 AND name = $3
"""
_READ_BACKFILLS: Final = """
SELECT record, version FROM orleanspy_reminder_backfills
WHERE service_id = $1 ORDER BY grain_id, name
"""
_REMOVE_BACKFILL: Final = """
DELETE FROM orleanspy_reminder_backfills
WHERE service_id = $1 AND grain_id = $2 AND name = $3 AND ($4::bigint IS NULL OR version = $4)
RETURNING 1
"""


def ix_terms(entry: ReminderEntry) -> str:
    """A row's index terms as one text for the bulk statements' arrays (joined
    by line breaks, which no term holds)."""
    return "\n".join(entry.index_terms()) if entry.labels or entry.calendar else ""


def _version(etag: str | None) -> int | None:
    if etag is None:
        return None
    if not etag.isascii() or not etag.isdigit() or len(etag) > 18:
        return -1  # no version of ours: never matches
    return int(etag)


class PostgresStores:
    """The label index reads, calendars and backfills of one table (module docstring)."""

    def __init__(self, pool: Pool, service_id: str) -> None:
        self._p = pool
        self._service = service_id

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        check_page_limit(limit)
        if not terms:
            raise ValueError("read_indexed needs at least one term")
        grain, name = parse_key_cursor(cursor)
        others = sorted(set(terms[1:]) - {terms[0]})
        with translate_errors("reminder read_indexed"):
            records = await self._p.fetch(
                _READ_INDEXED, self._service, terms[0], grain, name, others, limit
            )
        rows = [decode_row(rec) for rec in records]
        nxt = key_cursor(rows[-1]) if len(rows) == limit else None
        return [r for r in rows if has_terms(r, terms)], nxt

    async def count_indexed(self, term: str) -> int:
        with translate_errors("reminder count_indexed"):
            return int(await self._p.fetchval(_COUNT_INDEXED, self._service, term))

    async def write_calendar(self, name: str, calendar: Calendar) -> StoredCalendar:
        with translate_errors("reminder write_calendar"):
            version = await self._p.fetchval(
                _WRITE_CALENDAR, self._service, name, pack(calendar.to_record())
            )
        return StoredCalendar(name, calendar, int(version))

    async def read_calendar(self, name: str) -> StoredCalendar | None:
        with translate_errors("reminder read_calendar"):
            rec = await self._p.fetchrow(_READ_CALENDAR, self._service, name)
        return None if rec is None else _calendar(rec)

    async def read_calendars(self) -> list[StoredCalendar]:
        with translate_errors("reminder read_calendars"):
            records = await self._p.fetch(_READ_CALENDARS, self._service)
        return [_calendar(rec) for rec in records]

    async def remove_calendar(self, name: str, version: int) -> bool:
        with translate_errors("reminder remove_calendar"):
            done = await self._p.fetchval(_REMOVE_CALENDAR, self._service, name, version)
        return done is not None

    async def add_backfill(self, job: BackfillJob) -> BackfillJob | None:
        with translate_errors("reminder add_backfill"):
            version = await self._p.fetchval(
                _ADD_BACKFILL, self._service, *self._key(job), pack(job.to_record())
            )
        return None if version is None else job.with_etag(str(version))

    async def update_backfill(self, job: BackfillJob, etag: str) -> str | None:
        with translate_errors("reminder update_backfill"):
            version = await self._p.fetchval(
                _UPDATE_BACKFILL,
                self._service,
                *self._key(job),
                pack(job.to_record()),
                _version(etag),
            )
        return None if version is None else str(version)

    async def read_backfill(self, grain_id: GrainId, name: str) -> BackfillJob | None:
        with translate_errors("reminder read_backfill"):
            rec = await self._p.fetchrow(_READ_BACKFILL, self._service, grain_id.canonical, name)
        return None if rec is None else _job(rec)

    async def read_backfills(self) -> list[BackfillJob]:
        with translate_errors("reminder read_backfills"):
            records = await self._p.fetch(_READ_BACKFILLS, self._service)
        return [_job(rec) for rec in records]

    async def remove_backfill(self, grain_id: GrainId, name: str, etag: str | None = None) -> bool:
        with translate_errors("reminder remove_backfill"):
            done = await self._p.fetchval(
                _REMOVE_BACKFILL, self._service, grain_id.canonical, name, _version(etag)
            )
        return done is not None

    @staticmethod
    def _key(job: BackfillJob) -> tuple[str, str]:
        return job.grain_id.canonical, job.name


def _calendar(rec: Any) -> StoredCalendar:
    try:
        calendar = Calendar.from_record(unpack(rec["record"]))
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed calendar {rec['name']!r} in postgresql: {exc}") from exc
    return StoredCalendar(rec["name"], calendar, int(rec["version"]))


def _job(rec: Any) -> BackfillJob:
    try:
        return BackfillJob.from_record(unpack(rec["record"]), str(rec["version"]))
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed backfill job in postgresql: {exc}") from exc
