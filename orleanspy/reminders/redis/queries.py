"""The reads of ``RedisReminderTable``: rows, grains, ranges, due reads, pages, type counts.

``RedisReads`` is made by the table when it starts, over its client, its
``ShardKeys`` and its registered scripts; the table's read methods are its.
A due read (``read_due_skipping``, and so the table's
``read_due`` and ``upcoming``) is one ``READ_MERGED`` call on one Redis, one
per node on a Redis Cluster (``_collect``); ``read_range`` reads each shard by
its own ``READ_DUE`` call; a page walks the shards' grain ZSETs in shard order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, cast

from orleanspy._redis import Client, node_groups, run_script_calls, translate_errors
from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry, row_key
from orleanspy.reminders.redis.layout import (
    LANE_WIDTH,
    ShardKeys,
    decode_row,
    grain_rows,
)
from orleanspy.reminders.redis.scripts import READ_DUE, READ_GRAINS, READ_MERGED, TYPES
from orleanspy.reminders.table import check_page_limit, grain_prefix
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.serialization import pack_lua

__all__ = ["RedisReads"]

# How many due members one ZRANGEBYSCORE call inside read_range's script returns.
_MAX_PAGE: Final = 1000
# The merged read first asks each shard for about twice its fair share of
# ``limit`` (at least this many), then reads on only the shards whose members
# keep coming first.
_MIN_FIRST_ASK: Final = 16
# A skip set travels with a due read (``_collect``) when it holds at most this
# many keys, or the range covers at least ``1 / _SKIP_SHARE`` of the ring.
_SKIP_SENT: Final = 64
_SKIP_SHARE: Final = 8
# Ranges whose read plans a table keeps (``_merged_plan``); all are dropped past it.
_PLANS_KEPT: Final = 64
#: Rows decoded between two yields to the event loop. A refill of a whole bucket
#: decodes about a thousand rows; in one go that held a busy silo's loop, and
#: every call waiting on it, for a few hundred milliseconds (a restart over
#: 100,000 overdue rows, ``benchmarks/bench_herd_restart``).
_DECODE_CHUNK: Final = 128
#: Shards whose grain ZSETs one round trip of ``read_page`` asks at most, and
#: the members it may move beyond the page (each shard is asked for the whole
#: page, so a large page asks fewer shards at a time).
_PAGE_SHARDS: Final = 32
_PAGE_SPARE: Final = 4096


class RedisReads:
    """The reads of one started table (``RedisReminderTable``'s, which see)."""

    def __init__(
        self, client: Client, keys: ShardKeys, scripts: Mapping[str, Any], *, cluster: bool
    ) -> None:
        self._client = client
        self._keys = keys
        self._scripts = scripts
        self._cluster = cluster
        self._plans: dict[
            RingRange | None,
            tuple[list[tuple[int, list[tuple[int, int]]]], list[list[Any]], bytes],
        ] = {}

    def _script(self, name: str) -> Any:
        return self._scripts[name]

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        s = self._keys.shard_of(grain_id.uniform_hash())
        with translate_errors("reminder read"):
            raw = await self._client.hget(self._keys.key(s, "rows"), row_key(grain_id, name))
        return None if raw is None else decode_row(raw)

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of the grain in name order (a lex prefix scan of one shard)."""
        s = self._keys.shard_of(grain_id.uniform_hash())
        prefix = f"{grain_id.canonical}|".encode()
        with translate_errors("reminder read_grain"):
            # 0xff never occurs in UTF-8, so it bounds every member with the prefix.
            keys = await self._client.zrangebylex(
                self._keys.key(s, "grain"), b"[" + prefix, b"(" + prefix + b"\xff"
            )
            raws = await self._client.hmget(self._keys.key(s, "rows"), keys) if keys else []
        rows = [decode_row(raw) for raw in raws if raw is not None]
        # A str grain key may contain '|', so the prefix can also match another
        # grain's rows: keep only this grain's.
        rows = [row for row in rows if row.grain_id == grain_id]
        rows.sort(key=lambda row: row.name)
        return rows

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``read_grain`` of each grain in one script call (``READ_GRAINS``) that
        scans each grain's lex prefix and fetches its rows; on a cluster one call
        per shard touched, all in one pipelined round trip (per node)."""
        if not grain_ids:
            return []
        keys = self._keys
        by_shard: dict[int, list[int]] = {}
        for i, g in enumerate(grain_ids):
            by_shard.setdefault(keys.shard_of(g.uniform_hash()), []).append(i)
        groups = list(by_shard.values()) if self._cluster else [list(range(len(grain_ids)))]
        calls: list[tuple[list[str], list[Any]]] = []
        for indexes in groups:
            flat: list[Any] = []
            for i in indexes:
                g = grain_ids[i]
                flat += (keys.shard_of(g.uniform_hash()), f"{g.canonical}|")
            shard = flat[0]
            # A cluster's call declares its shard's keys; one Redis needs one to route by.
            declared = [keys.key(shard, "grain")] if self._cluster else []
            calls.append(([*declared, keys.key(shard, "rows")], [keys.prefix, pack_lua(flat)]))
        script = self._script("read_grains")
        with translate_errors("reminder read_grains"):
            replies = await run_script_calls(self._client, READ_GRAINS, script.sha, calls)
        out: list[list[ReminderEntry]] = [[] for _ in grain_ids]
        for indexes, reply in zip(groups, replies, strict=True):
            at = 0
            for i in indexes:
                out[i], at = grain_rows(reply, at, grain_ids[i])
        return out

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (reads whole shards: tools only)."""
        rows = await self._collect(r, LANE_WIDTH - 1, 0, "reminder read_range")
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
        """Due rows of ``r`` in the due order (priority descending, then next_due;
        ties by hash, then key), at most ``limit``, less the rows whose key is in
        ``skip`` (``read_due`` and ``upcoming`` are this with nothing to skip).

        One script call whatever the number of shards (one per node on a
        cluster): the shards' filtered index reads, merged in Redis, and the
        records of only the rows returned (``_collect``). Skipped members are
        dropped before the row fetch, so their records never leave Redis and
        are never decoded (a ``skip`` that is a ``Collection`` is listed once,
        at the call, and sent along, so the skipped members do not leave Redis
        either; see ``_collect``). With ``after`` the read script starts each
        lane's scan past it, so earlier members are not read. With ``take``
        only the first ``take`` members not skipped are fetched."""
        if limit <= 0:
            return []
        before_ms = to_ms(before)
        after_ms = -1 if after is None else to_ms(after)
        rows = await self._collect(
            r, before_ms, limit, "reminder read_due", skip, after_ms=after_ms, take=take
        )
        return [row for row in rows if after_ms < to_ms(row.next_due) <= before_ms]

    async def count(self) -> int:
        with translate_errors("reminder count"):
            pipe = self._client.pipeline(transaction=False)
            for s in range(self._keys.shards):
                pipe.hlen(self._keys.key(s, "rows"))
            return sum(int(n) for n in await pipe.execute())

    async def read_page(
        self,
        cursor: str | None,
        limit: int,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows shard by shard, each shard in member order of its grain ZSET
        (``grain|name``, a lex range for the filter). One round trip asks up to
        ``_PAGE_SHARDS`` shards (fewer for a large page: ``_PAGE_SPARE``) for
        the members still wanted, a second fetches the
        rows taken. The cursor is ``"<shard>|<last member>"``."""
        check_page_limit(limit)
        prefix = grain_prefix(type_name, key_prefix).encode()
        shard, last = 0, b""
        if cursor is not None:
            head, sep, tail = cursor.partition("|")
            if not sep or not head.isdigit() or int(head) >= self._keys.shards:
                raise ValueError(f"not a page cursor of this table: {cursor!r}")
            shard, last = int(head), tail.encode()
        # 0xff never occurs in UTF-8, so it bounds every member with the prefix.
        top = b"(" + prefix + b"\xff" if prefix else b"+"
        taken: list[tuple[int, list[bytes]]] = []
        need = limit
        with translate_errors("reminder read_page"):
            while need and shard < self._keys.shards:
                fan_out = max(1, min(_PAGE_SHARDS, _PAGE_SPARE // need))
                batch = range(shard, min(shard + fan_out, self._keys.shards))
                pipe = self._client.pipeline(transaction=False)
                for s in batch:
                    low = b"(" + last if s == shard and last else b"[" + prefix
                    if low == b"[":
                        low = b"-"
                    pipe.zrangebylex(self._keys.key(s, "grain"), low, top, start=0, num=need)
                answers = await pipe.execute()
                for s, members in zip(batch, answers, strict=True):
                    shard, last = s, b""
                    if members:
                        got = members[:need]
                        taken.append((s, got))
                        need -= len(got)
                        last = got[-1]
                    if not need:
                        break
                else:
                    shard, last = batch[-1] + 1, b""
            pipe = self._client.pipeline(transaction=False)
            for s, members in taken:
                pipe.hmget(self._keys.key(s, "rows"), members)
            raws = await pipe.execute() if taken else []
        want = prefix.decode()
        rows = [
            row
            for chunk in raws
            for raw in chunk
            if raw is not None and (row := decode_row(raw)).grain_id.canonical.startswith(want)
        ]
        if shard >= self._keys.shards:
            return rows, None
        return rows, f"{shard}|{last.decode()}" if last else f"{shard}|"

    async def count_types(self) -> dict[str, int]:
        """Per shard, a skip scan of its grain ZSET (``TYPES``), all shards in one
        pipelined round trip: the cost follows shards x types, never rows."""
        script = self._script("types")
        calls: list[tuple[list[str], list[Any]]] = [
            ([self._keys.key(s, "grain")], []) for s in range(self._keys.shards)
        ]
        with translate_errors("reminder count_types"):
            answers = await run_script_calls(self._client, TYPES, script.sha, calls)
        counts: dict[str, int] = {}
        for flat in answers:
            for i in range(0, len(flat), 2):
                t = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
                counts[t] = counts.get(t, 0) + int(flat[i + 1])
        return counts

    async def _collect(
        self,
        r: RingRange | None,
        before_ms: int,
        limit: int,
        what: str,
        skip: Container[str] = (),
        *,
        after_ms: int = -1,
        take: int | None = None,
    ) -> list[ReminderEntry]:
        """Rows of ``r`` with ``after_ms`` < next_due <= ``before_ms``: the first
        ``limit`` in the due order (all when ``limit`` is 0), in the due order
        (score, hash, key), less those whose key is in ``skip`` (chosen, then
        not fetched), the first ``take`` of those left (all when ``None``).

        With a limit, one script call (``READ_MERGED``) per node merges the
        shards there in Redis and fetches the rows taken: on one Redis that is
        the whole read, one command whatever the number of shards; on a
        cluster the nodes' candidates are merged here. A ``skip`` that is a
        collection no larger than twice the limit travels with the call (unless
        it is large and the range small: ``_SKIP_SENT``), so skipped members
        never leave Redis; any other is applied here, and the rows taken are
        fetched in a second round trip. Without a limit (``read_range``) each
        shard is read by its own script call.
        """
        before_ms = min(before_ms, LANE_WIDTH - 1)
        if before_ms < 0:
            return []
        plan, items, packed = self._merged_plan(r)
        if limit <= 0:
            found = await self._scan(plan, before_ms=before_ms, what=what, after_ms=after_ms)
            members = [(s, m) for (s, _), part in zip(plan, found, strict=True) for m in part]
            return await self._fetch(members, what)
        # Sent along: the keys the script leaves out itself. Otherwise the script
        # returns members only, and they are skipped here: so for a range that is
        # a small part of the ring, since a silo owning many reads each of them
        # with the whole window as its skip, most of it outside that range.
        remote = (
            isinstance(skip, Collection)
            and len(skip) <= 2 * limit
            and (r is None or len(skip) <= _SKIP_SENT or r.size * _SKIP_SHARE >= HASH_SPACE)
        )
        groups = await node_groups(self._client, [self._keys.key(s, "due") for s, _ in plan])
        form = ("r" if len(groups) == 1 else "m") if remote else "k"
        ask = min(limit, max(_MIN_FIRST_ASK, -(-2 * limit // len(plan))))
        skipped = pack_lua(list(cast(Collection[str], skip)) if remote and skip else [])
        head = [self._keys.prefix, before_ms, after_ms, limit]
        tail = [-1 if take is None or not remote else take, ask, form, skipped]
        calls = [
            (
                [self._keys.key(plan[members[0]][0], "due")],
                [
                    *head,
                    *tail,
                    packed if len(groups) == 1 else pack_lua([items[i] for i in members]),
                ],
            )
            for members in groups
        ]
        script = self._script("read_merged")
        with translate_errors(what):
            if len(calls) == 1 and not self._cluster:
                replies = [await script(keys=calls[0][0], args=calls[0][1])]
            else:
                replies = await run_script_calls(self._client, READ_MERGED, script.sha, calls)
        if form == "r":
            return await _decoded(replies[0])
        # Across nodes (or skipping here): merge the candidates by (score, member),
        # the index's order, then cut at the limit and take.
        width = 3 if form == "m" else 2
        candidates = sorted(
            (int(flat[i]), flat[i + 1], flat[i + 2] if width == 3 else None)
            for flat in replies
            for i in range(0, len(flat), width)
        )
        left = len(candidates) if take is None else take
        raws: list[bytes] = []
        wanted: list[tuple[int, bytes]] = []
        for _, member, raw in candidates[:limit]:
            if left <= 0:
                break
            if form == "m":
                if raw is not None:  # None: skipped (or gone)
                    raws.append(raw)
                    left -= 1
            elif not (skip and member[9:].decode() in skip):
                wanted.append((self._keys.shard_of(int(member[:8], 16)), member))
                left -= 1
        return await _decoded(raws) if form == "m" else await self._fetch(wanted, what)

    def _merged_plan(
        self, r: RingRange | None
    ) -> tuple[list[tuple[int, list[tuple[int, int]]]], list[list[Any]], bytes]:
        """``_plan(r)``, its shards in ``READ_MERGED``'s form (``[shard]`` for a
        whole shard, else ``[shard, lo, hi, ...]`` in 8 hex digits) and those
        packed. Kept per range: a silo reads the same few ranges at every refill,
        and building them cost a tenth of a refill."""
        cached = self._plans.get(r)
        if cached is None:
            plan = self._keys.plan(r)
            span = 1 << self._keys.shift
            items = [
                [s]
                if parts == [(s * span, (s + 1) * span - 1)]
                else [s, *(f"{x:08x}" for lo_hi in parts for x in lo_hi)]
                for s, parts in plan
            ]
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            cached = self._plans[r] = (plan, items, pack_lua(items))
        return cached

    async def _fetch(self, members: list[tuple[int, bytes]], what: str) -> list[ReminderEntry]:
        """The rows of ``members`` (shard, due member), in that order: one HMGET
        per shard, pipelined (a member whose row went meanwhile is left out)."""
        if not members:
            return []
        by_shard: dict[int, list[int]] = {}
        for i, (s, _) in enumerate(members):
            by_shard.setdefault(s, []).append(i)
        with translate_errors(what):
            pipe = self._client.pipeline(transaction=False)
            for s, indexes in by_shard.items():
                pipe.hmget(self._keys.key(s, "rows"), [members[i][1][9:] for i in indexes])
            fetched = await pipe.execute()
        raws: list[bytes | None] = [None] * len(members)
        for indexes, got in zip(by_shard.values(), fetched, strict=True):
            for i, raw in zip(indexes, got, strict=True):
                raws[i] = raw
        return await _decoded(raws)

    async def _scan(
        self,
        plan: list[tuple[int, list[tuple[int, int]]]],
        *,
        before_ms: int,
        what: str,
        after_ms: int = -1,
    ) -> list[list[bytes]]:
        """Per planned shard, every due member inside the shard's intervals with
        after < next_due <= ``before_ms``, in score order. One pipelined round
        trip of ``READ_DUE`` calls."""
        script = self._script("read_due")
        top = 256 * LANE_WIDTH - 1
        calls = [
            (
                [self._keys.key(s, "due")],
                [
                    0,
                    top,
                    before_ms,
                    0,
                    _MAX_PAGE,
                    after_ms,
                    *(f"{x:08x}" for lo_hi in parts for x in lo_hi),
                ],
            )
            for s, parts in plan
        ]
        with translate_errors(what):
            # One Redis: loaded first on the same connection, so NOSCRIPT cannot
            # happen. A cluster: every node's calls at once, concurrently.
            replies = await run_script_calls(self._client, READ_DUE, script.sha, calls)
        return [[flat[i] for i in range(0, len(flat), 2)] for flat in replies]


async def _decoded(raws: Iterable[bytes | None]) -> list[ReminderEntry]:
    """The rows of ``raws`` (``None``s left out), in order, decoded
    ``_DECODE_CHUNK`` at a time with a turn of the event loop between chunks."""
    rows: list[ReminderEntry] = []
    for raw in raws:
        if raw is None:
            continue
        if rows and len(rows) % _DECODE_CHUNK == 0:
            await asyncio.sleep(0)
        rows.append(decode_row(raw))
    return rows
