"""Response timeouts for local calls that run as a turn in their caller's task.

A local call to an idle activation runs inline (``Activation.call_inline``): no
message, no response future, no task. Its response timeout cannot fail a future,
so it cancels the caller's task instead, and the call raises
``GrainCallTimeoutError`` as a queued call would.

Per call this costs a dict insert and delete, and only for a task's outermost
inline call: calls nested inside it (a grain calling another local grain) start
later, so their deadlines come after the outer one's, whose cancellation ends
them too. No clock is read per call: a sweeper counts epochs of a quarter of the
timeout and cancels tasks whose outermost call began five epochs ago, so a call
times out after between 1 and 1.25 times the response timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["InlineDeadlines", "running_task"]

running_task: Callable[[], asyncio.Task[Any] | None]
if sys.version_info >= (3, 12):
    running_task = asyncio.current_task  # implemented in C from 3.12 on
else:
    # 3.11's current_task() is Python around the same table (about 0.2 us, a
    # tenth of a local call): read the table directly. It is private to asyncio
    # but has existed unchanged since 3.7, and 3.12+ never takes this branch.
    _current_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
        asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    )
    _running_loop = asyncio.get_running_loop

    def running_task() -> asyncio.Task[Any] | None:
        """``asyncio.current_task()``, cheaper on 3.11."""
        return _current_tasks.get(_running_loop())


_EPOCHS_PER_TIMEOUT = 4


class InlineDeadlines:
    """Cancels tasks whose outermost inline call has run past ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._running: dict[asyncio.Task[Any], int] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._epoch = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def begin(self, task: asyncio.Task[Any]) -> bool:
        """Track the call running in ``task``; ``True`` if it is the task's
        outermost inline call (then pass that to ``end`` and ``timed_out``)."""
        running = self._running
        if task in running:
            return False
        running[task] = self._epoch
        if self._sweeper is None and not self._closed:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return True

    def end(self, task: asyncio.Task[Any], outermost: bool) -> None:
        if outermost:
            self._running.pop(task, None)

    def timed_out(self, task: asyncio.Task[Any], outermost: bool) -> bool:
        """Whether ``task``'s cancellation was this timeout's (then it is undone)."""
        if not outermost or task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() == 0

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep(self) -> None:
        step = self.timeout / _EPOCHS_PER_TIMEOUT
        while True:
            await asyncio.sleep(step)
            self._epoch += 1
            oldest = self._epoch - _EPOCHS_PER_TIMEOUT - 1
            for task, began in list(self._running.items()):
                if began <= oldest and task not in self._expired and not task.done():
                    self._expired.add(task)
                    task.cancel()
            # A task that ended without reaching ``timed_out`` leaves no trace.
            self._expired = {t for t in self._expired if not t.done()}
