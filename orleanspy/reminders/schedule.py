"""Reminder schedules: the fixed interval grid and cron expressions.

A ``Schedule`` answers two questions about one reminder: which slot comes
strictly after a given instant, and how many slots lie in a half-open window.
Both take and return timezone-aware datetimes; results are UTC.

Interval schedules
    Slots are ``start_at + k * period`` for ``k >= 0``, computed in integer
    milliseconds (``start_at`` and ``period`` are truncated to whole ms), so the
    millionth slot is exactly on the grid: no float accumulates error.

Cron schedules
    Evaluated with croniter. Five fields are standard cron (minute first). Six
    fields put **seconds first** (``"0 0 0 1 * *"`` is midnight on the 1st,
    ``"*/10 * * * * *"`` every ten seconds); croniter reads seconds first only
    with ``second_at_beginning=True``, which is always passed here (without it
    ``"0 */5 * * * *"`` would fire every second). The aliases ``@hourly``,
    ``@daily``, ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly`` and
    ``@annually`` are accepted. Random (``R``) and hashed (``H``) fields are
    refused: every silo must compute the same slots from the stored row.

    An expression is evaluated in its IANA zone (default UTC), so
    ``"0 0 9 * * 1-5"`` in ``Europe/Berlin`` fires at 09:00 Berlin time in summer
    and in winter. Around daylight-saving changes we keep croniter 7's
    behaviour, pinned by tests. For a daily ``"0 30 2 * * *"`` in Europe/Berlin:

    * spring forward (02:00 -> 03:00, e.g. 2024-03-31): 02:30 does not exist; the
      slot fires **once at 03:00 local** (01:00 UTC), the first instant after the
      gap. Several slots inside the gap (``"0 0,30 2 * * *"``) collapse into
      that one 03:00 tick.
    * fall back (03:00 -> 02:00, e.g. 2024-10-27): 02:30 happens twice; the slot
      fires **twice**, at 02:30 CEST (00:30 UTC) and 02:30 CET (01:30 UTC).

    America/New_York behaves the same way (``"0 30 2 * * *"`` fires at 03:00 EDT
    on the spring-forward day; ``"0 30 1 * * *"`` fires twice on the fall-back
    day).

Cost: building a croniter takes about 100 µs and one ``get_next`` 30-60 µs. A
``CronSchedule`` keeps one iterator: asking ``next_after`` of the slot it last
returned just steps it; any other instant re-positions it (a few µs) instead of
building a new one. ``schedule_for`` shares one ``CronSchedule`` per
``(expression, zone)``. Schedules are not thread-safe; use them from the event
loop's thread.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.reminders.model import ReminderEntry

__all__ = [
    "DEFAULT_SLOT_CAP",
    "CronSchedule",
    "IntervalSchedule",
    "Schedule",
    "cron_schedule",
    "parse_zone",
    "schedule_for",
]

DEFAULT_SLOT_CAP = 100_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_ALIASES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
# croniter's own pattern for random/hashed fields, applied to each comma item.
_RANDOM_OR_HASHED = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
# Guards next_after against an iterator that returns a slot not after t; croniter 7
# never does in our tests, but the contract "strictly after" must hold regardless.
_MAX_CATCH_UP_STEPS = 8


class Schedule(Protocol):
    """When a reminder is due. Implementations are pure functions of their inputs."""

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t`` (aware, any zone), as aware UTC."""
        ...

    def slots_between(self, after: datetime, upto: datetime, cap: int = DEFAULT_SLOT_CAP) -> int:
        """The number of slots ``s`` with ``after < s <= upto``, counting at most ``cap``.

        The result is ``min(true count, cap)``, and ``0`` when ``upto <= after`` or
        ``cap <= 0``. The cap bounds the work for cron schedules, which count by
        stepping (tens of µs per slot); callers that only need "how many ticks
        were missed" for a status report should pass a small cap.
        """
        ...


def _us(t: datetime) -> int:
    if t.tzinfo is None:
        raise ValueError("naive datetime: schedules take timezone-aware datetimes")
    return (t - _EPOCH) // _US


