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
    P rem:T:fenced  ZSET  fenced writers (``str(SiloAddress)``), score = ms fenced
    P rem:meta      HASH  "shards" -> the shard count the table was created with

A change message is ``<writer: 8 hex><hash: 8 hex><msgpack [grain, name,
next_due_ms | nil]>`` or, from upserts, ``... [grain, name, next_due_ms,
priority]``. Schedule CASes publish nothing (``ReminderTable.update_schedule``).
The fixed-width head lets a reader drop its own writes and rows outside its
ranges before decoding anything. ``writer`` is the ``writer_id`` of the table
instance that wrote the row.

A row lives in shard ``hash >> (32 - log2(shards))`` (the top bits), so a ring
range maps onto a run of consecutive shards. Writes are Lua scripts over one
shard. ``read_due`` (and ``read_due_skipping``, ``upcoming``) is one script
call (``_READ_MERGED``) on one Redis, one per node on a Redis Cluster: it reads
the due members of every shard that overlaps the range whose 8-hex-digit hash
prefix lies in the range (the filtering runs in Redis, before any row is
touched), merges the shards in the due order with a heap, leaves out the
skipped keys (sent along), and fetches and returns only the records of the
rows taken. A cluster's nodes answer with their candidates' scores and
members too, merged here. (A script call per shard, then a fetch per shard,
cost a refill of the default window hundreds of commands to pack and parse.)
``read_range`` reads each shard by its own script call (``_READ_DUE``).

The due score encodes the contract's order (priority descending, then
``next_due``): ``lane = 127 - priority`` (0 for priority 127, 255 for -128)
times 2**44, plus ``next_due`` in ms (2**44 ms reaches the year 2527; the
largest score, under 2**52, is an exact double). Sorting by score is the due
order. The read scripts walk the lanes present in a shard: a lane is read up to
``before``, and the next one is found by one more ``ZRANGEBYSCORE``, so the
cost grows with the rows returned and the priorities present, never with rows
not yet due. With a lower bound (``read_due_skipping(..., after=...)``) each
lane's scan starts past it. Every script that writes the due index computes
the score with ``lane_score`` (Python) or the same formula in Lua, from the
row's stored priority.

``update_schedule_many`` applies a whole batch in one script call whose rows
travel packed in one argument; it scores each row from its stored priority too.
It and ``append_history`` take the shard key prefix and build the keys of the
shards a batch touches in Lua (see the comment above ``_UPDATE_MANY``).

