"""``check_stream_provider``: the conformance suite for ``StreamProvider`` backends.

A provider author proves a backend with ``await check_stream_provider(factory)``,
where each call of ``factory()`` returns an async context manager yielding a
new, started provider over streams nobody else writes (for a shared server, a
fresh service id per call), the shape every kit in ``orleanspy.testing`` takes.
Test suites that want one test case per check parametrise over
``STREAM_PROVIDER_CHECKS`` and await ``check(factory)``.

The checks cover the contract in ``orleanspy.streams.provider``: order and ids,
fan-out to every subscriber, replay from an id, paging, argument errors,
serialization (nothing appended on failure, readers never share the object)
and closing a subscription from another task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from orleanspy.errors import SerializationError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import MissedReminder
from orleanspy.streams.provider import (
    MISSED_REMINDERS_STREAM,
    StreamItem,
    StreamProvider,
    Subscription,
)
from orleanspy.testing._kit import ProviderFactory, on_one_provider, run_checks

__all__ = ["STREAM_PROVIDER_CHECKS", "Check", "StreamFactory", "check_stream_provider"]

StreamFactory = ProviderFactory[StreamProvider]
Check = Callable[[StreamFactory], Awaitable[None]]

S = "kit.stream"
_TIMEOUT = 5.0


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


async def _take(sub: Subscription, n: int) -> list[StreamItem]:
    """The next ``n`` items of ``sub``; fails if they do not come within the deadline."""
    out: list[StreamItem] = []
    try:
        async with asyncio.timeout(_TIMEOUT):
            while len(out) < n:
                out.append(await anext(sub))
    except TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} items within {_TIMEOUT}s") from None
    return out


def _values(items: list[StreamItem]) -> list[object]:
    return [i.item for i in items]


async def _raises(exc_type: type[BaseException], action: Callable[[], Any], what: str) -> None:
    try:
        result = action()
        if asyncio.iscoroutine(result):
            await result
    except exc_type:
        return
    raise AssertionError(f"{what}: expected {exc_type.__name__}")


async def check_implements_the_protocol(provider: StreamProvider) -> None:
    _expect(isinstance(provider, StreamProvider), "not a StreamProvider")
    async with provider.subscribe(S) as sub:
        _expect(isinstance(sub, Subscription), "subscribe() returned no Subscription")


async def check_subscriber_sees_new_items_in_publish_order(provider: StreamProvider) -> None:
    await provider.publish(S, "before")
    async with provider.subscribe(S) as sub:
        ids = [await provider.publish(S, n) for n in range(5)]
        got = await _take(sub, 5)
    _expect(_values(got) == [0, 1, 2, 3, 4], f"items out of order or extra: {_values(got)}")
    _expect([i.id for i in got] == ids, "delivered ids differ from the published ones")
    _expect({i.stream for i in got} == {S}, "items name another stream")


async def check_two_subscribers_each_see_every_item(provider: StreamProvider) -> None:
    async with provider.subscribe(S) as a, provider.subscribe(S) as b:
        for n in range(3):
            await provider.publish(S, {"n": n})
        got_a, got_b = await asyncio.gather(_take(a, 3), _take(b, 3))
    want = [{"n": 0}, {"n": 1}, {"n": 2}]
    _expect(_values(got_a) == _values(got_b) == want, "a subscriber missed items")


async def check_subscriber_ignores_other_streams(provider: StreamProvider) -> None:
    async with provider.subscribe(S) as sub:
        await provider.publish("kit.other", "x")
        await provider.publish(S, "mine")
        _expect(_values(await _take(sub, 1)) == ["mine"], "an item of another stream came")


async def check_from_id_replays_history_after_it_then_follows(provider: StreamProvider) -> None:
    ids = [await provider.publish(S, name) for name in "abc"]
    async with provider.subscribe(S, from_id=ids[0]) as sub:
        _expect(_values(await _take(sub, 2)) == ["b", "c"], "replay after an id")
        await provider.publish(S, "d")
        _expect(_values(await _take(sub, 1)) == ["d"], "following after the replay")
    async with provider.subscribe(S, from_id="0") as everything:
        got = _values(await _take(everything, 4))
        _expect(got == ["a", "b", "c", "d"], f"replay from '0': {got}")


async def check_read_pages_with_after_and_limit(provider: StreamProvider) -> None:
    for n in range(10):
        await provider.publish(S, n)
    first = await provider.read(S, limit=4)
    second = await provider.read(S, after=first[-1].id, limit=4)
    third = await provider.read(S, after=second[-1].id, limit=4)
    _expect(_values(first) == [0, 1, 2, 3], f"first page {_values(first)}")
    _expect(_values(second) == [4, 5, 6, 7], f"second page {_values(second)}")
    _expect(_values(third) == [8, 9], f"last page {_values(third)}")
    _expect(await provider.read(S, after=third[-1].id) == [], "read past the end")
    _expect(await provider.read("kit.never.written") == [], "read of an unknown stream")


async def check_read_rejects_bad_arguments(provider: StreamProvider) -> None:
    await _raises(ValueError, lambda: provider.read(S, after="not-an-id"), "malformed id")
    await _raises(ValueError, lambda: provider.read(S, limit=0), "limit 0")
    await _raises(ValueError, lambda: provider.subscribe(S, from_id="nope"), "bad from_id")


async def check_missed_reminder_round_trips(provider: StreamProvider) -> None:
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
        (got,) = await _take(sub, 1)
    _expect(got.item == event, f"subscriber got {got.item!r}")
    _expect(got.item is not event, "the subscriber shares the publisher's object")
    (stored,) = await provider.read(MISSED_REMINDERS_STREAM)
    _expect(stored.item == event, f"read got {stored.item!r}")


async def check_unserializable_item_raises_and_appends_nothing(provider: StreamProvider) -> None:
    await _raises(SerializationError, lambda: provider.publish(S, object()), "publish(object())")
    _expect(await provider.read(S) == [], "a failed publish appended an item")


async def check_aclose_from_another_task_ends_iteration(provider: StreamProvider) -> None:
    sub = provider.subscribe(S)
    await sub.__aenter__()
    seen: list[object] = []

    async def consume() -> None:
        async for item in sub:
            seen.append(item.item)

    task = asyncio.create_task(consume())
    try:
        await provider.publish(S, 1)
        async with asyncio.timeout(_TIMEOUT):
            while not seen:
                await asyncio.sleep(0.005)
        await sub.aclose()
        async with asyncio.timeout(_TIMEOUT):
            await task  # ends normally: StopAsyncIteration, not an error
    finally:
        task.cancel()
        await sub.aclose()
    _expect(seen == [1], f"consumer saw {seen}")
    await _raises(StopAsyncIteration, lambda: anext(sub), "anext after aclose")


STREAM_PROVIDER_CHECKS: tuple[Check, ...] = tuple(
    on_one_provider(check)
    for check in (
        check_implements_the_protocol,
        check_subscriber_sees_new_items_in_publish_order,
        check_two_subscribers_each_see_every_item,
        check_subscriber_ignores_other_streams,
        check_from_id_replays_history_after_it_then_follows,
        check_read_pages_with_after_and_limit,
        check_read_rejects_bad_arguments,
        check_missed_reminder_round_trips,
        check_unserializable_item_raises_and_appends_nothing,
        check_aclose_from_another_task_ends_iteration,
    )
)
"""Every check, each taking the factory and running on one fresh, started provider."""


async def check_stream_provider(factory: StreamFactory) -> None:
    """Run every check, each on a fresh provider from ``factory``. Raises
    ``AssertionError`` naming the first check that fails and what it saw."""
    await run_checks(STREAM_PROVIDER_CHECKS, factory)
