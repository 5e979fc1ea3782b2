"""``Batcher``: operations beyond the concurrency limit share a batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from orleanspy.storage._batch import Batcher


class _Store:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None
        self.running = 0
        self.most_running = 0

    async def lookup(self, keys: Sequence[int]) -> list[str | Exception | None]:
        self.calls.append(list(keys))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        if self.fail is not None:
            raise self.fail
        return [f"v{k}" if k % 2 == 0 else (KeyError(k) if k % 7 == 0 else None) for k in keys]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_items_beyond_the_limit_share_batches() -> None:
    store = _Store()
    batcher = Batcher(store.lookup, concurrency=2, max_batch=10)
    readers = [asyncio.ensure_future(batcher.submit(k)) for k in range(25)]
    await _settle()
    store.release.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    for k, result in enumerate(results):
        if k % 2 == 0:
            assert result == f"v{k}"
        elif k % 7 == 0:  # an error result reaches only its own caller
            assert isinstance(result, KeyError) and result.args == (k,)
        else:
            assert result is None
    assert store.most_running <= 2
    assert sorted(k for call in store.calls for k in call) == list(range(25))
    assert all(len(call) <= 10 for call in store.calls)
    assert len(store.calls) < 25


async def test_a_lone_read_does_not_wait_for_a_batch() -> None:
    store = _Store()
    store.release.set()
    batcher = Batcher(store.lookup, concurrency=4)
    assert await batcher.submit(2) == "v2"
    assert store.calls == [[2]]


async def test_a_failed_lookup_fails_every_reader_of_it_and_later_reads_work() -> None:
    store = _Store()
    store.fail = ConnectionError("down")
    batcher = Batcher(store.lookup, concurrency=1)
    readers = [asyncio.ensure_future(batcher.submit(k)) for k in range(5)]
    await _settle()
    store.release.set()
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    store.fail = None
    assert await batcher.submit(4) == "v4"


async def test_a_cancelled_reader_leaves_the_others_their_results() -> None:
    store = _Store()
    batcher = Batcher(store.lookup, concurrency=1)
    readers = [asyncio.ensure_future(batcher.submit(k)) for k in (0, 2, 4)]
    await _settle()
    readers[1].cancel()
    store.release.set()
    assert await readers[0] == "v0"
    assert await readers[2] == "v4"
    with pytest.raises(asyncio.CancelledError):
        await readers[1]


async def test_a_read_queued_as_the_last_worker_finishes_is_served() -> None:
    store = _Store()
    store.release.set()
    batcher = Batcher(store.lookup, concurrency=1)

    async def reader() -> list[str | None]:
        # Each result wakes this task in the loop round its worker ends, so every
        # next read is queued before a done-callback of that worker could run.
        return [await batcher.submit(k) for k in range(0, 40, 2)]

    assert await asyncio.wait_for(reader(), timeout=5) == [f"v{k}" for k in range(0, 40, 2)]


async def test_a_batch_with_the_wrong_number_of_results_fails_its_callers() -> None:
    async def short(items: object) -> list[str]:
        return []

    batcher: Batcher[int, str] = Batcher(short, concurrency=1)
    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        await batcher.submit(1)