Change feeds use Redis 7 sharded pub/sub, one channel per shard (it lives on
the shard's node in Redis Cluster); the subscription and the message form live
in ``_redis_feed``. A scoped feed (``scoped_changes``)
subscribes only to the shards overlapping its scope's ranges, re-subscribes
when they change, and skips its own table's writes and rows outside the ranges
by the message head, without decoding them.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Collection, Container, Iterable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from orleanspy._redis import (
    Client,
    Redis,
    call_script,
    connect,
    is_cluster,
    key_prefix,
    node_groups,
    resolve,
    run_script_calls,
    translate_errors,
)
from orleanspy.clock import to_ms
from orleanspy.errors import ConfigurationError, SerializationError, StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders._redis_feed import ClusterTopology, RedisChanges, change_payload
from orleanspy.reminders.model import (
    FireRecord,
    ReminderEntry,
    ScheduleUpdate,
    row_key,
)
from orleanspy.reminders.table import ENDED_HISTORY_KEPT, FeedScope, grain_prefix
from orleanspy.ring import HASH_SPACE, RingRange
from orleanspy.serialization import pack, pack_lua, unpack

if TYPE_CHECKING:
    from orleanspy.options import RedisOptions

__all__ = ["RedisReminderTable"]

_log = logging.getLogger(__name__)

_TOP: Final = HASH_SPACE - 1
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

# Optional fields of a fire record, merged into its stored map by the script.
_HISTORY_FLAGS: Final = frozenset({"x", "m", "n", "f"})

#: Width of a priority lane in the due score: next_due ms must lie in [0, 2**44).
LANE_WIDTH: Final = 1 << 44


def lane_score(priority: int, due_ms: int) -> int:
    """The due-index score of a row: priority lane first, then due time (exact in a double)."""
    if not 0 <= due_ms < LANE_WIDTH:
        raise StorageError(f"next_due {due_ms} ms is outside the storable range [1970, 2527)")
    if not -128 <= priority <= 127:
        raise StorageError(f"priority {priority} is outside -128..127")
    return (127 - priority) * LANE_WIDTH + due_ms


# KEYS: rows, due, grain, etag counter.
# ARGV: key, due member, score, record, etag suffix, channel, change payload,
# condition: '' (none), '-' (only if absent) or the etag the row must have.
# Returns the new etag, or nil when the condition does not hold.
_UPSERT: Final = """
if ARGV[8] ~= '' then
  local raw = redis.call('HGET', KEYS[1], ARGV[1])
  if ARGV[8] == '-' then
    if raw then return false end
  else
    if not raw or cmsgpack.unpack(raw)['e'] ~= ARGV[8] then return false end
  end
end
local etag = redis.call('INCR', KEYS[4]) .. ARGV[5]
local rec = cmsgpack.unpack(ARGV[4])
rec['e'] = etag
redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(rec))
if rec['u'] then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
end
redis.call('ZADD', KEYS[3], 0, ARGV[1])
redis.call('SPUBLISH', ARGV[6], ARGV[7])
return etag
"""

# A Lua function for the scripts that publish a paused row's change: the head,
# then msgpack (grain, name, nil) written out by hand, as a Lua table cannot end
# in nil.
_LUA_REMOVAL: Final = """
local function removal(head, rec)
  return head .. string.char(0x93) .. cmsgpack.pack(rec['g']) .. cmsgpack.pack(rec['n'])
    .. string.char(0xc0)
end
"""

# Many upserts into one shard in one call. KEYS: rows, due, grain, etag counter.
# ARGV: etag suffix, channel, then one msgpack array of rows, each
# [key, due member, score, record map] and, for a paused row only, a 5th
# element true (the row stays out of the index); ARGV[4] is the writer id. The
# change message is built here: writer id, the row's hash (the due member's
# 8-hex prefix), then msgpack (grain, name, due, priority) from the record, or
# for a paused row ``removal`` (``_LUA_REMOVAL``). Returns the etags in order.
_UPSERT_MANY: Final = (
    _LUA_REMOVAL
    + """
local rows = cmsgpack.unpack(ARGV[3])
local out = {}
for i = 1, #rows do
  local row = rows[i]
  local etag = redis.call('INCR', KEYS[4]) .. ARGV[1]
  local rec = row[4]
  rec['e'] = etag
  redis.call('HSET', KEYS[1], row[1], cmsgpack.pack(rec))
  redis.call('ZADD', KEYS[3], 0, row[1])
  local head = ARGV[4] .. string.sub(row[2], 1, 8)
  if row[5] then
    redis.call('ZREM', KEYS[2], row[2])
    redis.call('SPUBLISH', ARGV[2], removal(head, rec))
  else
    redis.call('ZADD', KEYS[2], string.format('%.0f', row[3]), row[2])
    redis.call('SPUBLISH', ARGV[2], head .. cmsgpack.pack({rec['g'], rec['n'], rec['d'], rec['r']}))
  end
  out[i] = etag
end
return out
"""
)

# _UPSERT_MANY over rows of many shards in one call (one Redis only: on Redis
# Cluster each call stays within one shard). ARGV[1]: etag suffix. ARGV[2]:
# shard key prefix (``_key``). ARGV[3]: msgpack flat list of shard groups, each
# the shard, its row count, then six items per row: key, due member, score
# (decimal text), the record, the change message, paused. The record comes
# encoded, as a msgpack map whose header counts one entry more than follows:
# the script appends that entry, "e" and the row's new etag, so Redis neither
# decodes nor re-encodes a row (``_record_without_etag``). The change message
# is the one ``_UPSERT_MANY`` publishes (``change_payload``). A shard's etags
# come from one INCRBY and its rows are written with one HSET and one ZADD per
# index (in slices of at most 500 rows: Lua's unpack has a stack limit). A
# paused row's ZREM first flushes the due ZADDs queued before it, so a row
# twice in a batch ends as its last write. Returns the etags in order. One call
# per batch, where one per shard cost the client a command to encode and Redis
# a script run for a few rows each.
_UPSERT_MANY_SHARDS: Final = """
local prefix = ARGV[2]
local rows = cmsgpack.unpack(ARGV[3])
local e = cmsgpack.pack('e')
local out = {}
local n = 0
local i = 1
while i <= #rows do
  local shard = prefix .. rows[i] .. '}:'
  local count = rows[i + 1]
  i = i + 2
  local channel = shard .. 'changes'
  local first = redis.call('INCRBY', shard .. 'etag', count) - count
  local hset, grain, due = {}, {}, {}
  local function flush()
    if #hset > 0 then
      redis.call('HSET', shard .. 'rows', unpack(hset))
      redis.call('ZADD', shard .. 'grain', unpack(grain))
      hset, grain = {}, {}
    end
    if #due > 0 then
      redis.call('ZADD', shard .. 'due', unpack(due))
      due = {}
    end
  end
  for j = 1, count do
    local key = rows[i]
    local etag = string.format('%.0f', first + j) .. ARGV[1]
    hset[#hset + 1] = key
    hset[#hset + 1] = rows[i + 3] .. e .. cmsgpack.pack(etag)
    grain[#grain + 1] = 0
    grain[#grain + 1] = key
    if rows[i + 5] then
      flush()
      redis.call('ZREM', shard .. 'due', rows[i + 1])
    else
      due[#due + 1] = rows[i + 2]
      due[#due + 1] = rows[i + 1]
    end
    redis.call('SPUBLISH', channel, rows[i + 4])
    if #hset >= 1000 then flush() end
    n = n + 1
    out[n] = etag
    i = i + 6
  end
  flush()
end
return out
"""


# _UPSERT_IF_MANY over rows of many shards in one call (one Redis only), the
# rows encoded as for _UPSERT_MANY_SHARDS but not grouped: eight items per row,
# shard, key, due member, score, record, change message, paused, condition
# ('-': only if absent, else the etag the row must have). ARGV as for
# _UPSERT_MANY_SHARDS. Returns per row the new etag, or false where the
# condition did not hold (nothing written or published).
_UPSERT_IF_MANY_SHARDS: Final = """
local prefix = ARGV[2]
local rows = cmsgpack.unpack(ARGV[3])
local e = cmsgpack.pack('e')
local out = {}
local n = 0
for i = 1, #rows, 8 do
  local shard = prefix .. rows[i] .. '}:'
  local hash = shard .. 'rows'
  local key = rows[i + 1]
  local raw = redis.call('HGET', hash, key)
  local cond = rows[i + 7]
  local ok
  if cond == '-' then
    ok = not raw
  else
    ok = raw and cmsgpack.unpack(raw)['e'] == cond
  end
  n = n + 1
  if ok then
    local etag = redis.call('INCR', shard .. 'etag') .. ARGV[1]
    redis.call('HSET', hash, key, rows[i + 4] .. e .. cmsgpack.pack(etag))
    redis.call('ZADD', shard .. 'grain', 0, key)
    if rows[i + 6] then
      redis.call('ZREM', shard .. 'due', rows[i + 2])
    else
      redis.call('ZADD', shard .. 'due', rows[i + 3], rows[i + 2])
    end
    redis.call('SPUBLISH', shard .. 'changes', rows[i + 5])
    out[n] = etag
  else
    out[n] = false
  end
end
return out
"""

# _READ_GRAINS over grains of many shards in one call (one Redis only). ARGV[1]:
# shard key prefix; ARGV[2]: msgpack flat list, per grain its shard and prefix
# ("grain|"). Returns what _READ_GRAINS returns, for the grains in order.
_READ_GRAINS_SHARDS: Final = """
local prefix = ARGV[1]
local g = cmsgpack.unpack(ARGV[2])
local out = {}
for i = 1, #g, 2 do
  local shard = prefix .. g[i] .. '}:'
  local p = g[i + 1]
  local keys = redis.call('ZRANGEBYLEX', shard .. 'grain', '[' .. p, '(' .. p .. '\\255')
  out[#out + 1] = #keys
  if #keys > 0 then
    local raws = redis.call('HMGET', shard .. 'rows', unpack(keys))
    for j = 1, #raws do out[#out + 1] = raws[j] end
  end
end
return out
"""


def _record_without_etag(record: dict[str, Any]) -> bytes:
    """``record`` (which has no ``"e"``) as a msgpack map whose header counts one
    entry more: ``_UPSERT_MANY_SHARDS`` appends ``"e"`` and the etag."""
    body = pack_lua(record)
    count = len(record) + 1
    skip = 1 if body[0] & 0xF0 == 0x80 else 3 if body[0] == 0xDE else 5
    head = bytes((0x80 | count,)) if count < 16 else b"\xde" + count.to_bytes(2, "big")
    return head + body[skip:]


# Conditional upserts into one shard in one call: as _UPSERT_MANY, each row
# [key, due member, score, record map, paused, condition] with condition '-'
# (only if absent) or the etag the row must have. Returns per row the new
# etag, or false where the condition did not hold (nothing written or published).
_UPSERT_IF_MANY: Final = (
    _LUA_REMOVAL
    + """
local rows = cmsgpack.unpack(ARGV[3])
local out = {}
for i = 1, #rows do
  local row = rows[i]
  local raw = redis.call('HGET', KEYS[1], row[1])
  local ok
  if row[6] == '-' then
    ok = not raw
  else
    ok = raw and cmsgpack.unpack(raw)['e'] == row[6]
  end
  if ok then
    local etag = redis.call('INCR', KEYS[4]) .. ARGV[1]
    local rec = row[4]
    rec['e'] = etag
    redis.call('HSET', KEYS[1], row[1], cmsgpack.pack(rec))
    redis.call('ZADD', KEYS[3], 0, row[1])
    local head = ARGV[4] .. string.sub(row[2], 1, 8)
    if row[5] then
      redis.call('ZREM', KEYS[2], row[2])
      redis.call('SPUBLISH', ARGV[2], removal(head, rec))
    else
      redis.call('ZADD', KEYS[2], string.format('%.0f', row[3]), row[2])
      redis.call('SPUBLISH', ARGV[2],
        head .. cmsgpack.pack({rec['g'], rec['n'], rec['d'], rec['r']}))
    end
    out[i] = etag
  else
    out[i] = false
  end
end
return out
"""
)

# The two per-tick scripts (the batched schedule CAS and the history append)
# name their keys in the arguments rather than in KEYS: each batch spans many
# shards, and redis-py's packing of one argument per key was the largest client
# cost of a tick. ARGV[2] is the shard key prefix ``P rem:{<service_id>:rem:``;
# a shard's key of kind K is ``prefix .. shard .. '}:' .. K`` (``_key``). A
# batch that spans shards runs on a single Redis instance only, as before: on
# Redis Cluster a batch would have to be split per slot (docs/decisions.md).

# ARGV[1]: etag suffix. ARGV[2]: shard key prefix. ARGV[3]: msgpack flat list,
# six items per update: shard, key, due member, expected etag, next_due ms,
# last_fire ms (-1: none). ARGV[4]: the writer (``str(SiloAddress)``, '' for
# none); an update in a shard whose ``fenced`` set holds it loses, as a lost
# CAS (``FencingReminderTable``). Returns per update the new etag, or false on a
# lost race. The rows travel in one argument so the client encodes one string per
# batch, not six per row. The due score is the lane of the row's stored
# priority plus next_due (``lane_score``), formatted with %.0f because Lua
# would print it with 14 digits; a paused row stays out of the index. Nothing
# is published: a schedule CAS is the owner's own write (``update_schedule``).
# ARGV[5] = '1' on a Redis Cluster: every shard's keys are touched before any is
# written, so a shard whose slot moved away (or is half moved) fails the call
# with nothing written; failing at that shard's turn would leave the shards
# before it updated under etags the caller never learns (its retry would then
# lose its own CAS).
_UPDATE_MANY: Final = """
local prefix = ARGV[2]
local u = cmsgpack.unpack(ARGV[3])
local out = {}
if ARGV[5] == '1' then
  local seen = {}
  for i = 1, #u, 6 do
    if not seen[u[i]] then
      seen[u[i]] = true
      local shard = prefix .. u[i] .. '}:'
      redis.call('EXISTS', shard .. 'rows', shard .. 'due', shard .. 'etag', shard .. 'fenced')
    end
  end
end
for i = 1, #u, 6 do
  local shard = prefix .. u[i] .. '}:'
  local rows = shard .. 'rows'
  local raw = redis.call('HGET', rows, u[i + 1])
  local result = false
  if raw and ARGV[4] ~= '' and redis.call('ZSCORE', shard .. 'fenced', ARGV[4]) then
    raw = false
  end
  if raw then
    local rec = cmsgpack.unpack(raw)
    if rec['e'] == u[i + 3] then
      result = redis.call('INCR', shard .. 'etag') .. ARGV[1]
      rec['d'] = u[i + 4]
      if u[i + 5] < 0 then rec['l'] = nil else rec['l'] = u[i + 5] end
      rec['e'] = result
      redis.call('HSET', rows, u[i + 1], cmsgpack.pack(rec))
      if not rec['u'] then
        local score = (127 - rec['r']) * 17592186044416 + u[i + 4]
        redis.call('ZADD', shard .. 'due', string.format('%.0f', score), u[i + 2])
      end
    end
  end
  out[#out + 1] = result
end
return out
"""

# A whole batch of fire records in one call. ARGV[1]: keep. ARGV[2]: shard key
# prefix. ARGV[3]: msgpack flat list, per row: its shard, its key, how many
# records follow, then five items per record, oldest first: slot ms, delivery
# ms, outcome, silo, and false or a map of the record's optional fields
# (``FireRecord.to_record``'s "x", "m", "n", "f"). The record map is built here
# (``FireRecord.to_record``'s form), so the client packs one string per batch,
# not one per record. Records of a missing row are dropped.
#: Items per fire record in ``append_history``'s packed list (``_APPEND_HISTORY``).
_HISTORY_FIELDS: Final = 5

_APPEND_HISTORY: Final = """
local keep = tonumber(ARGV[1])
local prefix = ARGV[2]
local u = cmsgpack.unpack(ARGV[3])
local i = 1
while i <= #u do
  local shard = prefix .. u[i] .. '}:'
  local n = u[i + 2]
  if redis.call('HEXISTS', shard .. 'rows', u[i + 1]) == 1 then
    local hist = shard .. 'hist:' .. u[i + 1]
    for j = i + 3, i + 3 + (n - 1) * 5, 5 do
      local rec = {t = u[j], a = u[j + 1], o = u[j + 2], s = u[j + 3]}
      local flags = u[j + 4]
      if flags then for k, v in pairs(flags) do rec[k] = v end end
      redis.call('LPUSH', hist, cmsgpack.pack(rec))
    end
    redis.call('LTRIM', hist, 0, keep - 1)
    redis.call('PERSIST', hist)  -- an ended row's history, continued by a new row
  end
  i = i + 3 + n * 5
end
return 1
"""

# KEYS: rows, due, grain, history. ARGV: key, due member, expected etag, channel,
# payload, and (``end``) how many ms the history list stays (else it is deleted).
_REMOVE: Final = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local rec = cmsgpack.unpack(raw)
if rec['e'] ~= ARGV[3] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[6] then redis.call('PEXPIRE', KEYS[4], ARGV[6]) else redis.call('DEL', KEYS[4]) end
redis.call('SPUBLISH', ARGV[4], ARGV[5])
return 1
"""

# KEYS: due. ARGV: min score, max score, before (next_due ms), limit (0 = all),
# page, after (next_due ms, exclusive; -1: none), then inclusive hash intervals
# as pairs of 8-hex-digit bounds. Returns [member, score, ...] of members with
# min <= score <= max, after < next_due <= before, inside the intervals, in
# score order (the due order). Lanes are visited in
# order; an empty stretch between lanes costs one ZRANGEBYSCORE LIMIT 0 1.
# Fixed-width lowercase hex compares as strings in numeric order.
_READ_DUE: Final = """
local W = 17592186044416
local max = tonumber(ARGV[2])
local before = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local page = tonumber(ARGV[5])
local after = tonumber(ARGV[6])
local want = 2 * limit
local out = {}
local cur = tonumber(ARGV[1])
while cur <= max do
  local head = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', cur),
                          string.format('%.0f', max), 'WITHSCORES', 'LIMIT', 0, 1)
  if #head == 0 then return out end
  local lane = math.floor(tonumber(head[2]) / W)
  local lo = math.max(cur, lane * W + after + 1)
  local hi = math.min(max, lane * W + before)
  local offset = 0
  while lo <= hi do
    local batch = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', lo),
                             string.format('%.0f', hi), 'WITHSCORES', 'LIMIT', offset, page)
    for i = 1, #batch, 2 do
      local h = string.sub(batch[i], 1, 8)
      for j = 7, #ARGV, 2 do
        if h >= ARGV[j] and h <= ARGV[j + 1] then
          out[#out + 1] = batch[i]
          out[#out + 1] = batch[i + 1]
          break
        end
      end
      if limit > 0 and #out >= want then return out end
    end
    if #batch < 2 * page then break end
    offset = offset + page
  end
  cur = (lane + 1) * W
end
return out
"""


# read_merged: the first rows of many shards in the due order, merged in Redis,
# in one call (per node on a cluster). KEYS: the first shard's due ZSET (it
# routes the call; the script builds every shard's keys from the prefix, so on
# a cluster they must all live on the called node). ARGV: the shard key
# prefix, before (next_due ms), after (next_due ms, exclusive; -1: none),
# limit (0: all), take (-1: all), the first page per shard, the reply's form,
# msgpack keys to skip, msgpack plan: per shard [shard, lo, hi, ...] with
# inclusive 8-hex-digit hash bounds, or [shard] for the whole shard, in shard
# order.
#
# A shard is read from a position (score, members at that score already read)
# by ZRANGEBYSCORE up to the top of the index: the members come lane by lane,
# and the first one past ``before`` (or not past ``after``) in a lane ends that
# lane's read, the next read starting at the next lane (or past ``after``). So
# a read costs the members returned plus at most a page per lane, never the
# rows not yet due. A binary heap of the shards' next members (score, then
# shard order) pops the candidates in the due order: members of one score
# sort by hash first, and shard order is hash order, so the heap's order is
# the index's (score, member) order without comparing strings. It stops after
# ``limit`` candidates (skipped ones count) or once ``take`` were not skipped.
#
# Skipped members first stay out of the heap, only counted: while the
# candidates taken plus every skipped member read stay within ``limit``, the
# limit cannot have cut the answer. Otherwise (or for form 'm') the merge runs
# again with skipped members in the heap, counting exactly.
#
# Reply forms: 'r' the records of the candidates not skipped (the whole answer
# on one node); 'm' score, member and record (false for a skipped one) of every
# candidate, for a merge across nodes; 'k' score and member of every
# candidate, no records (the caller skips).
_READ_MERGED: Final = """
local W = 17592186044416
local TOP = 256 * W - 1
local TOPS = string.format('%.0f', TOP)
local prefix = ARGV[1]
local before = tonumber(ARGV[2])
local after = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local take = tonumber(ARGV[5])
local ask = tonumber(ARGV[6])
local form = ARGV[7]
local skip, skipping = {}, false
for _, k in ipairs(cmsgpack.unpack(ARGV[8])) do
  skip[k] = true
  skipping = true
end
local plan = cmsgpack.unpack(ARGV[9])
local keys, ivss = {}, {}
for x = 1, #plan do
  local p = plan[x]
  keys[x] = prefix .. p[1] .. '}:'
  local ivs = {}
  for j = 2, #p do ivs[#ivs + 1] = p[j] end
  ivss[x] = ivs
end

-- Skipped members read but kept out of the heap (not exact).
local skipped_read = 0

-- Appends (score, member, skipped) of the next n candidates of shard x to buf,
-- from position (cur, off): score >= cur, less the first off members at score
-- cur. Returns the position to go on from, or nil once the shard is read out.
local function scan(x, cur, off, n, buf, exact)
  local key, ivs = keys[x] .. 'due', ivss[x]
  local got = 0
  local fetch = math.min(math.max(n, 16), 1000)
  while true do
    local batch = redis.call('ZRANGEBYSCORE', key, string.format('%.0f', cur), TOPS,
                             'WITHSCORES', 'LIMIT', off, fetch)
    local jump = nil
    for i = 1, #batch, 2 do
      local score = tonumber(batch[i + 1])
      local lane = math.floor(score / W)
      local due = score - lane * W
      if due <= after then
        jump = lane * W + after + 1
        break
      end
      if due > before then
        jump = (lane + 1) * W
        break
      end
      if score == cur then off = off + 1 else cur, off = score, 1 end
      local m = batch[i]
      local inside = #ivs == 0
      if not inside then
        local h = string.sub(m, 1, 8)
        for j = 1, #ivs, 2 do
          if h >= ivs[j] and h <= ivs[j + 1] then
            inside = true
            break
          end
        end
      end
      if inside then
        local skipped = skipping and (skip[string.sub(m, 10)] or false)
        if skipped and not exact then
          skipped_read = skipped_read + 1
        else
          buf[#buf + 1] = score
          buf[#buf + 1] = m
          buf[#buf + 1] = skipped
          got = got + 1
          if got >= n then return cur, off end
        end
      end
    end
    if jump then
      if jump > TOP then return nil end
      cur, off = jump, 0
    elseif #batch < 2 * fetch then
      return nil
    else
      fetch = math.min(2 * fetch, 1000)
    end
  end
end

local function merge(exact)
  -- The heap: hs[i] the score of the next candidate of shard number hx[i].
  local hs, hx, hn = {}, {}, 0
  local function sift(s, x)
    local i = 1
    while true do
      local c = 2 * i
      if c > hn then break end
      local cs, cx = hs[c], hx[c]
      if c < hn then
        local ds, dx = hs[c + 1], hx[c + 1]
        if ds < cs or (ds == cs and dx < cx) then c, cs, cx = c + 1, ds, dx end
      end
      if s < cs or (s == cs and x < cx) then break end
      hs[i], hx[i] = cs, cx
      i = c
    end
    hs[i], hx[i] = s, x
  end
  local bufs, pos, at, off = {}, {}, {}, {}
  for x = 1, #plan do
    local buf = {}
    at[x], off[x] = scan(x, 0, 0, ask, buf, exact)
    bufs[x], pos[x] = buf, 1
    if #buf > 0 then
      -- Shards come in order, so pushing is appending and sifting up.
      hn = hn + 1
      local i, s = hn, buf[1]
      while i > 1 do
        local p = math.floor(i / 2)
        if hs[p] < s or (hs[p] == s and hx[p] < x) then break end
        hs[i], hx[i] = hs[p], hx[p]
        i = p
      end
      hs[i], hx[i] = s, x
    end
  end
  local out = {}
  local count, taken = 0, 0
  while hn > 0 and (limit <= 0 or count < limit) and (take < 0 or taken < take) do
    local x = hx[1]
    local buf, i = bufs[x], pos[x]
    local score, m = buf[i], buf[i + 1]
    count = count + 1
    if buf[i + 2] then
      if form ~= 'r' then
        out[#out + 1] = score
        out[#out + 1] = m
        if form == 'm' then out[#out + 1] = false end
      end
    else
      taken = taken + 1
      if form == 'r' then
        out[#out + 1] = redis.call('HGET', keys[x] .. 'rows', string.sub(m, 10))
      else
        out[#out + 1] = score
        out[#out + 1] = m
        if form == 'm' then
          out[#out + 1] = redis.call('HGET', keys[x] .. 'rows', string.sub(m, 10))
        end
      end
    end
    i = i + 3
    if i > #buf and at[x] then
      buf = {}
      at[x], off[x] = scan(x, at[x], off[x], ask, buf, exact)
      bufs[x], i = buf, 1
    end
    pos[x] = i
    if i > #buf then
      local s, y = hs[hn], hx[hn]
      hs[hn], hx[hn] = nil, nil
      hn = hn - 1
      if hn > 0 then sift(s, y) end
    else
      sift(buf[i], x)
    end
  end
  return out, taken
end

local exact = form == 'm'
local out, taken = merge(exact)
if not exact and skipped_read > 0 and limit > 0 and taken + skipped_read > limit then
  out = merge(true)
end
return out
"""


# count_types: the grain types of one shard's grain ZSET and their row counts,
# by a skip scan: the first member at or after ``min`` names a type T; all of
# T's members lie in [T/, T0) ('0' follows '/', and no type name holds '/');
# count them there and jump to T0. One ZRANGEBYLEX and one ZLEXCOUNT per type.
_TYPES: Final = """
local out = {}
local min = '-'
while true do
  local m = redis.call('ZRANGEBYLEX', KEYS[1], min, '+', 'LIMIT', 0, 1)
  if #m == 0 then break end
  local slash = string.find(m[1], '/', 1, true)
  if not slash then break end
  local t = string.sub(m[1], 1, slash - 1)
  out[#out + 1] = t
  out[#out + 1] = redis.call('ZLEXCOUNT', KEYS[1], '[' .. t .. '/', '(' .. t .. '0')
  min = '[' .. t .. '0'
end
return out
"""

# read_grains: KEYS grain ZSET, rows HASH of one shard; ARGV the grains'
# prefixes ("grain|"). Returns per grain its member count n, then n records
# (nil for a member whose row went meanwhile). 0xff never occurs in UTF-8, so
# it bounds every member with the prefix.
_READ_GRAINS: Final = """
local out = {}
for i = 1, #ARGV do
  local p = ARGV[i]
  local keys = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. p, '(' .. p .. '\\255')
  out[#out + 1] = #keys
  if #keys > 0 then
    local raws = redis.call('HMGET', KEYS[2], unpack(keys))
    for j = 1, #raws do out[#out + 1] = raws[j] end
  end
end
return out
"""

#: Shards whose grain ZSETs one round trip of ``read_page`` asks at most, and
#: the members it may move beyond the page (each shard is asked for the whole
#: page, so a large page asks fewer shards at a time).
_PAGE_SHARDS: Final = 32
_PAGE_SPARE: Final = 4096


def _intervals(r: RingRange | None) -> list[tuple[int, int]]:
    """``r`` as inclusive intervals of hashes (``None``: the whole ring)."""
    return [(0, _TOP)] if r is None else r.intervals()


def _decode_row(raw: bytes | str) -> ReminderEntry:
    if isinstance(raw, str):
        raise StorageError(
            "the redis client decodes responses; create it with decode_responses=False"
        )
    try:
        return ReminderEntry.from_record(unpack(raw))
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed reminder row in redis: {exc}") from exc


def _decode_grain_row(raw: bytes | str, grain_id: GrainId) -> ReminderEntry | None:
    """``_decode_row`` of a row read for ``grain_id``; ``None`` when it is another
    grain's (a str key may hold '|', so a grain's prefix can match other rows)."""
    if isinstance(raw, str):
        return _decode_row(raw)
    try:
        rec = unpack(raw)
        if rec["g"] != grain_id.canonical:
            return None
        return ReminderEntry.from_record(rec, grain_id)
    except (SerializationError, KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"malformed reminder row in redis: {exc}") from exc


def _grain_rows(
    reply: Sequence[Any], at: int, grain_id: GrainId
) -> tuple[list[ReminderEntry], int]:
    """``grain_id``'s rows, by name, from a ``_READ_GRAINS*`` reply at ``at`` (a
    count, then that many rows), and where the next grain's part starts."""
    n = int(reply[at])
    rows = [
        r
        for raw in reply[at + 1 : at + 1 + n]
        if raw is not None and (r := _decode_grain_row(raw, grain_id)) is not None
    ]
    if len(rows) > 1:
        rows.sort(key=lambda row: row.name)
    return rows, at + 1 + n


class RedisReminderTable:
    """A ``ReminderTable`` (and ``BatchingReminderTable``) in Redis.

    ``url_or_client``: a URL (the table creates its client and closes it with the
    start stack) or a ``redis.asyncio.Redis`` client created with bytes responses
    (the table never closes it). ``shards`` is a power of two in 1..65536 and is
    fixed for the life of the stored table: ``start`` fails with
    ``StorageError`` if the stored table was created with another count.

    On Redis Cluster (a ``RedisCluster`` client, or a URL that names one) each
    shard is its own hash slot, so shards spread over the masters; reads that
    span shards go to every node concurrently, the per-tick batch scripts run
    once per node. ``options``: ``RedisOptions``; with ``wait_replicas`` every
    whole-row write (``upsert``, ``upsert_if``, ``upsert_many``) and ``remove``
    waits for that many replicas. Schedule CASes and history do not (a lost
    one is re-read: see docs/redis.md).
    """

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
        self._shift = 32 - (shards.bit_length() - 1)
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._source: Redis | None = None if isinstance(url_or_client, str) else url_or_client
        self._client: Client | None = None
        self._cluster = False
        self._options = options if options is not None and options.wait_replicas else None
        # Shared with the change feeds: a cluster feed that lost a node marks the
        # slot map stale, and the next subscription re-reads it first.
        self._topology = ClusterTopology()
        self._prefix = key_prefix(service_id)
        # What every shard key starts with (``_key``); the per-tick scripts
        # build their keys from it.
        self._shard_prefix = f"{self._prefix}rem:{{{service_id}:rem:"
        self._meta = f"{self._prefix}rem:meta"
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
        self._plans: dict[
            RingRange | None,
            tuple[list[tuple[int, list[tuple[int, int]]]], list[list[Any]], bytes],
        ] = {}
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
        self._cluster = is_cluster(client)
        # Pushed after the client's close, so it unwinds first: the change feeds
        # end before the client they read from is closed.
        stack.push_async_callback(self._close_subscriptions)
        with translate_errors("reminder table start"):
            pipe = client.pipeline(transaction=False)
            pipe.hsetnx(self._meta, "shards", str(self.shards))
            pipe.hget(self._meta, "shards")
            _, stored = await pipe.execute()
        stored_shards = None if stored is None else stored.decode()
        if stored_shards != str(self.shards):
            raise StorageError(
                f"reminder table of service {self.service_id!r} was created with "
                f"{stored_shards} shards but this table is configured with {self.shards}; "
                "configure the stored shard count (ReminderOptions.shards)"
            )
        for name, text in (
            ("upsert", _UPSERT),
            ("upsert_many", _UPSERT_MANY),
            ("upsert_many_shards", _UPSERT_MANY_SHARDS),
            ("upsert_if_many_shards", _UPSERT_IF_MANY_SHARDS),
            ("read_grains_shards", _READ_GRAINS_SHARDS),
            ("upsert_if_many", _UPSERT_IF_MANY),
            ("update_many", _UPDATE_MANY),
            ("remove", _REMOVE),
            ("read_due", _READ_DUE),
            ("read_merged", _READ_MERGED),
            ("history", _APPEND_HISTORY),
            ("types", _TYPES),
            ("read_grains", _READ_GRAINS),
        ):
            self._scripts[name] = client.register_script(text)

    @property
    def _c(self) -> Client:
        if self._client is None:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._client

    # -- keys -----------------------------------------------------------------------

    def shard_of(self, h: int) -> int:
        """The shard that holds rows of grain hash ``h``."""
        return h >> self._shift

    def _key(self, shard: int, kind: str) -> str:
        return f"{self._shard_prefix}{shard}}}:{kind}"

    def _channel(self, shard: int) -> str:
        return self._key(shard, "changes")

    @staticmethod
    def _member(h: int, key: str) -> str:
        return f"{h:08x}|{key}"

    # -- writes ---------------------------------------------------------------------

    async def upsert(self, entry: ReminderEntry) -> str:
        """Insert or replace the row unconditionally; returns its new etag."""
        etag = await self._upsert(entry, "", "reminder upsert")
        assert etag is not None
        return etag

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        """``upsert`` each entry, in order, in one pipelined round trip: on one
        Redis one script call for the whole batch (``_UPSERT_MANY_SHARDS``), on a
        cluster one per shard touched; the rows packed into one argument (the
        script is loaded first on the same connection, so NOSCRIPT cannot
        happen)."""
        if not entries:
            return []
        if not self._cluster:
            return await self._upsert_many_shards(entries)
        by_shard: dict[int, list[int]] = {}
        packed: list[list[Any]] = []
        shift = self._shift
        for i, entry in enumerate(entries):
            h = entry.grain_id.uniform_hash()
            shard = by_shard.get(h >> shift)
            if shard is None:
                by_shard[h >> shift] = [i]
            else:
                shard.append(i)
            record = entry.to_compact_record()
            key = f"{record['g']}|{record['n']}"
            row: list[Any] = [
                key,
                f"{h:08x}|{key}",
                lane_score(record["r"], record["d"]),
                record,
            ]
            if entry.paused:
                row.append(True)
            packed.append(row)
        replies = await self._write_rows("upsert_many", _UPSERT_MANY, by_shard, packed)
        return [str(etag.decode()) for etag in replies]

    def _encoded(self, entry: ReminderEntry) -> tuple[int, str, str, str, bytes, bytes, bool]:
        """A row as the ``*_SHARDS`` scripts take it: shard, key, due member,
        score, the record without its etag (``_record_without_etag``), the
        change message, paused."""
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
            h >> self._shift,
            key,
            f"{h:08x}|{key}",
            str(score),
            _record_without_etag(record),
            change,
            entry.paused,
        )

    async def _run_shards(self, name: str, text: str, routing: int, args: list[Any]) -> Any:
        """One call of a ``*_SHARDS`` script, routed by shard ``routing``'s key
        (one Redis: the script builds the other shards' keys)."""
        with translate_errors(f"reminder {name.removesuffix('_shards')}"):
            (reply,) = await run_script_calls(
                self._c,
                text,
                self._script(name).sha,
                [([self._key(routing, "rows")], args)],
                wait=self._options,
            )
        return reply

    async def _upsert_many_shards(self, entries: Sequence[ReminderEntry]) -> list[str]:
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
        flat: list[Any] = []
        for shard, group in groups.items():
            flat += (shard, len(order[shard]), *group)
        reply = await self._run_shards(
            "upsert_many_shards",
            _UPSERT_MANY_SHARDS,
            flat[0],
            [self._etag_suffix, self._shard_prefix, pack_lua(flat), self._writer],
        )
        out: list[str] = [""] * len(entries)
        etags = iter(reply)
        for indexes in order.values():
            for i in indexes:
                out[i] = str(next(etags).decode())
        return out

    async def _write_rows(
        self, name: str, text: str, by_shard: dict[int, list[int]], packed: list[list[Any]]
    ) -> list[Any]:
        """Run a whole-row batch script once per shard touched (``by_shard``: the
        indexes of ``packed`` rows in each shard), all in one pipelined round trip
        (per node on a cluster); the script's reply for each row, in ``packed``'s
        order."""
        calls = [
            (
                [self._key(s, k) for k in ("rows", "due", "grain", "etag")],
                [
                    self._etag_suffix,
                    self._channel(s),
                    pack([packed[i] for i in indexes]),
                    self._writer,
                ],
            )
            for s, indexes in by_shard.items()
        ]
        with translate_errors(f"reminder {name}"):
            replies = await run_script_calls(
                self._c, text, self._script(name).sha, calls, wait=self._options
            )
        out: list[Any] = [None] * len(packed)
        for indexes, reply in zip(by_shard.values(), replies, strict=True):
            for i, item in zip(indexes, reply, strict=True):
                out[i] = item
        return out

    async def upsert_if_many(
        self, writes: Sequence[tuple[ReminderEntry, str | None]]
    ) -> list[str | None]:
        """``upsert_if`` of each pair in one pipelined round trip: one script call
        per shard touched (``_UPSERT_IF_MANY``), its rows packed in one argument."""
        if not writes:
            return []
        if not self._cluster:
            flat: list[Any] = []
            for entry, etag in writes:
                flat += self._encoded(entry)
                flat.append("-" if etag is None else etag)
            replies = await self._run_shards(
                "upsert_if_many_shards",
                _UPSERT_IF_MANY_SHARDS,
                flat[0],
                [self._etag_suffix, self._shard_prefix, pack_lua(flat), self._writer],
            )
            return [None if etag is None else str(etag.decode()) for etag in replies]
        by_shard: dict[int, list[int]] = {}
        packed: list[list[Any]] = []
        for i, (entry, etag) in enumerate(writes):
            h = entry.grain_id.uniform_hash()
            by_shard.setdefault(h >> self._shift, []).append(i)
            record = entry.to_compact_record()
            key = f"{record['g']}|{record['n']}"
            score = lane_score(record["r"], record["d"])
            cond = "-" if etag is None else etag
            packed.append([key, f"{h:08x}|{key}", score, record, entry.paused, cond])
        replies = await self._write_rows("upsert_if_many", _UPSERT_IF_MANY, by_shard, packed)
        return [None if etag is None else str(etag.decode()) for etag in replies]

    async def read_grains(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        """``read_grain`` of each grain in one pipelined round trip: per shard
        touched, one script call (``_READ_GRAINS``) that scans each grain's lex
        prefix and fetches its rows."""
        if not grain_ids:
            return []
        if not self._cluster:
            return await self._read_grains_shards(grain_ids)
        by_shard: dict[int, list[int]] = {}
        for i, g in enumerate(grain_ids):
            by_shard.setdefault(self.shard_of(g.uniform_hash()), []).append(i)
        script = self._script("read_grains")
        calls = [
            (
                [self._key(s, "grain"), self._key(s, "rows")],
                [f"{grain_ids[i].canonical}|" for i in indexes],
            )
            for s, indexes in by_shard.items()
        ]
        with translate_errors("reminder read_grains"):
            replies = await run_script_calls(self._c, _READ_GRAINS, script.sha, calls)
        out: list[list[ReminderEntry]] = [[] for _ in grain_ids]
        for indexes, flat in zip(by_shard.values(), replies, strict=True):
            at = 0
            for i in indexes:
                out[i], at = _grain_rows(flat, at, grain_ids[i])
        return out

    async def _read_grains_shards(self, grain_ids: Sequence[GrainId]) -> list[list[ReminderEntry]]:
        shift = self._shift
        flat: list[Any] = []
        for g in grain_ids:
            flat += (g.uniform_hash() >> shift, f"{g.canonical}|")
        reply = await self._run_shards(
            "read_grains_shards",
            _READ_GRAINS_SHARDS,
            flat[0],
            [self._shard_prefix, pack_lua(flat)],
        )
        out: list[list[ReminderEntry]] = []
        at = 0
        for g in grain_ids:
            rows, at = _grain_rows(reply, at, g)
            out.append(rows)
        return out

    async def upsert_if(self, entry: ReminderEntry, expected_etag: str | None) -> str | None:
        """``upsert`` only if the row is absent (``expected_etag`` ``None``) or has
        ``expected_etag``; the new etag, or ``None`` when it did not hold."""
        condition = "-" if expected_etag is None else expected_etag
        return await self._upsert(entry, condition, "reminder upsert_if")

    async def _upsert(self, entry: ReminderEntry, condition: str, what: str) -> str | None:
        keys, args = self._upsert_call(entry, condition)
        with translate_errors(what):
            etag = await call_script(self._c, self._script("upsert"), keys, args, self._options)
        return None if etag is None else str(etag.decode())

    def _upsert_call(self, entry: ReminderEntry, condition: str) -> tuple[list[str], list[Any]]:
        h = entry.hash
        s = self.shard_of(h)
        key = entry.key
        due_ms = to_ms(entry.next_due)
        record = entry.to_compact_record()
        record.pop("e", None)  # the script sets the new one
        keys = [
            self._key(s, "rows"),
            self._key(s, "due"),
            self._key(s, "grain"),
            self._key(s, "etag"),
        ]
        if entry.paused:  # out of the schedule: published as a removal
            change = change_payload(self._writer, h, entry.grain_id, entry.name, None)
        else:
            change = change_payload(
                self._writer, h, entry.grain_id, entry.name, due_ms, priority=int(entry.priority)
            )
        args: list[Any] = [
            key,
            self._member(h, key),
            lane_score(int(entry.priority), due_ms),
            pack(record),
            self._etag_suffix,
            self._channel(s),
            change,
            condition,
        ]
        return keys, args

    async def update_schedule(
        self,
        grain_id: GrainId,
        name: str,
        etag: str,
        next_due: datetime,
        last_fire: datetime | None,
    ) -> str | None:
        """CAS on the etag: the new etag, or ``None`` if the row is gone or moved on."""
        update = ScheduleUpdate(grain_id, name, etag, next_due, last_fire)
        return (await self.update_schedule_many([update]))[0]

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
        shift = self._shift
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
                    "update_many", _UPDATE_MANY, flat, 6, [self._etag_suffix], tail=[writer, "1"]
                )
            else:
                results = await self._script("update_many")(
                    args=[self._etag_suffix, self._shard_prefix, pack_lua(flat), writer]
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
        (shard, key, n, then ``_HISTORY_FIELDS`` fields per record). The script's ARGV stay
        ``head + [shard prefix, packed items]``: the routing key is the one
        declared key, and the other shards' keys it builds are local to the node
        (a key whose slot moved meanwhile fails the call: unavailable, retried),
        then ``tail``.
        """
        items: list[tuple[int, int]] = []  # (start, end) of each item in flat
        i = 0
        while i < len(flat):
            end = i + (width if width is not None else 3 + _HISTORY_FIELDS * int(flat[i + 2]))
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
            calls.append(([routing], [*head, self._shard_prefix, pack_lua(sub), *tail]))
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
        shift = self._shift
        for key, recs in by_row.items():
            flat += (recs[0].grain_id.uniform_hash() >> shift, key, len(recs))
            for r in recs:
                flags = {k: v for k, v in r.to_record().items() if k in _HISTORY_FLAGS}
                flat += (to_ms(r.slot), to_ms(r.at), r.outcome.value, r.silo, flags or False)
        with translate_errors("reminder append_history"):
            if self._cluster:
                await self._per_node("history", _APPEND_HISTORY, flat, None, [keep])
            else:
                await self._script("history")(args=[keep, self._shard_prefix, pack_lua(flat)])

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
                ],
                [
                    key,
                    self._member(h, key),
                    etag,
                    self._channel(s),
                    change_payload(self._writer, h, grain_id, name, None),
                    *(() if history_ms is None else (history_ms,)),
                ],
                self._options,
            )
        return bool(done)

    # -- reads ----------------------------------------------------------------------

    async def read(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        s = self.shard_of(grain_id.uniform_hash())
        with translate_errors("reminder read"):
            raw = await self._c.hget(self._key(s, "rows"), row_key(grain_id, name))
        return None if raw is None else _decode_row(raw)

    async def read_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        """Every row of the grain in name order (a lex prefix scan of one shard)."""
        s = self.shard_of(grain_id.uniform_hash())
        prefix = f"{grain_id.canonical}|".encode()
        with translate_errors("reminder read_grain"):
            # 0xff never occurs in UTF-8, so it bounds every member with the prefix.
            keys = await self._c.zrangebylex(
                self._key(s, "grain"), b"[" + prefix, b"(" + prefix + b"\xff"
            )
            raws = await self._c.hmget(self._key(s, "rows"), keys) if keys else []
        rows = [_decode_row(raw) for raw in raws if raw is not None]
        # A str grain key may contain '|', so the prefix can also match another
        # grain's rows: keep only this grain's.
        rows = [row for row in rows if row.grain_id == grain_id]
        rows.sort(key=lambda row: row.name)
        return rows

    async def read_range(self, r: RingRange) -> list[ReminderEntry]:
        """Every row in ``r``, ordered by hash then key (reads whole shards: tools only)."""
        rows = await self._collect(r, LANE_WIDTH - 1, 0, "reminder read_range")
        rows.sort(key=lambda row: (row.hash, row.key))
        return rows

    async def read_due(self, r: RingRange, before: datetime, limit: int) -> list[ReminderEntry]:
        """Due rows of ``r`` in the due order (priority descending, then next_due;
        ties by hash, then key), at most ``limit``.

        One script call whatever the number of shards (one per node on a
        cluster): the shards' filtered index reads, merged in Redis, and the
        records of only the rows returned (``_collect``).
        """
        if limit <= 0:
            return []
        before_ms = to_ms(before)
        rows = await self._collect(r, before_ms, limit, "reminder read_due")
        return [row for row in rows if to_ms(row.next_due) <= before_ms]

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
        """``read_due`` less the rows whose key is in ``skip``: the index read is the
        same, but skipped members are dropped before the row fetch, so their
        records never leave Redis and are never decoded (a ``skip`` that is a
        ``Collection`` is listed once, at the call, and sent along, so the
        skipped members do not leave Redis either; see ``_collect``). With
        ``after`` the read script starts each lane's scan past it, so earlier
        members are not read. With ``take`` only the first ``take`` members not
        skipped are fetched."""
        if limit <= 0:
            return []
        before_ms = to_ms(before)
        after_ms = -1 if after is None else to_ms(after)
        rows = await self._collect(
            r, before_ms, limit, "reminder read_due", skip, after_ms=after_ms, take=take
        )
        return [row for row in rows if after_ms < to_ms(row.next_due) <= before_ms]

    async def upcoming(self, before: datetime, limit: int) -> list[ReminderEntry]:
        """``read_due`` over the whole ring."""
        if limit <= 0:
            return []
        before_ms = to_ms(before)
        rows = await self._collect(None, before_ms, limit, "reminder upcoming")
        return [row for row in rows if to_ms(row.next_due) <= before_ms]

    async def count(self) -> int:
        """Sum of the shards' row counts (one pipelined round trip)."""
        with translate_errors("reminder count"):
            pipe = self._c.pipeline(transaction=False)
            for s in range(self.shards):
                pipe.hlen(self._key(s, "rows"))
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
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        prefix = grain_prefix(type_name, key_prefix).encode()
        shard, last = 0, b""
        if cursor is not None:
            head, sep, tail = cursor.partition("|")
            if not sep or not head.isdigit() or int(head) >= self.shards:
                raise ValueError(f"not a page cursor of this table: {cursor!r}")
            shard, last = int(head), tail.encode()
        # 0xff never occurs in UTF-8, so it bounds every member with the prefix.
        top = b"(" + prefix + b"\xff" if prefix else b"+"
        taken: list[tuple[int, list[bytes]]] = []
        need = limit
        with translate_errors("reminder read_page"):
            while need and shard < self.shards:
                fan_out = max(1, min(_PAGE_SHARDS, _PAGE_SPARE // need))
                batch = range(shard, min(shard + fan_out, self.shards))
                pipe = self._c.pipeline(transaction=False)
                for s in batch:
                    low = b"(" + last if s == shard and last else b"[" + prefix
                    if low == b"[":
                        low = b"-"
                    pipe.zrangebylex(self._key(s, "grain"), low, top, start=0, num=need)
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
            pipe = self._c.pipeline(transaction=False)
            for s, members in taken:
                pipe.hmget(self._key(s, "rows"), members)
            raws = await pipe.execute() if taken else []
        want = prefix.decode()
        rows = [
            row
            for chunk in raws
            for raw in chunk
            if raw is not None and (row := _decode_row(raw)).grain_id.canonical.startswith(want)
        ]
        if shard >= self.shards:
            return rows, None
        return rows, f"{shard}|{last.decode()}" if last else f"{shard}|"

    async def count_types(self) -> dict[str, int]:
        """Per shard, a skip scan of its grain ZSET (``_TYPES``), all shards in one
        pipelined round trip: the cost follows shards x types, never rows."""
        script = self._script("types")
        calls: list[tuple[list[str], list[Any]]] = [
            ([self._key(s, "grain")], []) for s in range(self.shards)
        ]
        with translate_errors("reminder count_types"):
            answers = await run_script_calls(self._c, _TYPES, script.sha, calls)
        counts: dict[str, int] = {}
        for flat in answers:
            for i in range(0, len(flat), 2):
                t = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
                counts[t] = counts.get(t, 0) + int(flat[i + 1])
        return counts

    def _plan(self, r: RingRange | None) -> list[tuple[int, list[tuple[int, int]]]]:
        """The shards overlapping ``r``, each with ``r``'s part of it as intervals."""
        plan: dict[int, list[tuple[int, int]]] = {}
        for a, b in _intervals(r):
            for s in range(a >> self._shift, (b >> self._shift) + 1):
                lo = max(a, s << self._shift)
                hi = min(b, ((s + 1) << self._shift) - 1)
                plan.setdefault(s, []).append((lo, hi))
        return sorted(plan.items())

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

        With a limit, one script call (``_READ_MERGED``) per node merges the
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
        groups = await node_groups(self._c, [self._key(s, "due") for s, _ in plan])
        form = ("r" if len(groups) == 1 else "m") if remote else "k"
        ask = min(limit, max(_MIN_FIRST_ASK, -(-2 * limit // len(plan))))
        skipped = pack_lua(list(cast(Collection[str], skip)) if remote and skip else [])
        head = [self._shard_prefix, before_ms, after_ms, limit]
        tail = [-1 if take is None or not remote else take, ask, form, skipped]
        calls = [
            (
                [self._key(plan[members[0]][0], "due")],
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
                replies = await run_script_calls(self._c, _READ_MERGED, script.sha, calls)
        if form == "r":
            return [_decode_row(raw) for raw in replies[0] if raw is not None]
        # Across nodes (or skipping here): merge the candidates by (score, member),
        # the index's order, then cut at the limit and take.
        width = 3 if form == "m" else 2
        candidates = sorted(
            (int(flat[i]), flat[i + 1], flat[i + 2] if width == 3 else None)
            for flat in replies
            for i in range(0, len(flat), width)
        )
        left = len(candidates) if take is None else take
        rows: list[ReminderEntry] = []
        wanted: list[tuple[int, bytes]] = []
        for _, member, raw in candidates[:limit]:
            if left <= 0:
                break
            if form == "m":
                if raw is not None:  # None: skipped (or gone)
                    rows.append(_decode_row(raw))
                    left -= 1
            elif not (skip and member[9:].decode() in skip):
                wanted.append((self.shard_of(int(member[:8], 16)), member))
                left -= 1
        return rows if form == "m" else await self._fetch(wanted, what)

    def _merged_plan(
        self, r: RingRange | None
    ) -> tuple[list[tuple[int, list[tuple[int, int]]]], list[list[Any]], bytes]:
        """``_plan(r)``, its shards in ``_READ_MERGED``'s form (``[shard]`` for a
        whole shard, else ``[shard, lo, hi, ...]`` in 8 hex digits) and those
        packed. Kept per range: a silo reads the same few ranges at every refill,
        and building them cost a tenth of a refill."""
        cached = self._plans.get(r)
        if cached is None:
            plan = self._plan(r)
            span = 1 << self._shift
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
            pipe = self._c.pipeline(transaction=False)
            for s, indexes in by_shard.items():
                pipe.hmget(self._key(s, "rows"), [members[i][1][9:] for i in indexes])
            fetched = await pipe.execute()
        raws: list[bytes | None] = [None] * len(members)
        for indexes, got in zip(by_shard.values(), fetched, strict=True):
            for i, raw in zip(indexes, got, strict=True):
                raws[i] = raw
        return [_decode_row(raw) for raw in raws if raw is not None]

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
        trip of ``_READ_DUE`` calls."""
        script = self._script("read_due")
        top = 256 * LANE_WIDTH - 1
        calls = [
            (
                [self._key(s, "due")],
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
            replies = await run_script_calls(self._c, _READ_DUE, script.sha, calls)
        return [[flat[i] for i in range(0, len(flat), 2)] for flat in replies]

    def _script(self, name: str) -> Any:
        if not self._scripts:
            raise RuntimeError("RedisReminderTable used before start()")
        return self._scripts[name]

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
        ``scope.ranges`` (re-subscribing within ``_redis_feed.FEED_POLL_S`` of a
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
        return {self._channel(s) for s in self._shards_of(ranges)}

    def _shards_of(self, ranges: Iterable[RingRange] | None) -> set[int]:
        if ranges is None:
            return set(range(self.shards))
        return {
            s
            for r in ranges
            for a, b in _intervals(r)
            for s in range(a >> self._shift, (b >> self._shift) + 1)
        }

    async def _close_subscriptions(self) -> None:
        for sub in list(self._subscriptions):
            await sub.aclose()
        await self._topology.close()