class IntervalSchedule:
    """Slots ``start_at + k * period``, ``k >= 0``, in integer milliseconds.

    ``start_at`` is truncated to a whole millisecond and ``period`` to whole
    milliseconds (the storage precision); a period under 1 ms is a ``ValueError``.
    """

    __slots__ = ("_period_ms", "_start_ms")

    def __init__(self, start_at: datetime, period: timedelta) -> None:
        period_ms = period // timedelta(milliseconds=1)
        if period_ms <= 0:
            raise ValueError(f"an interval period must be at least 1 ms, got {period}")
        self._start_ms = to_ms(start_at)
        self._period_ms = period_ms

    @property
    def start_at(self) -> datetime:
        return from_ms(self._start_ms)

    @property
    def period(self) -> timedelta:
        return timedelta(milliseconds=self._period_ms)

    def _first_index_after(self, t: datetime) -> int:
        """The smallest ``k >= 0`` whose slot is strictly after ``t``."""
        offset_us = _us(t) - self._start_ms * 1000
        if offset_us < 0:
            return 0
        return offset_us // (self._period_ms * 1000) + 1

    def next_after(self, t: datetime) -> datetime:
        """``start_at`` when ``t < start_at``, else the next grid point after ``t``."""
        return from_ms(self._start_ms + self._first_index_after(t) * self._period_ms)

    def slots_between(self, after: datetime, upto: datetime, cap: int = DEFAULT_SLOT_CAP) -> int:
        """Counted in closed form (O(1)); see ``Schedule.slots_between``."""
        if cap <= 0 or upto <= after:
            return 0
        first = self._first_index_after(after)
        # Index of the last slot <= upto: one less than the first slot after upto.
        last = self._first_index_after(upto) - 1
        return max(0, min(cap, last - first + 1))

    def __repr__(self) -> str:
        return f"IntervalSchedule(start_at={self.start_at.isoformat()}, period={self.period})"


def parse_zone(tz: str | None) -> ZoneInfo:
    """The IANA zone named ``tz`` (``None`` means UTC); ``ReminderError`` if unknown."""
    if tz is None:
        return ZoneInfo("UTC")
    if not isinstance(tz, str) or not tz.strip():
        raise ReminderError(
            f"tz must be an IANA zone name such as 'Europe/Berlin' or None for UTC, got {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ReminderError(
            f"unknown time zone {tz!r}: use an IANA zone name such as 'Europe/Berlin', "
            "'America/New_York' or 'UTC'"
        ) from exc


def _check_shape(expr: str) -> list[str]:
    """The expression's fields; ``ReminderError`` for shapes we do not accept."""
    if not isinstance(expr, str):
        raise ReminderError(f"cron must be a string, got {type(expr).__name__}")
    fields = expr.split()
    if len(fields) == 1 and fields[0].lower() in _ALIASES:
        return fields
    if len(fields) not in (5, 6):
        raise ReminderError(
            f"bad cron expression {expr!r}: expected 5 fields (minute hour day month "
            "weekday), 6 fields (second first: second minute hour day month weekday) or "
            f"one of {', '.join(sorted(_ALIASES))}; got {len(fields)} field(s)"
        )
    for item in (part for field in fields for part in field.split(",")):
        if _RANDOM_OR_HASHED.match(item):
            raise ReminderError(
                f"bad cron expression {expr!r}: random (R) and hashed (H) fields are not "
                "supported, because every silo must compute the same slots; write explicit "
                "values instead"
            )
    return fields


