"""Version 6 of the PostgreSQL reminder schema: a v5 table migrates in place
(rows kept, no fingerprint), gains the byte-order grain index that paging uses,
and an older silo's whole-row write keeps a fingerprint it does not know."""

from __future__ import annotations

from dataclasses import replace

import asyncpg

from orleanspy._postgres import migrate
from orleanspy.identity import GrainId
from orleanspy.reminders.postgres import migrations
from tests.postgres.test_pg_reminder_schema_v3 import _v2_upsert, table_at


async def test_a_v5_table_migrates_keeps_rows_and_pages_by_byte_order(postgres_url: str) -> None:
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=1)
    try:
        await migrate(pool, "reminders", migrations.STEPS[:5])
    finally:
        await pool.close()
    old = GrainId("Old", "row")
    conn = await asyncpg.connect(postgres_url)
    try:
        await _v2_upsert(conn, old, 100)
        # Keys whose order differs between byte order and most collations.
        for key in ("a-b", "a_b", "A", "ab", "a"):
            await _v2_upsert(conn, GrainId("Old", key), 0)
    finally:
        await conn.close()

    async with table_at(postgres_url) as table:
        row = await table.read(old, "r")
        assert row is not None and row.fingerprint is None and row.declared
        stamped = await table.upsert(replace(row, fingerprint="0123456789ab:100:2"))
        assert stamped
        # An older silo rewrites the whole row: the fingerprint stays.
        conn = await asyncpg.connect(postgres_url)
        try:
            await _v2_upsert(conn, old, 50)
            version = await conn.fetchval(
                "SELECT version FROM orleanspy_schema WHERE component = 'reminders'"
            )
            index = await conn.fetchval(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'orleanspy_reminders_grain'"
            )
        finally:
            await conn.close()
        assert version == len(migrations.STEPS) >= 6
        assert 'COLLATE "C"' in index
        kept = await table.read(old, "r")
        assert kept is not None and kept.priority == 50
        assert kept.fingerprint == "0123456789ab:100:2"
        rows, cursor = await table.read_page(None, 3, type_name="Old")
        more, end = await table.read_page(cursor, 10, type_name="Old")
        keys = [r.grain_id.canonical for r in rows + more]
        assert end is None and keys == sorted(keys, key=lambda k: k.encode())
        assert len(keys) == 6
        assert [r.grain_id.key for r in (await table.read_page(None, 10, type_name="Old",
                                                               key_prefix="a"))[0]] == [
            "a", "a-b", "a_b", "ab"
        ]  # fmt: skip
        assert await table.count_types() == {"Old": 6}
