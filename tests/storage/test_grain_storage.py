"""The grain storage providers: the shared contract suite on memory, a private
redis-server and PostgreSQL, the suite failing a broken provider, then what is
particular to each backend."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import asyncpg
import pytest

from orleanspy._redis import connect
from orleanspy.errors import ConfigurationError, StorageError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.storage.contract import GrainStorage, StoredState
from orleanspy.storage.factory import grain_storage_from_url
from orleanspy.storage.memory import InMemoryGrainStorage
from orleanspy.storage.postgres import PostgresGrainStorage
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing import GRAIN_STORAGE_CHECKS, check_grain_storage
from orleanspy.testing.grain_storage import check_concurrent_writers_one_wins
from orleanspy.testing.redis_server import RedisServer

Factory = Callable[[], AbstractAsyncContextManager[GrainStorage]]
GID = GrainId("Account", "a")


def memory_factory() -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[GrainStorage]:
        async with AsyncExitStack() as stack:
            storage = InMemoryGrainStorage()
            await storage.start(stack)
            yield storage

    return make


def redis_factory(url: str) -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[GrainStorage]:
        async with AsyncExitStack() as stack:
            # A fresh service id per provider: empty on a shared server.
            storage = RedisGrainStorage(url, service_id=f"c-{uuid.uuid4().hex[:8]}")
            await storage.start(stack)
            yield storage

    return make


def postgres_factory(url: str) -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[GrainStorage]:
        async with AsyncExitStack() as stack:
            storage = PostgresGrainStorage(url, service_id=f"c-{uuid.uuid4().hex[:8]}")
            await storage.start(stack)
            yield storage

    return make


@pytest.fixture(params=["memory", "redis", "redis_cluster", "redis_sentinel", "postgres"])
def storage_factory(request: pytest.FixtureRequest) -> Factory:
    if request.param == "memory":
        return memory_factory()
    if request.param.startswith("redis"):
        return redis_factory(request.getfixturevalue(f"{request.param}_url"))
    return postgres_factory(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("check", GRAIN_STORAGE_CHECKS, ids=lambda c: c.__name__)
async def test_grain_storage_contract(storage_factory: Factory, check: Any) -> None:
    await check(storage_factory)


async def test_check_grain_storage_runs_every_check_on_memory() -> None:
    await check_grain_storage(memory_factory())


def test_providers_satisfy_the_protocol() -> None:
    assert isinstance(InMemoryGrainStorage(), GrainStorage)
    assert isinstance(RedisGrainStorage("redis://x"), GrainStorage)
    assert isinstance(PostgresGrainStorage("postgresql://x"), GrainStorage)


# -- the kit fails broken providers ---------------------------------------------------


class _LastWriterWins(InMemoryGrainStorage):
    """Ignores etags on write: what optimistic concurrency exists to prevent."""

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        current = await self.read(grain_id, name)
        return await super().write(grain_id, name, data, current.etag if current else None)


class _NotAtomic(InMemoryGrainStorage):
    """Checks the etag, then awaits before writing: two writers both pass the check."""

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        current = await self.read(grain_id, name)
        if (current.etag if current else None) != etag:
            return None
        await asyncio.sleep(0)
        self._states[(grain_id.canonical, name)] = StoredState(data, uuid.uuid4().hex)
        return self._states[(grain_id.canonical, name)].etag


class _StaleReplica(InMemoryGrainStorage):
    """Reads come from a replica one write behind: a new activation sees the state
    before the last write, and with it, the ticks that write committed undone."""

    def __init__(self) -> None:
        super().__init__()
        self._previous: dict[tuple[str, str], StoredState] = {}

    async def write(
        self, grain_id: GrainId, name: str, data: bytes, etag: str | None
    ) -> str | None:
        before = await super().read(grain_id, name)
        written = await super().write(grain_id, name, data, etag)
        if written is not None and before is not None:
            self._previous[(grain_id.canonical, name)] = StoredState(before.data, written)
        return written

    async def read(self, grain_id: GrainId, name: str) -> StoredState | None:
        stale = self._previous.get((grain_id.canonical, name))
        return stale if stale is not None else await super().read(grain_id, name)


def _factory_of(cls: type[InMemoryGrainStorage]) -> Factory:
    @asynccontextmanager
    async def make() -> AsyncIterator[GrainStorage]:
        yield cls()

    return make


async def test_the_kit_fails_a_provider_that_ignores_etags() -> None:
    with pytest.raises(AssertionError, match="check_stale_etag_is_refused"):
        await check_grain_storage(_factory_of(_LastWriterWins))


async def test_the_kit_fails_a_provider_whose_cas_is_not_atomic() -> None:
    with pytest.raises(AssertionError, match="exactly one"):
        await check_concurrent_writers_one_wins(_factory_of(_NotAtomic))


async def test_the_kit_fails_a_provider_that_loses_the_committed_ticks() -> None:
    from orleanspy.testing.grain_storage import check_tick_commits_survive_a_new_activation

    with pytest.raises(AssertionError, match="a new activation must see the commit"):
        await check_tick_commits_survive_a_new_activation(_factory_of(_StaleReplica))


# -- URLs ---------------------------------------------------------------------------


def test_urls_pick_the_backend() -> None:
    assert isinstance(grain_storage_from_url("memory://", service_id="s"), InMemoryGrainStorage)
    redis = grain_storage_from_url("redis://127.0.0.1:1/0", service_id="s")
    assert isinstance(redis, RedisGrainStorage) and redis.service_id == "s"
    pg = grain_storage_from_url("postgresql://postgres@127.0.0.1/x", service_id="s")
    assert isinstance(pg, PostgresGrainStorage) and pg.service_id == "s"
    with pytest.raises(ConfigurationError, match="scheme must be one of"):
        grain_storage_from_url("mysql://x", service_id="s")


# -- Redis --------------------------------------------------------------------------


async def test_redis_layout_is_one_hash_per_state_under_the_service_prefix(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(redis_url, service_id="shop")
        await storage.start(stack)
        etag = await storage.write(GID, "profile", b"data", None)
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        key = "orleanspy:shop:state:{shop:Account/s:a}:profile"
        assert storage.key(GID, "profile") == key
        assert await client.type(key) == b"hash"
        assert await client.hgetall(key) == {b"d": b"data", b"e": etag.encode()}  # type: ignore[union-attr]
        # The state's key, and the schema versions of the Redis providers.
        assert sorted(await client.keys("*")) == sorted([key.encode(), b"orleanspy:schema"])


async def test_redis_record_of_another_shape_is_a_storage_error(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(redis_url, service_id="shop")
        await storage.start(stack)
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        await client.set(storage.key(GID, "a"), b"a string, not a hash")
        with pytest.raises(StorageError, match="redis error during grain state read"):
            await storage.read(GID, "a")
        with pytest.raises(StorageError):
            await storage.write(GID, "a", b"x", None)
        assert await client.get(storage.key(GID, "a")) == b"a string, not a hash"
        await client.hset(storage.key(GID, "b"), "d", b"data without an etag")
        with pytest.raises(StorageError, match="malformed grain state record"):
            await storage.read(GID, "b")


async def test_redis_client_passed_in_is_not_closed(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        async with AsyncExitStack() as stack:
            storage = RedisGrainStorage(client, service_id="s")
            await storage.start(stack)
            await storage.write(GID, "s", b"x", None)
        assert await client.ping()
    finally:
        await client.aclose()


async def test_redis_unavailable_is_storage_unavailable(own_redis: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(own_redis.url, service_id="s")
        await storage.start(stack)
        etag = await storage.write(GID, "s", b"kept", None)
        own_redis.stop()
        with pytest.raises(StorageUnavailableError):
            await storage.write(GID, "s", b"lost?", etag)
        own_redis.start()
        # Without persistence the restarted server is empty; what matters is that
        # the provider works again without being rebuilt.
        assert await storage.write(GID, "s", b"again", None) is not None


# -- PostgreSQL ---------------------------------------------------------------------


async def test_postgres_creates_its_table_and_keeps_the_version_as_etag(
    postgres_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        # Several providers starting at once do not race on creating the schema.
        providers = [PostgresGrainStorage(postgres_url, service_id=f"s{i}") for i in range(4)]
        await asyncio.gather(*(p.start(stack) for p in providers))
        etag = await providers[0].write(GID, "profile", b"data", None)
        assert etag is not None
        conn = await asyncpg.connect(postgres_url)
        try:
            row = await conn.fetchrow(
                "SELECT service_id, grain_id, state_name, data, version FROM orleanspy_grain_state"
            )
        finally:
            await conn.close()
        assert tuple(row) == ("s0", "Account/s:a", "profile", b"data", int(etag))
        # The same grain under another service id is another state.
        assert await providers[1].read(GID, "profile") is None


async def test_postgres_records_its_schema_version_and_uses_the_shared_pool_settings(
    postgres_url: str,
) -> None:
    """Grain state migrates like every PostgreSQL table (a version row in
    orleanspy_schema) and its pool has jit off, as ``_postgres.open_pool`` sets."""
    async with AsyncExitStack() as stack:
        storage = PostgresGrainStorage(postgres_url, table="states_v")
        await storage.start(stack)
        await storage.start(stack)  # a second start finds the version and changes nothing
        assert await storage._p.fetchval("SHOW jit") == "off"
        versions = await storage._p.fetch(
            "SELECT component, version FROM orleanspy_schema WHERE component LIKE 'grain_state:%'"
        )
        assert [tuple(r) for r in versions] == [("grain_state:states_v", 1)]


class _FailingPool:
    """A started pool whose next statement fails with ``error`` (what asyncpg
    raises when the server restarts under a busy connection)."""

    def __init__(self, pool: Any, error: BaseException) -> None:
        self._pool, self._error = pool, error

    def get_max_size(self) -> int:
        return int(self._pool.get_max_size())

    async def _fail(self, *args: Any) -> Any:
        raise self._error

    fetchval = fetchrow = fetch = execute = _fail


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.InternalClientError(
            "cannot switch to state 12; another operation is in progress"
        ),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.ConnectionFailureError("connection failure"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_postgres_connection_class_errors_are_storage_unavailable(
    postgres_url: str, error: BaseException
) -> None:
    async with AsyncExitStack() as stack:
        storage = PostgresGrainStorage(postgres_url)
        await storage.start(stack)
        storage._pool = _FailingPool(storage._pool, error)
        for attempt in (
            storage.write(GID, "s", b"x", None),
            storage.write(GID, "s", b"x", "7"),
            storage.clear(GID, "s", "7"),
            storage.read(GID, "s"),
        ):
            with pytest.raises(StorageUnavailableError) as info:
                await attempt
            assert info.value.__cause__ is error


def test_postgres_table_name_must_be_an_identifier() -> None:
    with pytest.raises(ConfigurationError, match="SQL identifier"):
        PostgresGrainStorage("postgresql://x", table="states; DROP TABLE x")


async def test_postgres_unreachable_is_storage_unavailable() -> None:
    storage = PostgresGrainStorage("postgresql://postgres@127.0.0.1:1/none")
    async with AsyncExitStack() as stack:
        with pytest.raises(StorageUnavailableError):
            await storage.start(stack)


def test_asyncpg_loads_only_with_the_postgresql_backend() -> None:
    import subprocess
    import sys

    code = (
        "import sys, orleanspy, orleanspy.storage, orleanspy.storage.factory, orleanspy.testing\n"
        "from orleanspy.storage.factory import grain_storage_from_url\n"
        "grain_storage_from_url('redis://x', service_id='s')\n"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported too early'\n"
        "grain_storage_from_url('postgresql://x', service_id='s')\n"
        "assert 'asyncpg' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


async def test_redis_a_bad_record_in_a_batch_fails_only_its_own_read(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(redis_url, service_id="shop")
        await storage.start(stack)
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        good = GrainId("Account", "good")
        etag = await storage.write(good, "s", b"fine", None)
        await client.set(storage.key(GID, "s"), b"a string, not a hash")
        await client.hset(storage.key(GID, "t"), "d", b"no etag")
        results = await asyncio.gather(
            storage.read(good, "s"),
            storage.read(GID, "s"),
            storage.read(GID, "t"),
            storage.read(GID, "missing"),
            return_exceptions=True,
        )
        assert results[0] == StoredState(b"fine", etag)
        assert isinstance(results[1], StorageError) and "WRONGTYPE" in str(results[1])
        assert isinstance(results[2], StorageError) and "malformed" in str(results[2])
        assert results[3] is None


async def test_redis_batched_writes_survive_a_script_flush_and_a_bad_record(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(redis_url, service_id="shop")
        await storage.start(stack)
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        grains = [GrainId("Account", k) for k in range(20)]
        etags = await asyncio.gather(*(storage.write(g, "s", b"v1", None) for g in grains))
        assert all(etags)
        await client.script_flush()  # as a restarted Redis would have forgotten it
        await client.set(storage.key(GID, "s"), b"a string, not a hash")
        results = await asyncio.gather(
            *(storage.write(g, "s", b"v2", e) for g, e in zip(grains, etags, strict=True)),
            storage.write(GID, "s", b"x", None),
            return_exceptions=True,
        )
        assert all(isinstance(r, str) for r in results[:-1]), results
        assert isinstance(results[-1], StorageError) and "WRONGTYPE" in str(results[-1])
        for g, etag in zip(grains, results, strict=False):
            assert await storage.read(g, "s") == StoredState(b"v2", etag)


async def test_redis_a_write_sent_again_after_it_ran_succeeds(redis_url: str) -> None:
    """The client resends a command whose reply a dropped connection lost: the
    write that ran is answered as written, not as a lost race; another write
    from the same old etag still loses."""
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(redis_url, service_id="shop")
        await storage.start(stack)
        etag = await storage.write(GID, "s", b"v1", None)
        assert etag is not None
        key = storage.key(GID, "s")
        write = (key, etag, b"v2", "00000000000000aa")
        assert await storage._write_many([write]) == [True]
        assert await storage._write_many([write]) == [True]  # resent, one call
        assert await storage._write_many([write, write]) == [True, True]  # in a batch
        assert await storage._write_many([(key, etag, b"v3", "00000000000000bb")]) == [False]
        assert await storage.read(GID, "s") == StoredState(b"v2", "00000000000000aa")
        first = (storage.key(GID, "new"), "", b"n", "00000000000000cc")
        assert await storage._write_many([first]) == [True]
        assert await storage._write_many([first]) == [True]  # a resent first write
