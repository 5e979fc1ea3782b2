"""The PostgreSQL test database: reachable, private, and emptied between tests."""

from __future__ import annotations

import asyncio

import asyncpg

from orleanspy.testing.postgres import PostgresDatabase


async def test_database_is_private_and_writable(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval("SELECT current_database()") == postgres_url.rsplit("/", 1)[1]
        await conn.execute("CREATE TABLE leftover (x int)")
    finally:
        await conn.close()


async def test_reset_leaves_no_tables(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    assert tables == []


def test_drop_removes_the_database() -> None:
    db = PostgresDatabase().create()
    db.drop()

    async def exists() -> bool:
        conn = await asyncpg.connect(db.admin_url)
        try:
            return bool(
                await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", db.name)
            )
        finally:
            await conn.close()

    assert asyncio.run(exists()) is False
