"""Reminder registration: what a user asks for, validated once, and the row it builds.

``ReminderSpec`` is what a registration asks for: the schedule (``due``,
``period``, ``cron``, ``tz``, ``at``, bounds, jitter, calendar) and the row's
options (priority, action, grace, payload, retry, labels). It is the one list of those
options: a grain's ``register_or_update_reminder`` and ``@register_reminder``
take them as keywords (``ReminderArgs`` and ``RepeatingArgs``, the same names
and types) and build a spec; ``ReminderRegistry.register`` and
``Registration`` (bulk) take one; a ``DeclaredReminder`` is one. Adding an
option means adding it here (the spec, the keyword types, ``new_entry``) and
to the row (``model.ReminderEntry``) and its storage, and nowhere else.

``new_entry`` is the single place where a spec is checked; every path that
creates a row (a grain's ``register_or_update_reminder``, the
``@register_reminder`` declarations at silo start-up, the management grain)
goes through it, so the rules below hold for every stored row:

* exactly one of ``period`` and ``cron``; ``tz`` only with ``cron``;
* ``due`` and ``period`` are seconds (``int``/``float``) or ``timedelta``,
  finite; ``due >= 0``; ``period >= options.minimum_period``;
* a cron's slots are never closer than ``options.minimum_period``;
* the name is non-empty, at most ``options.max_name_length`` characters, and
  free of ``|`` (the storage key separator) and line breaks;
* the grain's canonical id (type and key) is at most ``MAX_GRAIN_ID_LENGTH``
  characters; a cron expression at most ``MAX_CRON_LENGTH`` and a zone name
  at most ``MAX_ZONE_LENGTH`` (``schedule``), so no row is costly to parse for
  every silo that comes to own it;
* the priority is an ``int`` in -128..127 (``bool`` is refused);
* the action is a ``MissedReminderAction``;
* a *one-shot* reminder (``at=`` an aware datetime, or ``due=`` without
  ``period``/``cron``) has one slot; ``at`` goes with neither ``due``,
  ``period`` nor ``cron``; an ``at`` in the past fires at once. Bounds
  (``starts_at``, ``ends_at``, ``max_ticks``) are for repeating reminders;
* ``jitter`` is ``>= 0`` and at most the period (the cron's smallest gap);
  ``0`` means none;
* ``starts_at``/``ends_at`` are aware datetimes, ``ends_at >= starts_at``, and
  the bounds leave at least one slot; ``max_ticks`` is an int ``>= 1`` (at most
  ``MAX_CRON_TICKS`` for a cron);
* ``payload`` is a value the codec carries, at most ``MAX_PAYLOAD_BYTES``
  encoded; ``retry`` is a ``RetryPolicy``;
* the grace (``grace``, optional) is a duration (seconds or ``timedelta``) in
  ``0 .. MAX_GRACE``; ``None`` leaves the row on
  ``ReminderOptions.missed_tick_grace``;
* ``overlap`` is an ``OverlapPolicy``, for repeating reminders only (a
  one-shot has no second slot to overlap);
* ``catchup_window`` is a duration in ``0 .. policies.MAX_CATCHUP_WINDOW``, with
  ``action=FIRE_IMMEDIATELY`` only (the other actions never catch up), and no
  shorter than the row's grace (a tick within its grace is on time, so a
  window that excluded it would skip on-time ticks);
* ``deadline`` is a duration in ``1 ms .. policies.MAX_DEADLINE``
  (``reminders.policies`` holds these checks).
* ``labels`` are at most ``labels.MAX_LABELS`` pairs of a key and a value
  within their bounds (``reminders.labels``);
* ``calendar`` names a stored calendar (``reminders.calendars``: the caller
  reads it and hands it to ``new_entry``, which refuses a name it was not
  given the calendar of); ``on_excluded`` is an ``Excluded`` and needs a
  calendar; the calendar must leave the reminder a slot.

Anything else raises ``ReminderError`` saying what is wrong and how to fix it.
Times are stored with millisecond precision, so ``start_at``, ``next_due`` and
``period`` are truncated to whole milliseconds here, once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, Final, TypedDict, cast

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.calendars import (
    CALENDAR_HORIZON,
    Excluded,
    StoredCalendar,
    check_calendar_name,
)
from orleanspy.reminders.labels import check_labels
from orleanspy.reminders.model import (
    MissedReminderAction,
    OverlapPolicy,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
    make_entry,
    payload_size,
)
from orleanspy.reminders.policies import catchup_window, check_deadline, check_overlap
from orleanspy.reminders.schedule import (
    MAX_CRON_TICKS,
    IntervalSchedule,
    Schedule,
    cron_schedule,
    parse_zone,
    schedule_for,
)
from orleanspy.serialization import pack, unpack

__all__ = [
    "DURATION_OPTIONS",
    "MAX_GRACE",
    "MAX_GRAIN_ID_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "ReminderArgs",
    "ReminderSpec",
    "RepeatingArgs",
    "check_grace",
    "check_keywords",
    "new_entry",
    "spec_of_row",
]

PRIORITY_MIN = -128
PRIORITY_MAX = 127
#: Ticks are scheduled before this instant (tables index due times up to 2527).
LATEST_TICK = datetime(2500, 1, 1, tzinfo=UTC)
#: Longest canonical grain id (``type/tagged key``) a reminder row may have.
MAX_GRAIN_ID_LENGTH = 1024
#: Largest payload a reminder may carry, encoded by the codec: it is stored in the
#: row and read by every owner, so it stays small (a key, a few ids, a flag).
MAX_PAYLOAD_BYTES = 4096
#: The longest missed-tick grace a row may have.
MAX_GRACE = timedelta(days=366)

_MS = timedelta(milliseconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FORBIDDEN_IN_NAME = ("|", "\n", "\r")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReminderSpec:
    """What one registration asks for; ``new_entry`` validates it and builds the row.

    The fields mean what ``Grain.register_or_update_reminder``'s keyword
    arguments mean (the module docstring lists the rules). A spec is a value:
    it is not checked when it is made, but once, by ``new_entry``, when a row
    is built from it, with the context the rules need (the clock's now, the
    silo's ``ReminderOptions``, the grain and the name): so a bulk
    ``Registration`` or a declaration is reported with its position or its
    class. ``None`` means "not given": for ``priority`` that is
    ``ReminderPriority.NORMAL``, for ``action`` ``MissedReminderAction.SKIP``,
    for ``grace`` the silo's ``ReminderOptions.missed_tick_grace``, for
    ``overlap`` ``OverlapPolicy.BUFFER_ONE``, for ``catchup_window`` no limit,
    for ``deadline`` the silo's ``ReminderOptions.tick_deadline``. Numbers are
    seconds.

    ``Registration`` and ``DeclaredReminder`` extend it with who the reminder
    is for; every field added here reaches them, and the keyword arguments of
    ``ReminderArgs`` / ``RepeatingArgs`` must name it too (a test checks).
    """

    due: timedelta | float | None = None
    period: timedelta | float | None = None
    cron: str | None = None
    tz: str | None = None
    priority: int | None = None
    action: MissedReminderAction | None = None
    grace: timedelta | float | None = None
    at: datetime | None = None
    jitter: timedelta | float | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    max_ticks: int | None = None
    payload: Any = field(default=None, hash=False)
    retry: RetryPolicy | None = None
    overlap: OverlapPolicy | None = None
    catchup_window: timedelta | float | None = None
    deadline: timedelta | float | None = None
    labels: Mapping[str, str] | None = field(default=None, hash=False)
    calendar: str | None = None
    on_excluded: Excluded | None = None


class RepeatingArgs(TypedDict, total=False):
    """The keyword arguments of ``@register_reminder``: a ``ReminderSpec``'s
    fields but ``at`` and ``max_ticks`` (a declaration is applied at every
    start, so it repeats and its count would start again)."""

    due: timedelta | float | None
    period: timedelta | float | None
    cron: str | None
    tz: str | None
    priority: int | None
    action: MissedReminderAction | None
    grace: timedelta | float | None
    jitter: timedelta | float | None
    starts_at: datetime | None
    ends_at: datetime | None
    payload: Any
    retry: RetryPolicy | None
    overlap: OverlapPolicy | None
    catchup_window: timedelta | float | None
    deadline: timedelta | float | None
    labels: Mapping[str, str] | None
    calendar: str | None
    on_excluded: Excluded | None


class ReminderArgs(RepeatingArgs, total=False):
    """The keyword arguments of ``Grain.register_or_update_reminder``: every
    field of a ``ReminderSpec``."""

    at: datetime | None
    max_ticks: int | None


#: The spec's fields given as durations (seconds or ``timedelta``).
DURATION_OPTIONS: Final = ("due", "period", "grace", "jitter", "catchup_window", "deadline")


def check_keywords(given: Mapping[str, object], allowed: frozenset[str], where: str) -> None:
    """``TypeError`` as Python words it for a keyword ``where`` does not take
    (keyword arguments checked before they become a ``ReminderSpec``)."""
    if not given.keys() <= allowed:
        unknown = next(k for k in given if k not in allowed)
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown!r}")


def spec_of_row(row: ReminderEntry) -> ReminderSpec:
    """The spec that registers ``row``'s schedule and options as they are: a
    one-shot row as ``at=`` its ``start_at``, a repeating one from now
    (``due=0``). ``new_entry`` of it validates a row read from elsewhere (an
    import)."""
    one_shot = row.period is None and row.cron is None
    return ReminderSpec(
        due=None if one_shot else 0,
        at=row.start_at if one_shot else None,
        period=row.period,
        cron=row.cron,
        tz=row.tz,
        priority=row.priority,
        action=row.action,
        grace=row.grace,
        jitter=row.jitter,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        max_ticks=row.max_ticks,
        payload=row.payload,
        retry=row.retry,
        overlap=row.overlap,
        catchup_window=row.catchup_window,
        deadline=row.deadline,
        labels=row.labels,
        calendar=row.calendar,
        on_excluded=row.on_excluded,
    )


#: The options a plain interval reminder leaves unset (``new_entry``'s shortcut
#: takes only specs that set none of them): every field but these four, so an
#: option added to the spec leaves the shortcut by itself. The payload, any
#: value of the user's, is checked apart (``is None``), so that no value's
#: ``__eq__`` runs; the others compare to ``None`` as a tuple (the fastest test).
_PLAIN = ("due", "period", "priority", "action")
_OTHERS = tuple(f.name for f in fields(ReminderSpec) if f.name not in (*_PLAIN, "payload"))
_UNSET_IF_PLAIN = attrgetter(*_OTHERS)
_ALL_UNSET = (None,) * len(_OTHERS)
#: What ``None`` stands for (looked up once: ``new_entry`` runs once per row in bulk).
_NORMAL: Final = ReminderPriority.NORMAL
_SKIP: Final = MissedReminderAction.SKIP


def _truncate_ms(t: datetime) -> datetime:
    return from_ms(to_ms(t))


def _duration(value: timedelta | float, what: str) -> timedelta:
    """``value`` as a ``timedelta`` (numbers are seconds, rounded to whole µs)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReminderError(
            f"{what} must be a number of seconds or a datetime.timedelta, "
            f"got {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise ReminderError(f"{what} must be a finite number of seconds, got {value!r}")
    try:
        return timedelta(seconds=value)
    except OverflowError as exc:
        raise ReminderError(f"{what} of {value!r} seconds is too large") from exc


def _whole_ms(d: timedelta) -> timedelta:
    # Via timedelta arithmetic, not float seconds * 1000, whose error would turn
    # 1.001 s into 1000 ms.
    return timedelta(milliseconds=d // _MS)


def _check_name(name: str, options: ReminderOptions) -> None:
    if not isinstance(name, str) or not name:
        raise ReminderError(f"a reminder name must be a non-empty string, got {name!r}")
    if len(name) > options.max_name_length:
        raise ReminderError(
            f"reminder name is {len(name)} characters long; the limit is "
            f"{options.max_name_length} (ReminderOptions.max_name_length): use a shorter name"
        )
    bad = [c for c in _FORBIDDEN_IN_NAME if c in name]
    if bad:
        raise ReminderError(
            f"reminder name {name!r} contains {bad[0]!r}; names may not contain '|' or "
            "line breaks: choose another name"
        )


def _check_grain(grain_id: GrainId) -> None:
    size = len(grain_id.canonical)
    if size > MAX_GRAIN_ID_LENGTH:
        raise ReminderError(
            f"grain id of {grain_id.type_name} is {size} characters long; reminders accept "
            f"at most {MAX_GRAIN_ID_LENGTH} (MAX_GRAIN_ID_LENGTH): use a shorter grain key"
        )


def _check_priority(priority: int) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ReminderError(
            f"priority must be an int in {PRIORITY_MIN}..{PRIORITY_MAX} (or a "
            f"ReminderPriority), got {type(priority).__name__} {priority!r}"
        )
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ReminderError(
            f"priority {priority} is out of range: use a value in "
            f"{PRIORITY_MIN}..{PRIORITY_MAX}, e.g. ReminderPriority.CRITICAL (100)"
        )


def check_grace(grace: timedelta | float | None) -> timedelta | None:
    """A row's missed-tick grace as stored (whole ms), or ``None`` for the default;
    ``ReminderError`` unless it is a duration in ``0 .. MAX_GRACE``."""
    if grace is None:
        return None
    value = _whole_ms(_duration(grace, "grace"))
    if not timedelta(0) <= value <= MAX_GRACE:
        raise ReminderError(
            f"grace must be between 0 and {MAX_GRACE.days} days, got {grace!r}: "
            "or None for ReminderOptions.missed_tick_grace"
        )
    return value


def _start(now: datetime, due: timedelta) -> datetime:
    try:
        start = _truncate_ms(now + due)
    except OverflowError:
        start = None
    if start is None or start >= LATEST_TICK:
        # Tables index due times as ms below 2**44 (the year 2527).
        raise ReminderError(f"due of {due} puts the first tick beyond the year 2500")
    return start


def new_entry(
    spec: ReminderSpec,
    *,
    service_id: str,
    grain_id: GrainId,
    name: str,
    now: datetime,
    options: ReminderOptions,
    declared: bool = False,
    fingerprint: str | None = None,
    calendar: StoredCalendar | None = None,
) -> ReminderEntry:
    """Validate ``spec`` and build its row for ``grain_id``'s reminder ``name``
    (``etag`` ``None``, never fired).

    ``calendar``: the stored calendar ``spec.calendar`` names (the caller read
    it; ``ReminderError`` "unknown calendar" when the spec names one and this
    is not it). The row keeps a copy of its rules and version.

    Interval form (``period``): ``due`` defaults to ``period``;
    ``start_at = now + due``. Cron form (``cron``, optional ``tz``):
    ``start_at = now + due`` (``due`` defaults to 0). One-shot form (``at``, or
    ``due`` alone): ``start_at = at`` (``now + due``), its only slot. ``next_due``
    is the first slot at or after ``start_at`` (and ``starts_at``), jittered.
    ``final_due`` is the ``max_ticks``-th slot. Numbers are seconds. Times are
    truncated to whole milliseconds; the cron expression is stored with its
    whitespace normalised. ``now`` must be timezone-aware (``ValueError``).

    ``declared`` and ``fingerprint`` are stored as given (declared rows).

    Raises ``ReminderError`` for every invalid input listed in the module docstring.
    """
    due, period, cron, tz = spec.due, spec.period, spec.cron, spec.tz
    priority = _NORMAL if spec.priority is None else spec.priority
    action = _SKIP if spec.action is None else spec.action
    if period is not None and spec.payload is None and _UNSET_IF_PLAIN(spec) == _ALL_UNSET:
        entry = _plain_interval(
            service_id,
            grain_id,
            name,
            now,
            options,
            due,
            period,
            priority,
            action,
            declared,
            fingerprint,
        )
        if entry is not None:
            return entry
    at, jitter, starts_at, ends_at = spec.at, spec.jitter, spec.starts_at, spec.ends_at
    max_ticks, payload, retry, grace = spec.max_ticks, spec.payload, spec.retry, spec.grace
    if now.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    _check_name(name, options)
    _check_grain(grain_id)
    _check_priority(priority)
    if not isinstance(action, MissedReminderAction):
        raise ReminderError(
            f"action must be a MissedReminderAction (FIRE_IMMEDIATELY, SKIP or NOTIFY), "
            f"got {action!r}"
        )
    if at is not None and (due is not None or period is not None or cron is not None):
        given = [n for n, v in (("due", due), ("period", period), ("cron", cron)) if v is not None]
        raise ReminderError(
            f"at= makes a one-shot reminder and takes no {' or '.join(given)}: give at= "
            "alone, or due/period/cron without at="
        )
    if period is not None and cron is not None:
        raise ReminderError(
            "give exactly one of period (an interval reminder) and cron (a cron reminder), got both"
        )
    if period is None and cron is None and at is None and due is None:
        raise ReminderError(
            "give period (an interval reminder), cron (a cron reminder), or at=/due= alone "
            "(a one-shot reminder), got none of them"
        )
    if tz is not None and cron is None:
        raise ReminderError("tz applies to cron reminders only: drop tz or give a cron expression")
    grace_td = check_grace(grace)
    overlap = check_overlap(spec.overlap, period is None and cron is None)
    catchup_td = catchup_window(spec.catchup_window, action, grace_td, options)
    deadline_td = check_deadline(spec.deadline)
    due_td = None if due is None else _duration(due, "due")
    if due_td is not None and due_td < timedelta(0):
        raise ReminderError(f"due must be >= 0, got {due!r}: use 0 to fire at once")
    jitter_td = _jitter(jitter)
    bounds = _bounds(starts_at, ends_at, max_ticks)
    payload = _check_payload(payload)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ReminderError(
            f"retry must be a RetryPolicy(max_attempts, backoff), got {type(retry).__name__}"
        )
    labels = check_labels(spec.labels)
    on_excluded, stored = _calendar(spec, calendar)
    extra: dict[str, Any] = {
        "grace": grace_td,
        "jitter": jitter_td,
        "starts_at": bounds[0],
        "ends_at": bounds[1],
        "max_ticks": max_ticks,
        "payload": payload,
        "retry": retry,
        "declared": declared,
        "fingerprint": fingerprint,
        "overlap": overlap,
        "catchup_window": catchup_td,
        "deadline": deadline_td,
        "labels": labels,
        "calendar": spec.calendar,
        "on_excluded": on_excluded,
        "calendar_version": None if stored is None else stored.version,
        "_calendar_rules": None if stored is None else stored.calendar,
    }
    base: Schedule
    if period is not None:
        period_td = _whole_ms(_duration(period, "period"))
        if period_td < options.minimum_period:
            raise ReminderError(
                f"period {period_td} is below the minimum of {options.minimum_period} "
                "(ReminderOptions.minimum_period): use a longer period"
            )
        _check_jitter_gap(jitter_td, period_td, f"the period of {period_td}")
        start_at = _start(now, period_td if due_td is None else due_td)
        entry = ReminderEntry(
            service_id=service_id,
            grain_id=grain_id,
            name=name,
            start_at=start_at,
            next_due=start_at,
            period=period_td,
            priority=int(priority),
            action=action,
            **extra,
        )
        base = IntervalSchedule(start_at, period_td)
    elif cron is not None:
        if not isinstance(cron, str):
            raise ReminderError(f"cron must be a string expression, got {type(cron).__name__}")
        parse_zone(tz)  # a bad zone is reported as such, before the expression is parsed
        expr = " ".join(cron.split())
        schedule = cron_schedule(expr, tz)
        start_at = _start(now, due_td or timedelta(0))
        # Slots are whole seconds and start_at is whole ms, so "after start_at - 1 ms"
        # is exactly "at or after start_at".
        first = schedule.next_after(start_at - _MS)
        following = schedule.next_after(first)
        gap = min(following - first, timedelta(seconds=schedule.min_gap_seconds()))
        if gap < options.minimum_period:
            raise ReminderError(
                f"cron {expr!r} fires {gap.total_seconds():g} s apart, below the minimum "
                f"period of {options.minimum_period} (ReminderOptions.minimum_period): use a "
                "sparser expression"
            )
        _check_jitter_gap(jitter_td, gap, f"the cron's smallest gap of {gap}")
        if max_ticks is not None and max_ticks > MAX_CRON_TICKS:
            raise ReminderError(
                f"max_ticks of {max_ticks} is above {MAX_CRON_TICKS} for a cron reminder "
                "(its last slot is found by stepping the expression): use ends_at instead"
            )
        entry = ReminderEntry(
            service_id=service_id,
            grain_id=grain_id,
            name=name,
            start_at=start_at,
            next_due=first,
            cron=expr,
            tz=tz,
            priority=int(priority),
            action=action,
            **extra,
        )
        base = schedule
    else:
        if bounds != (None, None) or max_ticks is not None:
            raise ReminderError(
                "starts_at, ends_at and max_ticks bound repeating reminders; a one-shot "
                "reminder fires once at its at=/due=: drop them"
            )
        if at is not None:
            if not isinstance(at, datetime) or at.tzinfo is None:
                raise ReminderError(f"at must be a timezone-aware datetime, got {at!r}")
            start_at = _start(max(at, now), timedelta(0))
        else:
            start_at = _start(now, due_td or timedelta(0))
        entry = ReminderEntry(
            service_id=service_id,
            grain_id=grain_id,
            name=name,
            start_at=start_at,
            next_due=start_at,
            priority=int(priority),
            action=action,
            **extra,
        )
        return _first_slot(entry)
    if max_ticks is not None:
        entry = _with_final(entry, base, max_ticks)
    return _first_slot(entry)


#: Durations given as numbers of seconds, as ``_duration`` makes them: the
#: same few values (a declaration's, a batch's) come again and again. Keyed by
#: type too, so ``1`` and ``1.0`` (equal, same hash) each keep their own entry.
_SECONDS: dict[tuple[type, float], timedelta] = {}
_SECONDS_KEPT = 4096
_ZERO = timedelta(0)


def _plain_interval(  # noqa: PLR0917 (positional: it runs once per row in bulk)
    service_id: str,
    grain_id: GrainId,
    name: str,
    now: datetime,
    options: ReminderOptions,
    due: timedelta | float | None,
    period: timedelta | float,
    priority: int,
    action: MissedReminderAction,
    declared: bool,
    fingerprint: str | None,
) -> ReminderEntry | None:
    """``new_entry`` of a plain interval reminder (``period``, optional ``due``,
    nothing else), or ``None`` when any input is not plainly valid: the caller
    then takes the general path, which raises the error it always raised. Only
    checks that can fail for these inputs are made; the row is the one the
    general path builds (its first slot is ``start_at``: the grid starts there
    and there is neither jitter nor a bound)."""
    if (
        now.tzinfo is None
        or type(name) is not str
        or not name
        or len(name) > options.max_name_length
        or "|" in name
        or "\n" in name
        or "\r" in name
        or len(grain_id.canonical) > MAX_GRAIN_ID_LENGTH
        or type(action) is not MissedReminderAction
    ):
        return None
    if type(priority) is not int:
        if isinstance(priority, bool) or not isinstance(priority, int):
            return None
        priority = int(priority)
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        return None
    given = _seconds(period)
    if given is None:
        return None
    period_td = _whole_ms(given)
    if period_td < options.minimum_period or period_td <= _ZERO:
        return None
    due_td = period_td if due is None else _seconds(due)
    if due_td is None or due_td < _ZERO:
        return None
    try:
        start_at = from_ms((now - _EPOCH + due_td) // _MS)
    except OverflowError:
        return None
    if start_at >= LATEST_TICK:
        return None
    return make_entry(  # action checked above: no __post_init__ needed
        service_id,
        grain_id,
        name,
        start_at,
        start_at,
        period_td,
        None,
        None,
        None,
        priority,
        action,
        None,
        bool(declared),
        False,
        fingerprint,
    )


def _seconds(value: timedelta | float) -> timedelta | None:
    """``_duration(value)`` when it succeeds, else ``None`` (cached for numbers;
    subclasses of ``timedelta``, ``int`` and ``float`` take the general path)."""
    if type(value) is timedelta:
        return value
    kind = type(value)
    if kind is not int and kind is not float:
        return None
    number = cast(float, value)
    key = (kind, number)
    td = _SECONDS.get(key)
    if td is None:
        if not math.isfinite(number):
            return None
        try:
            td = timedelta(seconds=number)
        except OverflowError:
            return None
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        _SECONDS[key] = td
    return td


def _jitter(jitter: timedelta | float | None) -> timedelta | None:
    if jitter is None:
        return None
    td = _whole_ms(_duration(jitter, "jitter"))
    if td < timedelta(0):
        raise ReminderError(f"jitter must be >= 0, got {jitter!r}: use 0 or None for none")
    return td or None


def _check_jitter_gap(jitter: timedelta | None, gap: timedelta, what: str) -> None:
    if jitter is not None and jitter > gap:
        raise ReminderError(
            f"jitter of {jitter} is longer than {what}: a slot's offset never reaches "
            "the next slot, so use a jitter no longer than that"
        )


def _aware(value: datetime | None, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ReminderError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return _truncate_ms(value)


def _bounds(
    starts_at: datetime | None, ends_at: datetime | None, max_ticks: int | None
) -> tuple[datetime | None, datetime | None]:
    starts = _aware(starts_at, "starts_at")
    ends = _aware(ends_at, "ends_at")
    if starts is not None and ends is not None and ends < starts:
        raise ReminderError(
            f"ends_at {ends.isoformat()} is before starts_at {starts.isoformat()}: "
            "a reminder must end after it starts"
        )
    if max_ticks is not None and (
        isinstance(max_ticks, bool) or not isinstance(max_ticks, int) or max_ticks < 1
    ):
        raise ReminderError(
            f"max_ticks must be an int >= 1 (how many slots the reminder has), got {max_ticks!r}"
        )
    return starts, ends


def _check_payload(payload: Any) -> Any:
    """The payload as it will read back from storage (the codec's round trip:
    tuples become lists), so the registered row equals the stored one."""
    if payload is None:
        return None
    size = payload_size(payload)
    if size > MAX_PAYLOAD_BYTES:
        raise ReminderError(
            f"payload is {size} bytes encoded; a reminder carries at most {MAX_PAYLOAD_BYTES} "
            "(MAX_PAYLOAD_BYTES): store the data elsewhere and put its key in the payload"
        )
    return unpack(pack(payload))


def _with_final(entry: ReminderEntry, base: Schedule, max_ticks: int) -> ReminderEntry:
    """``entry`` with ``final_due``, its ``max_ticks``-th nominal slot (``None``
    when ``ends_at`` comes first)."""
    unjittered = schedule_for(replace(entry, jitter=None))
    first = unjittered.next_after(entry.start_at - _MS)
    if first is None:
        return entry  # no slot at all: _first_slot reports it
    if isinstance(base, IntervalSchedule):
        last_ms = to_ms(first) + (max_ticks - 1) * (base.period // _MS)
        if last_ms >= to_ms(LATEST_TICK):
            raise ReminderError(f"max_ticks of {max_ticks} puts the last slot beyond the year 2500")
        final: datetime | None = from_ms(last_ms)
    else:
        final = first
        for _ in range(max_ticks - 1):
            final = unjittered.next_after(final)
            if final is None:
                break
    if final is None or (entry.ends_at is not None and final > entry.ends_at):
        return entry
    if final >= LATEST_TICK:
        raise ReminderError(f"max_ticks of {max_ticks} puts the last slot beyond the year 2500")
    return replace(entry, final_due=final)


def _calendar(
    spec: ReminderSpec, calendar: StoredCalendar | None
) -> tuple[Excluded | None, StoredCalendar | None]:
    """The spec's ``on_excluded`` and its calendar, checked."""
    on_excluded = spec.on_excluded
    if spec.calendar is None:
        if on_excluded is not None:
            raise ReminderError(
                "on_excluded says what becomes of a slot a calendar excludes: give calendar= too"
            )
        return None, None
    name = check_calendar_name(spec.calendar)
    if calendar is None or calendar.name != name:
        raise ReminderError(
            f"unknown calendar {name!r}: set it first (client.reminders.set_calendar, or "
            "orleanspy reminders calendar set)"
        )
    if on_excluded is not None:
        try:
            on_excluded = Excluded(on_excluded)
        except ValueError:
            raise ReminderError(
                f"on_excluded must be an Excluded (SKIP, NEXT_BUSINESS_DAY or "
                f"PREVIOUS_BUSINESS_DAY), got {on_excluded!r}"
            ) from None
    return on_excluded, calendar


def _first_slot(entry: ReminderEntry) -> ReminderEntry:
    """``entry`` with ``next_due`` its first slot at or after ``start_at``, jittered.

    The nominal slot is found first: a cron's slot before ``start_at`` may have
    a jittered instant after it, and it is not one of the row's slots."""
    if entry.jitter is None:
        first = schedule_for(entry).next_after(entry.start_at - _MS)
        if first == entry.next_due:
            return entry  # the common case: no copy of the row (bulk registration)
    else:
        nominal = schedule_for(replace(entry, jitter=None)).next_after(entry.start_at - _MS)
        # The jittered instant of that slot: the previous slot's instant lies before it.
        first = None if nominal is None else schedule_for(entry).next_after(nominal - _MS)
    if first is None and entry.calendar is not None:
        raise ReminderError(
            f"calendar {entry.calendar!r} excludes every slot of the reminder from "
            f"{entry.start_at.isoformat()} on (looking {CALENDAR_HORIZON.days} days ahead): "
            "choose another schedule or calendar"
        )
    if first is None:
        raise ReminderError(
            f"the reminder has no slot between {entry.start_at.isoformat()} and its end "
            f"({entry.ends_at.isoformat() if entry.ends_at else 'none'}): move ends_at later"
        )
    if first >= LATEST_TICK:
        raise ReminderError("the reminder's first slot lies beyond the year 2500")
    return replace(entry, next_due=first)
