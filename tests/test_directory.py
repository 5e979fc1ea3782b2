from __future__ import annotations

import sys
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack

import pytest

from orleanspy import _redis
from orleanspy.directory.cached import CachedDirectory
from orleanspy.directory.memory import InMemoryGrainDirectory
from orleanspy.directory.redis import RedisGrainDirectory
from orleanspy.directory.table import ActivationAddress, GrainDirectory
from orleanspy.errors import ConfigurationError, StorageError, StorageUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.testing import started
from orleanspy.testing.grain_directory import (
    GRAIN_DIRECTORY_CHECKS,
    Check,
    DirectoryFactory,
    check_grain_directory,
)
from orleanspy.testing.redis_server import RedisServer

A = SiloAddress("127.0.0.1", 11111, 1)
B = SiloAddress("127.0.0.1", 11112, 1)


def addr(silo: SiloAddress = A) -> ActivationAddress:
    return ActivationAddress(silo, uuid.uuid4().hex)


def memory() -> AbstractAsyncContextManager[GrainDirectory]:
    return started(InMemoryGrainDirectory())


def cached_memory() -> AbstractAsyncContextManager[GrainDirectory]:
    return started(CachedDirectory(InMemoryGrainDirectory(), max_size=50))


def redis_factory(url: str, *, cached: bool = False) -> DirectoryFactory:
    def factory() -> AbstractAsyncContextManager[GrainDirectory]:
        inner = RedisGrainDirectory(
            url, cluster_id="test", service_id=f"svc-{uuid.uuid4().hex[:8]}", shards=16
        )
        return started(CachedDirectory(inner) if cached else inner)

    return factory


BACKENDS: dict[str, Callable[[str], DirectoryFactory]] = {
    "memory": lambda url: memory,
    "cached-memory": lambda url: cached_memory,
    "redis": redis_factory,
    "cached-redis": lambda url: redis_factory(url, cached=True),
    "redis_cluster": redis_factory,
}


@pytest.fixture(params=list(BACKENDS))
def factory(request: pytest.FixtureRequest) -> DirectoryFactory:
    make = BACKENDS[request.param]
    if request.param == "redis_cluster":
        return make(request.getfixturevalue("redis_cluster_url"))
    if "redis" in request.param:
        return make(request.getfixturevalue("redis_url"))
    return make("")


@pytest.mark.parametrize("check", GRAIN_DIRECTORY_CHECKS, ids=lambda c: c.__name__)
async def test_directory_contract(check: Check, factory: DirectoryFactory) -> None:
    await check(factory)


async def test_check_grain_directory_runs_the_whole_suite() -> None:
    await check_grain_directory(memory)


async def test_contract_suite_catches_a_last_writer_wins_directory() -> None:
    class LastWriterWins(InMemoryGrainDirectory):
        async def register(
            self, grain_id: GrainId, address: ActivationAddress
        ) -> ActivationAddress:
            self._entries[grain_id] = address
            return address

    with pytest.raises(AssertionError, match="first_writer_wins"):
        await check_grain_directory(lambda: started(LastWriterWins()))


# --- in-memory specifics ----------------------------------------------------------


async def test_memory_unregister_silo_is_exact() -> None:
    d = InMemoryGrainDirectory()
    for i in range(5):
        await d.register(GrainId("G", i), addr(A))
    await d.register(GrainId("G", "b"), addr(B))
    assert await d.unregister_silo(A) == 5
    assert await d.unregister_silo(A) == 0
    assert len(d) == 1


# --- the cache ------------------------------------------------------------------------


