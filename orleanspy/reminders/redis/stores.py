"""``RedisReminderTable``'s label index reads, calendars and backfill jobs (``reminders.stores``).

Keys (``P`` = ``orleanspy:<service_id>:``, ``T`` = a shard's hash tag)::

    P rem:T:terms      HASH  "grain|name" -> msgpack list of the row's terms
    P rem:T:ix:<term>  ZSET  "grain|name" of the rows carrying <term>, scores 0
    P rem:calendars    HASH  "c:<name>" -> "<version>|<msgpack Calendar record>",
                             "#" -> the last version given
    P rem:backfills    HASH  "j:<grain|name>" -> "<etag>|<msgpack job record>",
                             "#" -> the last etag given

The per-shard keys are written by the row scripts (``scripts.LUA_REINDEX``);
this module reads them: a page of ``read_indexed`` walks the first term's ZSET
of each shard in order by lex from the cursor, checks the other terms with
``ZSCORE`` and fetches the rows, in one script call on one Redis (every shard
from the cursor's on) and one per shard on a Redis Cluster (pipelined,
``_CLUSTER_SHARDS`` at a time). The cursor is ``"<shard>|<last member>"``.
Rows the index holds but that no longer carry the terms (written by a release
without the index) are left out here.

Calendars and backfills are one HASH each (no hash tag: one key, so one slot
on a Redis Cluster); every write is a script on that key, so a version or
etag and its record change together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

from orleanspy._redis import Client, run_script_calls, translate_errors
from orleanspy.errors import SerializationError, StorageError
from orleanspy.identity import GrainId
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.model import ReminderEntry, row_key
from orleanspy.reminders.redis.layout import ShardKeys, decode_row
from orleanspy.reminders.stores import has_terms
from orleanspy.reminders.table import check_page_limit
from orleanspy.serialization import pack_lua, unpack

__all__ = ["STORE_SCRIPTS", "RedisStores"]

# Shards asked at once on a Redis Cluster (one script call each, pipelined).
_CLUSTER_SHARDS: Final = 32
# Members of the first term one script call looks at, per row asked for.
_SCAN_PER_ROW: Final = 20
_MIN_SCAN: Final = 2000

# ARGV: shard key prefix, msgpack list of the shards to walk in order, the member
# to start after in the first of them ('' for none), limit, msgpack terms, and
# the most members of the first term one call looks at (so a selector whose
# other terms match few of the first's rows never holds Redis for long: the
# page then comes short, with its cursor). Returns {shard, member, records}:
# where the page stopped (shard -1: every shard given was walked to its end)
# and the records, in order.
READ_INDEXED: Final = """
local prefix = ARGV[1]
local shards = cmsgpack.unpack(ARGV[2])
local after = ARGV[3]
local limit = tonumber(ARGV[4])
local terms = cmsgpack.unpack(ARGV[5])
local budget = tonumber(ARGV[6])
local seen = 0
local out = {}
for si = 1, #shards do
  local shard = prefix .. shards[si] .. '}:'
  local ix = shard .. 'ix:' .. terms[1]
  local min = '-'
  if si == 1 and after ~= '' then min = '(' .. after end
  while true do
    local members = redis.call('ZRANGEBYLEX', ix, min, '+', 'LIMIT', 0, 256)
    for _, m in ipairs(members) do
      seen = seen + 1
      local ok = true
      for t = 2, #terms do
        if not redis.call('ZSCORE', shard .. 'ix:' .. terms[t], m) then
          ok = false
          break
        end
      end
      if ok then
        local raw = redis.call('HGET', shard .. 'rows', m)
        if raw then
          out[#out + 1] = raw
          if #out >= limit then return {shards[si], m, out} end
        end
      end
      if seen >= budget then return {shards[si], m, out} end
      min = '(' .. m
    end
    if #members < 256 then break end
  end
end
return {-1, '', out}
"""

# KEYS: the calendars hash. ARGV: name, msgpack record. Returns the new version.
WRITE_CALENDAR: Final = """
local v = redis.call('HINCRBY', KEYS[1], '#', 1)
redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], v .. '|' .. ARGV[2])
return v
"""

# KEYS: a hash of "<version>|<record>" values. ARGV: field, version ('': any).
# Removes the field if it holds that version; 1 if removed.
REMOVE_VERSIONED: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
if ARGV[2] ~= '' and string.match(raw, '^([^|]*)|') ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""

# KEYS: the backfills hash. ARGV: field, msgpack record, expected etag ('-': the
# field must be absent). Returns the new etag, or false when the condition fails.
PUT_BACKFILL: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] == '-' then
  if raw then return false end
elseif not raw or string.match(raw, '^([^|]*)|') ~= ARGV[3] then
  return false
end
local v = redis.call('HINCRBY', KEYS[1], '#', 1)
redis.call('HSET', KEYS[1], ARGV[1], v .. '|' .. ARGV[2])
return v
"""

