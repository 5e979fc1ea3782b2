"""Registration validation (new_entry) and the next slot after a tick."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, register_reminder
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderEntry,
    ReminderPriority,
    RetryPolicy,
)
from orleanspy.reminders.schedule import CronSchedule, IntervalSchedule, schedule_for
from orleanspy.reminders.spec import (
    DURATION_OPTIONS,
    ReminderArgs,
    ReminderSpec,
    RepeatingArgs,
    new_entry,
)

#: ``new_entry``'s arguments beside the spec.
CONTEXT = ("service_id", "grain_id", "name", "now", "options", "declared", "fingerprint")
NOW = datetime(2024, 5, 3, 12, 0, 0, 123_456, tzinfo=UTC)  # a Friday
GRAIN = GrainId("StatsGrain", "a")
MS123 = timedelta(milliseconds=123)  # NOW's milliseconds, which registration keeps


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def make(options: ReminderOptions | None = None, **kw: Any) -> ReminderEntry:
    args: dict[str, Any] = {
        "service_id": "shop",
        "grain_id": GRAIN,
        "name": "tick",
        "now": NOW,
        "options": options or ReminderOptions(),
    }
    args.update(kw)
    context = {k: args.pop(k) for k in CONTEXT if k in args}
    return new_entry(ReminderSpec(**args), **context)


# -- happy paths ------------------------------------------------------------------------


def test_interval_due_defaults_to_period_and_times_are_truncated_to_ms() -> None:
    entry = make(period=30)
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 30, 123_000, tzinfo=UTC)
    assert entry.next_due == entry.start_at
    assert entry.period == timedelta(seconds=30)
    assert entry.cron is None
    assert entry.tz is None
    assert entry.etag is None
    assert entry.last_fire is None
    assert entry.priority == 0
    assert entry.action is MissedReminderAction.SKIP
    assert (entry.service_id, entry.grain_id, entry.name) == ("shop", GRAIN, "tick")


def test_interval_with_explicit_due_as_timedelta() -> None:
    entry = make(due=timedelta(seconds=5), period=timedelta(minutes=1))
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 5, 123_000, tzinfo=UTC)
    assert entry.next_due == entry.start_at
    assert entry.period == timedelta(minutes=1)


def test_interval_due_zero_fires_now() -> None:
    entry = make(due=0, period=60)
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 0, 123_000, tzinfo=UTC)


def test_durations_are_truncated_to_whole_ms_without_float_error() -> None:
    assert make(period=1.001).period == timedelta(milliseconds=1001)
    assert make(period=timedelta(seconds=2, microseconds=999)).period == timedelta(seconds=2)
    entry = make(due=0.0019, period=10)
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 0, 125_000, tzinfo=UTC)


def test_now_in_another_zone_gives_utc_times() -> None:
    entry = make(now=NOW.astimezone(ZoneInfo("Asia/Tokyo")), period=10)
    assert entry.start_at.utcoffset() == timedelta(0)
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 10, 123_000, tzinfo=UTC)


def test_interval_entry_round_trips_through_storage_form() -> None:
    entry = make(period=timedelta(milliseconds=1500), priority=ReminderPriority.CRITICAL)
    assert ReminderEntry.from_record(entry.to_record()) == entry


def test_cron_next_due_is_the_first_slot_at_or_after_start() -> None:
    entry = make(cron="0 0 9 * * 1-5", tz="Europe/Berlin")
    assert entry.start_at == datetime(2024, 5, 3, 12, 0, 0, 123_000, tzinfo=UTC)
    assert entry.next_due == utc(2024, 5, 6, 7)  # Monday 09:00 CEST
    assert entry.period is None
    assert entry.cron == "0 0 9 * * 1-5"
    assert entry.tz == "Europe/Berlin"
    assert ReminderEntry.from_record(entry.to_record()) == entry


def test_cron_slot_exactly_at_start_is_next_due() -> None:
    on_slot = utc(2024, 5, 3, 12, 0, 10)
    assert make(now=on_slot, cron="*/10 * * * * *").next_due == on_slot
    # Sub-millisecond parts are dropped before the comparison (storage precision).
    assert make(now=on_slot + timedelta(microseconds=500), cron="*/10 * * * * *").next_due == (
        on_slot
    )
    just_after = on_slot + timedelta(milliseconds=1)
    assert make(now=just_after, cron="*/10 * * * * *").next_due == utc(2024, 5, 3, 12, 0, 20)


def test_cron_due_delays_the_start() -> None:
    entry = make(cron="0 0 * * * *", due=timedelta(hours=2))
    assert entry.start_at == datetime(2024, 5, 3, 14, 0, 0, 123_000, tzinfo=UTC)
    assert entry.next_due == utc(2024, 5, 3, 15)


def test_cron_whitespace_is_normalised() -> None:
    assert make(cron="  0  0 9\t* * 1-5 ").cron == "0 0 9 * * 1-5"


def test_cron_alias_and_five_fields() -> None:
    assert make(cron="@hourly").next_due == utc(2024, 5, 3, 13)
    assert make(cron="*/15 * * * *").next_due == utc(2024, 5, 3, 12, 15)


@pytest.mark.parametrize("priority", [-128, 127, 0, ReminderPriority.BACKGROUND])
def test_priorities_in_range_are_stored_as_ints(priority: int) -> None:
    entry = make(period=10, priority=priority)
    assert entry.priority == int(priority)
    assert type(entry.priority) is int


@pytest.mark.parametrize("action", list(MissedReminderAction))
def test_every_action_is_accepted(action: MissedReminderAction) -> None:
    assert make(period=10, action=action).action is action


def test_name_at_the_length_limit_is_accepted() -> None:
    options = ReminderOptions(max_name_length=8)
    assert make(options, name="x" * 8, period=10).name == "x" * 8


# -- validation -------------------------------------------------------------------------

STRICT = ReminderOptions(minimum_period=timedelta(seconds=2), max_name_length=8)
MINUTE = ReminderOptions(minimum_period=timedelta(minutes=1))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cron": "not a cron"}, "bad cron expression"),
        ({"cron": "61 * * * *"}, "out of range"),
        ({"cron": "R * * * *"}, "random"),
        ({"cron": 5}, "cron must be a string"),
        ({"cron": "0 0 0 30 2 *"}, "never matches"),
        ({"period": 10, "cron": "@hourly"}, "got both"),
        ({}, "got none of them"),
        ({"period": 1.5, "options": STRICT}, "below the minimum"),
        ({"period": 0}, "below the minimum"),
        ({"period": -5}, "below the minimum"),
        ({"period": timedelta(milliseconds=999)}, "below the minimum"),
        ({"period": "10"}, "number of seconds"),
        ({"period": math.inf}, "finite"),
        ({"cron": "* * * * * *", "options": STRICT}, "below the minimum period"),
        ({"cron": "*/30 * * * * *", "options": MINUTE}, "30 s apart"),
        # 00:00:00 and 00:00:30 daily: from 00:00:10 the next two slots are a day
        # apart, but the expression still fires twice within 30 s.
        (
            {"cron": "0,30 0 0 * * *", "options": MINUTE, "now": utc(2024, 5, 3, 0, 0, 10)},
            "30 s apart",
        ),
        ({"due": -1, "period": 10}, "due must be >= 0"),
        ({"due": timedelta(seconds=-1), "period": 10}, "due must be >= 0"),
        ({"due": math.nan, "period": 10}, "finite"),
        ({"due": math.inf, "period": 10}, "finite"),
        ({"due": -math.inf, "cron": "@hourly"}, "finite"),
        ({"due": True, "period": 10}, "number of seconds"),
        ({"due": 1e30, "period": 10}, "too large"),
        ({"due": timedelta(days=3_000_000), "period": 10}, "beyond the year 2500"),
        ({"due": timedelta(days=200_000), "period": 10}, "beyond the year 2500"),
        ({"cron": "0 " * 200 + "*"}, "limit is 256"),
        ({"cron": "0 0 " + ",".join(["1"] * 2_000_000) + " * * *"}, "limit is 256"),
        ({"cron": "@hourly", "tz": "A" * 300}, "limit is 64"),
        ({"cron": "@hourly", "tz": "Europe/" + "B" * 50}, "unknown time zone"),
        ({"period": 10, "grain_id": GrainId("StatsGrain", "k" * 2000)}, "at most 1024"),
        ({"cron": "@hourly", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "@hourly", "tz": ""}, "IANA zone"),
        ({"period": 10, "tz": "Europe/Berlin"}, "tz applies to cron reminders only"),
        ({"name": "", "period": 10}, "non-empty"),
        ({"name": "x" * 9, "period": 10, "options": STRICT}, "limit is 8"),
        ({"name": "a|b", "period": 10}, "'|'"),
        ({"name": "a\nb", "period": 10}, "line breaks"),
        ({"name": "a\rb", "period": 10}, "line breaks"),
        ({"priority": 128, "period": 10}, "out of range"),
        ({"priority": -129, "period": 10}, "out of range"),
        ({"priority": True, "period": 10}, "must be an int"),
        ({"priority": 1.5, "period": 10}, "must be an int"),
        ({"priority": "1", "period": 10}, "must be an int"),
        ({"action": 2, "period": 10}, "MissedReminderAction"),
        ({"action": "SKIP", "period": 10}, "MissedReminderAction"),
        # one-shot, jitter, bounds, payload, retry
        ({"at": NOW, "period": 10}, "at= makes a one-shot reminder and takes no period"),
        ({"at": NOW, "due": 5}, "takes no due"),
        ({"at": NOW, "cron": "@hourly"}, "takes no cron"),
        ({"at": datetime(2024, 5, 3, 13)}, "timezone-aware"),
        ({"due": 5, "ends_at": NOW + timedelta(days=1)}, "one-shot reminder fires once"),
        ({"due": 5, "max_ticks": 2}, "one-shot reminder fires once"),
        ({"period": 10, "jitter": -1}, "jitter must be >= 0"),
        ({"period": 10, "jitter": 11}, "longer than the period"),
        ({"cron": "*/30 * * * * *", "jitter": 31}, "smallest gap"),
        ({"period": 10, "jitter": "5"}, "number of seconds"),
        (
            {"period": 10, "starts_at": NOW + timedelta(hours=2), "ends_at": NOW},
            "is before starts_at",
        ),
        ({"period": 10, "ends_at": NOW - timedelta(hours=1)}, "no slot between"),
        ({"period": 10, "ends_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"period": 10, "max_ticks": 0}, "max_ticks must be an int >= 1"),
        ({"period": 10, "max_ticks": True}, "max_ticks must be an int >= 1"),
        ({"period": 10, "max_ticks": 2.0}, "max_ticks must be an int >= 1"),
        ({"cron": "@hourly", "max_ticks": 10_001}, "use ends_at instead"),
        ({"period": 10, "max_ticks": 10**12}, "beyond the year 2500"),
        ({"period": 10, "payload": b"x" * 4100}, "at most 4096"),
        ({"period": 10, "payload": object()}, "payload cannot be stored"),
        ({"period": 10, "retry": 3}, "retry must be a RetryPolicy"),
    ],
)
def test_invalid_registrations_raise_reminder_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ReminderError, match=message) as info:
        make(**kw)
    assert isinstance(info.value, ValueError)


def test_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        make(now=datetime(2024, 5, 3, 12), period=10)


def test_cron_at_exactly_the_minimum_period_is_accepted() -> None:
    assert make(cron="*/2 * * * * *", options=STRICT).next_due == utc(2024, 5, 3, 12, 0, 2)


# -- the next slot after a tick ----------------------------------------------------------


def test_next_slot_keeps_the_interval_grid() -> None:
    entry = make(due=0, period=60)
    schedule = schedule_for(entry)
    assert isinstance(schedule, IntervalSchedule)
    fired = entry.next_due
    # Counted from the slot, never from a (late) delivery time.
    assert schedule.next_after(fired) == fired + timedelta(minutes=1)


def test_next_cron_slot_counts_from_the_slot() -> None:
    entry = make(cron="0 0 9 * * 1-5", tz="Europe/Berlin")
    schedule = schedule_for(entry)
    assert isinstance(schedule, CronSchedule)
    assert schedule.next_after(entry.next_due) == utc(2024, 5, 7, 7)  # Tuesday 09:00 CEST


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int in 1..100"),
        ({"max_attempts": 101}, "max_attempts must be an int in 1..100"),
        ({"max_attempts": True}, "max_attempts"),
        ({"backoff": timedelta(0)}, "1 ms to 1 day"),
        ({"backoff": timedelta(days=2)}, "1 ms to 1 day"),
        ({"backoff": 5}, "1 ms to 1 day"),
    ],
)
def test_invalid_retry_policies_raise_reminder_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ReminderError, match=message):
        RetryPolicy(**kw)


def test_one_shot_forms() -> None:
    at = make(at=NOW + timedelta(minutes=5))
    assert at.one_shot and at.start_at == at.next_due == utc(2024, 5, 3, 12, 5, 0) + MS123
    due = make(due=30)
    assert due.one_shot and due.next_due == utc(2024, 5, 3, 12, 0, 30) + MS123
    # An instant in the past fires at once.
    past = make(at=NOW - timedelta(days=1))
    assert past.next_due == utc(2024, 5, 3, 12, 0, 0) + MS123
    assert schedule_for(past).next_after(past.next_due) is None


def test_bounds_give_the_first_and_last_slot() -> None:
    e = make(due=0, period=10, starts_at=NOW + timedelta(seconds=25), max_ticks=3)
    assert e.next_due == utc(2024, 5, 3, 12, 0, 30) + MS123
    assert e.final_due == utc(2024, 5, 3, 12, 0, 50) + MS123
    c = make(cron="0 0 9 * * 1-5", max_ticks=3)  # Fri 3 May, 12:00: Mon, Tue, Wed
    assert c.final_due == utc(2024, 5, 8, 9)
    # ends_at before the max_ticks-th slot: ends_at rules, no final_due.
    short = make(period=10, max_ticks=100, ends_at=NOW + timedelta(minutes=1))
    assert short.final_due is None


def test_payload_is_kept_as_it_reads_back() -> None:
    e = make(period=10, payload=(1, {"a": {2, 3}}))
    assert e.payload == [1, {"a": {2, 3}}]  # a tuple reads back as a list, a set as a set
    assert ReminderEntry.from_record(e.to_record()) == e


def test_jitter_zero_is_none() -> None:
    assert make(period=10, jitter=0).jitter is None
    assert make(period=10, jitter=timedelta(milliseconds=1500)).jitter == timedelta(
        milliseconds=1500
    )


def test_a_jittered_cron_starts_at_its_first_slot_after_registration() -> None:
    # The slot before start_at (11:59:45) may
    # have a jittered instant after start_at; it is not one of the row's slots.
    for k in range(200):
        e = make(cron="15,45 * * * * *", jitter=16, grain_id=GrainId("J", k))
        assert utc(2024, 5, 3, 12, 0, 15) <= e.next_due < utc(2024, 5, 3, 12, 0, 31), k
        assert schedule_for(e).nominal(e.next_due) == utc(2024, 5, 3, 12, 0, 15)


# -- the one list of options ----------------------------------------------------------------


def test_the_keyword_arguments_name_every_field_of_the_spec() -> None:
    spec_fields = {f.name for f in dataclasses.fields(ReminderSpec)}
    assert ReminderArgs.__optional_keys__ == spec_fields
    assert RepeatingArgs.__optional_keys__ == spec_fields - {"at", "max_ticks"}
    assert set(DURATION_OPTIONS) <= spec_fields


@pytest.mark.parametrize("keyword", ["max_ticks", "at", "perod"])
def test_a_declaration_refuses_a_keyword_it_does_not_take_when_written(keyword: str) -> None:
    with pytest.raises(
        TypeError, match=f"register_reminder\\(\\) got an unexpected keyword argument '{keyword}'"
    ):
        register_reminder("r", period=60, **{keyword: 1})  # type: ignore[call-arg]


async def test_a_registration_refuses_a_keyword_it_does_not_take() -> None:
    grain: Any = object()  # refused before the grain's runtime is reached
    with pytest.raises(
        TypeError,
        match="register_or_update_reminder\\(\\) got an unexpected keyword argument 'perod'",
    ):
        await Grain.register_or_update_reminder(grain, "r", perod=60)  # type: ignore[call-arg]


def test_a_spec_is_a_value_checked_when_its_row_is_built() -> None:
    spec = ReminderSpec(period=60, cron="0 * * * * *")  # both: made, not checked
    with pytest.raises(ReminderError, match="exactly one of period"):
        new_entry(
            spec, service_id="s", grain_id=GRAIN, name="r", now=NOW, options=ReminderOptions()
        )
    default = new_entry(
        ReminderSpec(period=60), service_id="s", grain_id=GRAIN, name="r", now=NOW,
        options=ReminderOptions(),
    )  # fmt: skip
    assert default.priority == ReminderPriority.NORMAL
    assert default.action is MissedReminderAction.SKIP
