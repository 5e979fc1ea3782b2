"""The cluster's tables built from URLs.

``TableConnections`` builds the membership table, reminder table, grain
directory, and the default grain storage on the cluster's store, for URLs,
sharing one Redis client or one PostgreSQL pool per URL, and closes them with
the stack it was given. Which backend a URL names is decided in ``schemes``
(``table_backend`` is its answer for the tables). Backend modules (and so
``redis`` or ``asyncpg``) are imported only when a URL chooses them.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from orleanspy.schemes import Backend, backend_of

if TYPE_CHECKING:
    from orleanspy.directory.table import GrainDirectory
    from orleanspy.membership.table import MembershipTable
    from orleanspy.reminders.table import ReminderTable
    from orleanspy.storage.contract import GrainStorage

__all__ = ["Backend", "TableConnections", "table_backend"]


def table_backend(url: str) -> Backend:
    """The backend ``url`` names for a table (``redis`` or ``postgres``);
    ``ConfigurationError`` for any other scheme (``schemes.backend_of``)."""
    return backend_of(url, "tables")


class TableConnections:
    """Tables for URLs, with one client (Redis) or pool (PostgreSQL) per URL,
    closed when ``stack`` unwinds."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        self._redis: dict[str, Any] = {}
        self._pools: dict[str, Any] = {}

    def redis(self, url: str) -> Any:
        """The shared ``redis.asyncio.Redis`` client of ``url``."""
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

        return RedisMembershipTable(self.redis(url), cluster_id=cluster_id, service_id=service_id)

    async def reminder_table(self, url: str, *, service_id: str, shards: int) -> ReminderTable:
        """``shards`` applies to Redis only (PostgreSQL slices the ring in its index)."""
        if table_backend(url) == "postgres":
            from orleanspy.reminders.postgres import PostgresReminderTable

            return PostgresReminderTable(await self.postgres(url), service_id=service_id)
        from orleanspy.reminders.redis import RedisReminderTable

        return RedisReminderTable(self.redis(url), service_id=service_id, shards=shards)

    async def directory(self, url: str, *, cluster_id: str, service_id: str) -> GrainDirectory:
        if table_backend(url) == "postgres":
            from orleanspy.directory.postgres import PostgresGrainDirectory

            return PostgresGrainDirectory(
                await self.postgres(url), cluster_id=cluster_id, service_id=service_id
            )
        from orleanspy.directory.redis import RedisGrainDirectory

        return RedisGrainDirectory(self.redis(url), cluster_id=cluster_id, service_id=service_id)

    async def grain_storage(self, url: str, *, service_id: str) -> GrainStorage:
        """Grain storage on the store of the cluster's tables at ``url``, sharing
        its client or pool (the silo's default provider)."""
        if table_backend(url) == "postgres":
            from orleanspy.storage.postgres import PostgresGrainStorage

            return PostgresGrainStorage(await self.postgres(url), service_id=service_id)
        from orleanspy.storage.redis import RedisGrainStorage

        return RedisGrainStorage(self.redis(url), service_id=service_id)