#: The scripts of this module by the name the table registers them under.
STORE_SCRIPTS: Final = {
    "read_indexed": READ_INDEXED,
    "write_calendar": WRITE_CALENDAR,
    "remove_versioned": REMOVE_VERSIONED,
    "put_backfill": PUT_BACKFILL,
}


def _split(raw: bytes) -> tuple[str, bytes]:
    head, sep, body = raw.partition(b"|")
    if not sep:
        raise StorageError("malformed versioned record in redis")
    return head.decode(), body


class RedisStores:
    """The label index reads, calendars and backfills of one table (module docstring)."""

    def __init__(
        self, client: Client, keys: ShardKeys, scripts: dict[str, Any], *, cluster: bool
    ) -> None:
        self._c = client
        self._keys = keys
        self._scripts = scripts
        self._cluster = cluster
        base = keys.meta.removesuffix("meta")
        self._calendars = f"{base}calendars"
        self._backfills = f"{base}backfills"

    # -- the label index ------------------------------------------------------------

    async def read_indexed(
        self, terms: Sequence[str], cursor: str | None, limit: int
    ) -> tuple[list[ReminderEntry], str | None]:
        check_page_limit(limit)
        if not terms:
            raise ValueError("read_indexed needs at least one term")
        first, after = self._parse(cursor)
        order = [terms[0], *sorted(set(terms[1:]) - {terms[0]})]
        packed_terms = pack_lua(order)
        shards = list(range(first, self._keys.shards))
        script = self._scripts["read_indexed"]
        budget = max(_MIN_SCAN, _SCAN_PER_ROW * limit)
        raws: list[bytes] = []
        stop: tuple[int, str] | None = None
        with translate_errors("reminder read_indexed"):
            if not self._cluster:
                reply = await script(
                    keys=[self._keys.key(first, "rows")],
                    args=[self._keys.prefix, pack_lua(shards), after, limit, packed_terms, budget],
                )
                raws = list(reply[2])
                if int(reply[0]) >= 0:
                    stop = (int(reply[0]), cast(bytes, reply[1]).decode())
            else:
                for i in range(0, len(shards), _CLUSTER_SHARDS):
                    group = shards[i : i + _CLUSTER_SHARDS]
                    want = limit - len(raws)
                    calls = [
                        (
                            [self._keys.key(s, "rows")],
                            [
                                self._keys.prefix,
                                pack_lua([s]),
                                after if s == first else "",
                                want,
                                packed_terms,
                                budget,
                            ],
                        )
                        for s in group
                    ]
                    replies = await run_script_calls(self._c, READ_INDEXED, script.sha, calls)
                    for s, reply in zip(group, replies, strict=True):
                        for raw in reply[2]:
                            raws.append(raw)
                            if len(raws) >= limit:
                                stop = (s, _member(raw))
                                break
                        if stop is None and int(reply[0]) >= 0:
                            # The shard's scan budget ran out: go on from there.
                            stop = (s, cast(bytes, reply[1]).decode())
                        if stop is not None:
                            break
                    if stop is not None:
                        break
        rows = [row for raw in raws if has_terms(row := decode_row(raw), terms)]
        return rows, None if stop is None else f"{stop[0]}|{stop[1]}"

    def _parse(self, cursor: str | None) -> tuple[int, str]:
        if cursor is None:
            return 0, ""
        shard, sep, member = cursor.partition("|")
        if not sep or not shard.isdigit() or int(shard) >= self._keys.shards:
            raise ValueError(f"not a page cursor of this table: {cursor!r}")
        return int(shard), member

    async def count_indexed(self, term: str) -> int:
        with translate_errors("reminder count_indexed"):
            pipe = self._c.pipeline(transaction=False)
            for s in range(self._keys.shards):
                pipe.zcard(self._keys.key(s, f"ix:{term}"))
            return sum(int(n) for n in await pipe.execute())

    # -- calendars ------------------------------------------------------------------

    async def write_calendar(self, name: str, calendar: Calendar) -> StoredCalendar:
        with translate_errors("reminder write_calendar"):
            version = await self._scripts["write_calendar"](
                keys=[self._calendars], args=[name, pack_lua(calendar.to_record())]
            )
        return StoredCalendar(name, calendar, int(version))

    async def read_calendar(self, name: str) -> StoredCalendar | None:
        with translate_errors("reminder read_calendar"):
            raw = await self._c.hget(self._calendars, f"c:{name}")
        return None if raw is None else _calendar(name, cast(bytes, raw))

    async def read_calendars(self) -> list[StoredCalendar]:
        with translate_errors("reminder read_calendars"):
            raw = await self._c.hgetall(self._calendars)
        found = [
            _calendar(k.decode()[2:], v)
            for k, v in cast(dict[bytes, bytes], raw).items()
            if k.startswith(b"c:")
        ]
        return sorted(found, key=lambda c: c.name)

    async def remove_calendar(self, name: str, version: int) -> bool:
        with translate_errors("reminder remove_calendar"):
            done = await self._scripts["remove_versioned"](
                keys=[self._calendars], args=[f"c:{name}", str(version)]
            )
        return bool(done)

    # -- backfills ------------------------------------------------------------------

    async def add_backfill(self, job: BackfillJob) -> BackfillJob | None:
        etag = await self._put(job, "-")
        return None if etag is None else job.with_etag(etag)

    async def update_backfill(self, job: BackfillJob, etag: str) -> str | None:
        return await self._put(job, etag)

    async def _put(self, job: BackfillJob, condition: str) -> str | None:
        with translate_errors("reminder backfill write"):
            etag = await self._scripts["put_backfill"](
                keys=[self._backfills],
                args=[f"j:{job.key}", pack_lua(job.to_record()), condition],
            )
        return None if etag is None else str(int(etag))

    async def read_backfill(self, grain_id: GrainId, name: str) -> BackfillJob | None:
        with translate_errors("reminder read_backfill"):
            raw = await self._c.hget(self._backfills, f"j:{row_key(grain_id, name)}")
        return None if raw is None else _job(cast(bytes, raw))

    async def read_backfills(self) -> list[BackfillJob]:
        with translate_errors("reminder read_backfills"):
            raw = await self._c.hgetall(self._backfills)
        jobs = [_job(v) for k, v in cast(dict[bytes, bytes], raw).items() if k.startswith(b"j:")]
        return sorted(jobs, key=lambda j: j.key)

    async def remove_backfill(self, grain_id: GrainId, name: str, etag: str | None = None) -> bool:
        with translate_errors("reminder remove_backfill"):
            done = await self._scripts["remove_versioned"](
                keys=[self._backfills], args=[f"j:{row_key(grain_id, name)}", etag or ""]
            )
        return bool(done)


def _member(raw: bytes) -> str:
    """The index member (``grain|name``) of a stored record."""
    row = decode_row(raw)
    return row.key


def _calendar(name: str, raw: bytes) -> StoredCalendar:
    version, body = _split(raw)
    try:
        return StoredCalendar(name, Calendar.from_record(unpack(body)), int(version))
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed calendar {name!r} in redis: {exc}") from exc


def _job(raw: bytes) -> BackfillJob:
    etag, body = _split(raw)
    try:
        return BackfillJob.from_record(unpack(body), etag)
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed backfill job in redis: {exc}") from exc
