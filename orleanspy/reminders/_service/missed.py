"""The missed-tick rule: what a due row's tick becomes when it is reached late.

The one place that decides between delivering a tick, a coalesced catch-up,
and skipping (with or without a ``MissedReminder``). Delivery applies it to
every due row; the repair pass applies it to long-overdue rows it moves in
place, without delivering. Both publish NOTIFY skips through one
``MissedNotifier``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from orleanspy.reminders.model import MissedReminder, MissedReminderAction, ReminderEntry
from orleanspy.reminders.schedule import Schedule

__all__ = ["MISSED_COUNT_CAP", "MissedNotifier", "PublishMissed", "TickPlan", "plan_tick"]

log = logging.getLogger(__name__)

PublishMissed = Callable[[MissedReminder], Awaitable[None]]

MISSED_COUNT_CAP = 1000
"""Missed-tick counts stop here (``TickStatus.missed_ticks`` then means "at least")."""


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What to do with a row that fell due.

    ``deliver``: whether a tick goes to the grain. ``slot`` is the scheduled time
    the tick stands for (``TickStatus.current_tick_time``). ``missed`` says the
    slot counts as missed; then ``missed_ticks`` counts slots: for a
    FIRE_IMMEDIATELY catch-up, the *further* slots in ``(slot, now]`` folded
    into it; for SKIP/NOTIFY, every slot in ``[slot, now]`` (none was
    delivered). ``resume`` is the next slot after ``now`` for a missed row, and
    ``None`` for an on-time tick (its next slot follows ``slot`` on the grid).
    """

    deliver: bool
    slot: datetime
    missed: bool = False
    missed_ticks: int = 0
    resume: datetime | None = None


def plan_tick(
    schedule: Schedule,
    action: MissedReminderAction,
    slot: datetime,
    now: datetime,
    grace: timedelta,
    *,
    reloaded: bool = False,
) -> TickPlan:
    """Apply the missed-tick rule to a tick due at ``slot`` (docs/architecture.md,
    section 2, step 6).

    A tick is on time while ``now <= slot + grace``: it is delivered as is, even
    if late, and no slot is skipped. Past the grace the row's ``action``
    decides; the grid resumes at the first slot after ``now``, so a row that was
    away for a long time produces at most one catch-up tick, never a burst.

    ``reloaded`` marks the first tick of a row read from the table within the
    grace after storage trouble (a failed read or write). Such a row's stored
    ``next_due`` may lag behind ticks already delivered, or the outage kept it
    from being loaded in time; so if more than one of its slots has passed (the
    one after ``slot`` too), the slots count as missed even inside the grace
    and ``action`` decides: with SKIP none is replayed, with FIRE_IMMEDIATELY
    one catch-up is delivered. Without storage trouble a row behind its grid is
    just late (an overload) and is delivered within the grace as usual.
    """
    if now <= slot + grace and not (reloaded and schedule.next_after(slot) <= now):
        return TickPlan(deliver=True, slot=slot)
    # Counting cron slots steps the iterator (~40 µs a slot): cap it so one dense
    # row found after a long outage cannot stall the loop; past the cap the count
    # reads "at least MISSED_COUNT_CAP".
    later = schedule.slots_between(slot, now, cap=MISSED_COUNT_CAP)
    resume = schedule.next_after(now)
    if action is MissedReminderAction.FIRE_IMMEDIATELY:
        return TickPlan(deliver=True, slot=slot, missed=True, missed_ticks=later, resume=resume)
    return TickPlan(deliver=False, slot=slot, missed=True, missed_ticks=later + 1, resume=resume)


class MissedNotifier:
    """Publishes a ``MissedReminder`` for each NOTIFY skip (``publish`` ``None``:
    nothing is published). A failed publish is logged, not retried, not counted."""

    def __init__(self, publish: PublishMissed | None, name: str = "") -> None:
        self._publish = publish
        self._name = name
        self.notified = 0

    async def notify(
        self,
        entry: ReminderEntry,
        scheduled: datetime,
        now: datetime,
        missed_ticks: int,
        next_due: datetime,
    ) -> None:
        if self._publish is None:
            return
        event = MissedReminder(
            service_id=entry.service_id,
            grain_id=entry.grain_id,
            name=entry.name,
            scheduled=scheduled,
            detected_at=now,
            missed_ticks=missed_ticks,
            next_due=next_due,
        )
        try:
            await self._publish(event)
        except Exception as exc:
            log.warning(
                "missed reminder not published name=%s key=%s error=%r", self._name, entry.key, exc
            )
            return
        self.notified += 1
