"""Reminder rows for the dashboard, a page at a time, straight from the store.

The only module of the dashboard that knows how a table lays its rows out, so
it can move to the tables' own paged read when they have one. A page never
holds more than ``limit`` rows, and one request looks at no more than
``SCAN_BUDGET`` candidates: a search that matches little returns a short page
and a cursor to go on, never a walk of the whole table.

- Redis: each shard's ``grain`` index (a sorted set of ``grain|name``, all
  scores 0) is read by lexicographic range from the cursor, shards in order: a
  few shards per round trip, or one while inside a shard with more entries than
  one ask; only the candidates whose key and name match are fetched.
- PostgreSQL: one statement: a keyset scan of the primary key ``(service_id,
  grain_id, name)`` from the cursor (bounded by the key prefix and by
  ``SCAN_BUDGET`` rows), the filters on what it read, and its last row.
- In memory (an embedded silo): its rows are in memory already; sorted and cut.

The cursor is opaque text: ``r:<shard>:<hex of the last key>`` (Redis) or
``p:<hex of the last key>`` (PostgreSQL, memory). A malformed cursor is a
``ValueError`` (the caller answers 400).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any, Final

from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry, row_key

__all__ = ["SCAN_BUDGET", "Page", "Query", "ReminderPages"]

#: Most index entries one search request examines.
SCAN_BUDGET: Final = 5000
_SHARDS_PER_ROUND: Final = 16
#: Most index entries asked of one shard per round trip.
_MAX_ASK: Final = 1000
_MAX_CURSOR: Final = 4096


@dataclass(frozen=True, slots=True)
class Query:
    """A search. ``grain_type``: exact type ('' any); ``key_prefix``: the key's
    start (string keys; ``i:4`` or ``u:...`` for int and UUID keys); ``name``:
    the reminder name's start; ``priority``: exact; ``state``: ``any``,
    ``paused``, ``active`` or ``orphaned`` (its grain type is hosted by no
    Active silo)."""

    grain_type: str = ""
    key_prefix: str = ""
    name: str = ""
    priority: int | None = None
    state: str = "any"

    @property
    def prefix(self) -> str:
        """The start every matching row key has."""
        if not self.grain_type:
            return ""
        if not self.key_prefix:
            return f"{self.grain_type}/"
        key = self.key_prefix
        tagged = key[:2] in ("s:", "i:", "u:")
        return f"{self.grain_type}/{key if tagged else 's:' + key}"

    def matches_key(self, key: str, hosted: Container[str] | None) -> bool:
        grain, _, name = key.rpartition("|")
        if not grain.startswith(self.prefix) or not name.startswith(self.name):
            return False
        if self.state == "orphaned":
            return hosted is not None and grain.partition("/")[0] not in hosted
        return True

    def matches_row(self, row: ReminderEntry) -> bool:
        if self.priority is not None and int(row.priority) != self.priority:
            return False
        if self.state == "paused":
            return row.paused
        if self.state == "active":
            return not row.paused
        return True


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ReminderEntry]
    cursor: str | None
    """Where the next page starts; ``None`` at the end."""
    scanned: int


def _hex(text: str) -> str:
    return text.encode().hex()


def _unhex(text: str) -> str:
    if len(text) > _MAX_CURSOR:
        raise ValueError("cursor too long")
    try:
        return bytes.fromhex(text).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("malformed cursor") from None


class ReminderPages:
    """Pages of one reminder table (Redis, PostgreSQL or in memory)."""

    def __init__(self, table: Any) -> None:
        self._table = table

    async def search(
        self, query: Query, cursor: str | None, limit: int, hosted: Container[str] | None
    ) -> Page:
        """Rows matching ``query`` after ``cursor``, at most ``limit``."""
        from orleanspy.reminders.postgres import PostgresReminderTable
        from orleanspy.reminders.redis import RedisReminderTable

        if isinstance(self._table, RedisReminderTable):
            return await self._redis(query, cursor, limit, hosted)
        if isinstance(self._table, PostgresReminderTable):
            return await self._postgres(query, cursor, limit, hosted)
        return await self._memory(query, cursor, limit, hosted)

    async def _redis(
        self, query: Query, cursor: str | None, limit: int, hosted: Container[str] | None
    ) -> Page:
        from orleanspy._redis import translate_errors
        from orleanspy.reminders.redis import _decode_row

        table = self._table
        shards = table.shards
        shard, after = 0, ""
        if cursor:
            kind, _, rest = cursor.partition(":")
            number, _, last = rest.partition(":")
            if kind != "r" or not number.isdigit() or not 0 <= int(number) < shards:
                raise ValueError("malformed cursor")
            shard, after = int(number), _unhex(last)
        prefix = query.prefix.encode()
        top = b"(" + prefix + b"\xff" if prefix else b"+"
        rows: list[ReminderEntry] = []
        scanned = 0
        client = table._c
        # A few pages' worth first; once a shard has more than that and the page is
        # still short (a narrow filter), the largest ask.
        ask = min(_MAX_ASK, 4 * limit)
        while shard < shards and len(rows) < limit and scanned < SCAN_BUDGET:
            # Inside a shard with more to read, ask that shard alone; else a few at once.
            batch = list(range(shard, min(shards, shard + (1 if after else _SHARDS_PER_ROUND))))
            want = min(ask, SCAN_BUDGET - scanned) + 1
            with translate_errors("dashboard reminder search"):
                async with client.pipeline(transaction=False) as pipe:
                    for s in batch:
                        if s == shard and after:
                            low = b"(" + after.encode()
                        else:
                            low = b"[" + prefix if prefix else b"-"
                        pipe.zrangebylex(table._key(s, "grain"), low, top, start=0, num=want)
                    answers = await pipe.execute()
            for s, members in zip(batch, answers, strict=True):
                keys = [m.decode(errors="replace") for m in members]
                more = len(keys) == want
                if more:
                    keys = keys[:-1]
                room = SCAN_BUDGET - scanned
                if len(keys) > room:  # the budget is exact, not per round
                    keys, more = keys[:room], True
                scanned += len(keys)
                candidates = [k for k in keys if query.matches_key(k, hosted)]
                if candidates:
                    with translate_errors("dashboard reminder search"):
                        raws = await client.hmget(table._key(s, "rows"), candidates)
                    for key, raw in zip(candidates, raws, strict=True):
                        if raw is None:
                            continue
                        row = _decode_row(raw)
                        if query.matches_row(row):
                            rows.append(row)
                            if len(rows) >= limit:
                                return Page(rows, f"r:{s}:{_hex(key)}", scanned)
                if more:
                    shard, after = s, (keys[-1] if keys else after)
                    ask = _MAX_ASK
                    break
                after = ""
            else:
                shard = batch[-1] + 1
        if shard >= shards:
            return Page(rows, None, scanned)
        return Page(rows, f"r:{shard}:{_hex(after)}", scanned)

    async def _postgres(
        self, query: Query, cursor: str | None, limit: int, hosted: Container[str] | None
    ) -> Page:
        from orleanspy._postgres import translate_errors
        from orleanspy.reminders.postgres import _COLUMNS, _row

        after_grain, after_name = _keyset(cursor)
        prefix = query.prefix
        paused = {"paused": True, "active": False}.get(query.state)
        orphan_types = None
        if query.state == "orphaned":
            orphan_types = sorted(hosted) if isinstance(hosted, set | frozenset) else []
        # The scan walks the primary key from the cursor, at most SCAN_BUDGET rows (a
        # bound on the database's work too); the filters run on what it read. Its
        # last row, with the count, says where the next request goes on.
        bound = "AND grain_id < $10 " if prefix else "AND $10::text IS NULL "
        sql = (
            f"WITH scan AS MATERIALIZED (SELECT {_COLUMNS} FROM orleanspy_reminders "
            "WHERE service_id = $1 AND (grain_id, name) > ($2, $3) AND grain_id >= $4 "
            f"{bound}ORDER BY service_id, grain_id, name LIMIT $11) "
            f"(SELECT {_COLUMNS}, 0::bigint AS scanned FROM scan "
            "WHERE starts_with(grain_id, $4) AND starts_with(name, $5) "
            "AND ($6::smallint IS NULL OR priority = $6) "
            "AND ($7::boolean IS NULL OR paused = $7) "
            "AND ($8::text[] IS NULL OR NOT (split_part(grain_id, '/', 1) = ANY($8))) "
            "ORDER BY grain_id, name LIMIT $9) "
            f"UNION ALL (SELECT {_COLUMNS}, count(*) OVER () FROM scan "
            "ORDER BY grain_id DESC, name DESC LIMIT 1)"
        )
        upper = prefix + "\U0010ffff" if prefix else None
        # A few pages' worth first; more, up to the budget, only when they held too
        # few hits (a narrow filter), going on from where the last scan stopped.
        rows: list[ReminderEntry] = []
        scanned, ask = 0, min(SCAN_BUDGET, 4 * (limit + 1))
        while True:
            with translate_errors("dashboard reminder search"):
                records = await self._table._p.fetch(
                    sql, self._table.service_id, after_grain, after_name, prefix, query.name,
                    query.priority, paused, orphan_types, limit + 1 - len(rows), upper, ask,
                )  # fmt: skip
            # The scan's last row is the one with its count (hits carry 0); none when
            # the scan read nothing.
            hits = [_row(r) for r in records if r["scanned"] == 0]
            last = next((r for r in records if r["scanned"] > 0), None)
            rows.extend(hits)
            if last is None:
                return Page(rows, None, scanned)
            scanned += int(last["scanned"])
            if len(rows) > limit:
                rows = rows[:limit]
                return Page(rows, f"p:{_hex(row_key(rows[-1].grain_id, rows[-1].name))}", scanned)
            if int(last["scanned"]) < ask:
                return Page(rows, None, scanned)  # the scan reached the end
            after_grain, after_name = last["grain_id"], last["name"]
            if scanned >= SCAN_BUDGET:
                return Page(rows, f"p:{_hex(after_grain + '|' + after_name)}", scanned)
            ask = SCAN_BUDGET - scanned

    async def _memory(
        self, query: Query, cursor: str | None, limit: int, hosted: Container[str] | None
    ) -> Page:
        from orleanspy.ring import RingRange

        after_grain, after_name = _keyset(cursor)
        after = (after_grain, after_name)
        found = []
        for row in await self._table.read_range(RingRange.full()):
            key = row.key
            if (row.grain_id.canonical, row.name) <= after:
                continue
            if query.matches_key(key, hosted) and query.matches_row(row):
                found.append(row)
        found.sort(key=lambda r: (r.grain_id.canonical, r.name))
        more = len(found) > limit
        rows = found[:limit]
        nxt = f"p:{_hex(row_key(rows[-1].grain_id, rows[-1].name))}" if more and rows else None
        return Page(rows, nxt, len(found))


def _keyset(cursor: str | None) -> tuple[str, str]:
    if not cursor:
        return "", ""
    kind, _, rest = cursor.partition(":")
    if kind != "p":
        raise ValueError("malformed cursor")
    grain, sep, name = _unhex(rest).rpartition("|")
    if not sep:
        raise ValueError("malformed cursor")
    GrainId.parse(grain)  # ValueError when it is not a grain id
    return grain, name
