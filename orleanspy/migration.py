"""``migrate_storage``: bring every schema of one store to this release's, and say
what was done (``orleanspy migrate``).

A store (a Redis or PostgreSQL URL) holds the cluster's tables: membership,
grain directory, reminders, the default grain state and (Redis) streams. Each
provider migrates its own component when it starts (``orleanspy.schema``); this
runs the same steps, under the same lock, as the first silo of a new release
would, ahead of the roll, for an operator who wants to see them. On PostgreSQL
it starts each provider (their steps are SQL in their modules); on Redis it runs
each provider module's ``SCHEMA_STEPS`` without starting the provider, so that
nothing a silo configures (the reminder table's shard count) is fixed by it.
It is idempotent, and safe while the previous release runs (steps are additive).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from orleanspy.schema import MigrationReport
from orleanspy.tables import TableConnections, table_backend

__all__ = ["migrate_storage"]


async def migrate_storage(
    url: str, *, service_id: str = "default", cluster_id: str = "dev"
) -> list[MigrationReport]:
    """Migrate every component ``url``'s store holds; one report per component,
    in the order they ran. ``SchemaTooNewError`` (nothing changed by this call
    beyond the components before it, which are current) if a newer release
    migrated one of them; ``StorageUnavailableError`` if the store is down."""
    if table_backend(url) == "redis":
        return await _migrate_redis(url)
    async with AsyncExitStack() as stack:
        connections = TableConnections(stack)
        providers: list[Any] = [
            await connections.membership_table(url, cluster_id=cluster_id, service_id=service_id),
            await connections.directory(url, cluster_id=cluster_id, service_id=service_id),
            await connections.reminder_table(url, service_id=service_id, shards=256),
            await connections.grain_storage(url, service_id=service_id),
        ]
        reports: list[MigrationReport] = []
        for provider in providers:
            await provider.start(stack)
            # A provider that keeps several components reports each.
            found = getattr(provider, "migrations", None) or [getattr(provider, "migration", None)]
            reports.extend(r for r in found if isinstance(r, MigrationReport))
        return reports


async def _migrate_redis(url: str) -> list[MigrationReport]:
    from orleanspy._redis import connect, resolve
    from orleanspy._redis_schema import migrate
    from orleanspy.directory import redis as directory
    from orleanspy.membership import redis as membership
    from orleanspy.reminders.redis import audit as reminder_audit
    from orleanspy.reminders.redis import layout as reminders
    from orleanspy.storage import redis as storage
    from orleanspy.streams import redis as streams

    components = (
        ("membership", membership.SCHEMA_STEPS),
        ("directory", directory.SCHEMA_STEPS),
        ("reminders", reminders.SCHEMA_STEPS),
        ("reminder_audit", reminder_audit.AUDIT_SCHEMA_STEPS),
        ("reminder_counters", reminders.COUNTERS_STEPS),
        ("reminder_dead_letters", reminders.DEAD_LETTERS_STEPS),
        ("grain_state", storage.SCHEMA_STEPS),
        ("streams", streams.SCHEMA_STEPS),
    )
    source = connect(url)
    try:
        client = await resolve(source)
        return [await migrate(client, name, steps) for name, steps in components]
    finally:
        await source.aclose()
