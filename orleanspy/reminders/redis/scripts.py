"""The Lua scripts of ``RedisReminderTable``: one copy of each, named in ``SCRIPTS``.

Every script works on the layout of ``table`` (its module docstring). The
whole-row batch scripts (``UPSERT_MANY``, ``UPSERT_IF_MANY``, ``READ_GRAINS``)
take their rows grouped by shard and build each shard's keys from the shard
key prefix, so one script serves both stores: on one Redis a batch is one call
whatever the shards it spans; on a Redis Cluster it is one call per shard,
whose declared keys are that shard's (Redis then redirects a call whose slot
moved before it runs, so a call never writes part of a shard). The single-row
writes are those scripts with one row. The due score's lane width is
``layout.LANE_WIDTH``, given to the scripts that score rows as ``W``
(``LUA_LANES``).
"""

from __future__ import annotations

from typing import Final

from orleanspy.reminders.counters import COUNT_CODES
from orleanspy.reminders.redis.layout import LANE_WIDTH

__all__ = [
    "ADD_COUNTS",
    "ADD_DEAD_LETTERS",
    "APPEND_HISTORY",
    "COUNT_FIELDS",
    "HISTORY_FIELDS",
    "READ_DEAD_LETTERS",
    "READ_DUE",
    "READ_GRAINS",
    "READ_MERGED",
    "REMOVE",
    "SCRIPTS",
    "SEARCH_DUE",
    "TYPES",
    "UPDATE_MANY",
    "UPSERT_IF_MANY",
    "UPSERT_MANY",
]

#: The lane width of the due score (``layout.lane_score``), as Lua: ``W``.
LUA_LANES: Final = f"local W = {LANE_WIDTH}\n"

#: ``reindex(shard, key, terms)``: the label index of row ``key`` of ``shard``
#: (its key prefix ``...}:``) made ``terms`` (a Lua list, maybe empty). The
#: shard's ``terms`` HASH keeps each indexed row's terms (msgpack), so a rewrite
#: or a removal finds the entries to drop without decoding the row; ``ix:<term>``
#: is a ZSET of the rows carrying the term, all scores 0 (pages walk it by lex).
#: Both carry the shard's hash tag. A row without terms costs one HGET.
LUA_REINDEX: Final = """
local function reindex(shard, key, terms)
  local tk = shard .. 'terms'
  local old = redis.call('HGET', tk, key)
  if old then
    for _, t in ipairs(cmsgpack.unpack(old)) do redis.call('ZREM', shard .. 'ix:' .. t, key) end
  end
  if #terms > 0 then
    for _, t in ipairs(terms) do redis.call('ZADD', shard .. 'ix:' .. t, 0, key) end
    redis.call('HSET', tk, key, cmsgpack.pack(terms))
  elseif old then
    redis.call('HDEL', tk, key)
  end
end
"""

# Whole-row upserts of many shards in one call. KEYS: on one Redis the first
# shard's rows key (it routes the call; the script builds every key it writes
# from the prefix); on a Redis Cluster a call holds one shard's rows and names
# its rows, due, grain and etag keys, so that Redis redirects the whole call
# before it runs when the slot has moved. ARGV[1]: etag suffix. ARGV[2]: shard
# key prefix (``ShardKeys.key``). ARGV[3]: msgpack flat list of shard groups,
# each the shard, its row count, then seven items per row: key, due member,
# score (decimal text), the record, the change message, paused, and the row's
# label index terms (a list; ``LUA_REINDEX``). The record
# comes encoded, as a msgpack map whose header counts one entry more than
# follows: the script appends that entry, "e" and the row's new etag, so Redis
# neither decodes nor re-encodes a row (``layout.record_without_etag``). The
# change message is ``feed.change_payload``'s. A shard's etags come from one
# INCRBY and its rows are written with one HSET and one ZADD per index (in
# slices of at most 500 rows: Lua's unpack has a stack limit). A paused row's
# ZREM first flushes the due ZADDs queued before it, so a row twice in a batch
# ends as its last write. Returns the etags in order. One call per batch (per
# shard on a cluster), where one per shard on one Redis cost the client a
# command to encode and Redis a script run for a few rows each.
UPSERT_MANY: Final = (
    LUA_REINDEX
    + """
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
    reindex(shard, key, rows[i + 6])
    if #hset >= 1000 then flush() end
    n = n + 1
    out[n] = etag
    i = i + 7
  end
  flush()
end
return out
"""
)

