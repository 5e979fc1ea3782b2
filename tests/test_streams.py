"""Stream providers: one contract suite for memory and Redis, plus Redis faults."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime

import pytest

from orleanspy._redis import connect
from orleanspy.errors import ClosedError, SerializationError, StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import MissedReminder
from orleanspy.streams.memory import InMemoryStreamProvider
from orleanspy.streams.provider import (
    MISSED_REMINDERS_STREAM,
    StreamItem,
    StreamProvider,
    Subscription,
)
from orleanspy.streams.redis import RedisStreamProvider
from orleanspy.testing.redis_server import RedisServer

S = "test.stream"


@pytest.fixture(params=["memory", "redis"])
async def provider(request: pytest.FixtureRequest) -> AsyncIterator[StreamProvider]:
    p: StreamProvider
    if request.param == "memory":
        p = InMemoryStreamProvider()
    else:
        p = RedisStreamProvider(request.getfixturevalue("redis_url"), service_id="svc")
    async with AsyncExitStack() as stack:
        await p.start(stack)
        yield p


async def take(sub: Subscription, n: int, timeout: float = 5.0) -> list[StreamItem]:
    """The next ``n`` items of ``sub``, failing the test if they do not come in time."""
    out: list[StreamItem] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            out.append(await anext(sub))
    return out


def values(items: list[StreamItem]) -> list[object]:
    return [i.item for i in items]


async def test_provider_implements_the_protocol(provider: StreamProvider) -> None:
    assert isinstance(provider, StreamProvider)
    async with provider.subscribe(S) as sub:
        assert isinstance(sub, Subscription)


async def test_subscriber_sees_new_items_in_publish_order(provider: StreamProvider) -> None:
    await provider.publish(S, "before")
    async with provider.subscribe(S) as sub:
        ids = [await provider.publish(S, n) for n in range(5)]
        got = await take(sub, 5)
    assert values(got) == [0, 1, 2, 3, 4]
    assert [i.id for i in got] == ids
    assert {i.stream for i in got} == {S}


async def test_two_subscribers_each_see_every_item(provider: StreamProvider) -> None:
    async with provider.subscribe(S) as a, provider.subscribe(S) as b:
        for n in range(3):
            await provider.publish(S, {"n": n})
        got_a, got_b = await asyncio.gather(take(a, 3), take(b, 3))
    assert values(got_a) == values(got_b) == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_subscriber_ignores_other_streams(provider: StreamProvider) -> None:
    async with provider.subscribe(S) as sub:
        await provider.publish("other", "x")
        await provider.publish(S, "mine")
        assert values(await take(sub, 1)) == ["mine"]


async def test_from_id_replays_history_after_it_then_follows(provider: StreamProvider) -> None:
    ids = [await provider.publish(S, name) for name in "abc"]
    async with provider.subscribe(S, from_id=ids[0]) as sub:
        assert values(await take(sub, 2)) == ["b", "c"]
        await provider.publish(S, "d")
        assert values(await take(sub, 1)) == ["d"]
    async with provider.subscribe(S, from_id="0") as everything:
        assert values(await take(everything, 4)) == ["a", "b", "c", "d"]


async def test_read_pages_with_after_and_limit(provider: StreamProvider) -> None:
    for n in range(10):
        await provider.publish(S, n)
    first = await provider.read(S, limit=4)
    second = await provider.read(S, after=first[-1].id, limit=4)
    third = await provider.read(S, after=second[-1].id, limit=4)
    assert values(first) == [0, 1, 2, 3]
    assert values(second) == [4, 5, 6, 7]
    assert values(third) == [8, 9]
    assert await provider.read(S, after=third[-1].id) == []
    assert await provider.read("never.written") == []


async def test_read_rejects_bad_arguments(provider: StreamProvider) -> None:
    with pytest.raises(ValueError):
        await provider.read(S, after="not-an-id")
    with pytest.raises(ValueError):
        await provider.read(S, limit=0)
    with pytest.raises(ValueError):
        provider.subscribe(S, from_id="nope")


async def test_missed_reminder_round_trips(provider: StreamProvider) -> None:
    at = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    event = MissedReminder(
        service_id="svc",
        grain_id=GrainId("StatsGrain", "a"),
        name="tick",
        scheduled=at,
        detected_at=at.replace(minute=5),
        missed_ticks=5,
        next_due=at.replace(minute=6),
    )
    async with provider.subscribe(MISSED_REMINDERS_STREAM) as sub:
        await provider.publish(MISSED_REMINDERS_STREAM, event)
        (got,) = await take(sub, 1)
    assert got.item == event
    assert got.item is not event
    (stored,) = await provider.read(MISSED_REMINDERS_STREAM)
    assert stored.item == event


async def test_unserializable_item_raises_and_appends_nothing(provider: StreamProvider) -> None:
    with pytest.raises(SerializationError):
        await provider.publish(S, object())
    assert await provider.read(S) == []


async def test_aclose_from_another_task_ends_iteration(provider: StreamProvider) -> None:
    sub = provider.subscribe(S)
    await sub.__aenter__()
    seen: list[object] = []

    async def consume() -> None:
        async for item in sub:
            seen.append(item.item)

    task = asyncio.create_task(consume())
    await provider.publish(S, 1)
    async with asyncio.timeout(5):
        while not seen:
            await asyncio.sleep(0.005)
    await sub.aclose()
    async with asyncio.timeout(5):
        await task  # ends normally: StopAsyncIteration, not an error
    assert seen == [1]
    with pytest.raises(StopAsyncIteration):
        await anext(sub)


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
