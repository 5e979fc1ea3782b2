"""The one sleeper, and the time rules it applies to a due row.

There is no timer per reminder: a single task sleeps until the heap's head is
due (or until it is woken because a new head arrived), re-reads the clock, and
hands every row whose ``next_due <= now`` to the lanes. Timers may fire a
little early (uvloop: ~1 ms), so waking is only a hint; the clock decides.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orleanspy.clock import Clock
from orleanspy.reminders._window import DueWindow, Row
from orleanspy.reminders.model import MissedReminderAction

__all__ = ["Backoff", "TickPlan", "Ticker", "plan_tick", "sleep_or_wake"]


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


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What to do with a row that fell due.

    ``deliver``: whether a tick goes to the grain. ``slot`` is the scheduled time
    the tick stands for (``TickStatus.current_tick_time``). ``missed`` says the
    row was reached later than the grace; then ``missed_ticks`` counts slots:
    for a FIRE_IMMEDIATELY catch-up, the *further* slots in ``(slot, now]``
    folded into it; for SKIP/NOTIFY, every slot in ``[slot, now]`` (none was
    delivered). ``resume`` is the next slot after ``now`` for a missed row, and
    ``None`` for an on-time tick (its next slot follows ``slot`` on the grid).
    """

    deliver: bool
    slot: datetime
    missed: bool = False
    missed_ticks: int = 0
    resume: datetime | None = None


def plan_tick(row: Row, now: datetime, grace: timedelta) -> TickPlan:
    """Apply the missed-tick rule (DESIGN.md section 2) to a due ``row`` at ``now``.

    A tick is on time while ``now <= slot + grace``: it is delivered as is, even
    if late, and no slot is skipped. Past the grace the row's action decides;
    the grid resumes at the first slot after ``now``, so a row that was away
    for a long time produces at most one catch-up tick, never a burst.
    """
    slot = row.next_due
    if now <= slot + grace:
        return TickPlan(deliver=True, slot=slot)
    # Counting cron slots steps the iterator (~40 µs a slot): cap it so one dense
    # row found after a long outage cannot stall the loop; past the cap the count
    # reads "at least MISSED_COUNT_CAP".
    later = row.schedule.slots_between(slot, now, cap=MISSED_COUNT_CAP)
    resume = row.schedule.next_after(now)
    if row.entry.action is MissedReminderAction.FIRE_IMMEDIATELY:
        return TickPlan(deliver=True, slot=slot, missed=True, missed_ticks=later, resume=resume)
    return TickPlan(deliver=False, slot=slot, missed=True, missed_ticks=later + 1, resume=resume)


MISSED_COUNT_CAP = 1000
"""Missed-tick counts stop here (``TickStatus.missed_ticks`` then means "at least")."""


class Backoff:
    """Exponential retry delays from ``initial`` to ``maximum`` with jitter.

    Each delay is drawn from ``[d/2, d]`` where ``d`` doubles per attempt, so
    many silos retrying the same store do not retry in lockstep.
    """

    def __init__(
        self,
        initial: timedelta,
        maximum: timedelta,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._initial = initial.total_seconds()
        self._maximum = max(self._initial, maximum.total_seconds())
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        """The next delay in seconds."""
        d = min(self._maximum, math.ldexp(self._initial, min(self._attempt, 62)))
        self._attempt += 1
        return d * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self._attempt = 0
