"""Counters and dead letters of ``PostgresReminderTable``.

``orleanspy_reminder_counters`` holds one row of counters per reminder row (a
child table: the reminder row's removal cascades to it); ``add_counts`` is one
statement that adds a batch's deltas to the rows that exist (a batch's deltas
are merged per row first, and written in key order, so two writers lock rows
in one order). ``orleanspy_reminder_dead_letters`` holds the service's dead
letters by id; ``add_dead_letters`` writes them and applies the bounds in one
transaction (two statements: a dead letter is rare), a page is one indexed
range scan. The tables come from ``migrations.COUNTERS_STEPS`` and
``DEAD_LETTERS_STEPS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from orleanspy._postgres import Pool, translate_errors
from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.counters import COUNTS, CounterDelta, ReminderCounters
from orleanspy.reminders.letters import DeadLetter, letter_cursor, parse_letter_cursor
from orleanspy.reminders.table import check_page_limit
from orleanspy.serialization import pack, unpack

__all__ = ["PostgresRecords"]

_N = len(COUNTS)
# $1 service; $2, $3 grain ids and names; then one bigint[] per counter; then
# the last errors and their times.
_ADD_COUNTS: Final = f"""
INSERT INTO orleanspy_reminder_counters AS c
    (service_id, grain_id, name, {", ".join(COUNTS)}, last_error, last_error_at)
SELECT $1, d.grain_id, d.name, {", ".join(f"d.{c}" for c in COUNTS)}, d.e, d.t
FROM unnest($2::text[], $3::text[],
            {", ".join(f"${i}::bigint[]" for i in range(4, 4 + _N))},
            ${4 + _N}::text[], ${5 + _N}::bigint[])
    AS d(grain_id, name, {", ".join(COUNTS)}, e, t)
JOIN orleanspy_reminders r
    ON r.service_id = $1 AND r.grain_id = d.grain_id AND r.name = d.name
ORDER BY d.grain_id, d.name
ON CONFLICT (service_id, grain_id, name) DO UPDATE SET
    {", ".join(f"{c} = c.{c} + EXCLUDED.{c}" for c in COUNTS)},
    last_error = coalesce(EXCLUDED.last_error, c.last_error),
    last_error_at = CASE WHEN EXCLUDED.last_error IS NULL THEN c.last_error_at
                         ELSE EXCLUDED.last_error_at END
"""
_READ_COUNTS: Final = f"""
SELECT {", ".join(COUNTS)}, last_error, last_error_at FROM orleanspy_reminder_counters
WHERE service_id = $1 AND grain_id = $2 AND name = $3
"""
_ADD_LETTERS: Final = """
INSERT INTO orleanspy_reminder_dead_letters (service_id, id, grain_id, name, at, record)
SELECT $1, d.id, d.grain_id, d.name, d.at, d.record
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
    AS d(id, grain_id, name, at, record)
ON CONFLICT (service_id, id) DO UPDATE SET
    grain_id = EXCLUDED.grain_id, name = EXCLUDED.name, at = EXCLUDED.at,
    record = EXCLUDED.record
"""
# $2 expire before (ms), $3 keep: drops the expired, and what comes after the
# keep-th newest in the listing order.
_TRIM_LETTERS: Final = """
DELETE FROM orleanspy_reminder_dead_letters
WHERE service_id = $1 AND (
    at < $2 OR (at, id) < (
        SELECT at, id FROM orleanspy_reminder_dead_letters
        WHERE service_id = $1 ORDER BY at DESC, id DESC OFFSET $3 - 1 LIMIT 1))
