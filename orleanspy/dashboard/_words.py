"""Schedules in words ("every weekday at 09:00 Europe/Berlin") and next slots.

``describe`` covers the shapes people write (fixed times on chosen weekdays or
days of the month, steps of minutes or hours, intervals); anything else reads
as the expression itself, which is never wrong.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from orleanspy.reminders.describe import next_fire_times
from orleanspy.reminders.model import ReminderEntry

__all__ = ["describe", "interval_words", "next_slots"]

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def interval_words(period: timedelta) -> str:
    """``every 30 seconds``, ``every hour``, ``every 1.5 seconds``."""
    seconds = period.total_seconds()
    for size, unit in _UNITS:
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"every {unit}" if n == 1 else f"every {n} {unit}s"
    return f"every {seconds:g} seconds"


def _days_words(dow: str) -> str | None:
    if dow in ("*", "?"):
        return "every day"
    if dow in ("1-5", "MON-FRI", "mon-fri"):
        return "every weekday"
    if dow in ("0,6", "6,0", "SAT,SUN", "sat,sun", "6-7"):
        return "every weekend day"
    try:
        days = sorted({int(d) % 7 for d in dow.split(",")})
    except ValueError:
        return None
    return "every " + ", ".join(_DAYS[d] for d in days)


def _cron_words(expr: str, tz: str) -> str:
    fields = expr.split()
    if len(fields) == 6:
        second, minute, hour, dom, month, dow = fields
    elif len(fields) == 5:
        second, (minute, hour, dom, month, dow) = "0", fields
    else:
        return f"cron {expr} {tz}"
    plain = f"cron {expr} {tz}"
    if month != "*":
        return plain
    if second.isdigit() and minute.isdigit() and hour.isdigit():
        at = f"{int(hour):02d}:{int(minute):02d}" + (f":{int(second):02d}" if int(second) else "")
        if dom in ("*", "?"):
            days = _days_words(dow)
            return plain if days is None else f"{days} at {at} {tz}"
        if dow in ("*", "?") and dom.isdigit():
            return f"on day {int(dom)} of every month at {at} {tz}"
        return plain
    if dom == "*" and dow in ("*", "?"):
        if second.isdigit() and minute.startswith("*/") and hour == "*":
            return f"every {minute[2:]} minutes"
        if second.isdigit() and minute == "*" and hour == "*":
            return "every minute"
        if second.startswith("*/") and minute == "*" and hour == "*":
            return f"every {second[2:]} seconds"
        if second == "*" and minute == "*" and hour == "*":
            return "every second"
        if second.isdigit() and minute.isdigit() and hour.startswith("*/"):
            return f"every {hour[2:]} hours at minute {int(minute)}"
        if second.isdigit() and minute.isdigit() and hour == "*":
            return f"every hour at minute {int(minute)}"
    return plain


def describe(entry: ReminderEntry) -> str:
    """The row's schedule in words."""
    if entry.cron:
        return _cron_words(entry.cron, entry.tz or "UTC")
    if entry.period is not None:
        return interval_words(entry.period)
    return "once"


def next_slots(entry: ReminderEntry, count: int = 5) -> list[datetime]:
    """The row's next ``count`` fire times from its ``next_due`` (that one first):
    ``describe.next_fire_times``, so calendar, jitter, bounds and pause count
    (a paused row has none; a row whose schedule does not compute, none past
    ``next_due``)."""
    try:
        fires = next_fire_times(entry, None, count, entry.next_due - timedelta(milliseconds=1))
    except (ValueError, TypeError, OverflowError):
        return [entry.next_due]
    return [f.at for f in fires]
