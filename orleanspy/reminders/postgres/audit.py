"""The audit log of ``PostgresReminderTable``: a table of its own, written in the
same statement as the row it describes.

    orleanspy_reminder_audit
        service_id, id        PRIMARY KEY
        at          bigint    the record's time, ms since the epoch
        principal   text      who acted
        action      text      what (pause, delete, ...)
        grain_id, name        the row (NULL for a batch's own record)
        record      bytea     msgpack of ``AuditRecord.to_record``
    index (service_id, at, id)                 newest first; the age trim
    index (service_id, grain_id, name, at)     one row's records
    index (service_id, principal, at)          one principal's records

Its schema is the component ``reminder_audit`` (``STEPS``), migrated by the
table's ``start`` on its own, so it moves independently of the rows' schema.

**Together.** An audited write is the table's own statement (``sql.INSERT_IF_ABSENT``,
``sql.REPLACE_IF``, ``sql.REMOVE``) with two more data-modifying ``WITH`` parts
(``with_audit``): an insert of the record that selects from the write's
``RETURNING`` rows (so it inserts only when the row was written) and the age
trim. One statement is one transaction: both commit, or neither. PostgreSQL
runs every data-modifying part of a ``WITH`` exactly once, whether the final
``SELECT`` reads it or not.

**Retention.** Each append deletes the service's records past the age cutoff
(the time index makes that a range scan that is empty but for the few just
expired); every ``AUDIT_TRIM_EVERY`` appends through one table instance also
deletes the records beyond ``max_records``.
"""

from __future__ import annotations

from typing import Any, Final

from orleanspy._postgres import Pool, translate_errors
from orleanspy.clock import to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.audit import AUDIT_COUNT_SLACK, AuditQuery, AuditRecord, AuditRetention
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.postgres import sql
from orleanspy.reminders.postgres.rows import index_terms, row_values, version_of
from orleanspy.serialization import pack, unpack

__all__ = ["AUDIT_COMPONENT", "AUDIT_STEPS", "AUDIT_TRIM_EVERY", "PostgresAuditLog", "with_audit"]

#: The schema component of the audit table (``orleanspy_schema``).
AUDIT_COMPONENT: Final = "reminder_audit"

AUDIT_STEPS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE IF NOT EXISTS orleanspy_reminder_audit (
            service_id text NOT NULL,
            id text NOT NULL,
            at bigint NOT NULL,
            principal text NOT NULL,
            action text NOT NULL,
            grain_id text,
            name text,
            record bytea NOT NULL,
            PRIMARY KEY (service_id, id)
        )""",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_audit_at "
        "ON orleanspy_reminder_audit (service_id, at, id)",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_audit_grain "
        "ON orleanspy_reminder_audit (service_id, grain_id, name, at)",
        "CREATE INDEX IF NOT EXISTS orleanspy_reminder_audit_principal "
        "ON orleanspy_reminder_audit (service_id, principal, at)",
    ),
)

#: Appends through one table instance between two trims of the count (within
#: the contract's slack).
AUDIT_TRIM_EVERY: Final = AUDIT_COUNT_SLACK


def with_audit(statement: str, first: int) -> str:
    """``statement`` (a ``WITH w AS (...) ... SELECT ... FROM w`` write of the
    table's) with the record's insert and the age trim as two more ``WITH``
    parts; the record's parameters are ``$first`` .. ``$first + 7`` (id, at,
    principal, action, grain, name, record, cutoff)."""
    head, sep, tail = statement.rpartition("\n)\n")
    if not sep:
        raise ValueError("not a WITH statement of the reminder table")
    p = [f"${first + i}" for i in range(8)]
    parts = f"""
), a AS (
    INSERT INTO orleanspy_reminder_audit
        (service_id, id, at, principal, action, grain_id, name, record)
    SELECT $1, {p[0]}::text, {p[1]}::bigint, {p[2]}::text, {p[3]}::text, {p[4]}::text,
        {p[5]}::text, {p[6]}::bytea
    FROM w
), x AS (
    DELETE FROM orleanspy_reminder_audit
    WHERE service_id = $1 AND at < {p[7]}::bigint AND EXISTS (SELECT 1 FROM w)
)
"""
    return head + parts + tail


# The table's conditional writes, audited (parameters as theirs, then the record's).
INSERT_IF_ABSENT_AUDITED: Final = with_audit(sql.INSERT_IF_ABSENT, 21)
REPLACE_IF_AUDITED: Final = with_audit(sql.REPLACE_IF, 22)
REMOVE_AUDITED: Final = with_audit(sql.REMOVE, 6)

# A record on its own: $1 service, $2..$8 the record, $9 the age cutoff.
APPEND: Final = """
WITH a AS (
    INSERT INTO orleanspy_reminder_audit
        (service_id, id, at, principal, action, grain_id, name, record)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
), x AS (
    DELETE FROM orleanspy_reminder_audit WHERE service_id = $1 AND at < $9
)
SELECT 1
"""

# $1 service, $2 id, $3 the new record.
SETTLE: Final = """
UPDATE orleanspy_reminder_audit SET record = $3 WHERE service_id = $1 AND id = $2
RETURNING 1
"""

# Delete the records past the newest $2 of service $1.
TRIM_COUNT: Final = """
DELETE FROM orleanspy_reminder_audit a
USING (SELECT at, id FROM orleanspy_reminder_audit WHERE service_id = $1
       ORDER BY at DESC, id DESC OFFSET $2 LIMIT 1) edge
