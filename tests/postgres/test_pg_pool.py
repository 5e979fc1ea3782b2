"""The providers' pools: a released connection costs no reset round trip, and a
transaction left open is still rolled back before the next acquirer gets it."""

from __future__ import annotations

from contextlib import AsyncExitStack

from orleanspy._postgres import open_pool


async def test_a_released_connection_sends_no_reset_query(postgres_url: str) -> None:
    async with AsyncExitStack() as stack:
        pool = await open_pool(postgres_url, stack, max_size=1)
        sent: list[str] = []
        async with pool.acquire() as conn:
            conn.add_query_logger(lambda record: sent.append(record.query))
            assert await conn.fetchval("SELECT 1") == 1
        async with pool.acquire() as again:
            assert await again.fetchval("SELECT 2") == 2
        # The statement of the first holder and nothing else (asyncpg's default
        # reset would have sent RESET ALL, UNLISTEN * ... on release).
        assert sent[0] == "SELECT 1"
        assert not any("RESET" in q or "UNLISTEN" in q for q in sent), sent


async def test_a_transaction_left_open_is_rolled_back_on_release(postgres_url: str) -> None:
    async with AsyncExitStack() as stack:
        pool = await open_pool(postgres_url, stack, max_size=1)
        await pool.execute("CREATE TABLE pool_probe (x int)")
        conn = await pool.acquire()
        await conn.execute("BEGIN")
        await conn.execute("INSERT INTO pool_probe VALUES (1)")
        await pool.release(conn)
        async with pool.acquire() as again:
            assert not again.is_in_transaction()
            assert await again.fetchval("SELECT count(*) FROM pool_probe") == 0
