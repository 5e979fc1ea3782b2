"""Calendars: the rules, the business-day shift, and next_after against brute force."""

from __future__ import annotations

import calendar as weekdays
import random
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from orleanspy.errors import ReminderError
from orleanspy.reminders.calendars import (
    MAX_EXCLUDED_DATES,
    Calendar,
    CalendarSchedule,
    Excluded,
    check_calendar_name,
)
from orleanspy.reminders.schedule import IntervalSchedule, cron_schedule
from orleanspy.serialization import pack, unpack

BERLIN = ZoneInfo("Europe/Berlin")
WEEKEND = [weekdays.SATURDAY, weekdays.SUNDAY]


def berlin(y: int, m: int, d: int, h: int = 0, mi: int = 0) -> datetime:
    return datetime(y, m, d, h, mi, tzinfo=BERLIN)


def fires(schedule: CalendarSchedule, after: datetime, n: int) -> list[datetime]:
    out: list[datetime] = []
    t: datetime | None = after
    for _ in range(n):
        assert t is not None
        t = schedule.next_after(t)
        if t is None:
            break
        out.append(t)
    return out


def test_payday_on_the_previous_business_day_in_berlin() -> None:
    # The 25th at 09:00 Berlin time; weekends and Christmas Day excluded.
    cal = Calendar(tz="Europe/Berlin", exclude_dates=[date(2026, 12, 25)], exclude_weekdays=WEEKEND)
    base = cron_schedule("0 0 9 25 * *", "Europe/Berlin")
    sched = CalendarSchedule(base, cal, Excluded.PREVIOUS_BUSINESS_DAY)
    got = fires(sched, berlin(2026, 12, 1), 5)
    assert [f.astimezone(BERLIN) for f in got] == [
        berlin(2026, 12, 24, 9),  # the 25th is a holiday
        berlin(2027, 1, 25, 9),
        berlin(2027, 2, 25, 9),
        berlin(2027, 3, 25, 9),
        berlin(2027, 4, 23, 9),  # the 25th is a Sunday
    ]
    # The shifted slot stands for the 25th; next_due lies before the natural time.
    assert sched.nominal(got[0]) == berlin(2026, 12, 25, 9)
    assert sched.nominal(got[4]) == berlin(2027, 4, 25, 9)
    assert sched.nominal(got[1]) == got[1]
    # Asked from after the natural slot's day before, the shifted fire is still found.
    assert sched.next_after(berlin(2026, 12, 23, 10)) == berlin(2026, 12, 24, 9)
    assert sched.next_after(berlin(2026, 12, 24, 9)) == berlin(2027, 1, 25, 9)


def test_next_business_day_and_skip() -> None:
    cal = Calendar(tz="Europe/Berlin", exclude_dates=["2026-12-25"], exclude_weekdays=WEEKEND)
    base = cron_schedule("0 0 9 25 * *", "Europe/Berlin")
    nxt = CalendarSchedule(base, cal, Excluded.NEXT_BUSINESS_DAY)
    assert [f.astimezone(BERLIN) for f in fires(nxt, berlin(2026, 12, 1), 2)] == [
        berlin(2026, 12, 28, 9),  # Friday the 25th off, then the weekend
        berlin(2027, 1, 25, 9),
    ]
    skip = CalendarSchedule(base, cal, Excluded.SKIP)
    got = fires(skip, berlin(2027, 3, 1), 3)
    assert [f.astimezone(BERLIN) for f in got] == [
        berlin(2027, 3, 25, 9),
        berlin(2027, 5, 25, 9),  # April's is a Sunday: dropped
        berlin(2027, 6, 25, 9),
    ]


