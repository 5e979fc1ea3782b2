"""The client of a Redis primary that Sentinels name (``redis+sentinel://`` URLs).

``_redis.connect`` parses the URL; this module builds the client. Its pool
makes a caller beyond ``max_connections`` wait for a free connection, as the
pool of a plain ``redis://`` URL does (``BlockingConnectionPool``): redis-py's
Sentinel pool fails it at once with ``MaxConnectionsError``, which the
providers would report as Redis being unavailable. A burst of grain calls on a
loaded silo is not an outage.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

__all__ = ["sentinel_client"]

#: How long a caller waits for a free connection before failing with a
#: connection error (the plain pool's ``timeout``).
POOL_WAIT_S = 10.0


class _WaitingSentinelPool(SentinelConnectionPool):
    """Sentinel's pool, with callers beyond ``max_connections`` waiting.

    A semaphore counts the connections handed out; only the public
    ``get_connection`` / ``release`` pair is wrapped, so the pool's own
    bookkeeping (and its failover handling) is redis-py's.
    """

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        self._free = asyncio.Semaphore(self.max_connections)
        # Connections this pool handed out and has not had back: a release of
        # anything else (or a second release) must not add a slot.
        self._lent: set[Any] = set()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(POOL_WAIT_S):
                await self._free.acquire()
        except TimeoutError:
            raise rexc.ConnectionError(
                f"no Redis connection free in {POOL_WAIT_S:g} s ({self.max_connections} in use)"
            ) from None
        try:
            connection = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        except BaseException:
            self._free.release()
            raise
        self._lent.add(connection)
        return connection

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            if connection in self._lent:
                self._lent.discard(connection)
                self._free.release()


class _SentinelRedis(aioredis.Redis):
    """The primary's client; closing it closes the connections to the sentinels too."""

    sentinels: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinels is not None:
            for s in self.sentinels.sentinels:
                await s.aclose()


def sentinel_client(
    sentinels: list[tuple[str, int]], name: str, kwargs: dict[str, Any]
) -> aioredis.Redis:
    """A client of primary ``name`` that ``sentinels`` name, followed across a
    failover. ``kwargs`` are the primary's connection options (``max_connections``,
    ``retry`` and ``db`` among them); the sentinels get the credentials and TLS
    of the primary, with 2 s timeouts."""
    # redis-py 8.2 types Sentinel's constructor, 8.1 does not.
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        sentinels,
        sentinel_kwargs={"socket_connect_timeout": 2, "socket_timeout": 2},
        **{k: v for k, v in kwargs.items() if k not in ("max_connections", "retry", "db")},
    )
    client: _SentinelRedis = sentinel.master_for(
        name,
        redis_class=_SentinelRedis,
        connection_pool_class=_WaitingSentinelPool,
        **kwargs,
    )
    client.sentinels = sentinel
    return client