WHERE a.service_id = $1 AND (a.at, a.id) <= (edge.at, edge.id)
"""

# $1 service; filters (NULL: any) $2 grain, $3 name, $4 principal, $5 action,
# $6 since ms, $7 until ms; $8 limit. Newest first.
READ: Final = """
SELECT record FROM orleanspy_reminder_audit
WHERE service_id = $1
  AND ($2::text IS NULL OR grain_id = $2)
  AND ($3::text IS NULL OR name = $3)
  AND ($4::text IS NULL OR principal = $4)
  AND ($5::text IS NULL OR action = $5)
  AND ($6::bigint IS NULL OR at >= $6)
  AND ($7::bigint IS NULL OR at <= $7)
ORDER BY at DESC, id DESC
LIMIT $8
"""


def _record_values(record: AuditRecord, retention: AuditRetention) -> tuple[Any, ...]:
    return (
        record.id,
        to_ms(record.at),
        record.principal,
        record.action,
        None if record.grain_id is None else record.grain_id.canonical,
        record.name,
        pack(record.to_record()),
        retention.cutoff_ms(record.at),
    )


class PostgresAuditLog:
    """The audit half of one started ``PostgresReminderTable`` (module docstring)."""

    def __init__(self, pool: Pool, service_id: str, channel: str) -> None:
        self._pool = pool
        self._service_id = service_id
        self._channel = channel
        self._appends = 0

    async def upsert_if(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        extra: tuple[int, ...] = ()
        if expected_etag is None:
            statement = INSERT_IF_ABSENT_AUDITED
        else:
            version = version_of(expected_etag)
            if version is None:
                return None
            statement, extra = REPLACE_IF_AUDITED, (version,)
        with translate_errors("reminder upsert_if (audited)"):
            new = await self._pool.fetchval(
                statement,
                self._service_id,
                *row_values(entry),
                self._channel,
                *extra,
                index_terms(entry),
                *_record_values(record, retention),
            )
        if new is not None:
            await self._counted(retention)
        return None if new is None else str(new)

    async def remove(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        version = version_of(etag)
        if version is None:
            return False
        with translate_errors("reminder remove (audited)"):
            records = await self._pool.fetch(
                REMOVE_AUDITED,
                self._service_id,
                grain_id.canonical,
                name,
                version,
                self._channel,
                *_record_values(record, retention),
            )
        if records:
            await self._counted(retention)
        return bool(records)

    async def append(self, record: AuditRecord, retention: AuditRetention) -> None:
        with translate_errors("reminder audit append"):
            await self._pool.fetchval(APPEND, self._service_id, *_record_values(record, retention))
        await self._counted(retention)

    async def settle(self, record: AuditRecord) -> bool:
        with translate_errors("reminder audit settle"):
            done = await self._pool.fetchval(
                SETTLE, self._service_id, record.id, pack(record.to_record())
            )
        return done is not None

    async def read(self, query: AuditQuery) -> list[AuditRecord]:
        with translate_errors("reminder audit read"):
            rows = await self._pool.fetch(
                READ,
                self._service_id,
                None if query.grain_id is None else query.grain_id.canonical,
                query.name,
                query.principal,
                query.action,
                query.since_ms,
                query.until_ms,
                query.limit,
            )
        try:
            return [AuditRecord.from_record(unpack(row["record"])) for row in rows]
        except (SerializationError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed audit record in postgresql: {exc}") from exc

    async def _counted(self, retention: AuditRetention) -> None:
        """Every ``AUDIT_TRIM_EVERY`` appends, trim the count to ``max_records``."""
        self._appends += 1
        if self._appends % AUDIT_TRIM_EVERY:
            return
        with translate_errors("reminder audit trim"):
            await self._pool.execute(TRIM_COUNT, self._service_id, retention.max_records)
