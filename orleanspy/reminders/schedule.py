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

    Fields mean what they mean in Vixie/ISC cron. croniter 7 disagrees in a
    few places, so every numeric field is expanded here and handed to croniter
    as an explicit list (``normalise_fields``): a one-value range ``N-N`` (and
    ``N-N/S``) is ``N`` (croniter reads ``*``); ``N/S`` is ``N-max/S``; and
    day-of-month and day-of-week are OR-ed only when neither field starts with
    ``*`` (``*/2`` counts as a wildcard), AND-ed otherwise. A property test
    compares the slots with cronsim, an independent implementation, over
    thousands of random expressions.

    An expression is evaluated in its IANA zone (default UTC), so
    ``"0 0 9 * * 1-5"`` in ``Europe/Berlin`` fires at 09:00 Berlin time in summer
    and in winter. croniter matches fields on local wall-clock times; turning
    them into instants around daylight-saving changes follows cron's own rule
    (Vixie/ISC cron), which is what a billing or report job expects:

    * a *fixed-time* job (neither the minute nor the hour field starts with
      ``*``) runs **once** in the repeated hour of a fall-back, on its first
      pass: ``"0 30 2 * * *"`` in Europe/Berlin fires at 02:30 CEST on
      2026-10-25, not again at 02:30 CET;
    * a fixed-time slot inside the skipped hour of a spring-forward runs once,
      **right after the gap**: 02:30 on 2026-03-29 fires at 03:00 CEST; several
      slots in the gap (``"0 0,30 2 * * *"``) give that one tick;
    * a job whose minute or hour field is a wildcard or a step (``*/15``,
      ``@hourly``) follows real elapsed time: it fires in both passes of a
      repeated hour and not at all in a skipped one.

    The same holds for zones with a 30-minute shift (Australia/Lord_Howe) and
    for America/New_York; tests pin all three. Interval reminders are not
    affected: they stay on their absolute grid.

One-shot reminders, bounds and jitter
    A row with neither period nor cron has one slot, ``start_at``
    (``OneShotSchedule``). ``BoundedSchedule`` wraps a schedule with the row's
    bounds and jitter: slots before ``starts_at``, after ``ends_at`` or after
    ``final_due`` (the ``max_ticks``-th slot) are not slots; ``next_after``
    returns ``None`` once no slot is left, which ends the reminder. With
    ``jitter``, each nominal slot ``n`` fires at ``n + offset``, ``offset`` in
    ``[0, min(jitter, next nominal slot - n, ends_at - n + 1 ms))`` whole ms,
    drawn from a hash of the row's key and ``n`` (BLAKE2b: the same on every
    silo and after every restart). The jittered instants are the schedule's
    slots (``next_due`` stores them; the due index orders by them); ``nominal``
    maps one back to its nominal slot (``TickStatus.current_tick_time``). Since
    an offset never reaches the next nominal slot, jittered slots keep the
    nominal order. Registration keeps ``jitter`` within the period (the cron's
    gap), so a lookup steps over one or two nominal slots.

Cost: building a croniter takes about 100 µs and one ``get_next`` 30-60 µs. A
``CronSchedule`` keeps one iterator: asking ``next_after`` of the slot it last
returned just steps it; any other instant re-positions it (a few µs) instead of
building a new one. In a zone with daylight saving each answer also checks the
zone's offset a few times (about 1 µs each). ``schedule_for`` shares one ``CronSchedule`` per
``(expression, zone)``. Schedules are not thread-safe; use them from the event
loop's thread.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.reminders.calendars import CalendarSchedule, Excluded
from orleanspy.reminders.model import ReminderEntry

__all__ = [
    "DEFAULT_SLOT_CAP",
    "MAX_CRON_LENGTH",
    "MAX_CRON_TICKS",
    "MAX_ZONE_LENGTH",
    "BoundedSchedule",
    "CronSchedule",
    "IntervalSchedule",
    "OneShotSchedule",
    "Schedule",
    "cron_schedule",
    "jitter_offset_ms",
    "next_slot",
    "parse_zone",
    "schedule_for",
]

