"""Reads that share a round trip when the store is busy.

Many activations load state at once when a silo takes over the grains of a dead
one. Each read on its own costs a round trip, a pooled connection and the
client's per-command work. ``ReadBatcher`` runs up to ``concurrency`` lookups at
once; a lookup starts one loop step after the read that asked for it and takes
every read queued by then (at most ``max_batch``), and reads that arrive while
all lookups are busy wait for the next one. A lone read never waits for a batch
to fill; reads that arrive together share one round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

__all__ = ["ReadBatcher"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ReadBatcher(Generic[K, V]):
    """``read(key)`` through ``lookup(keys) -> {key: value}`` (missing keys: ``None``).

    At most ``concurrency`` lookups run at once, each for at most ``max_batch``
    keys. A reader that is cancelled stops waiting; the lookup it joined still
    completes for the others. A failed lookup raises its exception in every
    reader of that batch.
    """

    def __init__(
        self,
        lookup: Callable[[Sequence[K]], Awaitable[Mapping[K, V]]],
        *,
        concurrency: int,
        max_batch: int = 256,
    ) -> None:
        self._lookup = lookup
        self._concurrency = max(1, concurrency)
        self._max_batch = max_batch
        self._queue: list[tuple[K, asyncio.Future[V | None]]] = []
        self._workers: set[asyncio.Task[None]] = set()

    async def read(self, key: K) -> V | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V | None] = loop.create_future()
        self._queue.append((key, future))
        if len(self._workers) < self._concurrency:
            self._workers.add(loop.create_task(self._drain()))
        return await future

    async def _drain(self) -> None:
        try:
            await self._drain_queue()
        finally:
            # Leave the set in the same step as the last look at the queue (not in a
            # done-callback, a loop round later): a read queued in between would
            # find the set full of finished workers and wait forever.
            task = asyncio.current_task()
            if task is not None:
                self._workers.discard(task)

    async def _drain_queue(self) -> None:
        while self._queue:
            batch = [item for item in self._queue[: self._max_batch] if not item[1].done()]
            del self._queue[: self._max_batch]
            if not batch:
                continue
            try:
                found = await self._lookup([key for key, _ in batch])
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
            for key, future in batch:
                if not future.done():
                    future.set_result(found.get(key))
