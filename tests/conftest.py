"""Shared fixtures: a private redis-server per test session, flushed per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orleanspy.testing.redis_server import RedisServer


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


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server for this test alone, for tests that kill and restart it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
