"""What ``describe`` answers about a reminder: ``ReminderDescription``, and when it
will fire next: ``next_fire_times``, a pure function of a row.

The fire times are its next ones after an instant,
computed from the row alone (its schedule, calendar, jitter, bounds, pause and
``next_due``), the same on every silo and in a client. Each answer is a
``FireTime``: the instant it fires (``at``: jittered, and shifted by the
calendar) and the slot it stands for (``slot``: ``TickStatus.current_tick_time``,
the slot before jitter and before a business-day shift).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final

from orleanspy.errors import ReminderError
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.model import FireRecord, ReminderEntry
from orleanspy.reminders.schedule import schedule_for
from orleanspy.serialization import register_type

__all__ = ["MAX_FIRE_TIMES", "FireTime", "ReminderDescription", "next_fire_times"]

#: The most fire times one call answers.
MAX_FIRE_TIMES: Final = 1000

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class FireTime:
    """One coming tick: when it fires (``at``) and the slot it stands for (``slot``)."""

    at: datetime
    slot: datetime


def next_fire_times(
    row: ReminderEntry, calendar: Calendar | None, count: int, after: datetime
) -> list[FireTime]:
    """The next ``count`` (1..``MAX_FIRE_TIMES``) ticks of ``row`` after ``after``
    (aware), in order; fewer when its schedule ends first, none while it is paused.

    ``calendar``: the rules of the row's calendar when the row does not carry
    them (a row received in a call leaves them behind; ``ReminderEntry``); the
    row's own are used when it has them, and none for a row without a calendar.
    The row's ``next_due`` is where it stands: when it lies after ``after``,
    the fire times between them were handled already (delivered, skipped, or
    moved by a repair) and are not answered; an overdue ``next_due`` fires as
    soon as the row is reached (the missed-tick rule decides how), so the
    answer starts from ``after`` then. ``ReminderError`` for a bad count or a
    naive ``after``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FIRE_TIMES:
        raise ReminderError(f"count must be an int in 1..{MAX_FIRE_TIMES}, got {count!r}")
    if not isinstance(after, datetime) or after.tzinfo is None:
        raise ReminderError(f"after must be a timezone-aware datetime, got {after!r}")
    if row.paused:
        return []
    if row.calendar is not None and row.calendar_rules is None:
        if calendar is None:
            raise ReminderError(
                f"reminder {row.name!r} of {row.grain_id} uses calendar {row.calendar!r}, whose "
                "rules it does not carry here: pass the calendar"
            )
        row = replace(row, _calendar_rules=calendar)
    schedule = schedule_for(row)
    t = row.next_due - _MS if row.next_due > after else after
    out: list[FireTime] = []
    while len(out) < count:
        at = schedule.next_after(t)
        if at is None:
            break
        out.append(FireTime(at, schedule.nominal(at)))
        t = at
    return out


@dataclass(frozen=True, slots=True)
class ReminderDescription:
    """A reminder as ``describe`` shows it (``client.reminders.describe``).

    ``row``: the row as stored (its schedule, options, labels, calendar,
    ``next_due`` and ``last_fire``); ``next_fires``: its next fire times after
    the instant asked about (calendar, jitter, bounds and pause honoured: none
    while paused); ``counters``: what became of its slots since it was made
    (delivered, failed, dead-lettered, deduplicated, skipped by reason, the last
    error); ``recent``: its latest deliveries, newest first (the fire history);
    ``backfill``: the backfill it runs, if any; ``dead_letters``: how many of
    its ticks wait as dead letters (of those the page looked at)."""

    row: ReminderEntry
    next_fires: list[FireTime]
    counters: ReminderCounters
    recent: list[FireRecord]
    backfill: BackfillJob | None = None
    dead_letters: int = 0

    @property
    def last_error(self) -> str | None:
        """The last failure's ``Type: message`` (``None``: none since it was made)."""
        return self.counters.last_error


register_type(FireTime, name="orleanspy.FireTime")
register_type(ReminderDescription, name="orleanspy.ReminderDescription")
