"""``next_fire_times``: a reminder's coming ticks from its row, honouring its
calendar, jitter, bounds, pause and where its ``next_due`` stands."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from orleanspy import Calendar, Excluded, ReminderError, ReminderOptions
from orleanspy.identity import GrainId
from orleanspy.reminders.calendars import StoredCalendar
from orleanspy.reminders.describe import FireTime, next_fire_times
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.serialization import pack, unpack

NOW = datetime(2026, 12, 1, tzinfo=UTC)
BERLIN = ZoneInfo("Europe/Berlin")
MIN = timedelta(minutes=1)


def row(spec: ReminderSpec, calendar: StoredCalendar | None = None) -> ReminderEntry:
    return new_entry(
        spec,
        service_id="s",
        grain_id=GrainId("G", "k"),
        name="r",
        now=NOW,
        options=ReminderOptions(),
        calendar=calendar,
    )


def test_the_payday_calendar_shifts_and_a_row_from_a_call_takes_the_calendar_given() -> None:
    de = StoredCalendar(
        "de",
        Calendar(tz="Europe/Berlin", exclude_dates=["2026-12-25"], exclude_weekdays=[5, 6]),
        1,
    )
    pay = row(
        ReminderSpec(
            cron="0 0 9 25 * *",
            tz="Europe/Berlin",
            calendar="de",
            on_excluded=Excluded.PREVIOUS_BUSINESS_DAY,
        ),
        de,
    )
    got = next_fire_times(pay, None, 5, NOW)
    assert [f.at.astimezone(BERLIN).date().isoformat() for f in got] == [
        "2026-12-24", "2027-01-25", "2027-02-25", "2027-03-25", "2027-04-23",
    ]  # fmt: skip
    assert got[0] == FireTime(
        datetime(2026, 12, 24, 9, tzinfo=BERLIN), datetime(2026, 12, 25, 9, tzinfo=BERLIN)
    )
    travelled = unpack(pack(pay))  # rules stay behind in a call
    with pytest.raises(ReminderError, match="pass the calendar"):
        next_fire_times(travelled, None, 3, NOW)
    assert next_fire_times(travelled, de.calendar, 5, NOW) == got


def test_jitter_bounds_pause_and_next_due() -> None:
    jittered = row(ReminderSpec(period=60, jitter=30))
    fires = next_fire_times(jittered, None, 4, NOW)
    assert [f.slot for f in fires] == [NOW + i * MIN for i in range(1, 5)]
    assert all(f.slot <= f.at < f.slot + timedelta(seconds=30) for f in fires)
    assert any(f.at != f.slot for f in fires)
    bounded = row(ReminderSpec(period=60, ends_at=NOW + 3 * MIN))
    assert [f.at for f in next_fire_times(bounded, None, 10, NOW)] == [
        NOW + MIN, NOW + 2 * MIN, NOW + 3 * MIN,
    ]  # fmt: skip
    assert next_fire_times(replace(bounded, paused=True), None, 10, NOW) == []
    # A row whose next_due lies ahead (a repair moved it) answers from there.
    moved = replace(bounded, next_due=NOW + 2 * MIN)
    assert [f.at for f in next_fire_times(moved, None, 10, NOW)] == [NOW + 2 * MIN, NOW + 3 * MIN]
    # An overdue row answers from the instant asked.
    late = row(ReminderSpec(period=60))
    assert next_fire_times(late, None, 1, NOW + 10.5 * MIN)[0].at == NOW + 11 * MIN
    one_shot = row(ReminderSpec(at=NOW + MIN))
    assert [f.at for f in next_fire_times(one_shot, None, 3, NOW)] == [NOW + MIN]


def test_bad_arguments_are_refused() -> None:
    r = row(ReminderSpec(period=60))
    for count in (0, 1001, True, 2.0):
        with pytest.raises(ReminderError, match="count"):
            next_fire_times(r, None, count, NOW)  # type: ignore[arg-type]
    with pytest.raises(ReminderError, match="timezone-aware"):
        next_fire_times(r, None, 1, datetime(2026, 12, 1))
