"""Herd control: catch-up deliveries ramp up instead of arriving all at once.

After a full outage every row is overdue, and a silo that delivered them as
fast as it can would activate every grain at once (dotnet/orleans #5079). A
*catch-up* delivery is one whose slot is more than
``ReminderOptions.catch_up_lateness`` old when its grain call is about to be
made; ticks on time never wait here. Catch-up grain calls are spaced out:
the first of a catch-up goes at once, and the rate starts at
``catch_up_rate`` per second and doubles every second, up to
``catch_up_ceiling`` (``0``: no ceiling). A catch-up ends when no catch-up
call was admitted for ``_QUIET`` seconds; the next one starts from
``catch_up_rate`` again.

Order: each call reserves the next free instant on the ramp when it asks, so
calls are admitted in the order they ask (the lanes' order: the critical lane
first, each lane first in, first out); nothing is dropped or reordered, only
spaced. ``catch_up_rate = 0`` (the default) turns this off. The rate is per
silo: a cluster of n silos catches up at up to n times it.
"""

from __future__ import annotations

from datetime import timedelta

from orleanspy.clock import Clock

__all__ = ["CatchUpThrottle"]

#: Seconds without a catch-up call after which a catch-up is over.
_QUIET = 1.0


class CatchUpThrottle:
    """Spaces catch-up grain calls on a ramp (module docstring)."""

    __slots__ = (
        "_ceiling",
        "_clock",
        "_epoch",
        "_last",
        "_lateness",
        "_next",
        "_rate",
        "_started",
    )

    def __init__(self, clock: Clock, *, rate: float, ceiling: float, lateness: timedelta) -> None:
        self._clock = clock
        # Times are kept in seconds from here: from the epoch, a double would
        # keep only about a microsecond of a turn's spacing.
        self._epoch = clock.now_ms()
        self._rate = rate
        self._ceiling = ceiling
        self._lateness = lateness.total_seconds()
        self._started = 0.0
        self._next = 0.0
        self._last = float("-inf")

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def rate_at(self, t: float) -> float:
        """The admitted rate ``t`` seconds into a catch-up."""
        rate: float = self._rate * 2.0 ** min(t, 60.0)
        return min(rate, self._ceiling) if self._ceiling > 0 else rate

    def reserve(self, lateness: timedelta) -> float:
        """Seconds the caller must wait before its grain call (``0`` when it is
        not a catch-up call, or its turn is now); the turn is the caller's from
        this call on."""
        if self._rate <= 0 or lateness.total_seconds() <= self._lateness:
            return 0.0
        now = (self._clock.now_ms() - self._epoch) / 1000
        if now - self._last > _QUIET:
            self._started = self._next = now  # a new catch-up
        at = max(self._next, now)
        self._next = at + 1.0 / self.rate_at(at - self._started)
        self._last = at
        return at - now

    async def admit(self, lateness: timedelta) -> None:
        """Wait for the caller's turn (``reserve``)."""
        wait = self.reserve(lateness)
        if wait > 0:
            await self._clock.sleep(wait)
