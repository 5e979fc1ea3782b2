"""A reminder's tick policies: what a slot that overlaps the running tick becomes
(``overlap``), how far back a missed slot is caught up (``catchup_window``) and
how long a tick may run (``deadline``): their checks (``spec.new_entry`` calls
them), and the cluster features a row needs for those and its other 0.2 options
(labels, a calendar): 0.1.x silos ignore them, so registrations wait for every
silo to know them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Final, Protocol

from orleanspy.errors import ReminderError
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import MissedReminderAction, OverlapPolicy

__all__ = [
    "MAX_CATCHUP_WINDOW",
    "MAX_DEADLINE",
    "Policies",
    "catchup_window",
    "check_deadline",
    "check_overlap",
    "needed_features",
]

#: The longest catch-up window a row may have.
MAX_CATCHUP_WINDOW: Final = timedelta(days=366)
#: The longest a tick may be allowed to run (``deadline``).
MAX_DEADLINE: Final = timedelta(days=1)
_MS: Final = timedelta(milliseconds=1)


class Policies(Protocol):
    """What carries the policies: a ``ReminderSpec``, or a row (``ReminderEntry``)."""

    @property
    def overlap(self) -> OverlapPolicy | None: ...

    @property
    def catchup_window(self) -> timedelta | float | None: ...

    @property
    def deadline(self) -> timedelta | float | None: ...

    @property
    def labels(self) -> Mapping[str, str] | None: ...

    @property
    def calendar(self) -> str | None: ...

    @property
    def on_excluded(self) -> object: ...


def _duration(value: timedelta | float, what: str) -> timedelta:
    """``value`` as whole milliseconds (numbers are seconds)."""
    if isinstance(value, timedelta):
        td = value
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReminderError(
            f"{what} must be a finite number of seconds or a datetime.timedelta, got {value!r}"
        )
    else:
        try:
            td = timedelta(seconds=value)
        except OverflowError as exc:
            raise ReminderError(f"{what} of {value!r} seconds is too large") from exc
    return timedelta(milliseconds=td // _MS)


def needed_features(spec: Policies) -> tuple[str, ...]:
    """The names of the cluster features (``versions.Feature``) a row of
    ``spec`` (or the row itself) needs: what it stores or sends that 0.1.x
    does not know."""
    needed: list[str] = []
    if spec.overlap is not None:
        needed.append("OVERLAP_POLICY")
    if spec.catchup_window is not None:
        needed.append("CATCHUP_WINDOW")
    if spec.deadline is not None or spec.overlap == OverlapPolicy.CANCEL_OTHER:
        needed.append("TICK_DEADLINE")
    if spec.labels:
        needed.append("REMINDER_LABELS")
    if spec.calendar is not None or spec.on_excluded is not None:
        needed.append("REMINDER_CALENDARS")
    return tuple(needed)


def check_deadline(deadline: timedelta | float | None) -> timedelta | None:
    """A tick deadline as stored (whole ms), or ``None`` for none given;
    ``ReminderError`` unless it is a duration in ``1 ms .. MAX_DEADLINE``."""
    if deadline is None:
        return None
    value = _duration(deadline, "deadline")
    if not _MS <= value <= MAX_DEADLINE:
        raise ReminderError(
            f"deadline must be between 1 ms and {MAX_DEADLINE.days} day, got {deadline!r}: "
            "how long receive_reminder may run before it is cancelled (None: "
            "ReminderOptions.tick_deadline)"
        )
    return value


def check_overlap(overlap: OverlapPolicy | None, one_shot: bool) -> OverlapPolicy | None:
    """The overlap policy as stored: an ``OverlapPolicy`` (its int value, as the
    codec carries an enum, is taken too)."""
    if overlap is None:
        return None
    if not isinstance(overlap, OverlapPolicy):
        if type(overlap) is int and overlap in OverlapPolicy._value2member_map_:
            return check_overlap(OverlapPolicy(overlap), one_shot)
        raise ReminderError(
            "overlap must be an OverlapPolicy (SKIP, BUFFER_ONE, BUFFER_ALL, CANCEL_OTHER "
            f"or ALLOW_ALL), got {overlap!r}"
        )
    if one_shot:
        raise ReminderError(
            "overlap governs the slots of a repeating reminder that fall due while its "
            "previous tick runs; a one-shot reminder has one slot: drop overlap"
        )
    return overlap


def catchup_window(
    window: timedelta | float | None,
    action: MissedReminderAction,
    grace: timedelta | None,
    options: ReminderOptions,
) -> timedelta | None:
    """The catch-up window as stored, checked against the action and the grace
    (docs/reminders.md, "Late ticks: grace, catch-up window and action")."""
    if window is None:
        return None
    value = _duration(window, "catchup_window")
    if not timedelta(0) <= value <= MAX_CATCHUP_WINDOW:
        raise ReminderError(
            f"catchup_window must be between 0 and {MAX_CATCHUP_WINDOW.days} days, got "
            f"{window!r}: or None for no limit"
        )
    if action is not MissedReminderAction.FIRE_IMMEDIATELY:
        raise ReminderError(
            f"catchup_window bounds the catch-up tick of action=FIRE_IMMEDIATELY; "
            f"action={action.name} never catches up: drop catchup_window, or use "
            "action=MissedReminderAction.FIRE_IMMEDIATELY"
        )
    effective = options.grace if grace is None else grace
    if value < effective:
        raise ReminderError(
            f"catchup_window of {value} is shorter than the grace of {effective}: a tick "
            "within its grace is delivered on time, so the window must reach at least "
            "that far back; raise catchup_window or lower grace"
        )
    return value
