"""Stream providers: one contract suite for memory and Redis, plus Redis faults."""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import AsyncExitStack

import pytest

from orleanspy._redis import connect
from orleanspy.errors import ClosedError, StorageUnavailableError
from orleanspy.streams.memory import InMemoryStreamProvider
from orleanspy.streams.provider import (
    StreamItem,
    StreamProvider,
    Subscription,
)
from orleanspy.streams.redis import RedisStreamProvider
from orleanspy.testing import started
from orleanspy.testing.redis_server import RedisServer
from orleanspy.testing.stream_provider import (
    STREAM_PROVIDER_CHECKS,
    Check,
    StreamFactory,
    check_stream_provider,
)

S = "test.stream"


@pytest.fixture(params=["memory", "redis", "redis_cluster"])
def factory(request: pytest.FixtureRequest) -> StreamFactory:
    """Fresh providers of one backend: the Redis ones on a private redis-server
    (or a private Redis Cluster), each under a service id of its own."""
    if request.param == "memory":
        return lambda: started(InMemoryStreamProvider())
    url = request.getfixturevalue(f"{request.param}_url")
    return lambda: started(RedisStreamProvider(url, service_id=f"svc-{uuid.uuid4().hex}"))


async def take(sub: Subscription, n: int, timeout: float = 5.0) -> list[StreamItem]:
    """The next ``n`` items of ``sub``, failing the test if they do not come in time."""
    out: list[StreamItem] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await anext(sub))
    return out


def values(items: list[StreamItem]) -> list[object]:
    return [i.item for i in items]


@pytest.mark.parametrize("check", STREAM_PROVIDER_CHECKS, ids=lambda c: c.__name__)
async def test_contract(factory: StreamFactory, check: Check) -> None:
    await check(factory)


async def test_check_stream_provider_runs_the_whole_suite_on_redis(redis_url: str) -> None:
    await check_stream_provider(
        lambda: started(RedisStreamProvider(redis_url, service_id=f"svc-{uuid.uuid4().hex}"))
    )


async def test_check_stream_provider_catches_a_provider_that_reorders() -> None:
    class Reversed(InMemoryStreamProvider):
        async def read(
            self, stream: str, *, after: str = "0", limit: int = 100
        ) -> list[StreamItem]:
            return list(reversed(await super().read(stream, after=after, limit=limit)))

    with pytest.raises(AssertionError, match="read_pages_with_after_and_limit"):
        await check_stream_provider(lambda: started(Reversed()))


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_unwinding_the_stack_ends_subscriptions_and_closes_provider(
    kind: str, request: pytest.FixtureRequest
) -> None:
    p: StreamProvider = (
        InMemoryStreamProvider()
        if kind == "memory"
        else RedisStreamProvider(request.getfixturevalue("redis_url"), service_id="svc")
    )
    with pytest.raises(RuntimeError):
        await p.publish(S, 1)
    stack = AsyncExitStack()
    await p.start(stack)
    sub = p.subscribe(S)
    await sub.__aenter__()
    task = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # let the reader start its read; closing must end it either way
    await stack.aclose()
    async with asyncio.timeout(5):
        with pytest.raises(StopAsyncIteration):
            await task
    with pytest.raises(ClosedError):
        await p.publish(S, 1)
    with pytest.raises(ClosedError):
        p.subscribe(S)


async def test_memory_history_is_bounded() -> None:
    async with InMemoryStreamProvider(max_len=3) as p:
        for n in range(5):
            await p.publish(S, n)
        assert values(await p.read(S)) == [2, 3, 4]
        async with p.subscribe(S, from_id="0") as sub:
            assert values(await take(sub, 3)) == [2, 3, 4]


async def test_redis_layout_and_approximate_trim(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        async with RedisStreamProvider(client, service_id="shop", max_len=10) as p:
            for n in range(500):
                await p.publish("orders", n)
            length = await client.xlen("orleanspy:shop:stream:{shop:stream:orders}")
            kept = await p.read("orders", limit=1000)
        assert 10 <= length < 500
        assert len(kept) == length
        assert kept[-1].item == 499
        # a client handed in is left open
        assert await client.ping()
    finally:
        await client.aclose()


async def test_redis_undecodable_item_is_skipped(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = connect(redis_url)
    try:
        async with RedisStreamProvider(client, service_id="svc") as p:
            async with p.subscribe(S, from_id="0") as sub:
                await client.xadd(p.key(S), {b"d": b"\xc1"})  # 0xc1 is never valid msgpack
                await p.publish(S, "good")
                assert values(await take(sub, 1)) == ["good"]
            assert values(await p.read(S)) == ["good"]
    finally:
        await client.aclose()
    assert "cannot decode" in caplog.text


async def test_redis_outage_publish_fails_and_subscription_resumes(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orleanspy.streams.redis")
    async with RedisStreamProvider(own_redis.url, service_id="svc") as p, p.subscribe(S) as sub:
        await p.publish(S, "before")
        assert values(await take(sub, 1)) == ["before"]
        pending = asyncio.create_task(anext(sub))

        own_redis.kill()
        with pytest.raises(StorageUnavailableError):
            await p.publish(S, "lost")
        async with asyncio.timeout(5):
            while "stream subscription interrupted" not in caplog.text:
                await asyncio.sleep(0.01)
        assert not pending.done()

        own_redis.start()
        await p.publish(S, "after")
        async with asyncio.timeout(10):
            got = await pending
        assert got.item == "after"
    assert "stream subscription resumed" in caplog.text