DEFAULT_SLOT_CAP = 100_000
#: Longest cron expression accepted. Bounds the parse (a 1 MB expression blocked a
#: silo for seconds, and every owner of the row would parse it again); 256 holds
#: any list of explicit values of one field.
MAX_CRON_LENGTH = 256
#: Longest time zone name accepted (the longest IANA name has 32 characters).
MAX_ZONE_LENGTH = 64
#: Most slots ``max_ticks`` may ask of a cron reminder: its last slot is found at
#: registration by stepping the expression (about 40 µs a slot).
MAX_CRON_TICKS = 10_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_MS = timedelta(milliseconds=1)
_ALIASES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
# croniter's own pattern for random/hashed fields, applied to each comma item.
_RANDOM_OR_HASHED = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE)
# Plain numeric items: "*", "N", "N-M", each with an optional "/S".
_NUMERIC_ITEM = re.compile(r"^(\*|(\d+)(?:-(\d+))?)(?:/(\d+))?$")
# The bounds of each field, seconds first (day-of-week 7 is Sunday too).
_FIELD_BOUNDS = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
# Zone names that mean plain UTC (no offsets to apply).
_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Zulu"})
# The largest daylight-saving shift of any zone (Antarctica/Troll: 2 h), with margin.
_MAX_SHIFT = timedelta(hours=3)
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
# Offset changes one next_after may cross (a few per search at most in real zones).
_MAX_DST_STEPS = 64
# Guards next_after against an iterator that returns a slot not after t; croniter 7
# never does in our tests, but the contract "strictly after" must hold regardless.
_MAX_CATCH_UP_STEPS = 8


class Schedule(Protocol):
    """When a reminder is due. Implementations are pure functions of their inputs."""

    def next_after(self, t: datetime) -> datetime | None:
        """The first slot strictly after ``t`` (aware, any zone), as aware UTC;
        ``None`` when no slot is left (a one-shot or bounded reminder ended)."""
        ...

    def nominal(self, slot: datetime) -> datetime:
        """The nominal slot of ``slot`` (one of this schedule's slots): itself,
        except under jitter, where it is the slot before the offset."""
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

    def nominal(self, slot: datetime) -> datetime:
        return slot

    def __repr__(self) -> str:
        return f"IntervalSchedule(start_at={self.start_at.isoformat()}, period={self.period})"


class OneShotSchedule:
    """One slot, ``at`` (a one-shot reminder)."""

    __slots__ = ("at",)

    def __init__(self, at: datetime) -> None:
        self.at = at

    def next_after(self, t: datetime) -> datetime | None:
        return self.at if t < self.at else None

    def nominal(self, slot: datetime) -> datetime:
        return slot

    def slots_between(self, after: datetime, upto: datetime, cap: int = DEFAULT_SLOT_CAP) -> int:
        return 1 if cap > 0 and after < self.at <= upto else 0

    def __repr__(self) -> str:
        return f"OneShotSchedule(at={self.at.isoformat()})"


def jitter_offset_ms(key: str, nominal_ms: int, cap_ms: int) -> int:
    """The jitter offset of the nominal slot ``nominal_ms`` of row ``key``: an int
    in ``[0, cap_ms)``, uniform, the same in every process (``cap_ms >= 1``)."""
    digest = hashlib.blake2b(b"%s|%d" % (key.encode(), nominal_ms), digest_size=8).digest()
    return int.from_bytes(digest, "big") * cap_ms >> 64


