"""Which ring ranges this silo owns, and what a change of them means."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from orleanspy.identity import GrainId
from orleanspy.reminders.table import FeedScope
from orleanspy.ring import (
    HASH_SPACE,
    RingRange,
    intersect_ranges,
    merge_ranges,
    subtract_ranges,
)

__all__ = ["Ownership"]


class Ownership:
    """The ranges a silo owns. Nothing is owned until the first ``update``.

    ``feed_scope`` follows the owned ranges: change feeds subscribed with it
    (``table.subscribe``) need only carry changes of owned rows, and never this
    silo's own writes (its service learns of those locally).
    """

    def __init__(self) -> None:
        self._ranges: tuple[RingRange, ...] = ()
        self.feed_scope = FeedScope((), skip_own_writes=True)
        # The ranges the ring assigns, and parts of them held back until a time
        # (``assign``): owned are the assigned ranges less the held ones.
        self._assigned: tuple[RingRange, ...] = ()
        self._holds: list[tuple[datetime, tuple[RingRange, ...]]] = []

    @property
    def ranges(self) -> tuple[RingRange, ...]:
        return self._ranges

    def owns_hash(self, h: int) -> bool:
        return any(h in r for r in self._ranges)

    def owns(self, grain_id: GrainId) -> bool:
        return self.owns_hash(grain_id.uniform_hash())

    def owns_everything(self) -> bool:
        """Whether this silo owns the whole ring (it is the only Active silo:
        every Active silo of a ring owns some of it)."""
        return sum(r.size for r in merge_ranges(self._ranges)) == HASH_SPACE

    def assign(
        self,
        ranges: Sequence[RingRange],
        *,
        hold: Sequence[RingRange] = (),
        until: datetime | None = None,
    ) -> list[RingRange]:
        """The ring assigns ``ranges``; ``hold`` (a part of them) is not owned
        before ``until`` (a handover: the silo that had it is still finishing).
        Parts held by an earlier call stay held until their own time, as far
        as they are still assigned. Returns what must be loaded now (``update``)."""
        self._assigned = tuple(dict.fromkeys(ranges))
        holds = [(t, intersect_ranges(r, self._assigned)) for t, r in self._holds]
        if hold and until is not None:
            holds.append((until, intersect_ranges(hold, self._assigned)))
        self._holds = [(t, r) for t, r in holds if r]
        return self._apply()

    @property
    def next_release(self) -> datetime | None:
        """When the earliest held part becomes owned (``None``: nothing held)."""
        return min((t for t, _ in self._holds), default=None)

    def release(self, now: datetime) -> list[RingRange]:
        """Own the held parts whose time came; return what must be loaded now."""
        if not any(t <= now for t, _ in self._holds):
            return []
        self._holds = [(t, r) for t, r in self._holds if t > now]
        return self._apply()

    def _apply(self) -> list[RingRange]:
        if not self._holds:
            return self.update(self._assigned)
        held = merge_ranges(r for _, rs in self._holds for r in rs)
        return self.update(subtract_ranges(self._assigned, held))

    def update(self, ranges: Sequence[RingRange]) -> list[RingRange]:
        """Replace the owned ranges; return those that must be loaded now.

        A new range that lies inside one range owned before needs no load: its
        rows were already eligible. Anything else is returned whole — a range
        that only partly overlaps the old ones is re-read, which is harmless
        because the window never loads a row it already holds.
        """
        old = self._ranges
        self._ranges = tuple(dict.fromkeys(ranges))
        self.feed_scope.set_ranges(self._ranges)
        return [r for r in self._ranges if not any(_inside(r, o) for o in old)]


def _inside(inner: RingRange, outer: RingRange) -> bool:
    """Whether every hash of ``inner`` lies in ``outer``."""
    if outer.begin == outer.end:
        return True
    if inner.begin == inner.end:
        return False
    # Measure both ranges from outer.begin; inner fits when it starts and ends
    # within outer's span without wrapping past outer.begin.
    span = outer.size
    start = (inner.begin - outer.begin) % (1 << 32)
    return start < span and start + inner.size <= span