def test_a_shifted_slot_landing_on_a_slot_of_its_own_fires_once() -> None:
    # Daily at 09:00; the weekend moves to Monday 09:00, which has its own slot.
    cal = Calendar(exclude_weekdays=WEEKEND)
    sched = CalendarSchedule(cron_schedule("0 0 9 * * *"), cal, Excluded.NEXT_BUSINESS_DAY)
    friday = datetime(2027, 1, 1, 9, tzinfo=UTC)  # a Friday
    assert fires(sched, friday, 2) == [friday + timedelta(days=3), friday + timedelta(days=4)]
    assert sched.nominal(friday + timedelta(days=3)) == friday + timedelta(days=3)


def test_previous_business_day_can_fire_before_an_earlier_slot() -> None:
    # 17:00 on Fridays and 09:00 on Saturdays; Saturday's moves to Friday 09:00,
    # before Friday's own 17:00 slot.
    base = cron_schedule("0 0 17 * * 5")
    sat = cron_schedule("0 0 9 * * 6")

    class Both:
        def next_after(self, t: datetime) -> datetime | None:
            return min(base.next_after(t), sat.next_after(t))

    sched = CalendarSchedule(Both(), Calendar(exclude_weekdays=[5]), Excluded.PREVIOUS_BUSINESS_DAY)
    thursday = datetime(2026, 12, 31, 12, tzinfo=UTC)
    got = fires(sched, thursday, 2)
    assert got == [datetime(2027, 1, 1, 9, tzinfo=UTC), datetime(2027, 1, 1, 17, tzinfo=UTC)]
    assert sched.nominal(got[0]) == datetime(2027, 1, 2, 9, tzinfo=UTC)


def test_ranges_exclude_instants_and_shifts_step_over_them() -> None:
    start = datetime(2027, 1, 4, 8, tzinfo=UTC)  # Monday 08:00 .. 12:00
    cal = Calendar(exclude_ranges=[(start, start + timedelta(hours=4))])
    base = cron_schedule("0 0 */2 * * *")  # every two hours
    skip = CalendarSchedule(base, cal, Excluded.SKIP)
    got = fires(skip, start - timedelta(hours=1), 2)
    assert got == [start + timedelta(hours=4), start + timedelta(hours=6)]
    nxt = CalendarSchedule(base, cal, Excluded.NEXT_BUSINESS_DAY)
    got = fires(nxt, start - timedelta(hours=1), 4)
    assert got == [
        start + timedelta(hours=4),
        start + timedelta(hours=6),
        start + timedelta(hours=8),
        start + timedelta(hours=10),
    ]
    # 08:00 and 10:00 of Monday moved to Tuesday's 08:00 and 10:00 (their own).
    assert nxt.next_after(start + timedelta(hours=23)) == start + timedelta(days=1)


def test_a_dst_gap_fires_right_after_the_gap() -> None:
    # 02:30 Berlin every day; 2027-03-28 (Sunday) has no 02:30.
    cal = Calendar(tz="Europe/Berlin", exclude_dates=["2027-03-29"])
    base = cron_schedule("0 30 2 * * *", "Europe/Berlin")
    sched = CalendarSchedule(base, cal, Excluded.PREVIOUS_BUSINESS_DAY)
    got = fires(sched, berlin(2027, 3, 27, 3), 2)
    # The cron itself fires at 03:00 on the 28th (after the gap); the 29th moves
    # back onto the 28th at "02:30", which is again right after the gap: once.
    assert got == [berlin(2027, 3, 28, 3), berlin(2027, 3, 30, 2, 30)]