"""
_READ_LETTER: Final = """
SELECT record FROM orleanspy_reminder_dead_letters WHERE service_id = $1 AND id = $2
"""
_REMOVE_LETTER: Final = """
DELETE FROM orleanspy_reminder_dead_letters WHERE service_id = $1 AND id = $2
"""
_COUNT_LETTERS: Final = """
SELECT count(*) FROM orleanspy_reminder_dead_letters WHERE service_id = $1
"""


class PostgresRecords:
    """The counters and dead letters of one service (module docstring)."""

    __slots__ = ("_pool", "_service")

    def __init__(self, pool: Pool, service_id: str) -> None:
        self._pool = pool
        self._service = service_id

    async def add_counts(self, deltas: Sequence[CounterDelta]) -> None:
        merged: dict[tuple[str, str], CounterDelta] = {}
        for d in deltas:
            key = (d.grain_id.canonical, d.name)
            known = merged.get(key)
            if known is None:
                known = merged[key] = CounterDelta(d.grain_id, d.name)
            known.merge(d)
        if not merged:
            return
        rows = [merged[k] for k in sorted(merged)]
        columns = [[d.counts[i] for d in rows] for i in range(_N)]
        with translate_errors("reminder add_counts"):
            await self._pool.execute(
                _ADD_COUNTS,
                self._service,
                [d.grain_id.canonical for d in rows],
                [d.name for d in rows],
                *columns,
                [d.last_error for d in rows],
                [None if d.last_error_at is None else to_ms(d.last_error_at) for d in rows],
            )

    async def read_counts(self, grain_id: GrainId, name: str) -> ReminderCounters:
        with translate_errors("reminder read_counts"):
            rec = await self._pool.fetchrow(_READ_COUNTS, self._service, grain_id.canonical, name)
        if rec is None:
            return ReminderCounters()
        at = rec["last_error_at"]
        return ReminderCounters.from_counts(
            [rec[c] for c in COUNTS], rec["last_error"], None if at is None else from_ms(at)
        )

    async def add_letters(
        self, letters: Sequence[DeadLetter], keep: int, expire_before: datetime
    ) -> None:
        with translate_errors("reminder add_dead_letters"):
            async with self._pool.acquire() as conn, conn.transaction():
                if letters:
                    await conn.execute(
                        _ADD_LETTERS,
                        self._service,
                        [d.id for d in letters],
                        [d.grain_id.canonical for d in letters],
                        [d.name for d in letters],
                        [to_ms(d.at) for d in letters],
                        [pack(d.to_record()) for d in letters],
                    )
                await conn.execute(_TRIM_LETTERS, self._service, to_ms(expire_before), keep)

    async def page(
        self, cursor: str | None, limit: int, grain_id: GrainId | None, name: str | None
    ) -> tuple[list[DeadLetter], str | None]:
        check_page_limit(limit)
        after = parse_letter_cursor(cursor)
        where = ["service_id = $1"]
        args: list[Any] = [self._service]
        if grain_id is not None:
            args.append(grain_id.canonical)
            where.append(f"grain_id = ${len(args)}")
        if name is not None:
            args.append(name)
            where.append(f"name = ${len(args)}")
        if after is not None:
            args += after
            where.append(f"(at, id) < (${len(args) - 1}, ${len(args)})")
        args.append(limit + 1)
        query = (
            "SELECT record FROM orleanspy_reminder_dead_letters WHERE "
            + " AND ".join(where)
            + f" ORDER BY at DESC, id DESC LIMIT ${len(args)}"
        )
        with translate_errors("reminder read_dead_letters"):
            records = await self._pool.fetch(query, *args)
        letters = [_decode(r["record"]) for r in records[:limit]]
        return letters, letter_cursor(letters[-1]) if len(records) > limit else None

    async def get(self, letter_id: str) -> DeadLetter | None:
        with translate_errors("reminder read_dead_letter"):
            raw = await self._pool.fetchval(_READ_LETTER, self._service, letter_id)
        return None if raw is None else _decode(raw)

    async def remove(self, letter_id: str) -> bool:
        with translate_errors("reminder remove_dead_letter"):
            status = await self._pool.execute(_REMOVE_LETTER, self._service, letter_id)
        return str(status).endswith(" 1")

    async def count(self) -> int:
        with translate_errors("reminder count_dead_letters"):
            return int(await self._pool.fetchval(_COUNT_LETTERS, self._service))


def _decode(raw: bytes) -> DeadLetter:
    try:
        rec = unpack(bytes(raw))
    except SerializationError as exc:
        raise StorageError(f"malformed dead letter in postgresql: {exc}") from exc
    if not isinstance(rec, dict):
        raise StorageError("malformed dead letter in postgresql: not a map")
    return DeadLetter.from_record(rec)
