"""Schedules in words, and lateness quantiles from histogram buckets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orleanspy.dashboard._series import quantile_ms
from orleanspy.dashboard._words import describe, interval_words, next_slots
from orleanspy.identity import GrainId
from orleanspy.metrics import LATENESS_BUCKETS
from orleanspy.options import ReminderOptions
from orleanspy.reminders.spec import ReminderSpec, new_entry

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)  # a Tuesday


def _cron(expr: str, tz: str | None = None):  # type: ignore[no-untyped-def]
    return new_entry(
        ReminderSpec(cron=expr, tz=tz),
        service_id="s",
        grain_id=GrainId("G", "k"),
        name="n",
        now=NOW,
        options=ReminderOptions(),
    )


@pytest.mark.parametrize(
    ("expr", "tz", "words"),
    [
        ("0 0 9 * * 1-5", "Europe/Berlin", "every weekday at 09:00 Europe/Berlin"),
        ("0 30 7 * * *", None, "every day at 07:30 UTC"),
        ("0 0 0 1 * *", None, "on day 1 of every month at 00:00 UTC"),
        ("0 */5 * * * *", None, "every 5 minutes"),
        ("*/10 * * * * *", None, "every 10 seconds"),
        ("0 15 * * * *", None, "every hour at minute 15"),
        ("0 0 12 * * 0,6", None, "every weekend day at 12:00 UTC"),
        ("0 0 8 * * 1,3", None, "every Monday, Wednesday at 08:00 UTC"),
        ("0 0 8 1 6 *", None, "cron 0 0 8 1 6 * UTC"),
    ],
)
def test_cron_in_words(expr: str, tz: str | None, words: str) -> None:
    assert describe(_cron(expr, tz)) == words


def test_intervals_in_words_and_next_slots() -> None:
    assert interval_words(timedelta(seconds=1)) == "every second"
    assert interval_words(timedelta(seconds=90)) == "every 90 seconds"
    assert interval_words(timedelta(hours=2)) == "every 2 hours"
    assert interval_words(timedelta(milliseconds=1500)) == "every 1.5 seconds"
    entry = _cron("0 0 9 * * 1-5", "Europe/Berlin")
    slots = next_slots(entry, 4)
    # Tuesday to Friday, 09:00 Berlin = 08:00 UTC in winter; the weekend skipped next.
    assert [s.astimezone(UTC).strftime("%a %H:%M") for s in slots] == [
        "Tue 08:00", "Wed 08:00", "Thu 08:00", "Fri 08:00",
    ]  # fmt: skip
    assert next_slots(entry, 5)[-1].strftime("%a") == "Mon"


def test_quantiles_from_buckets() -> None:
    counts = [0.0] * (len(LATENESS_BUCKETS) + 1)
    assert quantile_ms(counts, 0.5) is None
    counts[0] = 100  # everything within the first bucket (<= 1 ms)
    assert quantile_ms(counts, 0.5) == 0.5
    counts[3] = 100  # half in (10 ms, 25 ms]
    assert quantile_ms(counts, 0.99) == pytest.approx(10 + 15 * 0.98, rel=1e-6)
    counts[-1] = 10_000  # past the last bound: reported as that bound
    assert quantile_ms(counts, 0.99) == LATENESS_BUCKETS[-1] * 1000


def test_next_slots_of_a_schedule_that_ends_stop_at_its_end() -> None:
    from datetime import UTC, datetime, timedelta

    from orleanspy.dashboard._words import next_slots
    from orleanspy.identity import GrainId
    from orleanspy.reminders.model import ReminderEntry

    start = datetime(2030, 1, 1, tzinfo=UTC)
    one_shot = ReminderEntry(
        service_id="s",
        grain_id=GrainId("G", "k"),
        name="once",
        start_at=start,
        period=None,
        cron=None,
        tz=None,
        next_due=start,
    )
    assert next_slots(one_shot) == [start]
    bounded = ReminderEntry(
        service_id="s",
        grain_id=GrainId("G", "k"),
        name="bounded",
        start_at=start,
        period=timedelta(seconds=10),
        cron=None,
        tz=None,
        next_due=start,
        ends_at=start + timedelta(seconds=25),
    )
    assert next_slots(bounded) == [start + timedelta(seconds=10 * i) for i in range(3)]