class CronSchedule:
    """A cron expression evaluated in an IANA zone (see the module docstring).

    Construction validates the expression and the zone (``ReminderError``). One
    croniter iterator is kept and reused; the schedule therefore holds mutable
    state, but every answer equals that of a freshly built schedule.
    """

    __slots__ = ("_iter", "_last", "_seconds_first", "_zone", "expr", "tz")

    def __init__(self, expr: str, tz: str | None = None) -> None:
        fields = _check_shape(expr)
        self._zone = parse_zone(tz)
        self.expr = expr
        self.tz = tz
        self._seconds_first = len(fields) == 6
        try:
            self._iter = croniter(
                " ".join(fields), _EPOCH.astimezone(self._zone), second_at_beginning=True
            )
        except (CroniterError, ValueError, TypeError, KeyError) as exc:
            raise ReminderError(
                f"bad cron expression {expr!r}: {exc}. Use 5 fields (minute first) or 6 "
                "fields (second first), e.g. '0 0 9 * * 1-5' for weekdays at 09:00:00"
            ) from exc
        # The slot the iterator is positioned on, in UTC; None until the first step.
        self._last: datetime | None = None

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``, aware UTC.

        Raises ``ReminderError`` if the expression never matches again (e.g. the
        30th of February), as croniter gives up after a bounded search.
        """
        if t.tzinfo is None:
            raise ValueError("naive datetime: schedules take timezone-aware datetimes")
        if self._last is None or t != self._last:
            self._iter.set_current(t.astimezone(self._zone), force=True)
        slot = self._step()
        for _ in range(_MAX_CATCH_UP_STEPS):
            if slot > t:
                return slot
            slot = self._step()
        raise ReminderError(f"cron {self.expr!r} produced no slot after {t.isoformat()}")

    def _step(self) -> datetime:
        try:
            local: datetime = self._iter.get_next(datetime)
        except CroniterBadDateError as exc:
            self._last = None
            raise ReminderError(
                f"cron expression {self.expr!r} never matches after this point "
                "(for example a day that does not exist in any month)"
            ) from exc
        slot = local.astimezone(UTC)
        self._last = slot
        return slot

    def slots_between(self, after: datetime, upto: datetime, cap: int = DEFAULT_SLOT_CAP) -> int:
        """Counted by stepping, O(min(count, cap)) at 30-60 µs per slot.

        See ``Schedule.slots_between``. When the count is below the cap the
        iterator is left on the first slot after ``upto``, so a following
        ``next_after(upto)`` costs a re-position, not a rebuild.
        """
        if cap <= 0 or upto <= after:
            return 0
        count = 0
        slot = self.next_after(after)
        while slot <= upto:
            count += 1
            if count >= cap:
                break
            slot = self.next_after(slot)
        return count

    def min_gap_seconds(self) -> int:
        """A lower bound, in seconds, on the distance between two slots, ignoring DST.

        Computed from the expanded second/minute/hour fields: the smallest step
        between consecutive times of day, including the wrap from the last time of
        one day to the first of the next. The wrap assumes two consecutive days
        can both fire, so a schedule restricted to non-adjacent days may be judged
        denser than it is, never sparser.
        """
        expanded = self._iter.expanded
        seconds = _values(expanded[5], 60) if self._seconds_first else [0]
        minutes = _values(expanded[0], 60)
        hours = _values(expanded[1], 24)
        first = hours[0] * 3600 + minutes[0] * 60 + seconds[0]
        last = hours[-1] * 3600 + minutes[-1] * 60 + seconds[-1]
        gaps = [86400 - last + first]
        span_s = seconds[-1] - seconds[0]
        span_m = minutes[-1] - minutes[0]
        if len(seconds) > 1:
            gaps.append(_min_step(seconds))
        if len(minutes) > 1:
            gaps.append(_min_step(minutes) * 60 - span_s)
        if len(hours) > 1:
            gaps.append(_min_step(hours) * 3600 - span_m * 60 - span_s)
        return min(gaps)

    def __repr__(self) -> str:
        return f"CronSchedule({self.expr!r}, tz={self.tz!r})"


def _values(field: list[object], size: int) -> list[int]:
    if field == ["*"]:
        return list(range(size))
    return sorted({int(v) for v in field if isinstance(v, int)})


def _min_step(values: list[int]) -> int:
    return min(b - a for a, b in itertools.pairwise(values))


@lru_cache(maxsize=1024)
def cron_schedule(expr: str, tz: str | None = None) -> CronSchedule:
    """A shared ``CronSchedule`` for ``(expr, tz)``; raises like the constructor.

    Rows with the same expression and zone share one iterator, which costs a
    cheap re-position per query instead of a croniter build per row.
    """
    return CronSchedule(expr, tz)


def schedule_for(entry: ReminderEntry) -> Schedule:
    """The schedule of a reminder row: its cron (shared per expression and zone)
    or its interval grid. ``ReminderError`` if the row has neither or a bad cron."""
    if entry.cron is not None:
        return cron_schedule(entry.cron, entry.tz)
    if entry.period is not None:
        return IntervalSchedule(entry.start_at, entry.period)
    raise ReminderError(
        f"reminder {entry.key!r} has neither a period nor a cron expression; "
        "register it again with one of them"
    )