class BoundedSchedule:
    """``base`` restricted to ``[starts_at, min(ends_at, final_due)]``, each slot
    delayed by its jitter offset (module docstring). Any bound may be ``None``."""

    __slots__ = ("_base", "_ends", "_jitter", "_key", "_last", "_starts")

    def __init__(
        self,
        base: Schedule,
        *,
        key: str,
        jitter: timedelta | None = None,
        starts_at: datetime | None = None,
        ends_at: datetime | None = None,
        final_due: datetime | None = None,
    ) -> None:
        self._base = base
        self._key = key
        self._jitter = 0 if jitter is None else jitter // timedelta(milliseconds=1)
        self._starts = starts_at
        self._ends = ends_at
        last = [t for t in (ends_at, final_due) if t is not None]
        self._last = min(last) if last else None

    def _nominal_after(self, t: datetime) -> datetime | None:
        """The first nominal slot strictly after ``t`` inside the bounds."""
        if self._starts is not None and t < self._starts:
            t = self._starts - _MS
        n = self._base.next_after(t)
        if n is None or (self._last is not None and n > self._last):
            return None
        return n

    def _jittered(self, n: datetime) -> datetime:
        if not self._jitter:
            return n
        n_ms = to_ms(n)
        cap = self._jitter
        following = self._nominal_after(n)
        if following is not None:
            cap = min(cap, to_ms(following) - n_ms)
        if self._ends is not None:
            cap = min(cap, to_ms(self._ends) - n_ms + 1)
        return from_ms(n_ms + jitter_offset_ms(self._key, n_ms, max(1, cap)))

    def next_after(self, t: datetime) -> datetime | None:
        if not self._jitter:
            return self._nominal_after(t)
        # A slot fired before t when its nominal slot is at or before t - jitter.
        n = self._nominal_after(t - timedelta(milliseconds=self._jitter))
        while n is not None:
            j = self._jittered(n)
            if j > t:
                return j
            n = self._nominal_after(n)
        return None

    def nominal(self, slot: datetime) -> datetime:
        """The slot before its jitter offset, then the base schedule's nominal slot
        of that (a calendar's shifted slot stands for the slot it moved)."""
        if not self._jitter:
            return self._base.nominal(slot)
        n = self._nominal_after(slot - timedelta(milliseconds=self._jitter))
        if n is None or n > slot:
            return self._base.nominal(slot)
        while (following := self._nominal_after(n)) is not None and following <= slot:
            n = following
        return self._base.nominal(n)

    def slots_between(self, after: datetime, upto: datetime, cap: int = DEFAULT_SLOT_CAP) -> int:
        """Counted by stepping, O(min(count, cap))."""
        count = 0
        slot = self.next_after(after)
        while count < cap and slot is not None and slot <= upto:
            count += 1
            slot = self.next_after(slot)
        return count

    def __repr__(self) -> str:
        return (
            f"BoundedSchedule({self._base!r}, jitter_ms={self._jitter}, "
            f"starts_at={self._starts}, last={self._last})"
        )


