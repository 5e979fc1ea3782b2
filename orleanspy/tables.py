"""Which backend a table URL names, and the tables built from URLs.

``table_backend(url)`` is the one place that reads a URL's scheme: ``redis://``,
``rediss://`` and ``unix://`` name Redis; ``postgresql://`` and ``postgres://``
name PostgreSQL. ``TableConnections`` builds the membership table, reminder
table and grain directory for URLs, sharing one Redis client or one PostgreSQL
pool per URL, and closes them with the stack it was given. Backend modules
(and so ``redis`` or ``asyncpg``) are imported only when a URL chooses them.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Literal

from orleanspy.errors import ConfigurationError

if TYPE_CHECKING:
    from orleanspy.directory.table import GrainDirectory
    from orleanspy.membership.table import MembershipTable
    from orleanspy.options import RedisOptions
    from orleanspy.reminders.table import ReminderTable

__all__ = ["Backend", "TableConnections", "table_backend"]

Backend = Literal["redis", "postgres"]

_SCHEMES: dict[str, Backend] = {
    "redis://": "redis",
    "rediss://": "redis",
    "redis+cluster://": "redis",
    "rediss+cluster://": "redis",
    "redis+sentinel://": "redis",
    "rediss+sentinel://": "redis",
    "unix://": "redis",
    "postgresql://": "postgres",
    "postgres://": "postgres",
}


def table_backend(url: str) -> Backend:
    """The backend ``url`` names; ``ConfigurationError`` for any other scheme."""
    for prefix, backend in _SCHEMES.items():
        if url.startswith(prefix):
            return backend
    raise ConfigurationError(
        # The scheme only: the rest of a URL may hold a password.
        f"unsupported table URL scheme {url.partition('://')[0]!r}: use redis://, rediss://, "
        "unix:// (Redis) or postgresql:// (PostgreSQL)"
    )


class TableConnections:
    """Tables for URLs, with one client (Redis) or pool (PostgreSQL) per URL,
    closed when ``stack`` unwinds."""

    def __init__(self, stack: AsyncExitStack, redis_options: RedisOptions | None = None) -> None:
        self._stack = stack
        #: How the Redis tables write (``RedisOptions``: replicas to WAIT for).
        self.redis_options = redis_options
        self._redis: dict[str, Any] = {}
        self._pools: dict[str, Any] = {}

    def redis(self, url: str) -> Any:
        """The shared Redis client of ``url`` (``orleanspy._redis.connect``; a plain
        ``redis://`` URL's client learns on first connect whether it names a
        cluster)."""
        if url not in self._redis:
            from orleanspy._redis import connect

            client = connect(url)
            self._stack.push_async_callback(client.aclose)
            self._redis[url] = client
        return self._redis[url]

    def redis_clients(self) -> dict[str, Any]:
        """The Redis clients made so far, by URL."""
        return dict(self._redis)

    async def postgres(self, url: str) -> Any:
        """The shared ``asyncpg`` pool of ``url``."""
        if url not in self._pools:
            from orleanspy._postgres import open_pool

            self._pools[url] = await open_pool(url, self._stack, max_size=8)
        return self._pools[url]

    async def membership_table(
        self, url: str, *, cluster_id: str, service_id: str
    ) -> MembershipTable:
        if table_backend(url) == "postgres":
            from orleanspy.membership.postgres import PostgresMembershipTable

            return PostgresMembershipTable(
                await self.postgres(url), cluster_id=cluster_id, service_id=service_id
            )
        from orleanspy.membership.redis import RedisMembershipTable

        return RedisMembershipTable(
            self.redis(url),
            cluster_id=cluster_id,
            service_id=service_id,
            options=self.redis_options,
        )

    async def reminder_table(self, url: str, *, service_id: str, shards: int) -> ReminderTable:
        """``shards`` applies to Redis only (PostgreSQL slices the ring in its index)."""
        if table_backend(url) == "postgres":
            from orleanspy.reminders.postgres import PostgresReminderTable

            return PostgresReminderTable(await self.postgres(url), service_id=service_id)
        from orleanspy.reminders.redis import RedisReminderTable

        return RedisReminderTable(
            self.redis(url), service_id=service_id, shards=shards, options=self.redis_options
        )

    async def directory(self, url: str, *, cluster_id: str, service_id: str) -> GrainDirectory:
        if table_backend(url) == "postgres":
            from orleanspy.directory.postgres import PostgresGrainDirectory

            return PostgresGrainDirectory(
                await self.postgres(url), cluster_id=cluster_id, service_id=service_id
            )
        from orleanspy.directory.redis import RedisGrainDirectory

        return RedisGrainDirectory(self.redis(url), cluster_id=cluster_id, service_id=service_id)