# Conditional whole-row upserts, ``upsert_if`` of each row (``upsert`` too:
# the condition ''). KEYS as for ``UPSERT_MANY`` (one Redis: a routing key; a
# cluster: one shard's rows, due, grain and etag keys). ARGV as for
# ``UPSERT_MANY``, the rows encoded as there but not grouped: nine items per
# row, shard, key, due member, score, record, change message, paused, terms,
# condition ('': none, '-': only if absent, else the etag the row must have).
# Returns per row the new etag, or false where the condition did not hold
# (nothing written or published).
UPSERT_IF_MANY: Final = (
    LUA_REINDEX
    + """
local prefix = ARGV[2]
local rows = cmsgpack.unpack(ARGV[3])
local e = cmsgpack.pack('e')
local out = {}
local n = 0
for i = 1, #rows, 9 do
  local shard = prefix .. rows[i] .. '}:'
  local hash = shard .. 'rows'
  local key = rows[i + 1]
  local cond = rows[i + 8]
  local raw = cond ~= '' and redis.call('HGET', hash, key)
  local ok
  if cond == '' then
    ok = true
  elseif cond == '-' then
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
    reindex(shard, key, rows[i + 7])
    out[n] = etag
  else
    out[n] = false
  end
end
return out
"""
)

# The rows of many grains in one call. KEYS: a routing key (one Redis), or one
# shard's grain and rows keys (a cluster: a call per shard). ARGV[1]: shard key
# prefix; ARGV[2]: msgpack flat list, per grain its shard and prefix ("grain|").
# Returns per grain its member count n, then n records (nil for a member whose
# row went meanwhile), for the grains in order. 0xff never occurs in UTF-8, so
# it bounds every member with the prefix.
READ_GRAINS: Final = """
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

# The two per-tick scripts (the batched schedule CAS and the history append)
# name their keys in the arguments rather than in KEYS: each batch spans many
# shards, and redis-py's packing of one argument per key was the largest client
# cost of a tick. ARGV[2] is the shard key prefix ``P rem:{<service_id>:rem:``;
# a shard's key of kind K is ``prefix .. shard .. '}:' .. K`` (``ShardKeys.key``).
# On one Redis a batch is one call; on a Redis Cluster one call per node, over
# that node's shards (``RedisReminderTable._per_node``).

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
UPDATE_MANY: Final = (
    LUA_LANES
    + """
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
        local score = (127 - rec['r']) * W + u[i + 4]
        redis.call('ZADD', shard .. 'due', string.format('%.0f', score), u[i + 2])
      end
    end
  end
  out[#out + 1] = result
end
return out
"""
)

# A whole batch of fire records in one call. ARGV[1]: keep. ARGV[2]: shard key
# prefix. ARGV[3]: msgpack flat list, per row: its shard, its key, how many
# records follow, then ``HISTORY_FIELDS`` items per record, oldest first: slot
# ms, delivery ms, outcome, silo, and false or a map of the record's optional
# fields (``FireRecord.to_record``'s "x", "m", "n", "f", "b"). The record map is
# built here (``FireRecord.to_record``'s form), so the client packs one string
# per batch, not one per record. Records of a missing row are dropped.
#: Items per fire record in ``append_history``'s packed list (``APPEND_HISTORY``).
HISTORY_FIELDS: Final = 5

APPEND_HISTORY: Final = """
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

# KEYS: rows, due, grain, history, counters. ARGV: key, due member, expected
# etag, channel, payload, how many ms the history list stays (``end``; '': it is
# deleted), and the shard key prefix ``...}:`` (the row's label index entries go
# with it). The row's counters go with it either way.
REMOVE: Final = (
    LUA_REINDEX
    + """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local rec = cmsgpack.unpack(raw)
if rec['e'] ~= ARGV[3] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[6] ~= '' then redis.call('PEXPIRE', KEYS[4], ARGV[6]) else redis.call('DEL', KEYS[4]) end
if KEYS[5] then redis.call('DEL', KEYS[5]) end
reindex(ARGV[7], ARGV[1], {})
redis.call('SPUBLISH', ARGV[4], ARGV[5])
return 1
"""
)

#: Items per row in ``add_counts``' packed list (``ADD_COUNTS``).
COUNT_FIELDS: Final = 5

# Counter deltas of many rows in one call (``CountingReminderTable``). ARGV[1]:
# shard key prefix. ARGV[2]: msgpack flat list, ``COUNT_FIELDS`` items per row:
# its shard, its key, the counts (an array in ``counters.COUNTS`` order), the
# last error or false, its time (ms) or false. A row's counters are a hash
# beside its history, ``cnt:<key>``, one field per counter code (``c``), ``e``
# and ``t`` for the last error; deltas of a missing row are dropped. Returns per
# row 1 if it exists (counted), else 0.
ADD_COUNTS: Final = (
    "local codes = {"
    + ", ".join(f"'{c}'" for c in COUNT_CODES)
    + """}
local prefix = ARGV[1]
local u = cmsgpack.unpack(ARGV[2])
local out = {}
for i = 1, #u, 5 do
  local shard = prefix .. u[i] .. '}:'
  out[#out + 1] = redis.call('HEXISTS', shard .. 'rows', u[i + 1])
  if out[#out] == 1 then
    local key = shard .. 'cnt:' .. u[i + 1]
    local counts = u[i + 2]
    for j = 1, #codes do
      if counts[j] ~= 0 then redis.call('HINCRBY', key, codes[j], counts[j]) end
    end
    if u[i + 3] then redis.call('HSET', key, 'e', u[i + 3], 't', u[i + 4]) end
  end
end
return out
"""
)

# Dead letters (``DeadLetterTable``). KEYS: the service's letters hash (id ->
# record) and its time index (ZSET id -> ms dead-lettered), one hash tag. ARGV[1]:
# keep, ARGV[2]: expire before (ms), then per letter its id, its time (ms) and
# its record. Letters are written, then those before the expiry and all but the
# newest ``keep`` (the lowest in the index: time, then id, ascending) removed.
ADD_DEAD_LETTERS: Final = """
local keep = tonumber(ARGV[1])
for i = 3, #ARGV, 3 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i])
end
local function drop(ids)
  for j = 1, #ids, 500 do
    redis.call('HDEL', KEYS[1], unpack(ids, j, math.min(j + 499, #ids)))
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
if #old > 0 then
  drop(old)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
end
local over = redis.call('ZCARD', KEYS[2]) - keep
if over > 0 then
  drop(redis.call('ZRANGE', KEYS[2], 0, over - 1))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
return 1
"""

# A page of dead letters, newest first. KEYS as for ``ADD_DEAD_LETTERS``. ARGV:
# the cursor's time ('+inf': from the newest) and id ('': none), the limit, the
# grain id and the reminder name to keep ('': any). Walks the index from the
# cursor down, skipping letters at the cursor's time whose id is not below the
# cursor's (ties are in id order), and reads each record, decoding it only when
# a filter asks. Returns the records and whether more follow. A filter costs a
# walk over the letters it does not keep (bounded: the service keeps at most
# ``max_dead_letters``).
READ_DEAD_LETTERS: Final = """
local top = ARGV[1]
local cid = ARGV[2]
local limit = tonumber(ARGV[3])
local grain, name = ARGV[4], ARGV[5]
local cat = tonumber(top)
local out = {}
local offset = 0
while true do
  local batch = redis.call('ZREVRANGEBYSCORE', KEYS[2], top, '-inf', 'WITHSCORES',
                           'LIMIT', offset, 200)
  if #batch == 0 then return {out, 0} end
  for i = 1, #batch, 2 do
    local id = batch[i]
    if not (cid ~= '' and tonumber(batch[i + 1]) == cat and id >= cid) then
      local raw = redis.call('HGET', KEYS[1], id)
      if raw then
        local keep = true
        if grain ~= '' or name ~= '' then
          local rec = cmsgpack.unpack(raw)
          keep = (grain == '' or rec['g'] == grain) and (name == '' or rec['n'] == name)
        end
        if keep then
          if #out >= limit then return {out, 1} end
          out[#out + 1] = raw
        end
      end
    end
  end
  offset = offset + 200
end
"""

# KEYS: due. ARGV: min score, max score, before (next_due ms), limit (0 = all),
# page, after (next_due ms, exclusive; -1: none), then inclusive hash intervals
# as pairs of 8-hex-digit bounds. Returns [member, score, ...] of members with
# min <= score <= max, after < next_due <= before, inside the intervals, in
# score order (the due order). Lanes are visited in
# order; an empty stretch between lanes costs one ZRANGEBYSCORE LIMIT 0 1.
# Fixed-width lowercase hex compares as strings in numeric order.
READ_DUE: Final = (
    LUA_LANES
    + """
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
)


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
READ_MERGED: Final = (
    LUA_LANES
    + """
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
)


# count_types: the grain types of one shard's grain ZSET and their row counts,
# by a skip scan: the first member at or after ``min`` names a type T; all of
# T's members lie in [T/, T0) ('0' follows '/', and no type name holds '/');
# count them there and jump to T0. One ZRANGEBYLEX and one ZLEXCOUNT per type.
TYPES: Final = """
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


# search_due: the dashboard's search in next-due order (``dashboard._reminder_reads``).
# KEYS: the first shard's due ZSET (it routes the call; on one Redis the script
# reads every shard named, building their keys from the prefix; on a Redis
# Cluster a call names one shard). ARGV: the shard key prefix, the cursor's due
# time (ms; -1: from the start), how many members due after it to return per
# lane of each shard, the lanes to read (lowest and highest, ``127 -
# priority``), the most members due at the cursor's time itself to return per
# lane, then the shard numbers. Per shard and lane in use (found by one
# ZRANGEBYSCORE LIMIT 0 1 per lane, as READ_DUE hops), returns flat quadruples
# (shard, lane, due ms, member): first every member due at the cursor's time (a
# tie, ordered by key in the caller), then those due after it, in due order.
SEARCH_DUE: Final = (
    LUA_LANES
    + """
local prefix = ARGV[1]
local c = tonumber(ARGV[2])
local ask = tonumber(ARGV[3])
local first = tonumber(ARGV[4])
local last = tonumber(ARGV[5])
local cap = tonumber(ARGV[6])
local out = {}
for a = 7, #ARGV do
  local shard = tonumber(ARGV[a])
  local key = prefix .. ARGV[a] .. '}:due'
  local lane = first
  while lane <= last do
    local head = redis.call('ZRANGEBYSCORE', key, string.format('%.0f', lane * W),
                            string.format('%.0f', (last + 1) * W - 1), 'WITHSCORES', 'LIMIT', 0, 1)
    if #head == 0 then break end
    lane = math.floor(tonumber(head[2]) / W)
    local base = lane * W
    local low = string.format('%.0f', base)
    if c >= 0 then
      low = string.format('%.0f', base + c)
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, low, low, 'LIMIT', 0, cap)) do
        out[#out + 1] = shard
        out[#out + 1] = lane
        out[#out + 1] = c
        out[#out + 1] = m
      end
      low = '(' .. low
    end
    local after = redis.call('ZRANGEBYSCORE', key, low, string.format('%.0f', base + W - 1),
                             'WITHSCORES', 'LIMIT', 0, ask)
    for i = 1, #after, 2 do
      out[#out + 1] = shard
      out[#out + 1] = lane
      out[#out + 1] = tonumber(after[i + 1]) - base
      out[#out + 1] = after[i]
    end
    lane = lane + 1
  end
end
return out
"""
)


#: Every script by the name the table registers it under.
SCRIPTS: Final = {
    "counts": ADD_COUNTS,
    "dead_letters": ADD_DEAD_LETTERS,
    "read_dead_letters": READ_DEAD_LETTERS,
    "upsert_many": UPSERT_MANY,
    "upsert_if_many": UPSERT_IF_MANY,
    "read_grains": READ_GRAINS,
    "update_many": UPDATE_MANY,
    "history": APPEND_HISTORY,
    "remove": REMOVE,
    "read_due": READ_DUE,
    "read_merged": READ_MERGED,
    "types": TYPES,
    "search_due": SEARCH_DUE,
}
