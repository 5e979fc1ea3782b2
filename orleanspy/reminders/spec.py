"""Reminder registration: validate what a user asked for and build the row.

``new_entry`` is the single place where registration input is checked; every
path that creates a row (a grain's ``register_or_update_reminder``, the
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
* the grace (``grace``, optional) is a duration (seconds or ``timedelta``) in
  ``0 .. MAX_GRACE``; ``None`` leaves the row on ``ReminderOptions.missed_tick_grace``.

Anything else raises ``ReminderError`` saying what is wrong and how to fix it.
Times are stored with millisecond precision, so ``start_at``, ``next_due`` and
``period`` are truncated to whole milliseconds here, once.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from orleanspy.clock import from_ms, to_ms
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import MissedReminderAction, ReminderEntry, ReminderPriority
from orleanspy.reminders.schedule import cron_schedule, parse_zone

__all__ = [
    "MAX_GRACE",
    "MAX_GRAIN_ID_LENGTH",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "check_grace",
    "new_entry",
]

PRIORITY_MIN = -128
PRIORITY_MAX = 127
#: Ticks are scheduled before this instant (tables index due times up to 2527).
LATEST_TICK = datetime(2500, 1, 1, tzinfo=UTC)
#: Longest canonical grain id (``type/tagged key``) a reminder row may have.
MAX_GRAIN_ID_LENGTH = 1024
#: The longest missed-tick grace a row may have.
MAX_GRACE = timedelta(days=366)

_MS = timedelta(milliseconds=1)
_FORBIDDEN_IN_NAME = ("|", "\n", "\r")


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
    *,
    service_id: str,
    grain_id: GrainId,
    name: str,
    now: datetime,
    options: ReminderOptions,
    due: timedelta | float | int | None = None,
    period: timedelta | float | int | None = None,
    cron: str | None = None,
    tz: str | None = None,
    priority: int = ReminderPriority.NORMAL,
    action: MissedReminderAction = MissedReminderAction.SKIP,
    grace: timedelta | float | None = None,
) -> ReminderEntry:
    """Validate a registration and build its row (``etag`` ``None``, never fired).

    Interval form (``period``): ``due`` defaults to ``period``;
    ``start_at = next_due = now + due``. Cron form (``cron``, optional ``tz``):
    ``start_at = now + due`` (``due`` defaults to 0) and ``next_due`` is the
    first cron slot at or after ``start_at``. Numbers are seconds. Times are
    truncated to whole milliseconds; the cron expression is stored with its
    whitespace normalised. ``now`` must be timezone-aware (``ValueError``).

    Raises ``ReminderError`` for every invalid input listed in the module docstring.
    """
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
    if (period is None) == (cron is None):
        raise ReminderError(
            "give exactly one of period (an interval reminder) and cron (a cron reminder), "
            f"got {'both' if cron is not None else 'neither'}"
        )
    if tz is not None and cron is None:
        raise ReminderError("tz applies to cron reminders only: drop tz or give a cron expression")
    grace_td = check_grace(grace)
    due_td = None if due is None else _duration(due, "due")
    if due_td is not None and due_td < timedelta(0):
        raise ReminderError(f"due must be >= 0, got {due!r}: use 0 to fire at once")
    if period is not None:
        period_td = _whole_ms(_duration(period, "period"))
        if period_td < options.minimum_period:
            raise ReminderError(
                f"period {period_td} is below the minimum of {options.minimum_period} "
                "(ReminderOptions.minimum_period): use a longer period"
            )
        start_at = _start(now, period_td if due_td is None else due_td)
        return ReminderEntry(
            service_id=service_id,
            grain_id=grain_id,
            name=name,
            start_at=start_at,
            next_due=start_at,
            period=period_td,
            priority=int(priority),
            action=action,
            grace=grace_td,
        )

    if not isinstance(cron, str):
        raise ReminderError(f"cron must be a string expression, got {type(cron).__name__}")
    parse_zone(tz)  # a bad zone is reported as such, before the expression is parsed
    expr = " ".join(cron.split())
    schedule = cron_schedule(expr, tz)
    start_at = _start(now, due_td or timedelta(0))
    # Slots are whole seconds and start_at is whole ms, so "after start_at - 1 ms"
    # is exactly "at or after start_at".
    next_due = schedule.next_after(start_at - _MS)
    following = schedule.next_after(next_due)
    gap = min(following - next_due, timedelta(seconds=schedule.min_gap_seconds()))
    if gap < options.minimum_period:
        raise ReminderError(
            f"cron {expr!r} fires {gap.total_seconds():g} s apart, below the minimum period "
            f"of {options.minimum_period} (ReminderOptions.minimum_period): use a sparser "
            "expression"
        )
    return ReminderEntry(
        service_id=service_id,
        grain_id=grain_id,
        name=name,
        start_at=start_at,
        next_due=next_due,
        cron=expr,
        tz=tz,
        priority=int(priority),
        action=action,
        grace=grace_td,
    )
