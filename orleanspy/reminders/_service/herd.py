"""Herd control: catch-up deliveries ramp up instead of arriving all at once.

After a full outage every row is overdue, and a silo that delivered them as
fast as it can would activate every grain at once (dotnet/orleans #5079): its
event loop falls behind, calls to its grains wait, its membership probes go
unanswered and its peers may vote it Dead. A *catch-up* delivery is one whose
slot is more than ``ReminderOptions.catch_up_lateness`` old when its grain call
is about to be made; ticks on time never wait here.

The ramp. Catch-up grain calls are spaced out: the first of a catch-up goes at
once, the rate starts at ``catch_up_rate`` per second and doubles every second,
up to ``catch_up_ceiling`` (``0``: no ceiling). A catch-up ends when no
catch-up call was admitted for ``_QUIET`` seconds; the next one starts from
``catch_up_rate`` again.

The brake. While a catch-up runs, the throttle samples its event loop's lag
every ``_PROBE`` seconds (how late a timer it set fires: the backlog of
everything else waiting to run). A sample above ``catch_up_max_lag`` halves the
rate (at most once per ``_HOLD``; never below ``catch_up_rate``), and the rate
grows again only after ``_CALM`` seconds without one, and from the first
halving on by ``catch_up_rate`` a second instead of doubling: additive
increase, multiplicative decrease (as TCP's congestion avoidance), so a silo
settles near the catch-up rate its loop keeps up with, whatever the machine,
and its other calls and its probes keep being answered. ``catch_up_max_lag =
None`` turns the brake off (the ramp alone).

Order: each call reserves the next free instant when it asks, so calls are
admitted in the order they ask (the lanes' order: the critical lane first,
each lane first in, first out); nothing is dropped or reordered, only spaced.
``catch_up_rate = 0`` turns herd control off. The rate is per silo: a cluster
of n silos catches up at up to n times it.
"""

from __future__ import annotations

from datetime import timedelta

from orleanspy.clock import Cancellable, Clock, call_at

__all__ = ["CatchUpThrottle"]

#: Seconds without a catch-up call after which a catch-up is over.
_QUIET = 1.0
#: Seconds between two samples of the loop's lag while a catch-up runs.
_PROBE = 0.1
#: Seconds after a halving before the next one may come.
_HOLD = 0.5
#: Seconds without a lag above the limit before the rate grows again.
_CALM = 1.0


class CatchUpThrottle:
    """Spaces catch-up grain calls on a ramp with a lag brake (module docstring).

    ``rate``: the first and the lowest rate, per second (``0``: off);
    ``ceiling``: the highest (``0``: none); ``lateness``: how late a slot must
    be for its call to count as catch-up; ``max_lag``: the loop lag that halves
    the rate (``None``: never)."""

    __slots__ = (
        "_calm_from",
        "_ceiling",
        "_clock",
        "_current",
        "_epoch",
        "_grown_at",
        "_halved_at",
        "_halvings_before",
        "_last",
        "_lateness",
        "_max_lag",
        "_next",
        "_probe",
        "_rate",
        "halvings",
    )

    def __init__(
        self,
        clock: Clock,
        *,
        rate: float,
        ceiling: float,
        lateness: timedelta,
        max_lag: timedelta | None = None,
    ) -> None:
        self._clock = clock
        # Times are kept in seconds from here: from the epoch, a double would
        # keep only about a microsecond of a turn's spacing.
        self._epoch = clock.now_ms()
        self._rate = rate
        self._ceiling = ceiling
        self._lateness = lateness.total_seconds()
        self._max_lag = None if max_lag is None else max_lag.total_seconds()
        self._current = rate
        self._grown_at = 0.0
        self._calm_from = 0.0
        self._halved_at = float("-inf")
        self._halvings_before = 0
        self._next = 0.0
        self._last = float("-inf")
        self._probe: Cancellable | None = None
        #: Times the brake halved the rate (only grows).
        self.halvings = 0

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def _now(self) -> float:
        return (self._clock.now_ms() - self._epoch) / 1000

    def _rate_at(self, t: float) -> float:
        """The admitted rate at ``t``: ``_current`` (the rate at ``_grown_at``)
        grown for every second after the calm began (doubled each second until
        the brake first acted, then by ``rate`` each second), up to the ceiling."""
        calm = max(0.0, t - max(self._grown_at, self._calm_from))
        if self.halvings > self._halvings_before:
            grown = self._current + self._rate * calm
        else:
            grown = self._current * 2.0 ** min(calm, 60.0)
        return min(grown, self._ceiling) if self._ceiling > 0 else grown

    def current_rate(self) -> float:
        """The admitted rate now, per second."""
        return self._rate_at(self._now())

    def reserve(self, lateness: timedelta) -> float:
        """Seconds the caller must wait before its grain call (``0`` when it is
        not a catch-up call, or its turn is now); the turn is the caller's from
        this call on."""
        if self._rate <= 0 or lateness.total_seconds() <= self._lateness:
            return 0.0
        now = self._now()
        if now - self._last > _QUIET:  # a new catch-up
            self._next = self._grown_at = self._calm_from = now
            self._current = self._rate
            self._halved_at = float("-inf")
            self._halvings_before = self.halvings
        at = max(self._next, now)
        # Spaced by the ramp's rate at the turn's own instant.
        self._next = at + 1.0 / self._rate_at(at)
        self._last = at
        if self._max_lag is not None and self._probe is None:
            self._sample_at(now + _PROBE)
        return at - now

    async def admit(self, lateness: timedelta) -> None:
        """Wait for the caller's turn (``reserve``)."""
        wait = self.reserve(lateness)
        if wait > 0:
            await self._clock.sleep(wait)

    def observe_lag(self, lag: float) -> None:
        """A sample of the loop's lag, in seconds: above ``max_lag`` it halves the
        rate (at most once per ``_HOLD``, never below ``rate``) and restarts the
        calm the rate must see before it grows again."""
        if self._max_lag is None or lag <= self._max_lag:
            return
        now = self._now()
        # Held where it is now until a calm of _CALM has passed, halved first
        # unless a halving came within _HOLD (the lag of the one before may not
        # have cleared yet). Turns already handed out keep their instants.
        self._current = self._rate_at(now)
        self._grown_at = now
        self._calm_from = now + _CALM
        if now - self._halved_at >= _HOLD and self._current > self._rate:
            self._current = max(self._rate, self._current / 2)
            self._halved_at = now
            self.halvings += 1

    def _sample_at(self, due: float) -> None:
        """Set a timer for ``due``; when it fires, its lateness is a lag sample.
        It is set again while the catch-up lasts (``_QUIET``), so the sampling
        ends with it and costs a timer, no task."""

        def fired() -> None:
            now = self._now()
            self.observe_lag(now - due)
            if now - self._last <= _QUIET:
                self._sample_at(now + _PROBE)
            else:
                self._probe = None

        when = self._clock.now() + timedelta(seconds=max(0.0, due - self._now()))
        self._probe = call_at(self._clock, when, fired)

    def close(self) -> None:
        """Call off the lag sampling (the service stopped)."""
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
