"""Operations that share a round trip when the store is busy.

Many activations load state at once when a silo takes over the grains of a dead
one, and many grains write at once under load. Each operation on its own costs a
round trip, a pooled connection and the client's per-command work. ``Batcher``
runs up to ``concurrency`` batches at once; a batch starts one loop step after
the operation that asked for it and takes every operation queued by then (at
most ``max_batch``), and operations that arrive while all batches are busy wait
for the next one. A lone operation never waits for a batch to fill; operations
that arrive together share one round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batcher"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class Batcher(Generic[ItemT, ResultT]):
    """``submit(item)`` through ``run(items) -> results`` (same order, same length).

    A result that is an ``Exception`` is raised to the caller of that item only.
    An exception from ``run`` itself is raised to every caller of that batch. A
    caller that is cancelled stops waiting; its batch still completes for the
    others (and an operation already sent may still take effect, as it would
    without batching).
    """

    def __init__(
        self,
        run: Callable[[Sequence[ItemT]], Awaitable[Sequence[ResultT | Exception]]],
        *,
        concurrency: int,
        max_batch: int = 256,
    ) -> None:
        self._run = run
        self._concurrency = max(1, concurrency)
        self._max_batch = max_batch
        self._queue: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._workers: set[asyncio.Task[None]] = set()

    async def submit(self, item: ItemT) -> ResultT:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultT] = loop.create_future()
        self._queue.append((item, future))
        if len(self._workers) < self._concurrency:
            self._workers.add(loop.create_task(self._drain()))
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        finally:
            # Leave the set in the same step as the last look at the queue (not in a
            # done-callback, a loop round later): an item queued in between would
            # find the set full of finished workers and wait forever.
            task = asyncio.current_task()
            if task is not None:
                self._workers.discard(task)

    async def _drain_queue(self) -> None:
        while self._queue:
            batch = [entry for entry in self._queue[: self._max_batch] if not entry[1].done()]
            del self._queue[: self._max_batch]
            if not batch:
                continue
            try:
                results = await self._run([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(
                        f"batch returned {len(results)} results for {len(batch)} items"
                    )
            except BaseException as exc:
                for _, future in batch:
                    if not future.done():
                        if isinstance(exc, asyncio.CancelledError):
                            future.cancel()
                        else:
                            future.set_exception(exc)
                if isinstance(exc, Exception):
                    continue
                raise
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
