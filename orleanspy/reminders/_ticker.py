"""The one sleeper.

There is no timer per reminder: a single task sleeps until the heap's head is
due (or until it is woken because a new head arrived), re-reads the clock, and
hands every row whose ``next_due <= now`` to the lanes. Timers may fire a
little early (uvloop: ~1 ms), so waking is only a hint; the clock decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from orleanspy.clock import Clock
from orleanspy.reminders._window import DueWindow, Row

__all__ = ["Ticker", "sleep_or_wake"]


async def sleep_or_wake(clock: Clock, deadline: datetime | None, wake: asyncio.Event) -> None:
    """Return when ``clock`` reaches ``deadline`` (never, if ``None``) or ``wake`` is set.

    Does not clear ``wake``; the caller does, before it looks at its state again.
    """
    if wake.is_set():
        return
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(wake.wait())]
    if deadline is not None:
        waiters.append(asyncio.ensure_future(clock.sleep_until(deadline)))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        # Reap the helpers so none outlives this call (no "pending task" at exit).
        await asyncio.gather(*waiters, return_exceptions=True)


class Ticker:
    """Moves due rows from the window to ``on_due``; see the module docstring."""

    def __init__(
        self, clock: Clock, window: DueWindow, on_due: Callable[[list[Row]], None]
    ) -> None:
        self._clock = clock
        self._window = window
        self._on_due = on_due
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Make the sleeper look at the heap again (a new head, a refill, a drop)."""
        self._wake.set()

    async def run(self) -> None:
        """Run until cancelled."""
        while True:
            self._wake.clear()
            due = self._window.pop_due(self._clock.now())
            if due:
                self._on_due(due)
            await sleep_or_wake(self._clock, self._window.head_due(), self._wake)
