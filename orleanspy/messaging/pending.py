"""Calls waiting for their response, and their response timeout.

Every call of one caller has the same response timeout, so deadlines arrive in
the order calls were made: a FIFO of deadlines and one sweeper task replace a
timer per call (``asyncio.timeout`` costs a heap insert and a cancel on every
call, a measurable share of a grain call).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from orleanspy.errors import GrainCallTimeoutError

__all__ = ["PendingCalls"]

T = TypeVar("T")
K = TypeVar("K")


class PendingCalls(Generic[T]):
    """Futures for outstanding calls, keyed by message id, failed after ``timeout``
    seconds (``GrainCallTimeoutError``) by one sweeper task.

    ``tag`` values (e.g. which gateway a call went through) let ``fail_where``
    fail a subset. The sweeper starts with the first call and stops on ``close``.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._futures: dict[int, tuple[asyncio.Future[T], object]] = {}
        self._deadlines: deque[tuple[float, int, object, str]] = deque()
        self._wakeup = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._futures)

    def add(
        self, msg_id: int, target: object, method: str, tag: object = None
    ) -> asyncio.Future[T]:
        """A future for call ``msg_id``; a timeout error names it ``target.method``
        (formatted only then: most calls never time out)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._futures[msg_id] = (fut, tag)
        self._deadlines.append((loop.time() + self.timeout, msg_id, target, method))
        if self._sweeper is None and not self._closed:
            self._sweeper = loop.create_task(self._sweep())
        elif len(self._deadlines) == 1:
            self._wakeup.set()
        return fut

    def resolve(self, msg_id: int, value: T) -> bool:
        """Complete call ``msg_id``; ``False`` if it is no longer waiting."""
        entry = self._futures.pop(msg_id, None)
        if entry is None or entry[0].done():
            return False
        entry[0].set_result(value)
        return True

    def retag(self, msg_id: int, tag: object) -> None:
        """Change the tag of a waiting call (it was sent another way)."""
        entry = self._futures.get(msg_id)
        if entry is not None:
            self._futures[msg_id] = (entry[0], tag)

    def discard(self, msg_id: int) -> None:
        """Forget call ``msg_id`` (its caller went away)."""
        self._futures.pop(msg_id, None)

    def fail_where(self, predicate: Callable[[object], bool], error: Exception) -> int:
        """Fail every waiting call whose tag satisfies ``predicate``."""
        failed = [k for k, (_f, tag) in self._futures.items() if predicate(tag)]
        for msg_id in failed:
            fut, _ = self._futures.pop(msg_id)
            if not fut.done():
                fut.set_exception(error)
        return len(failed)

    async def close(self, error: Exception) -> None:
        """Fail everything still waiting and stop the sweeper."""
        self._closed = True
        self.fail_where(lambda _tag: True, error)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        futures = self._futures
        while True:
            # Answered calls leave their deadlines behind: drop those at the
            # head without waiting for their time, so the sweeper sleeps until
            # the oldest call still waiting. (Waking at each deadline cost a
            # loop wake-up per call, a timeout later, to a steady caller.)
            while deadlines and deadlines[0][1] not in futures:
                deadlines.popleft()
            if not deadlines:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            deadline, msg_id, target, method = deadlines[0]
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            deadlines.popleft()
            entry = futures.pop(msg_id, None)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(
                    GrainCallTimeoutError(
                        f"{target}.{method}: no response within {self.timeout:g}s"
                    )
                )
