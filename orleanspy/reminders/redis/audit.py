"""The audit log of ``RedisReminderTable``: per shard, beside the rows it describes.

Keys (``T`` the shard's hash tag, as for its rows: ``table``'s module docstring)::

    P rem:T:audit     HASH  record id -> msgpack record (``AuditRecord.to_record``)
    P rem:T:audit:at  ZSET  record id, score = the record's time in ms

A record lives in the shard of its grain (a record without one, such as a
batch's own, in shard 0). So the script that writes a row and the one that
appends its record are one script over one shard's keys, which share the hash
tag: on a Redis Cluster one node runs it atomically, and on a cluster every
key it touches is declared, so a moved slot redirects the whole call before it
runs. Each append trims its shard: records older than the retention's age (at
most ``_TRIM_BATCH`` per append, the rest on the next), then the oldest beyond
``AuditRetention.per_shard(shards)``.

A read asks the shards it needs (one for a grain, else all) for the records in
its time window, newest first, at most the shard's cap each, in one pipelined
round trip, then fetches and filters them: its cost follows the records
retained in the window, never the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from orleanspy._redis import Client, call_script, translate_errors
from orleanspy._redis_schema import RedisStep
from orleanspy.clock import to_ms
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.options import RedisOptions
from orleanspy.reminders.audit import (
    AuditQuery,
    AuditRecord,
    AuditRetention,
    newest_first,
)
from orleanspy.reminders.model import ReminderEntry, row_key
from orleanspy.reminders.redis.feed import change_payload
from orleanspy.reminders.redis.layout import ShardKeys, member
from orleanspy.reminders.redis.scripts import LUA_REINDEX
from orleanspy.serialization import pack, pack_lua, unpack

__all__ = ["AUDIT_SCHEMA_STEPS", "AUDIT_SCRIPTS", "RedisAuditLog"]


async def _nothing(_client: Client) -> None:
    """A step that changes no data (it only records a version)."""


#: The schema steps of the audit keys (component ``reminder_audit``): version 1
#: is this layout, whose keys appear with the first record.
AUDIT_SCHEMA_STEPS: Final[tuple[RedisStep, ...]] = (
    ("the audit log keys per shard (written from 0.2 on; no data changes)", _nothing),
)

#: Records past the retention age one append removes at most (the next removes more).
_TRIM_BATCH: Final = 100

# The append and trim every audited write runs, after its own write, over the
# record's shard: ``audit(shard key prefix, id, at ms, record, cutoff ms, cap)``.
_AUDIT_LUA: Final = f"""
local function audit(shard, id, at, rec, cutoff, cap)
  local hash, index = shard .. 'audit', shard .. 'audit:at'
  redis.call('HSET', hash, id, rec)
  redis.call('ZADD', index, at, id)
  local old = redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. cutoff, 'LIMIT', 0, {_TRIM_BATCH})
  if #old > 0 then
    redis.call('HDEL', hash, unpack(old))
    redis.call('ZREM', index, unpack(old))
  end
  local over = redis.call('ZCARD', index) - tonumber(cap)
  if over > 0 then
    local excess = redis.call('ZRANGE', index, 0, over - 1)
    redis.call('HDEL', hash, unpack(excess))
    redis.call('ZREM', index, unpack(excess))
  end
end
"""

# ``upsert_if`` of one row (``scripts.UPSERT_IF_MANY``'s body for one row) and,
# when it writes, the record. KEYS: the routing key (one Redis) or the shard's
# rows, due, grain, etag, audit and audit:at keys (a cluster). ARGV[1] etag
# suffix, ARGV[2] shard key prefix, ARGV[3] the row as ``UPSERT_IF_MANY`` takes
# one (shard, key, due member, score, record, change, paused, label index
# terms, condition),
# ARGV[4..8] the record's id, time ms, bytes, the cutoff ms and the shard's cap.
# Returns the new etag, or false (nothing written, nothing published).
_UPSERT_IF_AUDITED: Final = (
    _AUDIT_LUA
    + LUA_REINDEX
    + """
