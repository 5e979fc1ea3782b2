"""Shared fixtures: the grain registry as collection left it, for every test; a
private redis-server per test session, flushed per test; a
private Redis Cluster (3 masters, a replica each) and a Sentinel set-up per test
session, started on first use; and a private PostgreSQL database per test
session, emptied per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orleanspy import grain as grain_module
from orleanspy.testing.postgres import PostgresDatabase
from orleanspy.testing.redis_server import RedisClusterServer, RedisSentinelSet, RedisServer


@pytest.fixture(autouse=True)
def _grain_registry_as_collected() -> Iterator[None]:
    """Undo the grain classes a test registered (a module it imported, such as the
    demo): a silo that hosts every registered class would otherwise meet them, and
    their declared reminders, in whichever test its worker runs next."""
    before = dict(grain_module._registry)
    yield
    grain_module._registry.clear()
    grain_module._registry.update(before)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of our own on a free loopback port (never the shared 6379)."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The private server's URL, emptied before the test (restarted if a test killed it)."""
    if not redis_server.running:
        redis_server.start()
    redis_server.flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """A Redis Cluster of our own: 3 masters with a replica each, on free loopback
    ports, node timeout 1 s. Tests that kill a node use ``own_redis_cluster``."""
    cluster = RedisClusterServer()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterServer) -> str:
    """A plain ``redis://`` URL naming one node of the session's cluster (cluster
    mode is detected), emptied before the test."""
    redis_cluster.wait_healthy()
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def own_redis_cluster() -> Iterator[RedisClusterServer]:
    """A Redis Cluster for this test alone, for tests that kill nodes."""
    cluster = RedisClusterServer()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinelSet]:
    """A primary, a replica and 3 sentinels of our own (quorum 2)."""
    sentinels = RedisSentinelSet()
    try:
        sentinels.start()
        yield sentinels
    finally:
        sentinels.close()


@pytest.fixture
def redis_sentinel_url(redis_sentinel: RedisSentinelSet) -> str:
    """The ``redis+sentinel://`` URL of the session's set-up, emptied before the test."""
    redis_sentinel.wait_healthy()
    redis_sentinel.flushall()
    return redis_sentinel.url


@pytest.fixture
def own_redis_sentinel() -> Iterator[RedisSentinelSet]:
    """A Sentinel set-up for this test alone, for tests that kill the primary."""
    sentinels = RedisSentinelSet()
    try:
        sentinels.start()
        yield sentinels
    finally:
        sentinels.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server for this test alone, for tests that kill and restart it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, append-only with fsync: a kill (or a freeze
    past the socket timeout) is an outage, not a data loss. ``close`` thaws a frozen
    server before stopping it."""
    server = RedisServer(appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[PostgresDatabase]:
    """A database of this test session's own on the machine's PostgreSQL, dropped after."""
    with PostgresDatabase() as database:
        yield database


@pytest.fixture
def postgres_url(postgres_database: PostgresDatabase) -> str:
    """The private database's URL, with an empty ``public`` schema for each test."""
    postgres_database.reset()
    return postgres_database.url
