"""``RedisReminderTable``: reminder rows in Redis, sharded by grain hash, with a due index.

Layout (``P`` = ``orleanspy:<service_id>:``, ``T`` = the shard's Redis Cluster
hash tag ``{<service_id>:rem:<s>}``, so each shard can live on its own node)::

    P rem:T:rows    HASH  "grain|name" -> msgpack record (all fields + etag;
                          "u" = true on paused rows only)
    P rem:T:due     ZSET  "hash8hex|grain|name", score = lane * 2**44 + next_due ms
                          (paused rows are not in it)
    P rem:T:grain   ZSET  "grain|name", all scores 0 (prefix scans by grain)
    P rem:T:etag    STRING  per-shard write counter (etags)
    P rem:T:changes sharded pub/sub channel (SPUBLISH) of the shard's changes
    P rem:T:hist:K  LIST  fire history of row K ("grain|name"), msgpack records, newest first
    P rem:T:cnt:K   HASH  counters of row K (``counters.COUNT_CODES`` -> count, "e"/"t"
                          the last error and its ms); removed with the row
    P rem:T:fenced  ZSET  fenced writers (``str(SiloAddress)``), score = ms fenced
    P rem:T:audit   HASH, P rem:T:audit:at ZSET  the operator audit log (``audit``)
    P rem:T:terms   HASH  "grain|name" -> the row's label index terms (msgpack list)
    P rem:T:ix:<t>  ZSET  "grain|name" of the rows carrying term <t>, scores 0
    P rem:meta      HASH  "shards" -> the shard count the table was created with
    P rem:calendars HASH  the service's calendars (``stores``)
    P rem:backfills HASH  the backfill jobs (``stores``)
    P dl:{<service_id>:dl}:rows, :at   the service's dead letters (``letters``)

A change message is ``<writer: 8 hex><hash: 8 hex><msgpack [grain, name,
next_due_ms | nil]>`` or, from upserts, ``... [grain, name, next_due_ms,
priority]``. Schedule CASes publish nothing (``ReminderTable.update_schedule``).
The fixed-width head lets a reader drop its own writes and rows outside its
ranges before decoding anything. ``writer`` is the ``writer_id`` of the table
instance that wrote the row.

A row lives in shard ``hash >> (32 - log2(shards))`` (the top bits), so a ring
range maps onto a run of consecutive shards. Writes are Lua scripts; a batch
of whole rows is one call on one Redis whatever the shards it spans, and one
call per shard on a Redis Cluster (``scripts``' module docstring).
``read_due`` (and ``read_due_skipping``, ``upcoming``) is one script call
(``scripts.READ_MERGED``) on one Redis, one per node on a Redis Cluster: it reads
the due members of every shard that overlaps the range whose 8-hex-digit hash
prefix lies in the range (the filtering runs in Redis, before any row is
touched), merges the shards in the due order with a heap, leaves out the
skipped keys (sent along), and fetches and returns only the records of the
rows taken. A cluster's nodes answer with their candidates' scores and
members too, merged here. (A script call per shard, then a fetch per shard,
cost a refill of the default window hundreds of commands to pack and parse.)
``read_range`` reads each shard by its own script call (``scripts.READ_DUE``).
The reads live in ``queries`` (``RedisReads``), the scripts in ``scripts``,
the keys, the due score and the row encoding in ``layout``; the label index
reads, calendars and backfills in ``stores`` (``RedisStores``).

The due score encodes the contract's order (priority descending, then
``next_due``): ``lane = 127 - priority`` (0 for priority 127, 255 for -128)
times 2**44, plus ``next_due`` in ms (2**44 ms reaches the year 2527; the
largest score, under 2**52, is an exact double). Sorting by score is the due
order. The read scripts walk the lanes present in a shard: a lane is read up to
``before``, and the next one is found by one more ``ZRANGEBYSCORE``, so the
cost grows with the rows returned and the priorities present, never with rows
not yet due. With a lower bound (``read_due_skipping(..., after=...)``) each
lane's scan starts past it. Every script that writes the due index computes
the score with ``layout.lane_score`` (Python) or the same formula in Lua, from the
row's stored priority.

``update_schedule_many`` applies a whole batch in one script call whose rows
travel packed in one argument; it scores each row from its stored priority too.
It and ``append_history`` take the shard key prefix and build the keys of the
shards a batch touches in Lua (see the comment above ``scripts.UPDATE_MANY``).

Change feeds use Redis 7 sharded pub/sub, one channel per shard (it lives on
the shard's node in Redis Cluster); the subscription and the message form live
in ``feed``. A scoped feed (``scoped_changes``)
subscribes only to the shards overlapping its scope's ranges, re-subscribes
when they change, and skips its own table's writes and rows outside the ranges
by the message head, without decoding them.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Container, Iterable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from orleanspy._redis import (
    Client,
    Redis,
    call_script,
    connect,
    is_cluster,
    node_groups,
    resolve,
    run_script_calls,
    translate_errors,
)
from orleanspy._redis_schema import migrate
from orleanspy.clock import to_ms
from orleanspy.errors import ConfigurationError, SerializationError, StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.audit import AuditQuery, AuditRecord, AuditRetention
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import CounterDelta, ReminderCounters, counters_from_record
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.model import FireRecord, ReminderEntry, ScheduleUpdate, row_key
from orleanspy.reminders.redis.audit import AUDIT_SCHEMA_STEPS, AUDIT_SCRIPTS, RedisAuditLog
from orleanspy.reminders.redis.feed import ClusterTopology, RedisChanges, change_payload
from orleanspy.reminders.redis.layout import (
    COUNTERS_STEPS,
    DEAD_LETTERS_STEPS,
    SCHEMA_STEPS,
    ShardKeys,
    lane_score,
    member,
    record_without_etag,
)
from orleanspy.reminders.redis.letters import RedisDeadLetters
from orleanspy.reminders.redis.queries import RedisReads
from orleanspy.reminders.redis.scripts import (
    ADD_COUNTS,
    APPEND_HISTORY,
    COUNT_FIELDS,
    HISTORY_FIELDS,
    SCRIPTS,
    UPDATE_MANY,
    UPSERT_IF_MANY,
    UPSERT_MANY,
)
from orleanspy.reminders.redis.stores import STORE_SCRIPTS, RedisStores
from orleanspy.reminders.table import ENDED_HISTORY_KEPT, FeedScope, ReminderTableBase
from orleanspy.ring import RingRange
from orleanspy.schema import SchemaVersion
from orleanspy.serialization import pack_lua, unpack

if TYPE_CHECKING:
    from orleanspy.options import RedisOptions

__all__ = ["RedisReminderTable"]

_log = logging.getLogger(__name__)

# Optional fields of a fire record, merged into its stored map by the script.
_HISTORY_FLAGS: Final = frozenset({"x", "m", "n", "f", "b"})


class RedisReminderTable(ReminderTableBase):
    """A ``ReminderTable`` (and ``BatchingReminderTable``) in Redis.

    ``url_or_client``: a URL (the table creates its client and closes it with the
    start stack) or a ``redis.asyncio.Redis`` client created with bytes responses
    (the table never closes it). ``shards`` is a power of two in 1..65536 and is
    fixed for the life of the stored table: ``start`` fails with
    ``StorageError`` if the stored table was created with another count.

    On Redis Cluster (a ``RedisCluster`` client, or a URL that names one) each
    shard is its own hash slot, so shards spread over the masters; reads that
    span shards go to every node concurrently, the per-tick batch scripts run
    once per node, the whole-row batch scripts once per shard. ``options``:
    ``RedisOptions``; with ``wait_replicas`` every whole-row write (``upsert``,
    ``upsert_if``, ``upsert_many``, ``upsert_if_many``) and ``remove`` waits
    for that many replicas. Schedule CASes and history do not (a lost one is
    re-read: see docs/redis.md).
    """

    schema = SchemaVersion("redis", "reminders", len(SCHEMA_STEPS))
    #: Every schema component the table keeps: the rows, and (0.2) the rows'
    #: counters, the service's dead letters and the operator audit log, each
    #: migrated on its own.
    schemas = (
        schema,
        SchemaVersion("redis", "reminder_counters", len(COUNTERS_STEPS)),
        SchemaVersion("redis", "reminder_dead_letters", len(DEAD_LETTERS_STEPS)),
        SchemaVersion("redis", "reminder_audit", len(AUDIT_SCHEMA_STEPS)),
    )

    def __init__(
        self,
        url_or_client: str | Redis,
        *,
        service_id: str,
        shards: int = 256,
        options: RedisOptions | None = None,
    ) -> None:
        if shards < 1 or shards > 65536 or shards & (shards - 1):
            raise ConfigurationError(
                f"RedisReminderTable shards must be a power of two in 1..65536, got {shards}"
            )
        self.service_id = service_id
        self.shards = shards
        self._keys = ShardKeys(service_id, shards)
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._source: Redis | None = None if isinstance(url_or_client, str) else url_or_client
        self._client: Client | None = None
        self._cluster = False
        self._options = options if options is not None and options.wait_replicas else None
        # Shared with the change feeds: a cluster feed that lost a node marks the
        # slot map stale, and the next subscription re-reads it first.
        self._topology = ClusterTopology()
        #: Tags every change this instance writes (8 hex digits), so a scoped feed
        #: of the same instance skips them undecoded. One instance serves one silo.
        self.writer_id = secrets.token_hex(4)
        self._writer = self.writer_id.encode()
        # Etags are "<shard counter><suffix>". The counter makes them unique while
        # the store lives; the random suffix keeps an etag held from before a
        # wiped store from matching a row written after it.
        self._etag_suffix = f".{self.writer_id}"
        self._subscriptions: set[RedisChanges] = set()
        self._scripts: dict[str, Any] = {}
        self._reads: RedisReads | None = None
        self._audit: RedisAuditLog | None = None
        self._letters: RedisDeadLetters | None = None
        self._stores: RedisStores | None = None
        #: The incarnation this instance writes for (``FencingReminderTable``).
        self.writer: SiloAddress | None = None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack) -> None:
        """Connect (if given a URL), check the stored shard count, register scripts.

        Raises ``StorageError`` if the table was created with another shard count,
        ``StorageUnavailableError`` if Redis cannot be reached.
        """
        if self._source is None:
            assert self._url is not None
            self._source = connect(self._url)
            stack.push_async_callback(self._source.aclose)
        with translate_errors("reminder table start"):
            client = self._client = await resolve(self._source)
        self.migration = await migrate(client, "reminders", SCHEMA_STEPS)
        self.migrations = [
            self.migration,
            await migrate(client, "reminder_counters", COUNTERS_STEPS),
            await migrate(client, "reminder_dead_letters", DEAD_LETTERS_STEPS),
            await migrate(client, "reminder_audit", AUDIT_SCHEMA_STEPS),
        ]
        self._cluster = is_cluster(client)
        # Pushed after the client's close, so it unwinds first: the change feeds
        # end before the client they read from is closed.
        stack.push_async_callback(self._close_subscriptions)
        meta = self._keys.meta
        with translate_errors("reminder table start"):
            pipe = client.pipeline(transaction=False)
            pipe.hsetnx(meta, "shards", str(self.shards))
            pipe.hget(meta, "shards")
            _, stored = await pipe.execute()
        stored_shards = None if stored is None else stored.decode()
        if stored_shards != str(self.shards):
            raise StorageError(
                f"reminder table of service {self.service_id!r} was created with "
                f"{stored_shards} shards but this table is configured with {self.shards}; "
                "configure the stored shard count (ReminderOptions.shards)"
            )
        for name, text in {**SCRIPTS, **AUDIT_SCRIPTS, **STORE_SCRIPTS}.items():
            self._scripts[name] = client.register_script(text)
        self._reads = RedisReads(client, self._keys, self._scripts, cluster=self._cluster)
        self._stores = RedisStores(client, self._keys, self._scripts, cluster=self._cluster)
        self._letters = RedisDeadLetters(client, self.service_id, self._scripts)
        self._audit = RedisAuditLog(
            client,
            self._keys,
            self._scripts,
            cluster=self._cluster,
            encode=self._encoded,
            writer=self._writer,
            etag_suffix=self._etag_suffix,
            options=self._options,
        )

    @property
    def _c(self) -> Client:
        if self._client is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._client

    @property
    def _r(self) -> RedisReads:
        if self._reads is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._reads

    @property
    def _s(self) -> RedisStores:
        if self._stores is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._stores

    def _script(self, name: str) -> Any:
        if not self._scripts:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._scripts[name]

    # -- keys -----------------------------------------------------------------------

    def shard_of(self, h: int) -> int:
        """The shard that holds rows of grain hash ``h``."""
        return self._keys.shard_of(h)

    def _key(self, shard: int, kind: str) -> str:
        return self._keys.key(shard, kind)

    def _write_keys(self, shard: int) -> list[str]:
        """The declared keys of a whole-row script call on ``shard``: on a cluster
        every key it writes (so that a moved slot redirects the whole call before
        it runs), on one Redis the one it is routed by."""
        if self._cluster:
            return [self._key(shard, kind) for kind in ("rows", "due", "grain", "etag")]
        return [self._key(shard, "rows")]

    # -- writes ---------------------------------------------------------------------

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row unconditionally; returns its new etag."""
        etag = await self._upsert(entry, "", "reminder upsert")
        assert etag is not None
        return etag

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` only if the row is absent (``expected_etag`` ``None``) or has
        ``expected_etag``; the new etag, or ``None`` when it did not hold."""
        condition = "-" if expected_etag is None else expected_etag
        return await self._upsert(entry, condition, "reminder upsert_if")

    async def _upsert(self, entry: ReminderEntry, condition: str, what: str) -> str | None:
        """One row through ``UPSERT_IF_MANY`` (condition ``''``: none)."""
        shard, *row = self._encoded(entry)
        args = [self._etag_suffix, self._keys.prefix, pack_lua([shard, *row, condition])]
        with translate_errors(what):
            (etag,) = await call_script(
                self._c,
                self._script("upsert_if_many"),
                self._write_keys(shard),
                args,
                self._options,
            )
        return None if etag is None else str(etag.decode())

    def _encoded(
        self, entry: ReminderEntry
    ) -> tuple[int, str, str, str, bytes, bytes, bool, list[str]]:
        """A row as the whole-row scripts take it: shard, key, due member, score,
        the record without its etag (``layout.record_without_etag``), the change
        message, paused, the label index terms."""
        grain_id = entry.grain_id
        h = grain_id.uniform_hash()
        record = entry.to_compact_record()
        record.pop("e", None)  # the script sets the new one
        name = entry.name
        key = f"{record['g']}|{name}"
        due_ms = record["d"]
        priority = record["r"]
        score = lane_score(priority, due_ms)
        if entry.paused:  # out of the schedule: published as a removal
            change = change_payload(self._writer, h, grain_id, name, None)
        else:
            change = change_payload(self._writer, h, grain_id, name, due_ms, priority=priority)
        return (
            self._keys.shard_of(h),
            key,
            member(h, key),
            str(score),
            record_without_etag(record),
            change,
            entry.paused,
            entry.index_terms() if entry.labels or entry.calendar else [],
        )

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        """``upsert`` each entry, in order, in one pipelined round trip: on one
        Redis one script call for the whole batch (``UPSERT_MANY``), on a
        cluster one per shard touched; the rows packed into one argument (the
        script is loaded first on the same connection, so NOSCRIPT cannot
        happen)."""
        if not entries:
            return []
        groups: dict[int, list[Any]] = {}
        order: dict[int, list[int]] = {}
        for i, entry in enumerate(entries):
            shard, *row = self._encoded(entry)
            group = groups.get(shard)
            if group is None:
                groups[shard] = row
                order[shard] = [i]
            else:
                group += row
                order[shard].append(i)
        calls_of = [[s] for s in groups] if self._cluster else [list(groups)]
        calls: list[tuple[list[str], list[Any]]] = []
        for shards in calls_of:
            flat: list[Any] = []
            for s in shards:
                flat += (s, len(order[s]), *groups[s])
            calls.append(
                (
                    self._write_keys(shards[0]),
                    [self._etag_suffix, self._keys.prefix, pack_lua(flat)],
                )
            )
        replies = await self._run("upsert_many", UPSERT_MANY, calls)
        out: list[str] = [""] * len(entries)
        for shards, reply in zip(calls_of, replies, strict=True):
            etags = iter(reply)
            for s in shards:
                for i in order[s]:
                    out[i] = str(next(etags).decode())
        return out

    async def upsert_if_many(
        self, writes: Sequence[tuple[ReminderEntry, str | None]]
    ) -> list[str | None]:
        """``upsert_if`` of each pair in one pipelined round trip: on one Redis one
        script call (``UPSERT_IF_MANY``), on a cluster one per shard touched, the
        rows packed in one argument."""
        if not writes:
            return []
        by_shard: dict[int, list[int]] = {}
        rows: list[list[Any]] = []
        for i, (entry, etag) in enumerate(writes):
            shard, *row = self._encoded(entry)
            by_shard.setdefault(shard, []).append(i)
            rows.append([shard, *row, "-" if etag is None else etag])
        calls_of = list(by_shard.values()) if self._cluster else [list(range(len(writes)))]
        calls = [
            (
                self._write_keys(rows[indexes[0]][0]),
                [
                    self._etag_suffix,
                    self._keys.prefix,
                    pack_lua([item for i in indexes for item in rows[i]]),
                ],
            )
            for indexes in calls_of
        ]
        replies = await self._run("upsert_if_many", UPSERT_IF_MANY, calls)
        out: list[str | None] = [None] * len(writes)
        for indexes, reply in zip(calls_of, replies, strict=True):
            for i, etag in zip(indexes, reply, strict=True):
                out[i] = None if etag is None else str(etag.decode())
        return out

    async def _run(
        self, name: str, text: str, calls: list[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        """The replies of whole-row script calls, in one pipelined round trip (per
        node on a cluster), waiting for replicas as ``options`` asks."""
        with translate_errors(f"reminder {name}"):
            return await run_script_calls(
                self._c, text, self._script(name).sha, calls, wait=self._options
            )

    async def update_schedule_many(self, updates: Sequence[ScheduleUpdate]) -> list[str | None]:
        """``update_schedule`` for each update, in order, in one script call.

        Each result is the new etag or ``None`` (lost race). The rows' fields
        travel packed in one argument; the script is sent by its digest and
        loaded again only when Redis answers NOSCRIPT (e.g. after a restart).
        The script runs atomically, but on ``StorageUnavailableError`` the
        caller cannot know whether it ran. Retrying is safe; an update that did
        apply then reports a lost race (its row already holds the new schedule,
        which a ``read`` shows).
        """
        if not updates:
            return []
        flat: list[Any] = []
        shift = self._keys.shift
        for u in updates:
            grain_id, name = u.grain_id, u.name
            h = grain_id.uniform_hash()
            key = f"{grain_id.canonical}|{name}"
            due_ms = to_ms(u.next_due)
            lane_score(0, due_ms)  # range check; the script scores with the stored priority
            flat += (
                h >> shift,
                key,
                f"{h:08x}|{key}",
                u.etag,
                due_ms,
                -1 if u.last_fire is None else to_ms(u.last_fire),
            )
        with translate_errors("reminder update_schedule_many"):
            # ARGV[4]: the writer, whom the script checks against each shard's
            # fence set ('' for a table with no writer).
            writer = "" if self.writer is None else str(self.writer)
            if self._cluster:
                results = await self._per_node(
                    "update_many", UPDATE_MANY, flat, 6, [self._etag_suffix], tail=[writer, "1"]
                )
            else:
                results = await self._script("update_many")(
                    args=[self._etag_suffix, self._keys.prefix, pack_lua(flat), writer]
                )
        return [None if r is None else r.decode() for r in results]

    async def _per_node(
        self,
        name: str,
        text: str,
        flat: list[Any],
        width: int | None,
        head: list[Any],
        *,
        tail: Sequence[Any] = (),
    ) -> list[Any]:
        """Run a batch script whose items (``flat``, each starting with its shard)
        span shards once per cluster node, over that node's items only, routed by
        a key of the node's first shard; the replies in ``flat``'s item order.

        ``width``: items of a fixed number of fields; ``None``: history items
        (shard, key, n, then ``HISTORY_FIELDS`` fields per record). The script's ARGV stay
        ``head + [shard prefix, packed items]``: the routing key is the one
        declared key, and the other shards' keys it builds are local to the node
        (a key whose slot moved meanwhile fails the call: unavailable, retried),
        then ``tail``.
        """
        items: list[tuple[int, int]] = []  # (start, end) of each item in flat
        i = 0
        while i < len(flat):
            end = i + (width if width is not None else 3 + HISTORY_FIELDS * int(flat[i + 2]))
            items.append((i, end))
            i = end
        shards = [int(flat[a]) for a, _ in items]
        distinct = sorted(set(shards))
        groups = await node_groups(self._c, [self._key(sh, "rows") for sh in distinct])
        group_of = {distinct[i]: g for g, members in enumerate(groups) for i in members}
        parts: list[list[int]] = [[] for _ in groups]
        for n, sh in enumerate(shards):
            parts[group_of[sh]].append(n)
        calls = []
        for members in parts:
            sub: list[Any] = []
            for n in members:
                a, b = items[n]
                sub += flat[a:b]
            routing = self._key(int(flat[items[members[0]][0]]), "rows")
            calls.append(([routing], [*head, self._keys.prefix, pack_lua(sub), *tail]))
        replies = await run_script_calls(self._c, text, self._script(name).sha, calls)
        if width is None:
            return replies
        out: list[Any] = [None] * len(items)
        for members, reply in zip(parts, replies, strict=True):
            for n, r in zip(members, reply, strict=True):
                out[n] = r
        return out

    async def fence(
        self,
        writer: SiloAddress,
        *,
        at: datetime | None = None,
        prune_before: datetime | None = None,
    ) -> None:
        """Add ``writer`` to every shard's ``fenced`` set, in one pipelined round
        trip (each shard's set lives under its own hash tag, beside the rows the
        schedule script checks it for). The fence is set (or its time raised)
        before pruning, so ``writer`` itself is never without one."""
        at_ms = to_ms(at or datetime.now(UTC))
        member = str(writer)
        with translate_errors("reminder fence"):
            pipe = self._c.pipeline(transaction=False)
            for s in range(self.shards):
                key = self._key(s, "fenced")
                pipe.zadd(key, {member: at_ms}, gt=True)
                if prune_before is not None and to_ms(prune_before) <= at_ms:
                    pipe.zremrangebyscore(key, "-inf", f"({to_ms(prune_before)}")
            await pipe.execute()

    async def append_history(self, records: Sequence[FireRecord], keep: int) -> None:
        """The whole batch in one script call, records packed in one argument;
        the newest ``keep`` kept per row."""
        by_row: dict[str, list[FireRecord]] = {}
        for rec in records:
            by_row.setdefault(row_key(rec.grain_id, rec.name), []).append(rec)
        if not by_row:
            return
        flat: list[Any] = []
        shift = self._keys.shift
        for key, recs in by_row.items():
            flat += (recs[0].grain_id.uniform_hash() >> shift, key, len(recs))
            for r in recs:
                flags = {k: v for k, v in r.to_record().items() if k in _HISTORY_FLAGS}
                flat += (to_ms(r.slot), to_ms(r.at), r.outcome.value, r.silo, flags or False)
        with translate_errors("reminder append_history"):
            if self._cluster:
                await self._per_node("history", APPEND_HISTORY, flat, None, [keep])
            else:
                await self._script("history")(args=[keep, self._keys.prefix, pack_lua(flat)])

    async def read_history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        key = row_key(grain_id, name)
        s = self.shard_of(grain_id.uniform_hash())
        with translate_errors("reminder read_history"):
            raws = await self._c.lrange(self._key(s, f"hist:{key}"), 0, -1)
        try:
            return [
                FireRecord.from_record(grain_id, name, unpack(cast(bytes, raw))) for raw in raws
            ]
        except (SerializationError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed reminder history in redis: {exc}") from exc

    async def remove(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """Delete the row if its etag is ``etag``; ``False`` if missing or moved on."""
        return await self._remove(grain_id, name, etag, None)

    async def end(self, grain_id: GrainId, name: str, etag: str) -> bool:
        """``remove``, leaving the row's history list to expire after
        ``ENDED_HISTORY_KEPT`` instead of deleting it."""
        kept_ms = ENDED_HISTORY_KEPT // timedelta(milliseconds=1)
        return await self._remove(grain_id, name, etag, kept_ms)

    async def _remove(
        self, grain_id: GrainId, name: str, etag: str, history_ms: int | None
    ) -> bool:
        h = grain_id.uniform_hash()
        s = self.shard_of(h)
        key = row_key(grain_id, name)
        with translate_errors("reminder remove"):
            done = await call_script(
                self._c,
                self._script("remove"),
                [
                    self._key(s, "rows"),
                    self._key(s, "due"),
                    self._key(s, "grain"),
                    self._key(s, f"hist:{key}"),
                    self._key(s, f"cnt:{key}"),
                ],
                [
                    key,
                    member(h, key),
                    etag,
                    self._keys.channel(s),
                    change_payload(self._writer, h, grain_id, name, None),
                    "" if history_ms is None else history_ms,
                    self._key(s, ""),
                ],
                self._options,
            )
        return bool(done)

    # -- counters and dead letters ----------------------------------------------------

    async def add_counts(self, deltas: Sequence[CounterDelta]) -> None:
        """The whole batch in one script call (one per node on a cluster); a
        row's counters live beside its history, under its shard's hash tag."""
        if not deltas:
            return
        flat: list[Any] = []
        shift = self._keys.shift
        for d in deltas:
            flat += (
                d.grain_id.uniform_hash() >> shift,
                row_key(d.grain_id, d.name),
                d.counts,
                False if d.last_error is None else d.last_error,
                False if d.last_error_at is None else to_ms(d.last_error_at),
            )
        with translate_errors("reminder add_counts"):
            if self._cluster:
                await self._per_node("counts", ADD_COUNTS, flat, COUNT_FIELDS, [])
            else:
                await self._script("counts")(args=[self._keys.prefix, pack_lua(flat)])

    async def read_counts(self, grain_id: GrainId, name: str) -> ReminderCounters:
        s = self.shard_of(grain_id.uniform_hash())
        with translate_errors("reminder read_counts"):
            raw = await self._c.hgetall(self._key(s, f"cnt:{row_key(grain_id, name)}"))
        try:
            return counters_from_record(
                {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}
            )
        except (AttributeError, ValueError) as exc:
            raise StorageError(f"malformed reminder counters in redis: {exc}") from exc

    @property
    def _dl(self) -> RedisDeadLetters:
        if self._letters is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._letters

    async def add_dead_letters(
        self, letters: Sequence[DeadLetter], *, keep: int, expire_before: datetime
    ) -> None:
        await self._dl.add(letters, keep, expire_before)

    async def read_dead_letters(
        self,
        cursor: str | None,
        limit: int,
        *,
        grain_id: GrainId | None = None,
        name: str | None = None,
    ) -> tuple[list[DeadLetter], str | None]:
        return await self._dl.page(cursor, limit, grain_id, name)

    async def read_dead_letter(self, letter_id: str) -> DeadLetter | None:
        return await self._dl.get(letter_id)

    async def remove_dead_letter(self, letter_id: str) -> bool:
        return await self._dl.remove(letter_id)

    async def count_dead_letters(self) -> int:
        return await self._dl.count()

    # -- the audit log (``audit.RedisAuditLog``; ``AuditedReminderTable``) --------------

    @property
    def _log(self) -> RedisAuditLog:
        if self._audit is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._audit

    async def upsert_if_audited(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        """``upsert_if`` and the record, in one script over the row's shard."""
        return await self._log.upsert_if(entry, expected_etag, record, retention)

    async def remove_audited(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        """``remove`` and the record, in one script over the row's shard."""
        return await self._log.remove(grain_id, name, etag, record, retention)

    async def append_audit(self, record: AuditRecord, retention: AuditRetention) -> None:
        await self._log.append(record, retention)

    async def settle_audit(self, record: AuditRecord) -> bool:
        return await self._log.settle(record)

    async def read_audit(self, query: AuditQuery) -> list[AuditRecord]:
        return await self._log.read(query)

    # -- reads (``queries.RedisReads``) ------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        return await self._r.read(grain_id, name)

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of the grain in name order (a lex prefix scan of one shard)."""
        return await self._r.read_grain(grain_id)

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``read_grain`` of each grain in one pipelined round trip (``READ_GRAINS``)."""
        return await self._r.read_grains(grain_ids)

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (reads whole shards: tools only)."""
        return await self._r.read_range(r)

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
        """Due rows of ``r`` in the due order, at most ``limit``, less the rows whose
        key is in ``skip``: one script call whatever the number of shards (one per
        node on a cluster; ``RedisReads.read_due_skipping``). ``read_due`` and
        ``upcoming`` are this with nothing to skip."""
        return await self._r.read_due_skipping(r, before, limit, skip, after=after, take=take)

    async def count(self) -> int:
        """Sum of the shards' row counts (one pipelined round trip)."""
        return await self._r.count()

    async def read_page(
        self,
        cursor: str | None,
        limit: int,
        *,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows shard by shard, each shard in member order of its grain ZSET; the
        cursor is ``"<shard>|<last member>"`` (``RedisReads.read_page``)."""
        return await self._r.read_page(cursor, limit, type_name=type_name, key_prefix=key_prefix)

    async def count_types(self) -> dict[str, int]:
        """Per shard, a skip scan of its grain ZSET, all shards in one round trip."""
        return await self._r.count_types()

    # -- the label index, calendars, backfills (``stores.RedisStores``) ----------------

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        """Rows carrying every term, shard by shard, each shard in member order
        of the first term's ZSET; the cursor is ``"<shard>|<last member>"``."""
        return await self._s.read_indexed(terms, cursor, limit)

    async def count_indexed(self, term: str) -> int:
        """The sum of the term's ZSET sizes over the shards (one round trip)."""
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

    def changes(self) -> RedisChanges:
        """A new subscription to the change channels of every shard, all writers.

        It subscribes on ``open`` or the first ``anext`` (changes published
        before that are not seen), raises ``StorageUnavailableError`` when Redis
        goes away (changes may have been missed: open a new feed, then re-read),
        and ends on ``aclose`` or when the table is closed.
        """
        return self.scoped_changes(FeedScope())

    def scoped_changes(self, scope: FeedScope) -> RedisChanges:
        """Like ``changes()``, but subscribed only to the shards overlapping
        ``scope.ranges`` (re-subscribing within ``feed.FEED_POLL_S`` of a
        ``set_ranges``); changes of rows outside the ranges and, with
        ``scope.skip_own_writes``, those written through this instance are
        dropped by their message head without being decoded."""
        sub = RedisChanges(
            self._c,
            scope,
            writer=self._writer,
            channels_of=self._channels_of,
            registry=self._subscriptions,
            topology=self._topology if self._cluster else None,
        )
        self._subscriptions.add(sub)
        return sub

    def _channels_of(self, ranges: Iterable[RingRange] | None) -> set[str]:
        """The change channels of the shards overlapping ``ranges`` (all: ``None``)."""
        return {self._keys.channel(s) for s in self._keys.shards_of(ranges)}

    async def _close_subscriptions(self) -> None:
        for sub in list(self._subscriptions):
            await sub.aclose()
        await self._topology.close()
