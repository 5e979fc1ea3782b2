"""The one sleeper.

There is no timer per reminder: a single task sleeps until the heap's head is
due (or until the window signals a new head), re-reads the clock, and moves
every row whose ``next_due <= now`` into the window's lanes. Timers may fire a
little early (uvloop: ~1 ms), so waking is only a hint; the clock decides.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from orleanspy.clock import Clock
from orleanspy.reminders._window import DueWindow

__all__ = ["Ticker", "sleep_or_wake"]


async def sleep_or_wake(clock: Clock, deadline: datetime | None, *wake: asyncio.Event) -> None:
    """Return when ``clock`` reaches ``deadline`` (never, if ``None``) or one of
    the ``wake`` events is set.

    Does not clear them; the caller does, before it looks at its state again.
    """
    if any(w.is_set() for w in wake):
        return
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(w.wait()) for w in wake]
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
    """Moves due rows from the window's heap to its lanes; see the module docstring."""

    def __init__(self, clock: Clock, window: DueWindow) -> None:
        self._clock = clock
        self._window = window

    async def run(self) -> None:
        """Run until cancelled."""
        window = self._window
        while True:
            window.head_changed.clear()
            window.pop_due(self._clock.now())
            await sleep_or_wake(self._clock, window.head_due(), window.head_changed)
