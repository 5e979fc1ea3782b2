"""Schema creation by the providers and their behaviour when the server drops
their connections."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import asyncpg

from orleanspy.directory.postgres import _SCHEMA as directory_schema
from orleanspy.directory.postgres import PostgresGrainDirectory
from orleanspy.errors import StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.membership.postgres import _SCHEMA as membership_schema
from orleanspy.membership.postgres import PostgresMembershipTable
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.postgres.audit import AUDIT_STEPS
from orleanspy.reminders.postgres.migrations import COUNTERS_STEPS, DEAD_LETTERS_STEPS
from orleanspy.reminders.postgres.migrations import STEPS as reminders_schema
from orleanspy.reminders.postgres.stores import COMPONENTS as reminder_components

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def test_providers_starting_together_create_the_schema_once(postgres_url: str) -> None:
    async with AsyncExitStack() as stack:
        providers = [
            p
            for i in range(3)
            for p in (
                PostgresReminderTable(postgres_url, service_id=f"s{i}"),
                PostgresMembershipTable(postgres_url, cluster_id="c", service_id=f"s{i}"),
                PostgresGrainDirectory(postgres_url, cluster_id="c", service_id=f"s{i}"),
            )
        ]
        await asyncio.gather(*(p.start(stack) for p in providers))
    conn = await asyncpg.connect(postgres_url)
    try:
        versions = dict(await conn.fetch("SELECT component, version FROM orleanspy_schema"))
    finally:
        await conn.close()
    assert versions == {
        "reminders": len(reminders_schema),
        # 0.2's counters and dead letters: components of their own, beside the rows'.
        "reminder_counters": len(COUNTERS_STEPS),
        "reminder_dead_letters": len(DEAD_LETTERS_STEPS),
        # The operator audit log: a component of its own too.
        "reminder_audit": len(AUDIT_STEPS),
        "membership": len(membership_schema),
        "directory": len(directory_schema),
        # The reminder table's label index, calendars and backfills migrate apart.
        **{name: len(steps) for name, steps in reminder_components},
    }


async def test_dropped_connections_are_storage_unavailable_then_recover(postgres_url: str) -> None:
    """The server ends every session: a call fails only with
    ``StorageUnavailableError``, and the next calls get fresh connections."""
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(postgres_url, service_id="svc")
        await table.start(stack)
        entry = ReminderEntry(
            service_id="svc",
            grain_id=GrainId("D", "x"),
            name="r",
            start_at=T0,
            next_due=T0,
            period=timedelta(minutes=1),
        )
        await table.upsert(entry)
        admin = await asyncpg.connect(postgres_url)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        outcomes: list[str] = []
        for _ in range(12):
            try:
                await table.upsert(entry)
                outcomes.append("ok")
            except StorageUnavailableError:
                outcomes.append("unavailable")
        # A pooled connection the server ended fails once; nothing else goes wrong.
        assert outcomes[-1] == "ok" and set(outcomes) <= {"ok", "unavailable"}
        row = await table.read(entry.grain_id, "r")
        assert row is not None and row.next_due == T0
