"""How each store reads the dashboard's search order (``_reminder_reads``).

Each reader answers two parts: ``scheduled`` (rows not paused, by next due,
then grain, then name) and ``paused`` (paused rows by grain, then name), each
from a position, examining at most ``budget`` rows in that order.

- In memory (an embedded silo): its rows are in memory already; sorted and cut.
- PostgreSQL, scheduled: one statement: per priority in use, the ``upcoming``
  index ``(service_id, priority, next_due) WHERE NOT paused`` read from the
  cursor's due time (ties of one millisecond sorted by grain and name in code
  point order), merged, cut at the budget; the filters on what it read, and its
  last row. Paused: a keyset scan of the primary key ``(service_id, grain_id,
  name)`` from the cursor, the same shape.
- Redis, scheduled: every shard's due index (``SEARCH_DUE``, one script call
  per shard, pipelined) gives, per priority lane in use, the members due at the
  cursor's millisecond and the next few after it; merged by position. A lane
  that gave as many as it was asked may hold more after its last, so only what
  comes before the earliest such last is known to be complete: that is taken,
  and the next round starts where it stopped. Paused: every shard's grain index
  (members ``grain|name``) by lexicographic range from the cursor, merged the
  same way, in the members' text order. Only candidates whose key matches are
  fetched.
- A search with a key prefix that at most ``budget`` rows have (counted in the
  primary key, or in every shard's grain index) reads those rows alone and sorts
  them: finding one grain's rows does not walk the due order.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Final, Protocol

from orleanspy.dashboard._reminder_order import (
    SCHEDULED_START,
    Part,
    Position,
    Query,
    key_of,
    take,
)
from orleanspy.reminders.model import ReminderEntry

__all__ = ["Reader", "reader_for"]

#: Members after the cursor asked of one lane of one shard in a request's first
#: round (at least), and in any round (at most).
_MIN_ASK: Final = 4
_MAX_ASK: Final = 1000
#: Members due in the cursor's own millisecond read per lane of one shard: rows
#: beyond it in one millisecond of one shard and priority may be shown out of
#: grain order (never lost: the keyset moves on by due time).
TIE_CAP: Final = 1000


class Reader(Protocol):
    async def scheduled(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part: ...

    async def paused(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part: ...


def reader_for(table: Any) -> Reader:
    """The reader of ``table``'s store (memory for any table that is neither
    Redis nor PostgreSQL: it reads ``read_range``)."""
    from orleanspy.reminders.postgres import PostgresReminderTable
    from orleanspy.reminders.redis import RedisReminderTable

    if isinstance(table, RedisReminderTable):
        return _Redis(table)
    if isinstance(table, PostgresReminderTable):
        return _Postgres(table)
    return _Memory(table)


def _cut(
    ordered: list[tuple[Position, ReminderEntry]],
    query: Query,
    limit: int,
    hosted: Container[str] | None,
    budget: int,
) -> Part:
    """``ordered`` (every row of a part after the cursor, in order) cut at the
    page and the budget."""
    examined = [
        (pos, row if query.matches_key(key_of(row), hosted) else None)
        for pos, row in ordered[:budget]
    ]
    rows, last = take(examined, query, limit)
    if last is None:
        return Part(rows, None, 0)
    scanned = next(i for i, (pos, _) in enumerate(examined) if pos == last) + 1
    ended = scanned == len(ordered)
    return Part(rows, None if ended else last, scanned)


def _narrow_part(
    rows: list[ReminderEntry],
    paused: bool,
    *,
    query: Query,
    after: Position,
    limit: int,
    hosted: Container[str] | None,
    budget: int,
) -> Part:
    """A part read from every row of a narrow search (``rows``: all rows whose
    key starts with the query's prefix), sorted here."""
    ordered = sorted(
        ((p, r) for r in rows if r.paused == paused and (p := Position.of(r)) > after),
        key=_position_order,
    )
    return _cut(ordered, query, limit, hosted, budget)


class _Memory:
    def __init__(self, table: Any) -> None:
        self._table = table

    async def _rows(self) -> list[ReminderEntry]:
        from orleanspy.ring import RingRange

        rows: list[ReminderEntry] = await self._table.read_range(RingRange.full())
        return rows

    async def scheduled(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        ordered = sorted(
            ((p, r) for r in await self._rows() if not r.paused and (p := Position.of(r)) > after),
            key=_position_order,
        )
        return _cut(ordered, query, limit, hosted, budget)

    async def paused(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        ordered = sorted(
            ((p, r) for r in await self._rows() if r.paused and (p := Position.of(r)) > after),
            key=_position_order,
        )
        return _cut(ordered, query, limit, hosted, budget)


# -- PostgreSQL ---------------------------------------------------------------------


class _Postgres:
    def __init__(self, table: Any) -> None:
        self._table = table

    async def _narrow(self, query: Query, budget: int) -> list[ReminderEntry] | None:
        """Every row whose key starts with the query's key prefix when there are at
        most ``budget`` (a range of the primary key), else ``None``."""
        from orleanspy._postgres import translate_errors
        from orleanspy.reminders.postgres.rows import decode_row
        from orleanspy.reminders.postgres.sql import COLUMNS

        if not query.key_prefix:
            return None
        prefix = query.prefix
        bounds = "service_id = $1 AND grain_id >= $2 AND grain_id < $3"
        with translate_errors("dashboard reminder search"):
            found = await self._table._p.fetchval(
                f"SELECT count(*) FROM (SELECT 1 FROM orleanspy_reminders WHERE {bounds} "
                "LIMIT $4) x",
                self._table.service_id, prefix, prefix + "\U0010ffff", budget + 1,
            )  # fmt: skip
            if found > budget:
                return None
            records = await self._table._p.fetch(
                f"SELECT {COLUMNS} FROM orleanspy_reminders WHERE {bounds}",
                self._table.service_id, prefix, prefix + "\U0010ffff",
            )  # fmt: skip
        return [decode_row(r) for r in records]

    async def scheduled(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        from orleanspy.reminders.postgres.sql import COLUMNS

        narrow = await self._narrow(query, budget)
        if narrow is not None:
            return _narrow_part(
                narrow, False, query=query, after=after, limit=limit, hosted=hosted, budget=budget
            )

        # Per priority in use (only the one asked for, with a priority filter): the
        # upcoming index from the cursor's due time; ties in grain, then name order
        # (code points, as the other stores), merged, at most $5 rows. The filters
        # run on what the scan read; its last row says where the next page starts.
        prio = (
            "(SELECT $10::smallint AS p)"
            if query.priority is not None
            else "(WITH RECURSIVE q(p) AS (SELECT max(priority) FROM orleanspy_reminders "
            "WHERE service_id = $1 AND NOT paused UNION ALL SELECT (SELECT max(priority) "
            "FROM orleanspy_reminders WHERE service_id = $1 AND NOT paused AND priority < q.p) "
            "FROM q WHERE q.p IS NOT NULL) SELECT p FROM q WHERE p IS NOT NULL)"
        )
        order = 'next_due, grain_id COLLATE "C", name COLLATE "C"'
        scan = (
            f"SELECT r.* FROM {prio} prio CROSS JOIN LATERAL (SELECT {COLUMNS} "
            "FROM orleanspy_reminders WHERE service_id = $1 AND NOT paused "
            "AND priority = prio.p AND ($10::smallint IS NULL OR priority = $10) "
            "AND next_due >= $2 AND (next_due > $2 OR "
            '(grain_id COLLATE "C", name COLLATE "C") > ($3::text COLLATE "C", '
            f'$4::text COLLATE "C")) ORDER BY {order} LIMIT $5) r ORDER BY {order} LIMIT $5'
        )
        return await self._run(
            scan, order, query=query, after=after, limit=limit, hosted=hosted, budget=budget,
            scheduled=True,
        )  # fmt: skip

    async def paused(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        from orleanspy.reminders.postgres.sql import COLUMNS

        narrow = await self._narrow(query, budget)
        if narrow is not None:
            return _narrow_part(
                narrow, True, query=query, after=after, limit=limit, hosted=hosted, budget=budget
            )
        # The primary key from the cursor (bounded by the key prefix), paused rows only.
        scan = (
            f"SELECT {COLUMNS} FROM orleanspy_reminders WHERE service_id = $1 AND paused "
            "AND $2::bigint IS NOT NULL AND (grain_id, name) > ($3, $4) AND grain_id >= $6 "
            "AND ($11::text IS NULL OR grain_id < $11) "
            "AND ($10::smallint IS NULL OR priority = $10) "
            "ORDER BY service_id, grain_id, name LIMIT $5"
        )
        return await self._run(
            scan, "grain_id, name", query=query, after=after, limit=limit, hosted=hosted,
            budget=budget, scheduled=False,
        )  # fmt: skip

    async def _run(
        self,
        scan: str,
        order: str,
        *,
        query: Query,
        after: Position,
        limit: int,
        hosted: Container[str] | None,
        budget: int,
        scheduled: bool,
    ) -> Part:
        from orleanspy._postgres import translate_errors
        from orleanspy.reminders.postgres.rows import decode_row
        from orleanspy.reminders.postgres.sql import COLUMNS

        orphan_types = None
        if query.state == "orphaned":
            orphan_types = sorted(hosted) if isinstance(hosted, set | frozenset) else []
        descending = ", ".join(f"{part} DESC" for part in order.split(", "))
        sql = (
            f"WITH scan AS MATERIALIZED ({scan}) "
            f"(SELECT {COLUMNS}, 0::bigint AS scanned FROM scan "
            "WHERE starts_with(grain_id, $6) AND starts_with(name, $7) "
            "AND ($8::text[] IS NULL OR NOT (split_part(grain_id, '/', 1) = ANY($8))) "
            f"ORDER BY {order} LIMIT $9) "
            f"UNION ALL (SELECT {COLUMNS}, count(*) OVER () FROM scan "
            f"ORDER BY {descending} LIMIT 1)"
        )
        prefix = query.prefix
        upper = prefix + "\U0010ffff" if prefix else None
        rows: list[ReminderEntry] = []
        seen: set[str] = set()
        scanned = 0
        # A few pages' worth first; more, up to the budget, only when they held too
        # few hits (a narrow filter), going on from where the last scan stopped.
        ask = min(budget, 4 * (limit + 1))
        while ask > 0:
            due = after.due if scheduled else 0
            args: list[Any] = [
                self._table.service_id, due, after.grain, after.name, ask, prefix,
                query.name, orphan_types, limit + 1 - len(rows), query.priority,
            ]  # fmt: skip
            if not scheduled:
                args.append(upper)
            with translate_errors("dashboard reminder search"):
                records = await self._table._p.fetch(sql, *args)
            hits = [decode_row(r) for r in records if r["scanned"] == 0]
            last = next((r for r in records if r["scanned"] > 0), None)
            # A row shown by an earlier scan of this request that moved on since
            # (it ticked) is not shown twice.
            rows.extend(row for row in hits if key_of(row) not in seen)
            seen.update(key_of(row) for row in hits)
            if last is None:
                return Part(rows, None, scanned)
            scanned += int(last["scanned"])
            if len(rows) > limit:
                rows = rows[:limit]
                return Part(rows, Position.of(rows[-1]), scanned)
            if int(last["scanned"]) < ask:
                return Part(rows, None, scanned)  # the scan reached the part's end
            after = Position.of(decode_row(last))
            ask = min(budget - scanned, 4 * (limit + 1) * 4)
        return Part(rows, after, scanned)


# -- Redis --------------------------------------------------------------------------


class _Redis:
    def __init__(self, table: Any) -> None:
        self._table = table

    async def _narrow(self, query: Query, budget: int) -> list[ReminderEntry] | None:
        """Every row whose key starts with the query's key prefix when there are at
        most ``budget``: counted in every shard's grain index (``ZLEXCOUNT``), then
        read; else ``None``."""
        from orleanspy._redis import translate_errors

        if not query.key_prefix:
            return None
        table = self._table
        prefix = query.prefix.encode()
        low, top = b"[" + prefix, b"(" + prefix + b"\xff"
        with translate_errors("dashboard reminder search"):
            async with table._c.pipeline(transaction=False) as pipe:
                for s in range(table.shards):
                    pipe.zlexcount(table._key(s, "grain"), low, top)
                counts = await pipe.execute()
            if sum(counts) > budget:
                return None
            shards = [s for s, n in enumerate(counts) if n]
            async with table._c.pipeline(transaction=False) as pipe:
                for s in shards:
                    pipe.zrangebylex(table._key(s, "grain"), low, top)
                answers = await pipe.execute()
        wanted = [
            (s, m.decode()) for s, members in zip(shards, answers, strict=True) for m in members
        ]
        return list((await self._fetch(wanted)).values())

    async def _fetch(self, wanted: list[tuple[int, str]]) -> dict[str, ReminderEntry]:
        """The rows of ``wanted`` (shard, key), by key: one HMGET per shard, pipelined."""
        from orleanspy._redis import translate_errors
        from orleanspy.reminders.redis.layout import decode_row

        if not wanted:
            return {}
        by_shard: dict[int, list[str]] = {}
        for shard, key in wanted:
            by_shard.setdefault(shard, []).append(key)
        table = self._table
        with translate_errors("dashboard reminder search"):
            async with table._c.pipeline(transaction=False) as pipe:
                for shard, keys in by_shard.items():
                    pipe.hmget(table._key(shard, "rows"), keys)
                answers = await pipe.execute()
        out: dict[str, ReminderEntry] = {}
        for keys, raws in zip(by_shard.values(), answers, strict=True):
            for key, raw in zip(keys, raws, strict=True):
                if raw is not None:
                    out[key] = decode_row(raw)
        return out

    async def _merge(
        self,
        streams: Any,
        *,
        query: Query,
        after: Position,
        limit: int,
        hosted: Container[str] | None,
        budget: int,
        paused: bool,
    ) -> Part:
        """Rounds of ``streams(position, ask)`` until the page is full, the budget
        spent or the part ends. A round answers the candidates after the position
        as ``(order, position, shard, key)`` and the bound ``(order, position)``
        before which they are complete (``None``: all of them are). ``paused``:
        the part's rows are the paused ones (else those not paused)."""
        examined: list[tuple[Position, ReminderEntry | None]] = []
        seen: set[str] = set()
        shards = self._table.shards
        ask = 0
        while len(examined) < budget:
            need = limit - sum(1 for _, row in examined if row is not None)
            # Twice a fair share of what the page still needs per shard, doubled
            # each round of the same request (ties, or a narrow filter).
            ask = min(_MAX_ASK, max(_MIN_ASK, -(-2 * max(need, 1) // shards), 2 * ask))
            candidates, bound = await streams(after, ask)
            complete = sorted(
                (c for c in candidates if bound is None or c[0] < bound[0]), key=_first
            )
            if not complete:
                if bound is None:
                    break  # the part's end
                after = bound[1]  # nothing before the bound: go on from it
                continue
            chunk: list[tuple[Any, Position, int, str]] = []
            matching = 0
            room = budget - len(examined)
            for candidate in complete:
                if candidate[3] in seen:
                    # A row examined by an earlier round of this request that has
                    # moved on since (it ticked): it is not shown twice.
                    continue
                if len(chunk) >= room:
                    break
                seen.add(candidate[3])
                chunk.append(candidate)
                if query.matches_key(candidate[3], hosted):
                    matching += 1
                    if matching >= need:
                        break
            got = await self._fetch(
                [(s, k) for _, _, s, k in chunk if query.matches_key(k, hosted)]
            )
            for _, pos, _, key in chunk:
                row = got.get(key)
                # The grain index holds every row; its part wants the paused ones.
                examined.append((pos, row if row is None or row.paused == paused else None))
            rows, last = take(examined, query, limit)
            if len(rows) >= limit:
                return Part(rows, last, _index(examined, last))
            if not chunk:  # every complete candidate was seen: go on past them
                after = complete[-1][1]
                if bound is None:
                    break
                continue
            after = chunk[-1][1]
            if bound is None and chunk[-1] is complete[-1]:
                return Part(rows, None, len(examined))
        rows, last = take(examined, query, limit)
        return Part(rows, last if examined else None, len(examined))

    async def scheduled(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        from orleanspy._redis import run_script_calls, translate_errors
        from orleanspy.reminders.redis.scripts import SEARCH_DUE

        narrow = await self._narrow(query, budget)
        if narrow is not None:
            return _narrow_part(
                narrow, False, query=query, after=after, limit=limit, hosted=hosted, budget=budget
            )
        table = self._table
        script = table._script("search_due")
        lanes = (0, 255) if query.priority is None else (127 - query.priority,) * 2

        async def streams(at: Position, ask: int) -> tuple[list[Any], Any]:
            c = -1 if at == SCHEDULED_START else at.due
            head = [table._keys.prefix, c, ask, lanes[0], lanes[1], TIE_CAP]
            # One call for every shard on one Redis; one per shard on a cluster.
            groups = [[s] for s in range(table.shards)] if table._cluster else [range(table.shards)]
            calls = [([table._key(g[0], "due")], [*head, *g]) for g in groups]
            with translate_errors("dashboard reminder search"):
                replies = await run_script_calls(table._c, SEARCH_DUE, script.sha, calls)
            out: list[tuple[Position, Position, int, str]] = []
            counts: dict[tuple[int, int], int] = {}
            lasts: dict[tuple[int, int], int] = {}
            for flat in replies:
                for i in range(0, len(flat), 4):
                    shard, lane, due = int(flat[i]), int(flat[i + 1]), int(flat[i + 2])
                    key = flat[i + 3][9:].decode()
                    if due > c:
                        stream = (shard, lane)
                        counts[stream] = counts.get(stream, 0) + 1
                        lasts[stream] = due
                    pos = Position.of_key(due, key)
                    if pos > at:
                        out.append((pos, pos, shard, key))
            # Complete: every position before the earliest due a full lane of a shard
            # stopped at (that lane may hold more in the same millisecond).
            full = [lasts[stream] for stream, n in counts.items() if n >= ask]
            if not full:
                return out, None
            edge = Position(min(full), "", "")
            return out, (edge, edge)

        return await self._merge(
            streams, query=query, after=after, limit=limit, hosted=hosted, budget=budget,
            paused=False,
        )  # fmt: skip

    async def paused(
        self, query: Query, after: Position, limit: int, hosted: Container[str] | None, budget: int
    ) -> Part:
        from orleanspy._redis import translate_errors

        narrow = await self._narrow(query, budget)
        if narrow is not None:
            return _narrow_part(
                narrow, True, query=query, after=after, limit=limit, hosted=hosted, budget=budget
            )
        table = self._table
        prefix = query.prefix.encode()
        top = b"(" + prefix + b"\xff" if prefix else b"+"

        async def streams(at: Position, ask: int) -> tuple[list[Any], Any]:
            # The grain index's members are ``grain|name``, in their text's order:
            # the order of this part on Redis (it differs from (grain, name) order
            # only where one grain's text is the start of another's).
            seen = at.key.encode()
            low = b"(" + seen if seen else b"-"
            if prefix and seen < prefix:
                low = b"[" + prefix
            with translate_errors("dashboard reminder search"):
                async with table._c.pipeline(transaction=False) as pipe:
                    for s in range(table.shards):
                        pipe.zrangebylex(table._key(s, "grain"), low, top, start=0, num=ask)
                    answers = await pipe.execute()
            out: list[tuple[str, Position, int, str]] = []
            bound: str | None = None
            for shard, members in enumerate(answers):
                keys = [m.decode(errors="replace") for m in members]
                out.extend((k, Position.of_key(-1, k), shard, k) for k in keys)
                if len(keys) >= ask and (bound is None or keys[-1] < bound):
                    bound = keys[-1]
            return out, None if bound is None else (bound, Position.of_key(-1, bound))

        return await self._merge(
            streams, query=query, after=after, limit=limit, hosted=hosted, budget=budget,
            paused=True,
        )  # fmt: skip


def _position_order(item: tuple[Position, Any]) -> tuple[int, str, str]:
    p = item[0]
    return p.due, p.grain, p.name


def _first(item: tuple[Any, ...]) -> Any:
    """A candidate's order: a position (as a plain tuple, quicker to compare) or text."""
    o = item[0]
    return (o.due, o.grain, o.name) if isinstance(o, Position) else o


def _index(examined: list[tuple[Position, ReminderEntry | None]], last: Position | None) -> int:
    if last is None:
        return 0
    return next(i for i, (pos, _) in enumerate(examined) if pos == last) + 1