@pytest.mark.parametrize("seed", range(40))
def test_next_after_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    tz = rng.choice(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
    t0 = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=rng.randrange(0, 700))
    dates = {t0.date() + timedelta(days=rng.randrange(-5, 90)) for _ in range(rng.randrange(0, 25))}
    weekday_set = rng.sample(range(7), rng.choice([0, 0, 1, 2, 2, 3]))
    ranges = []
    for _ in range(rng.choice([0, 0, 1, 3])):
        a = t0 + timedelta(hours=rng.randrange(-48, 24 * 80))
        ranges.append((a, a + timedelta(minutes=rng.randrange(30, 60 * 60))))
    cal = Calendar(tz=tz, exclude_dates=sorted(dates), exclude_weekdays=weekday_set,
                   exclude_ranges=ranges)  # fmt: skip
    base = rng.choice(
        [
            cron_schedule("0 0 9 * * *", tz),
            cron_schedule("0 30 2 * * *", tz),
            cron_schedule("0 0 9,17 * * 1-5", tz),
            cron_schedule("0 0 */6 * * *", tz),
            cron_schedule("0 15 10 1,15,25 * *", tz),
            cron_schedule("0 0 8 * * 6", tz),
            IntervalSchedule(t0 + timedelta(minutes=rng.randrange(0, 600)), timedelta(hours=7)),
        ]
    )
    mode = rng.choice(list(Excluded))
    sched = CalendarSchedule(base, cal, mode)
    # Every nominal slot from a margin before to a margin after the window, fired.
    lo, hi = t0 - timedelta(days=70), t0 + timedelta(days=160)
    slots: list[datetime] = []
    s = base.next_after(lo)
    while s is not None and s < hi:
        slots.append(s)
        s = base.next_after(s)
    fire_times = sorted({f for s in slots if (f := sched.fire(s)) is not None})
    for _ in range(25):
        t = t0 + timedelta(minutes=rng.randrange(0, 60 * 24 * 60))
        expected = next((f for f in fire_times if f > t), None)
        assert sched.next_after(t) == expected, (t, cal, mode, base)
        if expected is not None:
            n = sched.nominal(expected)
            assert sched.fire(n) == expected, (expected, n)


def test_rules_are_validated() -> None:
    with pytest.raises(ReminderError, match="unknown time zone"):
        Calendar(tz="Mars/Olympus")
    with pytest.raises(ReminderError, match="not a date"):
        Calendar(exclude_dates=["25.12.2026"])
    with pytest.raises(ReminderError, match="takes dates"):
        Calendar(exclude_dates=[datetime(2026, 12, 25, tzinfo=UTC)])
    with pytest.raises(ReminderError, match=r"0 \(Monday\) \.\. 6"):
        Calendar(exclude_weekdays=[7])
    with pytest.raises(ReminderError, match="at least one weekday open"):
        Calendar(exclude_weekdays=range(7))
    with pytest.raises(ReminderError, match="end after it starts"):
        later, earlier = datetime(2027, 1, 2, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
        Calendar(exclude_ranges=[(later, earlier)])
    with pytest.raises(ReminderError, match="timezone-aware"):
        Calendar(exclude_ranges=[(datetime(2027, 1, 1), datetime(2027, 1, 2))])
    many = [date(2000, 1, 1) + timedelta(days=i) for i in range(MAX_EXCLUDED_DATES + 1)]
    with pytest.raises(ReminderError, match="at most 1000 dates"):
        Calendar(exclude_dates=many)
    with pytest.raises(ReminderError, match="must be a list"):
        Calendar(exclude_dates="2026-12-25")  # type: ignore[arg-type]
    for bad in ("", "has space", "a|b", "x" * 65, 3):
        with pytest.raises(ReminderError, match="not a calendar name"):
            check_calendar_name(bad)
    assert check_calendar_name("de-business.v2") == "de-business.v2"


def test_a_calendar_round_trips_its_record_and_the_codec() -> None:
    a = datetime(2027, 1, 4, 8, tzinfo=UTC)
    cal = Calendar(
        tz="Europe/Berlin",
        exclude_dates=[date(2026, 12, 25), "2026-12-24", "2026-12-25"],
        exclude_weekdays=[6, 5],
        exclude_ranges=[(a, a + timedelta(hours=1))],
    )
    assert cal.exclude_dates == ("2026-12-24", "2026-12-25")
    assert cal.exclude_weekdays == (5, 6)
    assert Calendar.from_record(cal.to_record()) == cal
    assert unpack(pack(cal)) == cal
    assert cal.excludes(berlin(2026, 12, 24, 12)) and not cal.excludes(berlin(2026, 12, 23, 12))