local r = cmsgpack.unpack(ARGV[3])
local shard = ARGV[2] .. r[1] .. '}:'
local hash = shard .. 'rows'
local raw = redis.call('HGET', hash, r[2])
local cond = r[9]
local ok
if cond == '-' then ok = not raw else ok = raw and cmsgpack.unpack(raw)['e'] == cond end
if not ok then return false end
local etag = redis.call('INCR', shard .. 'etag') .. ARGV[1]
redis.call('HSET', hash, r[2], r[5] .. cmsgpack.pack('e') .. cmsgpack.pack(etag))
redis.call('ZADD', shard .. 'grain', 0, r[2])
if r[7] then
  redis.call('ZREM', shard .. 'due', r[3])
else
  redis.call('ZADD', shard .. 'due', r[4], r[3])
end
redis.call('SPUBLISH', shard .. 'changes', r[6])
reindex(shard, r[2], r[8])
audit(shard, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return etag
"""
)

# ``remove`` (``scripts.REMOVE``, history deleted, the row's counters and label
# index entries with it) and, when it removes, the record. KEYS: rows, due,
# grain, history, audit, audit:at of the row's shard. ARGV: key, due member,
# expected etag, channel, change, shard key prefix with the shard
# ("...rem:<s>}:"), the record's id, time ms, bytes, cutoff ms, cap.
_REMOVE_AUDITED: Final = (
    _AUDIT_LUA
    + LUA_REINDEX
    + """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
if cmsgpack.unpack(raw)['e'] ~= ARGV[3] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[4])
redis.call('DEL', ARGV[6] .. 'cnt:' .. ARGV[1])
reindex(ARGV[6], ARGV[1], {})
redis.call('SPUBLISH', ARGV[4], ARGV[5])
audit(ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])
return 1
"""
)

# A record on its own. KEYS: the shard's audit and audit:at. ARGV: shard key
# prefix with the shard, id, time ms, bytes, cutoff ms, cap.
_APPEND_AUDIT: Final = (
    _AUDIT_LUA
    + """
