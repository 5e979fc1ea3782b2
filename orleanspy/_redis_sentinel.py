"""The client of a Redis primary that Sentinels name (``redis+sentinel://`` URLs).

``_redis.connect`` parses the URL; this module builds the client. Its pool
makes a caller beyond ``max_connections`` wait for a free connection, as the
pool of a plain ``redis://`` URL does (``BlockingConnectionPool``): redis-py's
Sentinel pool fails it at once with ``MaxConnectionsError``, which the
providers would report as Redis being unavailable. A burst of grain calls on a
loaded silo is not an outage. The primary is the one a majority of the
sentinels name (``_MajoritySentinel``), not the first sentinel's answer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

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


class _MajoritySentinel(Sentinel):
    """Sentinels whose primary is the one most of them name.

    redis-py asks the sentinels one by one and takes the first that names a
    primary it sees up. Right after a failover a sentinel that has not heard of
    it yet still names the old primary, and if that node is back (restarted
    empty, or as a replica still syncing) its empty data is read as the truth:
    grain states and directory entries that are not there, writes that are
    lost when the node is turned into a replica. Here every sentinel is asked
    at once and the primary is the one a majority of the configured sentinels
    name, as Sentinel itself needs a majority to fail over; without one there
    is no primary yet (``MasterNotFoundError``, which callers retry as an
    outage).
    """

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        answers = await asyncio.gather(
            *(s.sentinel_masters() for s in self.sentinels), return_exceptions=True
        )
        votes: Counter[tuple[str, int]] = Counter()
        errors: list[str] = []
        for sentinel, answer in zip(self.sentinels, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(
                    answer, (rexc.ConnectionError, rexc.ResponseError, rexc.TimeoutError)
                ):
                    raise answer
                errors.append(f"{sentinel} - {answer!r}")
                continue
            state = answer.get(service_name) if isinstance(answer, dict) else None
            if state and self.check_master_state(state, service_name):
                votes[(str(state["ip"]), int(state["port"]))] += 1
        needed = len(self.sentinels) // 2 + 1
        if votes:
            (address, count), *_ = votes.most_common(1)
            if count >= needed:
                return address
        named = ", ".join(f"{h}:{p} by {n}" for (h, p), n in votes.items()) or "none"
        raise MasterNotFoundError(
            f"No master found for {service_name!r}: {needed} of {len(self.sentinels)} "
            f"sentinels must name one (named: {named})"
            + (f" : {', '.join(errors)}" if errors else "")
        )


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
    sentinel = _MajoritySentinel(  # type: ignore[no-untyped-call,unused-ignore]
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
