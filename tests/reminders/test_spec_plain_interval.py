"""``new_entry``'s shortcut for plain interval reminders (period, optional due,
nothing else) builds the row the general path builds, and leaves every input
it does not plainly accept to the general path and its errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import MissedReminderAction, ReminderPriority
from orleanspy.reminders.spec import ReminderSpec, new_entry

#: ``new_entry``'s arguments beside the spec.
CONTEXT = ("service_id", "grain_id", "name", "now", "options", "declared", "fingerprint")
NOW = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
OPTIONS = ReminderOptions()


def build(**kw: Any) -> Any:
    args: dict[str, Any] = {
        "service_id": "svc",
        "grain_id": GrainId("Plain", "k"),
        "name": "r",
        "now": NOW,
        "options": OPTIONS,
    }
    args.update(kw)
    context = {k: args.pop(k) for k in CONTEXT if k in args}
    return new_entry(ReminderSpec(**args), **context)


@pytest.mark.parametrize(
    "kw",
    [
        {"period": 60},
        {"period": 60.0015, "due": 0},
        {"period": timedelta(seconds=1, microseconds=1500), "due": timedelta(0)},
        {"period": 3600, "due": 1.0005},
        {"period": 1, "due": 10**9 // 1000},
        {"period": 60, "priority": ReminderPriority.CRITICAL},
        {"period": 60, "priority": -128, "action": MissedReminderAction.NOTIFY},
        {"period": 60, "declared": True, "fingerprint": "abc:0:1:"},
    ],
)
def test_the_shortcut_builds_the_general_row(kw: dict[str, Any]) -> None:
    # jitter=0 means none, but takes the general path.
    assert build(**kw) == build(**kw, jitter=0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"period": 60, "name": ""}, "non-empty string"),
        ({"period": 60, "name": "a|b"}, "contains '|'"),
        ({"period": 60, "name": "x" * 300}, "max_name_length"),
        ({"period": 60, "priority": True}, "priority must be an int"),
        ({"period": 60, "priority": 128}, "out of range"),
        ({"period": 60, "action": 1}, "action must be a MissedReminderAction"),
        ({"period": 0.5}, "below the minimum"),
        ({"period": 60, "due": -1}, "due must be >= 0"),
        ({"period": float("nan")}, "finite number"),
        ({"period": "60"}, "number of seconds or a datetime.timedelta"),
        ({"period": 60, "due": 10**14}, "too large"),
        ({"period": 60, "due": 10**12}, "beyond the year 2500"),
        ({"period": 60, "due": 10**11}, "beyond the year 2500"),
        ({"period": 60, "grain_id": GrainId("Plain", "k" * 2000)}, "MAX_GRAIN_ID_LENGTH"),
    ],
)
def test_what_the_shortcut_refuses_gets_the_general_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ReminderError, match=message.replace("|", r"\|")):
        build(**kw)


def test_a_naive_now_is_still_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        build(period=60, now=NOW.replace(tzinfo=None))
