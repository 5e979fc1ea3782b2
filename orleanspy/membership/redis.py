"""``RedisMembershipTable``: the membership table of a cluster, in one Redis HASH.

Layout (docs/architecture.md, section 4): the key
``orleanspy:<service_id>:cluster:{<service_id>:<cluster_id>}:members`` holds one
field per silo (``str(silo)`` -> msgpack map of the row, its etag under
``"e"``) and the field ``version`` (msgpack ``[number, etag]``). The braces are
a Redis Cluster hash tag; all writes touch this single key anyway.

Every write is a Lua script, so the checks and the write are one atomic step.
The scripts decode rows with Redis' built-in ``cmsgpack``; rows therefore never
hold nil (``MembershipEntry.to_record`` omits unset fields). Etags are the
decimal table version at which a row was written: unique, since the number
only grows.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import AsyncExitStack
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from orleanspy._redis import (
    Client,
    Redis,
    call_script,
    connect,
    key_prefix,
    resolve,
    translate_errors,
)
from orleanspy._redis_schema import adopt, migrate
from orleanspy.clock import to_ms
from orleanspy.errors import StorageError
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import (
    INITIAL_VERSION,
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
    TableVersion,
)
from orleanspy.schema import SchemaVersion
from orleanspy.serialization import pack, unpack

if TYPE_CHECKING:
    from orleanspy.options import RedisOptions

__all__ = ["RedisMembershipTable"]

_VERSION_FIELD = b"version"

#: The schema steps of this layout (``orleanspy._redis_schema``).
SCHEMA_STEPS = (adopt(),)

# KEYS[1] the hash. ARGV: mode ("insert"|"update"), silo field, row (msgpack map
# without etag), expected row etag, expected version etag, new version number.
# Returns 1 written, 0 lost race, -1 version number not above the stored one.
_WRITE = """
local key = KEYS[1]
local row = redis.call('HGET', key, ARGV[2])
if ARGV[1] == 'insert' then
  if row then return 0 end
else
  if not row then return 0 end
  if cmsgpack.unpack(row)['e'] ~= ARGV[4] then return 0 end
end
local cur_number, cur_etag = 0, ''
local v = redis.call('HGET', key, 'version')
if v then
  local t = cmsgpack.unpack(v)
  cur_number, cur_etag = t[1], t[2]
end
if cur_etag ~= ARGV[5] then return 0 end
local number = tonumber(ARGV[6])
if number <= cur_number then return -1 end
local etag = ARGV[6]
local rec = cmsgpack.unpack(ARGV[3])
rec['e'] = etag
redis.call('HSET', key, ARGV[2], cmsgpack.pack(rec), 'version', cmsgpack.pack({number, etag}))
return 1
"""

# KEYS[1] the hash. ARGV: silo field, i_am_alive ms. Leaves etags and version alone.
_I_AM_ALIVE = """
local row = redis.call('HGET', KEYS[1], ARGV[1])
if not row then return 0 end
local rec = cmsgpack.unpack(row)
rec['ia'] = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(rec))
return 1
"""

# KEYS[1] the hash. ARGV: cutoff ms, the Dead status number. Returns the count deleted.
_DELETE_DEAD = """
local all = redis.call('HGETALL', KEYS[1])
local cutoff, dead = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for i = 1, #all, 2 do
  if all[i] ~= 'version' then
    local rec = cmsgpack.unpack(all[i + 1])
    if rec['s'] == dead and rec['ia'] < cutoff then
      redis.call('HDEL', KEYS[1], all[i])
      n = n + 1
    end
  end
end
return n
"""


class RedisMembershipTable:
    schema = SchemaVersion("redis", "membership", len(SCHEMA_STEPS))
    """A ``MembershipTable`` in Redis.

    ``url_or_client``: a URL (the table opens its own client in ``start`` and
    closes it when the stack unwinds) or a ``redis.asyncio.Redis`` client (used
    as is, never closed here; responses must be bytes, i.e. no
    ``decode_responses``). On Redis Cluster the table is one key, so one slot
    (with this cluster's directory shards spread elsewhere). ``options``:
    ``RedisOptions``; with ``wait_replicas`` every row insert and update waits
    for that many replicas (heartbeats do not).
    """

    def __init__(
        self,
        url_or_client: str | Redis,
        *,
        cluster_id: str,
        service_id: str,
        options: RedisOptions | None = None,
    ) -> None:
        for what, value in (("cluster_id", cluster_id), ("service_id", service_id)):
            if not value or any(c in value for c in "{}:|"):
                raise ValueError(f"{what} must be non-empty without '{{', '}}', ':', '|'")
        self._source = url_or_client
        self._client: Client | None = None
        self._options = options
        self.key = f"{key_prefix(service_id)}cluster:{{{service_id}:{cluster_id}}}:members"
        self._write_script: Any = None
        self._alive_script: Any = None
        self._delete_script: Any = None

    async def start(self, stack: AsyncExitStack) -> None:
        if self._client is not None:
            raise RuntimeError("RedisMembershipTable.start() was already called")
        if isinstance(self._source, str):
            source = connect(self._source)
            stack.push_async_callback(source.aclose)
        else:
            source = self._source
        with translate_errors("membership start"):
            client = await resolve(source)
        self.migration = await migrate(client, "membership", SCHEMA_STEPS)
        self._client = client
        self._write_script = client.register_script(_WRITE)
        self._alive_script = client.register_script(_I_AM_ALIVE)
        self._delete_script = client.register_script(_DELETE_DEAD)

    @property
    def _redis(self) -> Client:
        if self._client is None:
            raise RuntimeError("RedisMembershipTable used before start()")
        return self._client

    async def read_all(self) -> MembershipSnapshot:
        with translate_errors("membership read_all"):
            raw = await cast(Awaitable[dict[bytes, bytes]], self._redis.hgetall(self.key))
        version = INITIAL_VERSION
        rows: dict[SiloAddress, tuple[MembershipEntry, str]] = {}
        try:
            for name, value in raw.items():
                if name == _VERSION_FIELD:
                    number, etag = unpack(value)
                    version = TableVersion(int(number), str(etag))
                    continue
                rec = unpack(value)
                entry = MembershipEntry.from_record(rec)
                rows[entry.silo] = (entry, str(rec["e"]))
        except (KeyError, ValueError, TypeError) as exc:
            raise StorageError(f"malformed membership row in {self.key}: {exc}") from exc
        return MembershipSnapshot(rows, version)

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        return await self._write("insert", entry, "", version)

    async def update_row(self, entry: MembershipEntry, etag: str, version: TableVersion) -> bool:
        return await self._write("update", entry, etag, version)

    async def update_i_am_alive(self, silo: SiloAddress, at: datetime) -> None:
        with translate_errors("membership update_i_am_alive"):
            await self._alive_script(keys=[self.key], args=[str(silo), to_ms(at)])

    async def delete_dead_before(self, cutoff: datetime) -> int:
        with translate_errors("membership delete_dead_before"):
            n = await self._delete_script(
                keys=[self.key], args=[to_ms(cutoff), int(SiloStatus.DEAD)]
            )
        return int(n)

    async def _write(
        self, mode: str, entry: MembershipEntry, etag: str, version: TableVersion
    ) -> bool:
        args = [mode, str(entry.silo), pack(entry.to_record()), etag, version.etag, version.version]
        with translate_errors(f"membership {mode}_row"):
            result = int(
                await call_script(self._redis, self._write_script, [self.key], args, self._options)
            )
        if result < 0:
            raise ValueError(
                f"table version {version.version} is not above the stored one: "
                "pass snapshot.version.next()"
            )
        return result == 1
