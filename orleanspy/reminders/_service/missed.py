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

from orleanspy._frozen import maker
from orleanspy.reminders.model import (
    MAX_BUFFERED_SLOTS,
    MissedReminder,
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
)
from orleanspy.reminders.schedule import IntervalSchedule, Schedule

__all__ = [
    "MISSED_COUNT_CAP",
    "MissedNotifier",
    "PublishMissed",
    "TickPlan",
    "plan_overlap",
    "plan_tick",
]

log = logging.getLogger(__name__)

PublishMissed = Callable[[MissedReminder], Awaitable[None]]

MISSED_COUNT_CAP = 1000
"""Missed-tick counts stop here (``TickStatus.missed_ticks`` then means "at least")."""


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What to do with a row that fell due.

    ``deliver``: whether a tick goes to the grain. ``slot`` is the scheduled time
    the tick stands for (``TickStatus.current_tick_time``): for a catch-up, the
    latest slot that passed; for a skip, the first (what a ``MissedReminder``
    names). ``missed`` says the slots count as missed; then ``missed_ticks``
    counts slots: for a FIRE_IMMEDIATELY catch-up, the earlier passed slots
    folded into it; for SKIP/NOTIFY, every passed slot (none was delivered).
    ``resume`` is the next slot after ``now`` for a missed row, and ``None`` for
    an on-time tick (its next slot follows ``slot`` on the grid).
    ``skipped``: passed slots not delivered as ticks of their own (skipped, or
    coalesced into a catch-up tick); ``outside``: passed slots older than the
    row's catch-up window (skipped, none of them delivered). They are what the
    row's skip counters get.
    """

    deliver: bool
    slot: datetime
    missed: bool = False
    missed_ticks: int = 0
    resume: datetime | None = None
    skipped: int = 0
    outside: int = 0

    @property
    def ended(self) -> bool:
        """A missed row whose schedule has no slot after now (a one-shot, or the
        last slot of a bounded reminder)."""
        return self.missed and self.resume is None


# One plan per tick: built without TickPlan's frozen __init__ (orleanspy._frozen).
_plan = maker(TickPlan)
_MS = timedelta(milliseconds=1)


def plan_tick(
    schedule: Schedule,
    action: MissedReminderAction,
    slot: datetime,
    now: datetime,
    grace: timedelta,
    *,
    catchup_window: timedelta | None = None,
) -> TickPlan:
    """Apply the missed-tick rule to a row due at ``slot`` (docs/architecture.md,
    section 2, step 6).

    A tick is on time while it is the only passed slot (the next one is not due
    yet) and ``now <= slot + grace``: it is delivered as is, even if late.

    Otherwise its slots are missed and the row's ``action`` decides, whatever
    the grace: catch-up is never a burst. FIRE_IMMEDIATELY delivers one tick
    for the latest passed slot, with the earlier ones counted in
    ``missed_ticks``; SKIP and NOTIFY deliver none. The grid resumes at the
    first slot after ``now``. So a row away for a long time (an outage, a
    silo killed, a pause, an overload longer than its period) gets at most one
    delivery for the slots it missed, and a row whose stored schedule lags
    ticks already delivered (a write lost with its silo) replays none of them
    as a burst either.

    ``catchup_window`` (FIRE_IMMEDIATELY rows that have one): passed slots older
    than ``now - catchup_window`` are skipped (``outside``) and never delivered;
    the catch-up tick is delivered only if the latest passed slot lies inside
    the window, and its ``missed_ticks`` counts the earlier slots inside it.
    """
    if not _due_by(schedule.next_after(slot), now):
        if now <= slot + grace:
            return _plan(True, slot)
        latest, earlier = slot, 0
    else:
        latest, earlier = _latest_passed(schedule, slot, now)
    resume = schedule.next_after(now)
    if action is MissedReminderAction.FIRE_IMMEDIATELY:
        if catchup_window is None:
            return _plan(True, latest, True, earlier, resume, earlier)
        cutoff = now - catchup_window
        if latest < cutoff:
            return _plan(False, slot, True, earlier + 1, resume, 0, earlier + 1)
        # Passed slots before the cutoff (the latest is not one of them).
        outside = schedule.slots_between(slot - _MS, cutoff - _MS, cap=earlier)
        within = earlier - outside
        return _plan(True, latest, True, within, resume, within, outside)
    return _plan(False, slot, True, earlier + 1, resume, earlier + 1)


def plan_overlap(
    schedule: Schedule, policy: OverlapPolicy, slot: datetime, now: datetime
) -> TickPlan:
    """The plan of a row whose slot ``slot`` fell due while its previous tick
    still ran (an overlapping slot), under ``policy`` (not ``BUFFER_ONE``, whose
    overlapping slots go through ``plan_tick`` as every release before 0.2 did,
    nor ``ALLOW_ALL``, whose slots never wait). The slots counted are those
    passed by ``now``, from ``slot`` on; ``skipped`` counts those not
    delivered (overlap skips).

    ``SKIP``: none is delivered; the grid resumes at the first slot after now.
    ``BUFFER_ALL``: ``slot`` is delivered as an on-time tick of its own (its
    next slot follows it on the grid), unless more than ``MAX_BUFFERED_SLOTS``
    passed: the oldest beyond that are skipped, and the first kept is delivered.
    ``CANCEL_OTHER``: the latest passed slot is delivered (the newest wins),
    the earlier ones are skipped; the grid resumes after now.
    """
    latest, earlier = _latest_passed(schedule, slot, now)
    resume = schedule.next_after(now)
    if policy is OverlapPolicy.SKIP:
        return _plan(False, slot, True, earlier + 1, resume, earlier + 1)
    if policy is OverlapPolicy.BUFFER_ALL:
        drop = earlier + 1 - MAX_BUFFERED_SLOTS
        first: datetime | None = slot
        for _ in range(max(0, drop)):
            assert first is not None
            first = schedule.next_after(first)
        if first is None or first > now:
            first = latest  # cannot happen on a grid; the latest passed slot, then
        return _plan(True, first, False, 0, None, max(0, drop))
    return _plan(True, latest, True, 0, resume, earlier)


def _latest_passed(schedule: Schedule, slot: datetime, now: datetime) -> tuple[datetime, int]:
    """The latest slot ``<= now`` from ``slot`` on, and how many passed slots come
    before it. Interval schedules answer in closed form; cron steps (~40 µs a
    slot), capped at ``MISSED_COUNT_CAP``: past the cap the slot reached is taken
    as the latest (it is then far past any sensible grace, and the count reads
    "at least")."""
    if isinstance(schedule, IntervalSchedule):
        earlier = schedule.slots_between(slot, now, cap=MISSED_COUNT_CAP)
        latest = schedule.next_after(now) - schedule.period
        return max(latest, slot), earlier
    latest, earlier = slot, 0
    while earlier < MISSED_COUNT_CAP:
        nxt = schedule.next_after(latest)
        if nxt is None or nxt > now:  # None: the schedule ended
            break
        latest, earlier = nxt, earlier + 1
    return latest, earlier


def _due_by(slot: datetime | None, now: datetime) -> bool:
    return slot is not None and slot <= now


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
        next_due: datetime | None,
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