audit(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return 1
"""
)

# Replace a stored record by id. KEYS: the shard's audit hash. ARGV: id, bytes.
_SETTLE_AUDIT: Final = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

#: The audit scripts, registered by the table beside its own (``scripts.SCRIPTS``).
AUDIT_SCRIPTS: Final = {
    "upsert_if_audited": _UPSERT_IF_AUDITED,
    "remove_audited": _REMOVE_AUDITED,
    "append_audit": _APPEND_AUDIT,
    "settle_audit": _SETTLE_AUDIT,
}

#: A row as the whole-row scripts take it (``RedisReminderTable._encoded``).
Encode = Callable[[ReminderEntry], tuple[int, str, str, str, bytes, bytes, bool, list[str]]]


class RedisAuditLog:
    """The audit half of one started ``RedisReminderTable`` (module docstring)."""

    def __init__(
        self,
        client: Client,
        keys: ShardKeys,
        scripts: Mapping[str, Any],
        *,
        cluster: bool,
        encode: Encode,
        writer: bytes,
        etag_suffix: str,
        options: RedisOptions | None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._scripts = scripts
        self._cluster = cluster
        self._encode = encode
        self._writer = writer
        self._etag_suffix = etag_suffix
        self._options = options

    def _shard_of(self, grain_id: GrainId | None) -> int:
        return 0 if grain_id is None else self._keys.shard_of(grain_id.uniform_hash())

    def _record_args(self, record: AuditRecord, retention: AuditRetention) -> list[Any]:
        return [
            record.id,
            to_ms(record.at),
            pack(record.to_record()),
            retention.cutoff_ms(record.at),
            retention.per_shard(self._keys.shards),
        ]

    def _audit_keys(self, shard: int) -> list[str]:
        return [self._keys.key(shard, "audit"), self._keys.key(shard, "audit:at")]

    async def upsert_if(
        self,
        entry: ReminderEntry,
        expected_etag: str | None,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:
        shard, *row = self._encode(entry)
        condition = "-" if expected_etag is None else expected_etag
        if self._cluster:
            keys = [self._keys.key(shard, k) for k in ("rows", "due", "grain", "etag")]
            keys += self._audit_keys(shard)
        else:
            keys = [self._keys.key(shard, "rows")]
        args = [
            self._etag_suffix,
            self._keys.prefix,
            pack_lua([shard, *row, condition]),
            *self._record_args(record, retention),
        ]
        with translate_errors("reminder upsert_if (audited)"):
            etag = await call_script(
                self._client, self._scripts["upsert_if_audited"], keys, args, self._options
            )
        return None if etag is None else str(etag.decode())

    async def remove(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:
        h = grain_id.uniform_hash()
        shard = self._keys.shard_of(h)
        key = row_key(grain_id, name)
        keys = [
            self._keys.key(shard, "rows"),
            self._keys.key(shard, "due"),
            self._keys.key(shard, "grain"),
            self._keys.key(shard, f"hist:{key}"),
            *self._audit_keys(shard),
        ]
        args = [
            key,
            member(h, key),
            etag,
            self._keys.channel(shard),
            change_payload(self._writer, h, grain_id, name, None),
            f"{self._keys.prefix}{shard}}}:",
            *self._record_args(record, retention),
        ]
        with translate_errors("reminder remove (audited)"):
            done = await call_script(
                self._client, self._scripts["remove_audited"], keys, args, self._options
            )
        return bool(done)

    async def append(self, record: AuditRecord, retention: AuditRetention) -> None:
        shard = self._shard_of(record.grain_id)
        args = [f"{self._keys.prefix}{shard}}}:", *self._record_args(record, retention)]
        with translate_errors("reminder audit append"):
            await call_script(
                self._client, self._scripts["append_audit"], self._audit_keys(shard), args,
                self._options,
            )  # fmt: skip

    async def settle(self, record: AuditRecord) -> bool:
        shard = self._shard_of(record.grain_id)
        with translate_errors("reminder audit settle"):
            done = await call_script(
                self._client,
                self._scripts["settle_audit"],
                [self._keys.key(shard, "audit")],
                [record.id, pack(record.to_record())],
                self._options,
            )
        return bool(done)

    async def read(self, query: AuditQuery) -> list[AuditRecord]:
        """``AuditedReminderTable.read_audit``: a shard's newest ``limit`` records
        in the window when only time filters, else its whole window (bounded by
        the shard's retention), filtered here."""
        shards = (
            [self._shard_of(query.grain_id)]
            if query.grain_id is not None
            else list(range(self._keys.shards))
        )
        top = "+inf" if query.until_ms is None else str(query.until_ms)
        bottom = "-inf" if query.since_ms is None else str(query.since_ms)
        only_time = query.grain_id is None and query.principal is None and query.action is None
        with translate_errors("reminder audit read"):
            pipe = self._client.pipeline(transaction=False)
            for s in shards:
                index = self._keys.key(s, "audit:at")
                if only_time:
                    pipe.zrevrangebyscore(index, top, bottom, start=0, num=query.limit)
                else:
                    pipe.zrevrangebyscore(index, top, bottom)
            ids_of = await pipe.execute()
            pipe = self._client.pipeline(transaction=False)
            asked = [(s, ids) for s, ids in zip(shards, ids_of, strict=True) if ids]
            for s, ids in asked:
                pipe.hmget(self._keys.key(s, "audit"), ids)
            raws = await pipe.execute() if asked else []
        found = [r for batch in raws for r in _decode(batch) if query.matches(r)]
        return newest_first(found, query.limit)


def _decode(raws: Sequence[Any]) -> list[AuditRecord]:
    out = []
    for raw in raws:
        if raw is None:  # trimmed between the two reads
            continue
        try:
            out.append(AuditRecord.from_record(unpack(raw)))
        except (SerializationError, KeyError, TypeError, ValueError) as exc:
            raise StorageError(f"malformed audit record in redis: {exc}") from exc
    return out
