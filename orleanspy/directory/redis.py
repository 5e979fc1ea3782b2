"""The Redis grain directory: first writer wins, one Lua script per write.

Layout (``S`` = ``shards``, default 256), one HASH per shard ``s``::

    orleanspy:<service_id>:dir:{<service_id>:<cluster_id>:dir:<s>}
        grain canonical -> msgpack [silo, activation_id]

Activations belong to one cluster, so the cluster id is part of the key: two
clusters of one service (a blue/green deployment) keep separate directories.

A grain's shard ``s`` is the top bits of its uniform hash (``h * S >> 32``, which
is exactly the top ``log2 S`` bits when ``S`` is a power of two). Each shard key
is its own Redis Cluster hash tag, and every script touches one key, so the
layout runs unchanged on Redis Cluster.

``register`` is a script "set if absent, else return the winner" and
``unregister`` a compare-and-delete on the stored bytes, so both are atomic.
``unregister_silo`` does nothing and returns ``0``: finding a silo's entries
would mean scanning every shard. Entries of dead silos are cleared when a
caller meets one (``unregister(grain, dead_address)``, then ``register``).
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

from orleanspy._redis import (
    Client,
    Redis,
    connect,
    key_prefix,
    resolve,
    retry_failover,
    translate_errors,
)
from orleanspy._redis_schema import adopt, migrate
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import ConfigurationError, StorageError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.schema import SchemaVersion
from orleanspy.serialization import pack, unpack

__all__ = ["RedisGrainDirectory"]

_REGISTER = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
    return current
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return false
"""

_UNREGISTER = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
    redis.call('HDEL', KEYS[1], ARGV[1])
    return 1
end
return 0
"""

_MAX_SHARDS = 1 << 16
_MAX_IN_FLIGHT = 64


def _encode(address: ActivationAddress) -> bytes:
    return pack([str(address.silo), address.activation_id])


def _decode(data: bytes | str) -> ActivationAddress:
    if not isinstance(data, bytes):
        raise StorageError(
            "the redis client decodes responses; give one with decode_responses=False"
        )
    try:
        silo, activation_id = unpack(data)
        return ActivationAddress(SiloAddress.parse(silo), activation_id)
    except (ValueError, TypeError) as exc:
        raise StorageError(f"malformed grain directory entry {data!r}: {exc}") from exc


#: The schema steps of this layout (``orleanspy._redis_schema``).
SCHEMA_STEPS = (adopt(),)


class RedisGrainDirectory:
    """A ``GrainDirectory`` in Redis, shared by every silo of a service.

    ``url_or_client``: a URL (the directory creates its client in ``start`` and
    closes it when the stack unwinds) or a ``redis.asyncio.Redis`` client (used
    as is, never closed here). The keys are per service and cluster (see the
    module doc). At most
    ``max_in_flight`` commands are outstanding at once; keep it at or below the
    client's pool size.
    """

    schema = SchemaVersion("redis", "directory", len(SCHEMA_STEPS))

    def __init__(
        self,
        url_or_client: str | Redis,
        *,
        cluster_id: str,
        service_id: str,
        shards: int = 256,
        max_in_flight: int = _MAX_IN_FLIGHT,
    ) -> None:
        if not 1 <= shards <= _MAX_SHARDS:
            raise ConfigurationError(f"shards must be in 1..{_MAX_SHARDS}, got {shards}")
        if max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if not service_id or not cluster_id:
            raise ConfigurationError("service_id and cluster_id must not be empty")
        self._url = url_or_client if isinstance(url_or_client, str) else None
        self._source: Redis | None = None if isinstance(url_or_client, str) else url_or_client
        self._client: Client | None = None
        self.cluster_id = cluster_id
        self.service_id = service_id
        self.shards = shards
        self._prefix = f"{key_prefix(service_id)}dir:"
        self._register: Any = None
        self._unregister: Any = None
        # redis-py's default pool raises instead of waiting when every connection
        # is busy, so a burst of lookups would fail as "unavailable"; queue here.
        self._max_in_flight = max_in_flight
        self._in_flight = asyncio.Semaphore(max_in_flight)

    def shard_of(self, grain_id: GrainId) -> int:
        """The shard holding ``grain_id``'s entry."""
        return (grain_id.uniform_hash() * self.shards) >> 32

    def key_of(self, shard: int) -> str:
        """The HASH key of ``shard`` (its own cluster hash tag)."""
        return f"{self._prefix}{{{self.service_id}:{self.cluster_id}:dir:{shard}}}"

    async def start(self, stack: AsyncExitStack) -> None:
        """Create the client if given a URL (closed on ``stack``), load the scripts and
        check the server answers; ``StorageUnavailableError`` if it does not."""
        if self._source is None:
            assert self._url is not None
            source = connect(self._url, max_connections=self._max_in_flight)
            stack.push_async_callback(source.aclose)
            self._source = source
        with translate_errors("grain directory start"):
            self._client = await resolve(self._source)
        self.migration = await migrate(self._client, "directory", SCHEMA_STEPS)
        self._register = self._client.register_script(_REGISTER)
        self._unregister = self._client.register_script(_UNREGISTER)
        with translate_errors("grain directory start"):
            await self._client.ping()

    def _redis(self) -> Client:
        if self._client is None or self._register is None:
            raise RuntimeError("RedisGrainDirectory used before start()")
        return self._client

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        """See ``GrainDirectory.register``: one script, set if absent else the winner.

        Retried through a failover (``retry_failover``). An attempt whose reply
        was lost may have stored ``address``; the retry then finds it stored and
        returns it, the same answer as a first attempt that won."""
        client = self._redis()
        key = self.key_of(self.shard_of(grain_id))
        args = [grain_id.canonical, _encode(address)]
        async with self._in_flight:
            winner = await retry_failover(
                client,
                "grain directory register",
                lambda _attempt: self._register(keys=[key], args=args),
            )
        return address if winner is None else _decode(winner)

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        """See ``GrainDirectory.lookup``; retried through a failover."""
        client = self._redis()
        key = self.key_of(self.shard_of(grain_id))
        async with self._in_flight:
            data = await retry_failover(
                client,
                "grain directory lookup",
                lambda _attempt: client.hget(key, grain_id.canonical),
            )
        return None if data is None else _decode(data)

    async def unregister(self, grain_id: GrainId, address: ActivationAddress) -> bool:
        """See ``GrainDirectory.unregister``: a compare-and-delete script, retried
        through a failover. A retry after an attempt whose reply was lost may
        find the entry gone by that attempt and return ``False``: the entry is
        gone either way, which is all callers rely on."""
        client = self._redis()
        key = self.key_of(self.shard_of(grain_id))
        args = [grain_id.canonical, _encode(address)]
        async with self._in_flight:
            removed = await retry_failover(
                client,
                "grain directory unregister",
                lambda _attempt: self._unregister(keys=[key], args=args),
            )
        return bool(removed)

    async def unregister_silo(self, silo: SiloAddress) -> int:
        """Removes nothing and returns ``0``; see the module doc for why that is safe."""
        self._redis()
        return 0
