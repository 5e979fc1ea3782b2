"""Store schema versions on real Redis and PostgreSQL: steps apply once, in order,
under the lock, when several migrate at once; a store newer than the code is
refused naming both; ``orleanspy migrate`` reports what it did and is idempotent."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest

from orleanspy import _redis_schema
from orleanspy._postgres import migrate as pg_migrate
from orleanspy._postgres import open_pool
from orleanspy._redis import Client, connect, resolve
from orleanspy.cli import main
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.migration import migrate_storage
from orleanspy.schema import SchemaTooNewError
from orleanspy.versions import __version__


async def _client(stack: AsyncExitStack, url: str) -> Client:
    source = connect(url)
    stack.push_async_callback(source.aclose)
    return await resolve(source)


async def test_redis_steps_apply_once_in_order_when_many_migrate_at_once(redis_url: str) -> None:
    applied: list[int] = []

    def step(n: int) -> _redis_schema.RedisStep:
        async def run(client: Client) -> None:
            await asyncio.sleep(0.01)  # let the others reach the lock meanwhile
            await client.rpush("schema-test:steps", n)
            applied.append(n)

        return (f"step {n}", run)

    steps = (_redis_schema.adopt(), step(2), step(3))
    async with AsyncExitStack() as stack:
        client = await _client(stack, redis_url)
        reports = await asyncio.gather(
            *(_redis_schema.migrate(client, "widgets", steps) for _ in range(5))
        )
        assert applied == [2, 3]
        assert await client.lrange("schema-test:steps", 0, -1) == [b"2", b"3"]
        assert await client.hget("orleanspy:schema", "widgets") == f"3|{__version__}".encode()
        assert sum(1 for r in reports if r.applied) == 1
        done = next(r for r in reports if r.applied)
        assert (done.before, done.after) == (0, 3)
        assert done.applied[0].startswith("1: the layout of 0.1.x")
        assert await client.get("orleanspy:schema:lock") is None
        # Again: nothing to do, one read.
        again = await _redis_schema.migrate(client, "widgets", steps)
        assert (again.before, again.after, again.applied) == (3, 3, [])
        assert "nothing to do" in again.line()


async def test_a_redis_store_newer_than_the_code_is_refused_at_start(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        client = await _client(stack, redis_url)
        await client.hset("orleanspy:schema", "membership", "9|0.9.0")
        table = RedisMembershipTable(redis_url, cluster_id="c", service_id="s")
        with pytest.raises(SchemaTooNewError) as caught:
            await table.start(stack)
    text = str(caught.value)
    assert "redis membership schema is at version 9, migrated by orleanspy 0.9.0" in text
    assert f"this release (orleanspy {__version__}) knows versions up to 1" in text


async def test_a_postgres_schema_newer_than_the_code_is_refused_naming_both(
    postgres_url: str,
) -> None:
    steps = (("CREATE TABLE IF NOT EXISTS schema_test (a int)",),)
    async with AsyncExitStack() as stack:
        pool = await open_pool(postgres_url, stack)
        first = await pg_migrate(pool, "schema_test", steps, summaries=["the table"])
        assert (first.before, first.after, first.applied) == (0, 1, ["1: the table"])
        assert (
            await pool.fetchval(
                "SELECT release FROM orleanspy_schema WHERE component = 'schema_test'"
            )
            == __version__
        )
        await pool.execute(
            "UPDATE orleanspy_schema SET version = 4, release = '0.4.0' "
            "WHERE component = 'schema_test'"
        )
        with pytest.raises(SchemaTooNewError, match=r"at version 4, migrated by orleanspy 0\.4\.0"):
            await pg_migrate(pool, "schema_test", steps)


@pytest.mark.parametrize("store", ["redis", "postgres"])
async def test_migrate_storage_is_idempotent_and_says_what_it_did(
    store: str, redis_url: str, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = redis_url if store == "redis" else postgres_url
    first = await migrate_storage(url)
    names = [r.component for r in first]
    assert {"membership", "directory", "reminders"} <= set(names)
    assert all(r.after >= 1 for r in first)
    assert all(r.applied for r in first)  # an empty store: every component is new
    second = await migrate_storage(url)
    assert [r.applied for r in second] == [[] for _ in second]
    assert await asyncio.to_thread(main, ["migrate", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"orleanspy {__version__}: ")
    assert out.count("nothing to do") == len(second)