class CountingDirectory(InMemoryGrainDirectory):
    """Counts the calls that would be I/O on a remote backend."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
        self.calls["lookup"] += 1
        return await super().lookup(grain_id)

    async def register(self, grain_id: GrainId, address: ActivationAddress) -> ActivationAddress:
        self.calls["register"] += 1
        return await super().register(grain_id, address)


async def test_cache_hit_does_no_io() -> None:
    inner = CountingDirectory()
    d = CachedDirectory(inner)
    g, a = GrainId("G", 1), addr()
    await d.register(g, a)
    for _ in range(10):
        assert await d.lookup(g) == a
    assert inner.calls["lookup"] == 0

    other = GrainId("G", 2)
    await inner.register(other, a)
    assert await d.lookup(other) == a
    assert await d.lookup(other) == a
    assert inner.calls["lookup"] == 1


async def test_cache_does_not_remember_misses() -> None:
    inner = CountingDirectory()
    d = CachedDirectory(inner)
    g, a = GrainId("G", 1), addr()
    assert await d.lookup(g) is None
    await inner.register(g, a)  # registered by another silo, behind the cache's back
    assert await d.lookup(g) == a


async def test_cache_register_caches_the_winner_not_the_loser() -> None:
    inner = CountingDirectory()
    d = CachedDirectory(inner)
    g, winner, loser = GrainId("G", 1), addr(A), addr(B)
    await inner.register(g, winner)
    assert await d.register(g, loser) == winner
    assert await d.lookup(g) == winner
    assert inner.calls["lookup"] == 0


async def test_cache_invalidate_and_invalidate_silo() -> None:
    inner = CountingDirectory()
    d = CachedDirectory(inner)
    on_a = [GrainId("G", i) for i in range(3)]
    on_b = GrainId("G", "b")
    for g in on_a:
        await d.register(g, addr(A))
    await d.register(on_b, addr(B))
    assert d.invalidate_silo(A) == 3
    assert len(d) == 1
    d.invalidate(on_b)
    assert len(d) == 0
    await d.lookup(on_a[0])
    assert inner.calls["lookup"] == 1


async def test_cache_unregister_drops_the_cached_entry() -> None:
    d = CachedDirectory(InMemoryGrainDirectory())
    g, a = GrainId("G", 1), addr()
    await d.register(g, a)
    assert await d.unregister(g, a) is True
    assert await d.lookup(g) is None
    assert len(d) == 0


async def test_cache_unregister_silo_forwards_and_drops() -> None:
    d = CachedDirectory(InMemoryGrainDirectory())
    await d.register(GrainId("G", 1), addr(A))
    await d.register(GrainId("G", 2), addr(B))
    assert await d.unregister_silo(A) == 1
    assert len(d) == 1
    assert await d.lookup(GrainId("G", 1)) is None


async def test_cache_evicts_least_recently_used() -> None:
    inner = CountingDirectory()
    d = CachedDirectory(inner, max_size=2)
    g1, g2, g3 = GrainId("G", 1), GrainId("G", 2), GrainId("G", 3)
    for g in (g1, g2):
        await d.register(g, addr())
    await d.lookup(g1)  # g1 is now the most recent; g2 goes next
    await d.register(g3, addr())
    assert len(d) == 2
    await d.lookup(g1)
    assert inner.calls["lookup"] == 0
    await d.lookup(g2)
    assert inner.calls["lookup"] == 1


async def test_cache_lookup_racing_an_invalidation_is_not_cached() -> None:
    class SlowInner(InMemoryGrainDirectory):
        cache: CachedDirectory

        async def lookup(self, grain_id: GrainId) -> ActivationAddress | None:
            found = await super().lookup(grain_id)
            self.cache.invalidate(grain_id)  # an unregister lands while the read is in flight
            return found

    inner = SlowInner()
    d = CachedDirectory(inner)
    inner.cache = d
    g = GrainId("G", 1)
    await inner.register(g, addr())
    assert await d.lookup(g) is not None
    assert len(d) == 0


def test_cache_rejects_non_positive_size() -> None:
    with pytest.raises(ValueError, match="max_size"):
        CachedDirectory(InMemoryGrainDirectory(), max_size=0)


# --- Redis specifics ---------------------------------------------------------------


async def test_redis_layout_and_sharding(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        d = RedisGrainDirectory(redis_url, cluster_id="dev", service_id="shop", shards=256)
        await d.start(stack)
        g, a = GrainId("G", "k"), addr()
        await d.register(g, a)
        shard = g.uniform_hash() >> 24  # 256 shards: the top 8 bits
        assert d.shard_of(g) == shard
        key = f"orleanspy:shop:dir:{{shop:dev:dir:{shard}}}"
        assert d.key_of(shard) == key
        client = _redis.connect(redis_url)
        stack.push_async_callback(client.aclose)
        # The state's key, and the schema versions of the Redis providers.
        assert sorted(await client.keys("*")) == sorted([key.encode(), b"orleanspy:schema"])
        assert await client.hkeys(key) == [g.canonical.encode()]


async def test_redis_clusters_of_one_service_keep_separate_directories(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        blue = RedisGrainDirectory(redis_url, cluster_id="blue", service_id="shop")
        green = RedisGrainDirectory(redis_url, cluster_id="green", service_id="shop")
        await blue.start(stack)
        await green.start(stack)
        g = GrainId("G", "k")
        a, b = addr(), addr()
        assert await blue.register(g, a) == a
        assert await green.register(g, b) == b  # not blue's winner
        assert await blue.lookup(g) == a
        assert await green.lookup(g) == b


async def test_redis_uses_a_given_client_without_closing_it(redis_url: str) -> None:
    client = _redis.connect(redis_url)
    try:
        async with AsyncExitStack() as stack:
            d = RedisGrainDirectory(client, cluster_id="dev", service_id="shop")
            await d.start(stack)
            await d.register(GrainId("G", 1), addr())
        assert await client.ping() is True  # still usable after the directory's stack closed
    finally:
        await client.aclose()


async def test_redis_unregister_silo_is_a_documented_noop(redis_url: str) -> None:
    async with redis_factory(redis_url)() as d:
        g, a = GrainId("G", 1), addr(A)
        await d.register(g, a)
        assert await d.unregister_silo(A) == 0
        assert await d.lookup(g) == a


async def test_redis_malformed_entry_is_a_storage_error(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        d = RedisGrainDirectory(redis_url, cluster_id="dev", service_id="shop")
        await d.start(stack)
        g = GrainId("G", 1)
        client = _redis.connect(redis_url)
        stack.push_async_callback(client.aclose)
        await client.hset(d.key_of(d.shard_of(g)), g.canonical, b"\xc1garbage")
        with pytest.raises(StorageError):
            await d.lookup(g)


async def test_redis_killed_raises_storage_unavailable(own_redis: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        d = RedisGrainDirectory(own_redis.url, cluster_id="dev", service_id="shop")
        await d.start(stack)
        g, a = GrainId("G", 1), addr()
        await d.register(g, a)
        own_redis.kill()
        with pytest.raises(StorageUnavailableError):
            await d.lookup(g)
        with pytest.raises(StorageUnavailableError):
            await d.register(GrainId("G", 2), a)
        with pytest.raises(StorageUnavailableError):
            await d.unregister(g, a)
        own_redis.start()
        # The server came back empty (killed, no persistence); scripts reload on demand.
        assert await d.lookup(g) is None
        assert await d.register(g, a) == a
        assert await d.unregister(g, a) is True


async def test_redis_start_fails_when_unreachable(own_redis: RedisServer) -> None:
    own_redis.kill()
    async with AsyncExitStack() as stack:
        d = RedisGrainDirectory(own_redis.url, cluster_id="dev", service_id="shop")
        with pytest.raises(StorageUnavailableError):
            await d.start(stack)


def test_redis_rejects_bad_shard_count() -> None:
    with pytest.raises(ConfigurationError, match="shards"):
        RedisGrainDirectory("redis://127.0.0.1:1/0", cluster_id="c", service_id="s", shards=0)


def test_memory_directory_module_does_not_load_redis() -> None:
    import subprocess

    code = "import sys, orleanspy.directory; print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
