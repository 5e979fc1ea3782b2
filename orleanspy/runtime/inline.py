"""Response timeouts for local calls that run as a turn in their caller's task.

A local call to an idle activation runs inline (``Dispatcher.invoke``): no
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

__all__ = ["InlineDeadlines", "task_of_loop"]

#: ``task_of_loop(loop)``: the task running in ``loop`` (None when none runs
#: there; with ``loop=None``, None on 3.11, the running loop's task from 3.12
#: on), a C callable on every supported version. The local-call fast path asks
#: it once per call with a loop it cached: 3.11's ``get_running_loop()`` costs a
#: ``getpid()`` system call, and ``current_task()`` is Python around it.
task_of_loop: Callable[[asyncio.AbstractEventLoop | None], asyncio.Task[Any] | None]
if sys.version_info >= (3, 12):
    task_of_loop = asyncio.current_task  # implemented in C from 3.12 on
else:
    # 3.11's current_task() is Python around the same table: read the table
    # directly. It is private to asyncio but has existed unchanged since 3.7,
    # and 3.12+ never takes this branch.
    _current_tasks: dict[asyncio.AbstractEventLoop | None, asyncio.Task[Any]] = (
        asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    )
    task_of_loop = _current_tasks.get


_EPOCHS_PER_TIMEOUT = 4


class InlineDeadlines:
    """Cancels tasks whose outermost inline call has run past ``timeout`` seconds.

    The caller (``Dispatcher.invoke``, on every local call, so with no method
    call of this class's) tracks a task's outermost inline call: for a task not
    yet in ``started`` it stores ``started[task] = epoch`` and, while
    ``sweeping`` is false, calls ``arm``; after the call it deletes the entry it
    made (nothing else removes entries), and passes whether it made one to
    ``timed_out``.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        #: The outermost inline call of each task, by the epoch it began in.
        self.started: dict[asyncio.Task[Any], int] = {}
        #: The current epoch (a quarter of the timeout each).
        self.epoch = 0
        #: Whether ``arm`` has nothing left to do (the sweeper runs, or ``close`` was called).
        self.sweeping = False
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def arm(self) -> None:
        """Start the sweeper (in the running loop) unless it runs or ``close`` was called."""
        if self._sweeper is None and not self._closed:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        self.sweeping = True

    def timed_out(self, task: asyncio.Task[Any], outermost: bool) -> bool:
        """Whether ``task``'s cancellation was this timeout's (then it is undone)."""
        if not outermost or task not in self._expired:
            return False
        self._expired.discard(task)
        return task.uncancel() == 0

    async def close(self) -> None:
        self._closed = True
        self.sweeping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep(self) -> None:
        step = self.timeout / _EPOCHS_PER_TIMEOUT
        while True:
            await asyncio.sleep(step)
            self.epoch += 1
            oldest = self.epoch - _EPOCHS_PER_TIMEOUT - 1
            for task, began in list(self.started.items()):
                if began <= oldest and task not in self._expired and not task.done():
                    self._expired.add(task)
                    task.cancel()
            # A task that ended without reaching ``timed_out`` leaves no trace.
            self._expired = {t for t in self._expired if not t.done()}