def parse_zone(tz: str | None) -> ZoneInfo:
    """The IANA zone named ``tz`` (``None`` means UTC); ``ReminderError`` if unknown."""
    if tz is None:
        return ZoneInfo("UTC")
    if not isinstance(tz, str) or not tz.strip():
        raise ReminderError(
            f"tz must be an IANA zone name such as 'Europe/Berlin' or None for UTC, got {tz!r}"
        )
    if len(tz) > MAX_ZONE_LENGTH:
        raise ReminderError(
            f"time zone name is {len(tz)} characters long; the limit is {MAX_ZONE_LENGTH} "
            "(MAX_ZONE_LENGTH): use an IANA zone name such as 'Europe/Berlin'"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: the name is looked up as a file (too long, a directory, ...).
        raise ReminderError(
            f"unknown time zone {tz!r}: use an IANA zone name such as 'Europe/Berlin', "
            "'America/New_York' or 'UTC'"
        ) from exc


def _fixed_time(fields: list[str]) -> bool:
    """Vixie cron's "fixed-time job": neither the minute nor the hour field starts
    with ``*``. Only those get the DST rule (once in a repeated hour, once right
    after a skipped one); the others follow elapsed time."""
    if len(fields) == 1:
        return fields[0].lower() != "@hourly"
    minute, hour = (fields[1], fields[2]) if len(fields) == 6 else (fields[0], fields[1])
    return not (minute.startswith("*") or hour.startswith("*"))


def _check_shape(expr: str) -> list[str]:
    """The expression's fields; ``ReminderError`` for shapes we do not accept."""
    if not isinstance(expr, str):
        raise ReminderError(f"cron must be a string, got {type(expr).__name__}")
    if len(expr) > MAX_CRON_LENGTH:
        raise ReminderError(
            f"cron expression is {len(expr)} characters long; the limit is {MAX_CRON_LENGTH} "
            "(MAX_CRON_LENGTH): use ranges and steps instead of long lists"
        )
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


def _expand(field: str, lo: int, hi: int) -> set[int] | None:
    """The values a numeric field stands for, as Vixie cron reads it (``N-N/S``
    is ``{N}``, ``N/S`` is ``N-hi/S``); ``None`` for anything else (names,
    ``L``, ``W``, ``#``, out-of-range values), which is left to croniter."""
    values: set[int] = set()
    for item in field.split(","):
        m = _NUMERIC_ITEM.match(item)
        if m is None:
            return None
        step = int(m.group(4)) if m.group(4) else 1
        if m.group(1) == "*":
            start, end = lo, hi
        else:
            start = int(m.group(2))
            end = int(m.group(3)) if m.group(3) else (hi if m.group(4) else start)
        if step < 1 or not lo <= start <= end <= hi:
            return None
        values.update(range(start, end + 1, step))
    return values


def _write(values: set[int]) -> str:
    return ",".join(str(v) for v in sorted(values))


def normalise_fields(fields: list[str]) -> tuple[list[str], bool]:
    """Five or six cron fields rewritten so that croniter evaluates them as Vixie
    cron does, and the ``day_or`` flag to give croniter.

    croniter 7 reads a one-value range ``N-N`` as ``*``, treats a list holding
    ``*`` as plain ``*`` in its day rule, and decides OR versus AND from its own
    expansion. So every numeric field is expanded here and written back as an
    explicit list (or ``*`` when it covers the whole field). The day rule is
    Vixie's: day-of-month and day-of-week are OR-ed only when neither field
    starts with ``*`` (``*/2`` counts as a wildcard); when OR-ed and either
    covers every day, every day matches. Aliases pass through.
    """
    if len(fields) == 1:
        return fields, True
    bounds = _FIELD_BOUNDS if len(fields) == 6 else _FIELD_BOUNDS[1:]
    out: list[str] = []
    full: list[bool] = []
    for i, (field, (lo, hi)) in enumerate(zip(fields, bounds, strict=True)):
        values = _expand(field, lo, hi)
        is_dow = i == len(fields) - 1
        if values is None:
            out.append(field)
            full.append(field == "*")
            continue
        if is_dow:
            values = {v % 7 for v in values}
        whole = len(values) == (7 if is_dow else hi - lo + 1)
        out.append("*" if whole else _write(values))
        full.append(whole)
    day_or = not (fields[-3].startswith("*") or fields[-1].startswith("*"))
    if day_or and (full[-3] or full[-1]):
        # An OR with every day is every day; croniter would use the other field alone.
        out[-3] = out[-1] = "*"
    return out, day_or


class CronSchedule:
    """A cron expression evaluated in an IANA zone (see the module docstring).

    Construction validates the expression and the zone (``ReminderError``). One
    croniter iterator over local wall-clock times is kept and reused; the
    schedule therefore holds mutable state, but every answer equals that of a
    freshly built schedule. Wall times are turned into instants here, with the
    daylight-saving rule of the module docstring.
    """

    __slots__ = ("_fixed", "_iter", "_last", "_seconds_first", "_utc", "_zone", "expr", "tz")

    def __init__(self, expr: str, tz: str | None = None) -> None:
        fields = _check_shape(expr)
        self._zone = parse_zone(tz)
        self.expr = expr
        self.tz = tz
        self._seconds_first = len(fields) == 6
        self._fixed = _fixed_time(fields)
        self._utc = self._zone.key in _UTC_NAMES
        fixed, day_or = normalise_fields(fields)
        try:
            # Naive wall-clock times: croniter only matches fields; the zone's
            # offsets, gaps and repeats are applied in _next.
            self._iter = croniter(
                " ".join(fixed),
                _EPOCH.replace(tzinfo=None),
                second_at_beginning=True,
                day_or=day_or,
            )
        except (CroniterError, ValueError, TypeError, KeyError) as exc:
            raise ReminderError(
                f"bad cron expression {expr!r}: {exc}. Use 5 fields (minute first) or 6 "
                "fields (second first), e.g. '0 0 9 * * 1-5' for weekdays at 09:00:00"
            ) from exc
        # The wall time the iterator is positioned on; None until the first step.
        self._last: datetime | None = None

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t``, aware UTC.

        Raises ``ReminderError`` if the expression never matches again (e.g. the
        30th of February), as croniter gives up after a bounded search.
        """
        if t.tzinfo is None:
            raise ValueError("naive datetime: schedules take timezone-aware datetimes")
        t = t.astimezone(UTC)
        if self._utc:
            return self._wall_after(t.replace(tzinfo=None)).replace(tzinfo=UTC)
        return self._next(t)

    def _offset(self, t: datetime) -> timedelta:
        """The zone's UTC offset at instant ``t`` (aware UTC)."""
        off = t.astimezone(self._zone).utcoffset()
        assert off is not None
        return off

    def _next(self, t: datetime) -> datetime:
        """The first instant after ``t`` whose local wall time matches, with the DST rule.

        Walks wall-clock matches under the offset in force; where an offset
        change lies ahead (at the next match, or within ``_MAX_SHIFT``, so that
        walls repeating after a fall-back are not passed over) it finds the
        change instant and goes on from there under the new offset.
        """
        off = self._offset(t)
        wall_from = (t + off).replace(tzinfo=None)
        lo = t  # exclusive: the instants searched are after lo, under ``off``
        for _ in range(_MAX_DST_STEPS):
            w = self._wall_after(wall_from)
            u = w.replace(tzinfo=UTC) - off
            change = self._change_between(lo, min(u, lo + _MAX_SHIFT), off)
            if change is None and self._offset(u) != off:
                change = self._change_between(lo, u, off)
            if change is None or u < change:
                # ``u`` is valid under ``off``. A fixed-time job runs once in a
                # repeated hour: not on the second pass (fold 1).
                if self._fixed and u.astimezone(self._zone).fold == 1:
                    lo, wall_from = u, w
                    continue
                return u
            new_off = self._offset(change)
            if new_off > off and self._fixed and w < (change + new_off).replace(tzinfo=None):
                # A fixed-time slot in the skipped hour runs once, right after the gap.
                return change
            lo = change - _US
            off = new_off
            wall_from = (change + new_off).replace(tzinfo=None) - _US
        raise ReminderError(f"cron {self.expr!r} produced no slot after {t.isoformat()}")

    def _change_between(self, lo: datetime, hi: datetime, off: timedelta) -> datetime | None:
        """The first instant in ``(lo, hi]`` whose offset is not ``off``, or ``None``.

        Steps a day at a time (zones change offset at most a few times a
        year), then bisects to the second within the day.
        """
        if hi <= lo:
            return None
        a = lo
        while True:
            b = min(hi, a + _DAY)
            if self._offset(b) != off:
                break
            if b >= hi:
                return None
            a = b
        # offset(a) == off (or a == lo), offset(b) != off: bisect to whole seconds.
        while b - a > _SECOND:
            mid = a + (b - a) / 2
            if self._offset(mid) != off:
                b = mid
            else:
                a = mid
        return b.replace(microsecond=0) if self._offset(b.replace(microsecond=0)) != off else b

    def _wall_after(self, wall: datetime) -> datetime:
        """The first matching wall time strictly after naive ``wall``."""
        if self._last is None or wall != self._last:
            self._iter.set_current(wall, force=True)
        slot = self._step()
        for _ in range(_MAX_CATCH_UP_STEPS):
            if slot > wall:
                return slot
            slot = self._step()
        raise ReminderError(f"cron {self.expr!r} produced no slot after {wall.isoformat()}")

    def _step(self) -> datetime:
        try:
            local: datetime = self._iter.get_next(datetime)
        except CroniterBadDateError as exc:
            self._last = None
            raise ReminderError(
                f"cron expression {self.expr!r} never matches after this point "
                "(for example a day that does not exist in any month)"
            ) from exc
        self._last = local
        return local

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

    def nominal(self, slot: datetime) -> datetime:
        return slot

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
    """The schedule of a reminder row: its cron (shared per expression and zone),
    its interval grid or its one slot, with its calendar's exclusions applied
    (``calendars.CalendarSchedule``: the slots are then fire times), within its
    bounds and with its jitter (``BoundedSchedule``, only for rows that have
    any). ``ReminderError`` for a bad cron."""
    base: Schedule
    if entry.cron is not None:
        base = cron_schedule(entry.cron, entry.tz)
    elif entry.period is not None:
        base = IntervalSchedule(entry.start_at, entry.period)
    else:
        base = OneShotSchedule(entry.start_at)
    rules = entry.calendar_rules
    if rules is not None:
        base = CalendarSchedule(base, rules, entry.on_excluded or Excluded.SKIP)
    if (
        entry.jitter is None
        and entry.starts_at is None
        and entry.ends_at is None
        and entry.final_due is None
    ):
        return base
    return BoundedSchedule(
        base,
        key=entry.key,
        jitter=entry.jitter,
        starts_at=entry.starts_at,
        ends_at=entry.ends_at,
        final_due=entry.final_due,
    )


def next_slot(entry: ReminderEntry, now: datetime) -> datetime:
    """The row's first slot after ``now`` (a repair); ``ReminderError`` when its
    schedule has none left (an ended one-shot or bounded reminder: delete it)."""
    nxt = schedule_for(entry).next_after(now)
    if nxt is None:
        raise ReminderError(
            f"reminder {entry.name!r} of {entry.grain_id} has no slot after "
            f"{now.isoformat()}: its schedule ended; delete it or register it again"
        )
    return nxt
