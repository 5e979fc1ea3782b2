"""Calendars: named sets of excluded days and times that many reminders share.

A ``Calendar`` says which instants are *excluded*: a day of ``exclude_dates``
or of ``exclude_weekdays`` (each read in the calendar's zone ``tz``, default
UTC: the whole local day), or an instant inside one of ``exclude_ranges``
(half-open ``[start, end)`` pairs of aware datetimes). A reminder names a
calendar (``calendar=``) and says what becomes of a slot that falls on an
excluded instant (``on_excluded=``, an ``Excluded``):

* ``SKIP`` (the default): the slot is dropped;
* ``NEXT_BUSINESS_DAY`` / ``PREVIOUS_BUSINESS_DAY``: the slot moves to the
  nearest day after (before) it whose instant at the *same local time of day*
  is not excluded, looking at most ``MAX_SHIFT_DAYS`` days away (a slot with
  no such day is dropped). A shifted slot that lands on a slot of its own, or
  on another shifted slot, fires once.

Days, dates and times of day are the calendar's zone's. A time of day that a
target day lacks (a spring-forward gap) fires right after the gap; one that a
day has twice (a fall-back) fires on its first pass, as a fixed-time cron job.

``CalendarSchedule`` applies a calendar to a reminder's schedule: its slots
are the *fire times* (``next_after`` answers with them, so a row's ``next_due``
is the shifted instant: a slot moved to the previous business day lies before
its natural time, and the due index has it there). ``nominal`` maps a fire
time back to the slot it stands for (``TickStatus.current_tick_time``: the
25th for a payment moved to the 24th). Shifting keeps the time of day, so
fire times are not in the order of their slots: a slot shifted back can fire
before an earlier slot of its own. ``next_after`` therefore looks ahead: for
``PREVIOUS_BUSINESS_DAY`` up to the first day after its answer that no
exclusion touches (no slot later than that can move before it), for
``NEXT_BUSINESS_DAY`` back to the last such day before ``t``. Days that an
excluded date or weekday covers cost one step each; days a range touches are
evaluated slot by slot (keep ranges short, or use dates).

Calendars are stored by name in the reminder table's store
(``reminders.stores.CalendarStore``); each row that uses one keeps a copy of
its rules (``ReminderEntry``), so every silo computes the same slots from the
row alone. Changing a calendar rewrites the rows that use it
(``remindable.calendars``).
"""

from __future__ import annotations

import bisect
import enum
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.serialization import register_type

__all__ = [
    "CALENDAR_HORIZON",
    "MAX_CALENDAR_NAME",
    "MAX_EXCLUDED_DATES",
    "MAX_EXCLUDED_RANGES",
    "MAX_SHIFT_DAYS",
    "Calendar",
    "CalendarSchedule",
    "Excluded",
    "StoredCalendar",
    "check_calendar_name",
]

#: The most dates one calendar excludes (its rules are copied into every row
#: that uses it, so they stay small).
MAX_EXCLUDED_DATES: Final = 1000
#: The most ranges one calendar excludes.
MAX_EXCLUDED_RANGES: Final = 100
#: How many days a shifted slot looks for a business day before it is dropped.
MAX_SHIFT_DAYS: Final = 62
#: The longest calendar name.
MAX_CALENDAR_NAME: Final = 64

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_MS = timedelta(milliseconds=1)
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
# How many nominal slots one ``next_after`` may look at, and how far ahead it
# looks, before it gives up (a schedule whose every slot the calendar excludes):
# ``None``, as for a schedule that ended.
_MAX_STEPS: Final = 200_000
_HORIZON: Final = timedelta(days=3660)
#: How far ahead a calendar looks for a slot it does not exclude.
CALENDAR_HORIZON: Final = _HORIZON
_MAX_ZONE_LENGTH: Final = 64


class Excluded(enum.IntEnum):
    """What becomes of a reminder's slot that its calendar excludes."""

    #: The slot is dropped.
    SKIP = 1
    #: The slot moves to the next business day, at the same time of day.
    NEXT_BUSINESS_DAY = 2
    #: The slot moves to the previous business day, at the same time of day.
    PREVIOUS_BUSINESS_DAY = 3


