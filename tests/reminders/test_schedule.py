"""Interval and cron schedules: the grid, cron dialects, zones and DST, counting."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orleanspy.clock import to_ms
from orleanspy.errors import ReminderError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.schedule import (
    CronSchedule,
    IntervalSchedule,
    OneShotSchedule,
    parse_zone,
    schedule_for,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def take(schedule: CronSchedule | IntervalSchedule, t: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        t = schedule.next_after(t)
        out.append(t)
    return out


# -- interval ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "period",
    [
        timedelta(milliseconds=333),
        timedelta(seconds=7),
        timedelta(milliseconds=1),
        timedelta(days=1, milliseconds=1),
    ],
)
def test_interval_slots_stay_on_the_grid_over_thousands_of_periods(period: timedelta) -> None:
    start = datetime(2024, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
    schedule = IntervalSchedule(start, period)
    start_ms, period_ms = to_ms(start), period // timedelta(milliseconds=1)
    t = start - timedelta(microseconds=1)
    for k in range(5000):
        t = schedule.next_after(t)
        assert to_ms(t) == start_ms + k * period_ms
        assert t.microsecond % 1000 == 0
        assert t.tzinfo is UTC
    # A jump a million periods ahead lands exactly on the grid too.
    far = start + 1_000_000 * period
    assert schedule.next_after(far - timedelta(microseconds=1)) == far
    assert schedule.next_after(far) == far + period


def test_interval_next_after_before_at_and_after_start() -> None:
    start = utc(2024, 5, 1, 12)
    schedule = IntervalSchedule(start, timedelta(minutes=1))
    assert schedule.next_after(utc(2020, 1, 1)) == start
    assert schedule.next_after(start - timedelta(microseconds=1)) == start
    assert schedule.next_after(start) == start + timedelta(minutes=1)
    assert schedule.next_after(start + timedelta(seconds=59, microseconds=999_999)) == utc(
        2024, 5, 1, 12, 1
    )
    assert schedule.next_after(start + timedelta(minutes=10)) == utc(2024, 5, 1, 12, 11)


def test_interval_accepts_any_zone_and_refuses_naive_times() -> None:
    schedule = IntervalSchedule(utc(2024, 5, 1, 12), timedelta(hours=1))
    berlin_noon = datetime(2024, 5, 1, 14, 30, tzinfo=BERLIN)  # 12:30 UTC
    assert schedule.next_after(berlin_noon) == utc(2024, 5, 1, 13)
    with pytest.raises(ValueError, match="naive"):
        schedule.next_after(datetime(2024, 5, 1, 12))


def test_interval_truncates_to_whole_milliseconds_and_refuses_sub_ms_periods() -> None:
    schedule = IntervalSchedule(
        datetime(2024, 1, 1, 0, 0, 0, 123_456, tzinfo=UTC), timedelta(microseconds=1500)
    )
    assert schedule.start_at == datetime(2024, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
    assert schedule.period == timedelta(milliseconds=1)
    with pytest.raises(ValueError, match="1 ms"):
        IntervalSchedule(utc(2024, 1, 1), timedelta(microseconds=999))


def test_interval_slots_between_counts_the_half_open_window_and_honours_the_cap() -> None:
    start = utc(2024, 1, 1)
    schedule = IntervalSchedule(start, timedelta(seconds=10))
    # (start - 1 s, start + 100 s] holds slots 0, 10, ..., 100: eleven.
    before, last = start - timedelta(seconds=1), start + timedelta(seconds=100)
    assert schedule.slots_between(before, last) == 11
    # The lower bound is excluded, the upper bound included.
    assert schedule.slots_between(start, last) == 10
    assert schedule.slots_between(start, start + timedelta(seconds=99, microseconds=999)) == 9
    assert schedule.slots_between(start, start + timedelta(days=365), cap=1000) == 1000
    assert schedule.slots_between(start, start + timedelta(days=365), cap=0) == 0
    assert schedule.slots_between(start + timedelta(seconds=5), start) == 0
    assert schedule.slots_between(start + timedelta(seconds=1), start + timedelta(seconds=9)) == 0


@settings(max_examples=200, deadline=None)
@given(
    period_ms=st.integers(1, 5000),
    after_ms=st.integers(-20_000, 20_000),
    width_ms=st.integers(0, 20_000),
)
def test_interval_slots_between_matches_brute_force(
    period_ms: int, after_ms: int, width_ms: int
) -> None:
    start = utc(2024, 1, 1)
    schedule = IntervalSchedule(start, timedelta(milliseconds=period_ms))
    after = start + timedelta(milliseconds=after_ms)
    upto = after + timedelta(milliseconds=width_ms)
    expected = sum(
        1
        for k in range(0, 40_001 // period_ms + 2)
        if after < start + k * timedelta(milliseconds=period_ms) <= upto
    )
    assert schedule.slots_between(after, upto) == expected


# -- cron -------------------------------------------------------------------------------


def test_cron_six_fields_monthly_midnight_on_the_first() -> None:
    schedule = CronSchedule("0 0 0 1 * *")
    assert take(schedule, utc(2024, 1, 15, 10), 3) == [
        utc(2024, 2, 1),
        utc(2024, 3, 1),
        utc(2024, 4, 1),
    ]


def test_cron_weekdays_at_nine_in_berlin_follow_local_time_in_winter_and_summer() -> None:
    schedule = CronSchedule("0 0 9 * * 1-5", "Europe/Berlin")
    # Friday 12 January 2024 after 09:00 CET: next is Monday 15th, 09:00 CET = 08:00 UTC.
    assert take(schedule, utc(2024, 1, 12, 10), 5) == [
        utc(2024, 1, 15, 8),
        utc(2024, 1, 16, 8),
        utc(2024, 1, 17, 8),
        utc(2024, 1, 18, 8),
        utc(2024, 1, 19, 8),
    ]
    # In summer (CEST) the same wall-clock time is 07:00 UTC.
    assert schedule.next_after(utc(2024, 7, 5, 10)) == utc(2024, 7, 8, 7)


def test_cron_six_fields_every_ten_seconds() -> None:
    schedule = CronSchedule("*/10 * * * * *")
    start = datetime(2024, 1, 15, 10, 0, 3, 500_000, tzinfo=UTC)
    assert take(schedule, start, 3) == [
        utc(2024, 1, 15, 10, 0, 10),
        utc(2024, 1, 15, 10, 0, 20),
        utc(2024, 1, 15, 10, 0, 30),
    ]
    # Strictly after: asking at a slot gives the following one.
    assert schedule.next_after(utc(2024, 1, 15, 10, 0, 10)) == utc(2024, 1, 15, 10, 0, 20)
    just_before = utc(2024, 1, 15, 10, 0, 10) - timedelta(milliseconds=1)
    assert schedule.next_after(just_before) == utc(2024, 1, 15, 10, 0, 10)


def test_cron_five_fields_are_minute_first() -> None:
    schedule = CronSchedule("*/15 * * * *")
    assert take(schedule, utc(2024, 1, 15, 10, 7, 30), 3) == [
        utc(2024, 1, 15, 10, 15),
        utc(2024, 1, 15, 10, 30),
        utc(2024, 1, 15, 10, 45),
    ]


def test_cron_six_fields_are_read_seconds_first_not_as_every_second() -> None:
    # Read minute-first (croniter's default), this would fire every second.
    schedule = CronSchedule("0 */5 * * * *")
    slots = take(schedule, utc(2024, 1, 15, 10, 0, 1), 4)
    assert slots == [utc(2024, 1, 15, 10, m) for m in (5, 10, 15, 20)]
    assert {b - a for a, b in itertools.pairwise(slots)} == {timedelta(minutes=5)}


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@hourly", [utc(2024, 1, 15, 11), utc(2024, 1, 15, 12)]),
        ("@daily", [utc(2024, 1, 16), utc(2024, 1, 17)]),
        ("@weekly", [utc(2024, 1, 21), utc(2024, 1, 28)]),  # Sundays
        ("@monthly", [utc(2024, 2, 1), utc(2024, 3, 1)]),
        ("@YEARLY", [utc(2025, 1, 1), utc(2026, 1, 1)]),
    ],
)
def test_cron_aliases(alias: str, expected: list[datetime]) -> None:
    assert take(CronSchedule(alias), utc(2024, 1, 15, 10, 30), 2) == expected


def test_cron_in_zone_returns_utc() -> None:
    slot = CronSchedule("0 0 12 * * *", "America/New_York").next_after(utc(2024, 1, 15))
    assert slot == utc(2024, 1, 15, 17)
    assert slot.utcoffset() == timedelta(0)


# -- DST (cron's own rule, documented in the module docstring and decisions.md) -------


def test_dst_berlin_spring_forward_fires_once_at_three_oclock() -> None:
    schedule = CronSchedule("0 30 2 * * *", "Europe/Berlin")
    slots = take(schedule, utc(2024, 3, 29, 12), 4)
    assert slots == [
        utc(2024, 3, 30, 1, 30),  # 02:30 CET
        utc(2024, 3, 31, 1, 0),  # 02:30 does not exist: 03:00 CEST
        utc(2024, 4, 1, 0, 30),  # 02:30 CEST
        utc(2024, 4, 2, 0, 30),
    ]
    assert slots[1].astimezone(BERLIN).hour == 3


def test_dst_berlin_spring_forward_collapses_slots_inside_the_gap() -> None:
    schedule = CronSchedule("0 0,30 2 * * *", "Europe/Berlin")
    assert take(schedule, utc(2024, 3, 30, 12), 3) == [
        utc(2024, 3, 31, 1, 0),  # both 02:00 and 02:30 -> one tick at 03:00 CEST
        utc(2024, 4, 1, 0, 0),
        utc(2024, 4, 1, 0, 30),
    ]


def test_dst_berlin_fall_back_fixed_time_job_fires_once() -> None:
    schedule = CronSchedule("0 30 2 * * *", "Europe/Berlin")
    slots = take(schedule, utc(2026, 10, 24, 12), 3)
    assert slots == [
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST; not again at 02:30 CET
        utc(2026, 10, 26, 1, 30),
        utc(2026, 10, 27, 1, 30),
    ]
    assert slots[0].astimezone(BERLIN).strftime("%H:%M %Z") == "02:30 CEST"


def test_dst_berlin_fall_back_wildcard_job_follows_elapsed_time() -> None:
    schedule = CronSchedule("0 */15 * * * *", "Europe/Berlin")
    slots = take(schedule, utc(2026, 10, 24, 23, 50), 10)
    # Every 15 minutes of real time, through both passes of 02:00-03:00.
    assert slots == [utc(2026, 10, 25, 0) + timedelta(minutes=15 * i) for i in range(10)]
    local = [s.astimezone(BERLIN).strftime("%H:%M%Z") for s in slots[3:6]]
    assert local == ["02:45CEST", "02:00CET", "02:15CET"]


def test_dst_berlin_spring_forward_wildcard_job_skips_the_missing_hour() -> None:
    schedule = CronSchedule("0 */15 * * * *", "Europe/Berlin")
    slots = take(schedule, utc(2026, 3, 29, 0, 40), 3)
    assert slots == [utc(2026, 3, 29, 0, 45), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 15)]
    assert slots[1].astimezone(BERLIN).strftime("%H:%M") == "03:00"


LORD_HOWE = ZoneInfo("Australia/Lord_Howe")


def test_dst_lord_howe_half_hour_shift() -> None:
    # 2026-04-05 02:00 LHDT (+11) -> 01:30 LHST (+10:30): 01:30-02:00 repeats.
    fall = CronSchedule("0 45 1 * * *", "Australia/Lord_Howe")
    assert take(fall, utc(2026, 4, 4), 2) == [
        utc(2026, 4, 4, 14, 45),  # 01:45 +11 on the 5th, once
        utc(2026, 4, 5, 15, 15),  # 01:45 +10:30 on the 6th
    ]
    every20 = CronSchedule("0 */20 * * * *", "Australia/Lord_Howe")
    slots = take(every20, utc(2026, 4, 4, 14), 4)
    assert slots == [
        utc(2026, 4, 4, 14, 20),  # 01:20 +11
        utc(2026, 4, 4, 14, 40),  # 01:40 +11
        utc(2026, 4, 4, 15, 10),  # 01:40 +10:30, the repeated half hour
        utc(2026, 4, 4, 15, 30),  # 02:00 +10:30
    ]
    assert [s.astimezone(LORD_HOWE).strftime("%H:%M") for s in slots] == [
        "01:20",
        "01:40",
        "01:40",
        "02:00",
    ]
    # 2026-10-04 02:00 LHST -> 02:30 LHDT: 02:15 does not exist, it runs at 02:30.
    spring = CronSchedule("0 15 2 * * *", "Australia/Lord_Howe")
    assert take(spring, utc(2026, 10, 3), 2) == [
        utc(2026, 10, 3, 15, 30),  # 02:30 +11, right after the gap
        utc(2026, 10, 4, 15, 15),  # 02:15 +11
    ]


def test_dst_berlin_hourly_across_fall_back_is_evenly_spaced_in_utc() -> None:
    schedule = CronSchedule("0 0 * * * *", "Europe/Berlin")
    slots = take(schedule, utc(2024, 10, 26, 21, 30), 8)
    assert slots == [utc(2024, 10, 26, 22) + timedelta(hours=h) for h in range(8)]


def test_dst_new_york_spring_forward_and_fall_back() -> None:
    spring = CronSchedule("0 30 2 * * *", "America/New_York")
    assert take(spring, utc(2024, 3, 9, 12), 2) == [
        utc(2024, 3, 10, 7, 0),  # 02:30 does not exist: 03:00 EDT
        utc(2024, 3, 11, 6, 30),
    ]
    fall = CronSchedule("0 30 1 * * *", "America/New_York")
    assert take(fall, utc(2024, 11, 2, 12), 3) == [
        utc(2024, 11, 3, 5, 30),  # 01:30 EDT, once (not again at 01:30 EST)
        utc(2024, 11, 4, 6, 30),
        utc(2024, 11, 5, 6, 30),
    ]
    hourly = CronSchedule("@hourly", "America/New_York")
    assert take(hourly, utc(2024, 11, 3, 4, 30), 3) == [
        utc(2024, 11, 3, 5),  # 01:00 EDT
        utc(2024, 11, 3, 6),  # 01:00 EST: a wildcard hour runs in both passes
        utc(2024, 11, 3, 7),
    ]


def test_dst_fresh_positioning_inside_the_repeated_hour_agrees_with_stepping() -> None:
    schedule = CronSchedule("0 30 2 * * *", "Europe/Berlin")
    # From inside either pass of the repeated hour, the next run is the next day.
    assert schedule.next_after(utc(2024, 10, 27, 0, 45)) == utc(2024, 10, 28, 1, 30)
    assert schedule.next_after(utc(2024, 10, 27, 1, 15)) == utc(2024, 10, 28, 1, 30)
    assert schedule.next_after(utc(2024, 10, 27, 1, 30)) == utc(2024, 10, 28, 1, 30)


# -- cron counting, reuse, validation -------------------------------------------------


def test_cron_slots_between_counts_and_honours_the_cap() -> None:
    schedule = CronSchedule("*/10 * * * * *")
    start = utc(2024, 1, 15, 10)
    assert schedule.slots_between(start, start + timedelta(hours=1)) == 360
    assert schedule.slots_between(start - timedelta(milliseconds=1), start) == 1
    assert schedule.slots_between(start, start + timedelta(seconds=9)) == 0
    assert schedule.slots_between(start, start + timedelta(hours=1), cap=100) == 100
    assert schedule.slots_between(start, start + timedelta(hours=1), cap=0) == 0
    assert schedule.slots_between(start + timedelta(seconds=5), start) == 0
    # Counting leaves the schedule usable at any instant.
    assert schedule.next_after(start + timedelta(hours=1)) == utc(2024, 1, 15, 11, 0, 10)
    assert schedule.next_after(start) == utc(2024, 1, 15, 10, 0, 10)


def test_cron_slots_between_across_dst_counts_real_ticks() -> None:
    schedule = CronSchedule("0 30 2 * * *", "Europe/Berlin")
    assert schedule.slots_between(utc(2024, 10, 26, 12), utc(2024, 10, 27, 12)) == 1
    assert schedule.slots_between(utc(2024, 3, 30, 12), utc(2024, 3, 31, 12)) == 1


EXPRESSIONS = [
    ("0 30 2 * * *", "Europe/Berlin"),
    ("0 0,30 2 * * *", "Europe/Berlin"),
    ("0 30 1 * * *", "America/New_York"),
    ("0 0 * * * *", "Europe/Berlin"),
    ("*/7 * * * * *", None),
    ("0 0 9 * * 1-5", "Europe/Berlin"),
    ("*/15 * * * *", "America/New_York"),
    ("0 0 0 L * *", "Australia/Sydney"),
    ("@monthly", None),
]


@settings(max_examples=60, deadline=None)
@given(
    case=st.sampled_from(EXPRESSIONS),
    start=st.datetimes(
        min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
    ),
    steps=st.lists(
        st.one_of(st.just(0), st.integers(-(10**9), 10**9)),
        min_size=1,
        max_size=8,
    ),
)
def test_cron_iterator_reuse_gives_the_same_answers_as_a_fresh_schedule(
    case: tuple[str, str | None], start: datetime, steps: list[int]
) -> None:
    expr, tz = case
    reused = CronSchedule(expr, tz)
    t = start
    for step in steps:
        # 0 continues from the last slot (the reuse path); others jump (re-position).
        if step:
            t = t + timedelta(milliseconds=step)
        got = reused.next_after(t)
        assert got == CronSchedule(expr, tz).next_after(t)
        assert got > t
        t = got


@pytest.mark.parametrize(
    "expr",
    [
        "not a cron",
        "61 * * * *",
        "* * *",
        "* * * * * * *",
        "",
        "@reboot",
        "R * * * *",
        "0 H * * *",
        "0 0 r(1-5) * * *",
        "0 0 9 * * mon-xyz",
    ],
)
def test_bad_cron_expressions_raise_reminder_error(expr: str) -> None:
    with pytest.raises(ReminderError, match="cron"):
        CronSchedule(expr)


def test_cron_that_never_matches_raises_reminder_error_on_use() -> None:
    schedule = CronSchedule("0 0 0 30 2 *")  # the 30th of February
    with pytest.raises(ReminderError, match="never matches"):
        schedule.next_after(utc(2024, 1, 1))


def test_cron_refuses_naive_times() -> None:
    with pytest.raises(ValueError, match="naive"):
        CronSchedule("@hourly").next_after(datetime(2024, 1, 1))


@pytest.mark.parametrize(
    ("expr", "gap"),
    [
        ("* * * * * *", 1),
        ("*/10 * * * * *", 10),
        ("0 */5 * * * *", 300),
        ("*/15 * * * *", 900),
        ("0 0 9 * * 1-5", 86400),
        ("0 0,30 2 * * *", 1800),
        ("0,59 0,59 0,23 * * *", 1),  # 23:59:59 -> 00:00:00 the next day
        ("50 59 9,10 * * *", 3600),
        ("@hourly", 3600),
    ],
)
def test_cron_min_gap_seconds(expr: str, gap: int) -> None:
    assert CronSchedule(expr).min_gap_seconds() == gap


# -- zones and rows ---------------------------------------------------------------------


def test_parse_zone() -> None:
    assert parse_zone(None) == ZoneInfo("UTC")
    assert parse_zone("Europe/Berlin") == BERLIN
    for bad in ("Mars/Olympus", "", "  ", "../etc/passwd"):
        with pytest.raises(ReminderError, match="zone"):
            parse_zone(bad)
    with pytest.raises(ReminderError, match="unknown time zone"):
        CronSchedule("@hourly", "Nowhere/Special")


def _row(**kw: object) -> ReminderEntry:
    base: dict[str, object] = {
        "service_id": "svc",
        "grain_id": GrainId("G", "k"),
        "name": "r",
        "start_at": utc(2024, 1, 1),
        "next_due": utc(2024, 1, 1),
    }
    base.update(kw)
    return ReminderEntry(**base)  # type: ignore[arg-type]


def test_schedule_for_builds_the_rows_schedule_and_shares_cron_iterators() -> None:
    interval = schedule_for(_row(period=timedelta(seconds=30)))
    assert isinstance(interval, IntervalSchedule)
    assert interval.next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 0, 0, 30)

    a = schedule_for(_row(cron="0 0 9 * * 1-5", tz="Europe/Berlin"))
    b = schedule_for(_row(name="other", cron="0 0 9 * * 1-5", tz="Europe/Berlin"))
    assert a is b
    assert schedule_for(_row(cron="0 0 9 * * 1-5")) is not a
    assert a.next_after(utc(2024, 1, 12, 10)) == utc(2024, 1, 15, 8)

    # Neither period nor cron: a one-shot, whose one slot is start_at.
    one = schedule_for(_row())
    assert isinstance(one, OneShotSchedule)
    assert one.next_after(one.at - timedelta(milliseconds=1)) == one.at
    assert one.next_after(one.at) is None
