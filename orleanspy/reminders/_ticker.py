"""The one sleeper.

There is no timer per reminder: a single task sleeps until the heap's head is
due (or until the window signals a new head), re-reads the clock, and moves
every row whose ``next_due <= now`` into the window's lanes. Waking is only a
hint (a timer on another ``Clock`` may fire early); the clock decides.

The sleep is one clock timer that sets the window's ``head_changed`` event and
one wait on that event: under a tick stream the ticker wakes about once per
millisecond, and a wait on several awaitables (``sleep_or_wake``: a task per
awaitable, then reaping them) cost ten times as much per wake.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from orleanspy.clock import Clock, call_at
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
        window, clock = self._window, self._clock
        wake = window.head_changed
        while True:
            wake.clear()
            window.pop_due(clock.now())
            head = window.head_due()
            timer = None if head is None else call_at(clock, head, wake.set)
            try:
                await wake.wait()
            finally:
                if timer is not None:
                    timer.cancel()