def check_calendar_name(name: object) -> str:
    """``name`` if it can name a calendar: 1..``MAX_CALENDAR_NAME`` characters,
    letters, digits and ``. _ : -``, starting with a letter or digit;
    ``ReminderError`` saying so otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_CALENDAR_NAME:
        raise ReminderError(
            f"not a calendar name: {name!r}; use 1..{MAX_CALENDAR_NAME} letters, digits and "
            "'._:-', starting with a letter or digit (e.g. 'de-business')"
        )
    return name


def _zone(tz: str | None) -> ZoneInfo:
    if tz is None:
        return ZoneInfo("UTC")
    if not isinstance(tz, str) or not tz.strip() or len(tz) > _MAX_ZONE_LENGTH:
        raise ReminderError(f"calendar tz must be an IANA zone name or None for UTC, got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ReminderError(
            f"unknown time zone {tz!r} for a calendar: use an IANA name such as 'Europe/Berlin'"
        ) from exc


def _iso_date(value: object) -> str:
    if isinstance(value, datetime):
        raise ReminderError(
            f"exclude_dates takes dates (datetime.date or 'YYYY-MM-DD'), got the datetime {value!r}"
        )
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip()).isoformat()
        except ValueError:
            pass
    raise ReminderError(f"not a date for exclude_dates: {value!r}; use a date or 'YYYY-MM-DD'")


def _weekday(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 6:
        raise ReminderError(
            f"exclude_weekdays takes 0 (Monday) .. 6 (Sunday), as calendar.MONDAY .. "
            f"calendar.SUNDAY, got {value!r}"
        )
    return value


def _range(value: object) -> tuple[datetime, datetime]:
    pair = tuple(value) if isinstance(value, Iterable) and not isinstance(value, str) else ()
    if len(pair) != 2:
        raise ReminderError(
            f"exclude_ranges takes (start, end) pairs of aware datetimes, got {value!r}"
        )
    start, end = pair
    for what, at in (("start", start), ("end", end)):
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ReminderError(
                f"an excluded range's {what} must be a timezone-aware datetime, got {at!r}"
            )
    a, b = from_ms(to_ms(start)), from_ms(to_ms(end))
    if a >= b:
        raise ReminderError(
            f"an excluded range must end after it starts, got {start.isoformat()} .. "
            f"{end.isoformat()}"
        )
    return a, b


@dataclass(frozen=True, slots=True)
class Calendar:
    """Excluded days and times (module docstring); compare by value.

    ``tz``: the IANA zone days are read in (``None``: UTC). ``exclude_dates``:
    dates (``datetime.date`` or ``"YYYY-MM-DD"``; kept as ISO text, sorted),
    at most ``MAX_EXCLUDED_DATES``. ``exclude_weekdays``: 0 (Monday) .. 6
    (Sunday), at most six of them (a calendar must leave some day open).
    ``exclude_ranges``: ``(start, end)`` pairs of aware datetimes, half open,
    at most ``MAX_EXCLUDED_RANGES`` (kept sorted, in UTC, whole ms).
    ``ReminderError`` for anything else.
    """

    tz: str | None = None
    exclude_dates: tuple[str, ...] = ()
    exclude_weekdays: tuple[int, ...] = ()
    exclude_ranges: tuple[tuple[datetime, datetime], ...] = ()
    # Lookups built once (never travels: the name starts with an underscore).
    _rules: _Rules | None = field(default=None, init=False, repr=False, compare=False)

    if TYPE_CHECKING:
        # What a type checker sees of the generated __init__: any iterables
        # (``__post_init__`` makes them sorted tuples), dates as dates or text.
        def __init__(
            self,
            tz: str | None = None,
            exclude_dates: Iterable[date | str] = (),
            exclude_weekdays: Iterable[int] = (),
            exclude_ranges: Iterable[tuple[datetime, datetime]] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        zone = _zone(self.tz)
        dates = _many(self.exclude_dates, "exclude_dates")
        weekdays = _many(self.exclude_weekdays, "exclude_weekdays")
        ranges = _many(self.exclude_ranges, "exclude_ranges")
        iso = tuple(sorted({_iso_date(d) for d in dates}))
        days = tuple(sorted({_weekday(w) for w in weekdays}))
        spans = tuple(sorted(_range(r) for r in ranges))
        if len(iso) > MAX_EXCLUDED_DATES:
            raise ReminderError(
                f"a calendar excludes at most {MAX_EXCLUDED_DATES} dates, got {len(iso)}: "
                "split it, or exclude weekdays or ranges instead"
            )
        if len(days) > 6:
            raise ReminderError("a calendar must leave at least one weekday open")
        if len(spans) > MAX_EXCLUDED_RANGES:
            raise ReminderError(
                f"a calendar excludes at most {MAX_EXCLUDED_RANGES} ranges, got {len(spans)}"
            )
        object.__setattr__(self, "exclude_dates", iso)
        object.__setattr__(self, "exclude_weekdays", days)
        object.__setattr__(self, "exclude_ranges", spans)
        object.__setattr__(self, "_rules", _Rules(zone, iso, days, spans))

    @property
    def rules(self) -> _Rules:
        rules = self._rules
        assert rules is not None
        return rules

    def excludes(self, t: datetime) -> bool:
        """Whether the instant ``t`` (aware) is excluded."""
        return self.rules.excluded(t)

    def to_record(self) -> dict[str, Any]:
        """Storage form (plain msgpack types): ``k`` the form (1), ``z`` zone,
        ``d`` dates as days since the epoch, ``w`` weekdays, ``r`` ranges as
        ``[start ms, end ms]``; empty parts left out. Never an empty map: a
        Redis script that rewrites the row would store that as an empty list."""
        rec: dict[str, Any] = {"k": 1}
        if self.tz is not None:
            rec["z"] = self.tz
        if self.exclude_dates:
            rec["d"] = [date.fromisoformat(d).toordinal() - _EPOCH_DAY for d in self.exclude_dates]
        if self.exclude_weekdays:
            rec["w"] = list(self.exclude_weekdays)
        if self.exclude_ranges:
            rec["r"] = [[to_ms(a), to_ms(b)] for a, b in self.exclude_ranges]
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any] | list[Any]) -> Calendar:
        """Inverse of ``to_record`` (an empty list is an empty record, as Lua's
        msgpack writes one)."""
        if isinstance(rec, list):
            rec = {}
        return cls(
            tz=rec.get("z"),
            exclude_dates=tuple(
                date.fromordinal(int(d) + _EPOCH_DAY).isoformat() for d in rec.get("d", ())
            ),
            exclude_weekdays=tuple(int(w) for w in rec.get("w", ())),
            exclude_ranges=tuple((from_ms(int(a)), from_ms(int(b))) for a, b in rec.get("r", ())),
        )


def _many(value: object, what: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ReminderError(f"{what} must be a list, got {value!r}")
    return list(value)


class _Rules:
    """A calendar's lookups: the excluded dates and weekdays as sets, the ranges
    merged into disjoint sorted spans (ms), and the zone's day arithmetic."""

    __slots__ = ("_ends", "_starts", "dates", "weekdays", "zone")

    def __init__(
        self,
        zone: ZoneInfo,
        dates: tuple[str, ...],
        weekdays: tuple[int, ...],
        ranges: tuple[tuple[datetime, datetime], ...],
    ) -> None:
        self.zone = zone
        self.dates = frozenset(date.fromisoformat(d) for d in dates)
        self.weekdays = frozenset(weekdays)
        starts: list[int] = []
        ends: list[int] = []
        for a, b in ranges:
            a_ms, b_ms = to_ms(a), to_ms(b)
            if ends and a_ms <= ends[-1]:
                ends[-1] = max(ends[-1], b_ms)
            else:
                starts.append(a_ms)
                ends.append(b_ms)
        self._starts = starts
        self._ends = ends

    # -- days -------------------------------------------------------------------------

    def day_of(self, t: datetime) -> date:
        return t.astimezone(self.zone).date()

    def day_excluded(self, d: date) -> bool:
        return d.weekday() in self.weekdays or d in self.dates

    def midnight(self, d: date) -> datetime:
        """The first instant of local day ``d`` (UTC)."""
        return self.instant(d, time(0))

    def instant(self, d: date, tod: time) -> datetime:
        """Local day ``d`` at time of day ``tod`` as an aware UTC instant: the first
        pass of a repeated time, the end of the gap for a skipped one."""
        wall = datetime.combine(d, tod)
        u = wall.replace(tzinfo=self.zone).astimezone(UTC)
        if u.astimezone(self.zone).replace(tzinfo=None) == wall:
            return u
        # A time the day skips (spring forward): the first instant after the gap,
        # found between the two readings of the wall time.
        lo = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        hi = u
        if lo > hi:
            lo, hi = hi, lo
        off = lo.astimezone(self.zone).utcoffset()
        while hi - lo > _MS:
            mid = lo + (hi - lo) / 2
            if mid.astimezone(self.zone).utcoffset() == off:
                lo = mid
            else:
                hi = mid
        return from_ms(-(-to_ms(hi) // 1000) * 1000) if hi.microsecond else hi

    def time_of(self, t: datetime) -> time:
        return t.astimezone(self.zone).time()

    def touched(self, d: date) -> bool:
        """Whether an excluded range overlaps local day ``d``."""
        if not self._starts:
            return False
        return self._overlaps(to_ms(self.midnight(d)), to_ms(self.midnight(d + _DAY)))

    def touched_between(self, a: date, b: date) -> bool:
        """Whether an excluded range overlaps any local day of ``a .. b`` (inclusive)."""
        if not self._starts:
            return False
        lo, hi = min(a, b), max(a, b)
        return self._overlaps(to_ms(self.midnight(lo)), to_ms(self.midnight(hi + _DAY)))

    def _overlaps(self, lo_ms: int, hi_ms: int) -> bool:
        i = bisect.bisect_right(self._starts, hi_ms - 1) - 1
        # The last span starting before hi; spans are disjoint and sorted.
        return i >= 0 and self._ends[i] > lo_ms

    def clear(self, d: date) -> bool:
        """A day no exclusion touches: every instant of it is a business instant."""
        return not self.day_excluded(d) and not self.touched(d)

    # -- instants ---------------------------------------------------------------------

    def range_end(self, t: datetime) -> datetime | None:
        """The end of the excluded range holding ``t``, or ``None``."""
        if not self._starts:
            return None
        ms = to_ms(t)
        i = bisect.bisect_right(self._starts, ms) - 1
        if i >= 0 and ms < self._ends[i]:
            return from_ms(self._ends[i])
        return None

    def excluded(self, t: datetime) -> bool:
        return self.day_excluded(self.day_of(t)) or self.range_end(t) is not None

    def shift_day(self, d: date, step: int) -> date | None:
        """The nearest day from ``d`` in direction ``step`` (+1/-1), at most
        ``MAX_SHIFT_DAYS`` away, that no excluded date or weekday covers."""
        for k in range(1, MAX_SHIFT_DAYS + 1):
            x = d + step * k * _DAY
            if not self.day_excluded(x):
                return x
        return None

    def shifted(self, s: datetime, step: int) -> datetime | None:
        """Slot ``s`` (excluded) moved to the nearest day in direction ``step``
        whose instant at the same time of day is not excluded; ``None`` past
        ``MAX_SHIFT_DAYS``."""
        local = s.astimezone(self.zone)
        d, tod = local.date(), local.time()
        for k in range(1, MAX_SHIFT_DAYS + 1):
            x = d + step * k * _DAY
            if self.day_excluded(x):
                continue
            w = self.instant(x, tod)
            if self.range_end(w) is None:
                return w
        return None

    def nearest_clear(self, d: date, step: int) -> date | None:
        """The nearest clear day strictly after (``step`` +1) or before (-1) ``d``,
        at most ``MAX_SHIFT_DAYS + 1`` days away."""
        for k in range(1, MAX_SHIFT_DAYS + 2):
            x = d + step * k * _DAY
            if self.clear(x):
                return x
        return None


class _Slots(Protocol):
    """What a calendar needs of the schedule it wraps (``schedule.Schedule``)."""

    def next_after(self, t: datetime) -> datetime | None: ...


class CalendarSchedule:
    """``base``'s slots with ``calendar`` applied (module docstring): a ``Schedule``
    whose slots are fire times. Pure: the same answers on every silo."""

    __slots__ = ("_base", "_rules", "_step", "calendar", "on_excluded")

    def __init__(self, base: _Slots, calendar: Calendar, on_excluded: Excluded) -> None:
        self._base = base
        self.calendar = calendar
        self.on_excluded = on_excluded
        self._rules = calendar.rules
        self._step = {
            Excluded.SKIP: 0,
            Excluded.NEXT_BUSINESS_DAY: 1,
            Excluded.PREVIOUS_BUSINESS_DAY: -1,
        }[on_excluded]

    def fire(self, s: datetime) -> datetime | None:
        """When nominal slot ``s`` fires: itself, shifted, or ``None`` (dropped)."""
        rules = self._rules
        if not rules.excluded(s):
            return s
        if not self._step:
            return None
        return rules.shifted(s, self._step)

    # -- next_after -------------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime | None:
        if t.tzinfo is None:
            raise ValueError("naive datetime: schedules take timezone-aware datetimes")
        if self._step == 0:
            return self._next_skipping(t)
        if self._step > 0:
            return self._next_forward(t)
        return self._next_backward(t)

    def _next_skipping(self, t: datetime) -> datetime | None:
        rules = self._rules
        s = self._base.next_after(t)
        horizon = t + _HORIZON
        for _ in range(_MAX_STEPS):
            if s is None or s > horizon:
                return None
            d = rules.day_of(s)
            if rules.day_excluded(d):
                s = self._base.next_after(rules.midnight(d + _DAY) - _MS)
                continue
            end = rules.range_end(s)
            if end is not None:
                s = self._base.next_after(end - _MS)
                continue
            return s
        return None

    def _best_of_day(self, d: date, t: datetime, nominal_after: datetime | None) -> datetime | None:
        """The earliest fire time after ``t`` of the nominal slots on local day
        ``d`` (those after ``nominal_after`` only, when given)."""
        rules = self._rules
        step = self._step
        if rules.day_excluded(d):
            target = rules.shift_day(d, step)
            if target is None:
                return None
            if not rules.touched_between(d, target):
                # Every slot of the day moves to ``target`` at its time of day, so
                # fire times follow the slots' order: the first slot whose fire
                # time is after ``t`` is the day's best.
                t_day = rules.day_of(t)
                if target < t_day:
                    return None
                start = nominal_after
                if target == t_day:
                    # Slots whose time of day is past t's (on the target day).
                    mapped = rules.instant(d, rules.time_of(t))
                    start = mapped if start is None else max(start, mapped)
                    start -= _MS  # the slot at exactly that time of day may still be later
                for s in _DaySlots(self._base, rules, d, start):
                    f = rules.instant(target, rules.time_of(s))
                    if f > t:
                        return f
                return None
        elif not rules.touched(d):
            # A clear day: its slots fire as they are, in order.
            first = max(t, nominal_after) if nominal_after is not None else t
            for s in _DaySlots(self._base, rules, d, first):
                return s
            return None
        best: datetime | None = None
        for s in _DaySlots(self._base, rules, d, nominal_after):
            fired = self.fire(s)
            if fired is not None and fired > t and (best is None or fired < best):
                best = fired
        return best

    def _next_forward(self, t: datetime) -> datetime | None:
        """NEXT_BUSINESS_DAY: slots on or after the day that follows the last clear
        day before ``t``'s day may fire after ``t``; a slot at or after the
        best fire time found cannot beat it (its fire time is not earlier)."""
        rules = self._rules
        t_day = rules.day_of(t)
        last_clear = rules.nearest_clear(t_day, -1)
        d = (t_day - (MAX_SHIFT_DAYS + 1) * _DAY) if last_clear is None else last_clear + _DAY
        best: datetime | None = None
        horizon = t_day + _HORIZON
        while True:
            d_next = self._day_with_slot(d)
            if d_next is None or d_next > horizon:
                return best
            d = d_next
            if best is not None and rules.midnight(d) >= best:
                return best
            f = self._best_of_day(d, t, None)
            if f is not None and (best is None or f < best):
                best = f
            d += _DAY

    def _next_backward(self, t: datetime) -> datetime | None:
        """PREVIOUS_BUSINESS_DAY: only slots after ``t`` can fire after it; once a
        fire time is found, slots on or after the first clear day after its day
        fire on that day or later, so the search ends there."""
        rules = self._rules
        d = rules.day_of(t)
        best: datetime | None = None
        stop: date | None = None
        horizon = d + _HORIZON
        while True:
            d_next = self._day_with_slot(d)
            if d_next is None or d_next > horizon:
                return best
            d = d_next
            if stop is not None and d >= stop:
                return best
            f = self._best_of_day(d, t, t)
            if f is not None and (best is None or f < best):
                best = f
                b_day = rules.day_of(best)
                clear = rules.nearest_clear(b_day, 1)
                stop = clear if clear is not None else b_day + (MAX_SHIFT_DAYS + 2) * _DAY
            d += _DAY

    def _day_with_slot(self, d: date) -> date | None:
        """The first local day from ``d`` on that holds a nominal slot, or ``None``
        when the base schedule has none left."""
        s = self._base.next_after(self._rules.midnight(d) - _MS)
        return None if s is None else max(d, self._rules.day_of(s))

    # -- the rest of the Schedule protocol ----------------------------------------------

    def nominal(self, slot: datetime) -> datetime:
        """The nominal slot that fires at ``slot``: ``slot`` itself when it is a
        slot of its own that fires there; else the nearest slot moved there."""
        rules = self._rules
        base = self._base
        if base.next_after(slot - _MS) == slot and not rules.excluded(slot):
            return slot
        if not self._step:
            return slot
        tod = rules.time_of(slot)
        d = rules.day_of(slot)
        for k in range(1, MAX_SHIFT_DAYS + 1):
            x = d - self._step * k * _DAY
            s = rules.instant(x, tod)
            if base.next_after(s - _MS) == s and self.fire(s) == slot:
                return s
            if rules.clear(x):
                break  # no slot beyond a clear day moves past it
        return slot

    def slots_between(self, after: datetime, upto: datetime, cap: int = 100_000) -> int:
        """Counted by stepping, O(min(count, cap))."""
        count = 0
        slot = self.next_after(after)
        while count < cap and slot is not None and slot <= upto:
            count += 1
            slot = self.next_after(slot)
        return count

    def __repr__(self) -> str:
        return f"CalendarSchedule({self._base!r}, {self.calendar!r}, {self.on_excluded.name})"


class _DaySlots:
    """The nominal slots of ``base`` on local day ``d`` (strictly after ``after``
    when given), in order."""

    __slots__ = ("_after", "_base", "_end", "_start")

    def __init__(self, base: _Slots, rules: _Rules, d: date, after: datetime | None) -> None:
        self._base = base
        start = rules.midnight(d) - _MS
        self._start = start if after is None or after < start else after
        self._end = rules.midnight(d + _DAY)

    def __iter__(self) -> Iterator[datetime]:
        s = self._base.next_after(self._start)
        for _ in range(_MAX_STEPS):
            if s is None or s >= self._end:
                return
            yield s
            s = self._base.next_after(s)


@dataclass(frozen=True, slots=True)
class StoredCalendar:
    """A calendar as its store holds it: its name, rules and ``version`` (a
    number that grows with every change of the calendar)."""

    name: str
    calendar: Calendar
    version: int


register_type(Calendar, name="orleanspy.Calendar")
register_type(StoredCalendar, name="orleanspy.StoredCalendar")
