"""Calendars on an embedded silo with a manual clock: the business-day shift as
delivered, a calendar change reaching held and stored rows live, deletion, and
bad input writing nothing."""

from __future__ import annotations

import calendar as weekdays
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from orleanspy import (
    Calendar,
    Excluded,
    FeatureUnavailableError,
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.remindable.registry import Registration
from orleanspy.reminders.describe import next_fire_times
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from orleanspy.versions import Feature

BERLIN = ZoneInfo("Europe/Berlin")
# Polls a day apart, so that months of manual time pass in a few hundred wake-ups.
REMINDERS = ReminderOptions(
    base_bucket_size=64,
    permits=4,
    adaptive=False,
    poll_interval=timedelta(days=1),
    look_ahead=timedelta(days=2),
    repair_interval=timedelta(days=1),
)
TICKS: list[tuple[str, TickStatus]] = []
WEEKEND = [weekdays.SATURDAY, weekdays.SUNDAY]


class PayGrain(Grain, Remindable, type_name="test_calendar.Pay"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((name, status))

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


@pytest.fixture(autouse=True)
def _clear_ticks() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def berlin(y: int, m: int, d: int, h: int = 0) -> datetime:
    return datetime(y, m, d, h, tzinfo=BERLIN)


async def advance_to(clock: ManualClock, when: datetime) -> None:
    """Move the clock to ``when``: a jump to a minute before it (the service
    polls there and loads what falls due soon), then on to it, as time would
    pass for rows due then. Rows due during the jump are missed: callers move
    through every slot they expect."""
    before = when - timedelta(minutes=1)
    if clock.now() < before:
        await clock.advance(before - clock.now())
    if clock.now() < when:
        await clock.advance(when - clock.now())


async def test_payday_moves_to_the_previous_business_day(tmp_path: Any) -> None:
    clock = ManualClock(berlin(2026, 12, 20, 12).astimezone(UTC))
    # Idle collection checked daily too: months of manual time stay cheap.
    options = SiloOptions(
        grain_types=(PayGrain,), reminders=REMINDERS, collection_check_interval=timedelta(days=1)
    )
    async with Silo.local(options, clock=clock) as silo:
        mgmt = silo.client.reminders
        change = await mgmt.set_calendar(
            "de-business",
            Calendar(tz="Europe/Berlin", exclude_dates=["2026-12-25"], exclude_weekdays=WEEKEND),
        )
        assert change.updated == 0
        grain = silo.client.get_grain(PayGrain, "acme")
        row = await grain.register(
            "payday",
            {
                "cron": "0 0 9 25 * *",
                "tz": "Europe/Berlin",
                "calendar": "de-business",
                "on_excluded": Excluded.PREVIOUS_BUSINESS_DAY,
            },
        )
        # The due index has the shifted instant, before the slot's natural time.
        assert row.next_due == berlin(2026, 12, 24, 9)
        assert row.calendar == "de-business" and row.on_excluded is Excluded.PREVIOUS_BUSINESS_DAY
        stored = await silo.reminder_table.read(GrainId("test_calendar.Pay", "acme"), "payday")
        assert stored is not None and stored.calendar_rules is not None
        fires = next_fire_times(stored, None, 3, clock.now())
        assert [f.at for f in fires] == [
            berlin(2026, 12, 24, 9),
            berlin(2027, 1, 25, 9),
            berlin(2027, 2, 25, 9),
        ]
        assert fires[0].slot == berlin(2026, 12, 25, 9)
        # The clock moves across the excluded 25th: the tick comes on the 24th.
        for when in [f.at for f in next_fire_times(stored, None, 5, clock.now())]:
            await advance_to(clock, when)
            await wait_for(lambda w=when: any(s.due_at == w for _, s in TICKS), 5.0, interval=0)
        got = [(s.due_at, s.current_tick_time) for _, s in TICKS]
        assert got == [
            (berlin(2026, 12, 24, 9), berlin(2026, 12, 25, 9)),
            (berlin(2027, 1, 25, 9), berlin(2027, 1, 25, 9)),
            (berlin(2027, 2, 25, 9), berlin(2027, 2, 25, 9)),
            (berlin(2027, 3, 25, 9), berlin(2027, 3, 25, 9)),
            (berlin(2027, 4, 23, 9), berlin(2027, 4, 25, 9)),
        ]
        assert all(s.missed_ticks == 0 and s.delivered_at == s.due_at for _, s in TICKS)


async def test_a_calendar_change_reaches_held_and_stored_rows_at_once() -> None:
    # Wednesday 2027-01-06, 08:00 UTC; daily reminders at 09:00 UTC.
    clock = ManualClock(datetime(2027, 1, 6, 8, tzinfo=UTC))
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(PayGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        mgmt = silo.client.reminders
        await mgmt.set_calendar("ops", Calendar(exclude_weekdays=WEEKEND))
        grain = silo.client.get_grain(PayGrain, "g")
        # "near" is held (due within the look-ahead); "far" is only in the table.
        await grain.register("near", {"cron": "0 0 9 * * *", "calendar": "ops"})
        await grain.register("far", {"cron": "0 0 9 8 * *", "calendar": "ops"})
        await grain.register("free", {"cron": "0 0 9 * * *"})
        svc = silo.reminder_service
        assert svc is not None
        await wait_for(lambda: svc.stats.loaded >= 2, 5.0, interval=0)
        # Today and the 8th become holidays; SKIP moves both rows on.
        change = await mgmt.set_calendar(
            "ops", Calendar(exclude_weekdays=WEEKEND, exclude_dates=["2027-01-06", "2027-01-08"])
        )
        assert (change.updated, change.paused) == (2, 0)
        gid = GrainId("test_calendar.Pay", "g")
        rows = {r.name: r for r in await mgmt.list_for_grain(gid)}
        assert rows["near"].next_due == datetime(2027, 1, 7, 9, tzinfo=UTC)
        assert rows["far"].next_due == datetime(2027, 2, 8, 9, tzinfo=UTC)
        assert rows["near"].calendar_version == change.version
        # Setting it again with the same rules moves nothing twice.
        again = await mgmt.set_calendar(
            "ops", Calendar(exclude_weekdays=WEEKEND, exclude_dates=["2027-01-06", "2027-01-08"])
        )
        assert again.updated == 2 and again.version > change.version
        await advance_to(clock, datetime(2027, 1, 6, 9, tzinfo=UTC))
        await wait_for(lambda: len(TICKS) == 1, 5.0, interval=0)
        await advance_to(clock, datetime(2027, 1, 7, 9, tzinfo=UTC))
        await wait_for(lambda: len(TICKS) == 3, 5.0, interval=0)
        # The held row skipped the new holiday at once; the row without a calendar did not.
        assert sorted((n, s.current_tick_time.day) for n, s in TICKS) == [
            ("free", 6),
            ("free", 7),
            ("near", 7),
        ]


async def test_delete_is_refused_while_in_use_and_force_detaches() -> None:
    clock = ManualClock(datetime(2027, 1, 6, 8, tzinfo=UTC))  # a Wednesday
    options = SiloOptions(grain_types=(PayGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock) as silo:
        mgmt = silo.client.reminders
        await mgmt.set_calendar("h", Calendar(exclude_dates=["2027-01-06"]))
        assert (await mgmt.get_calendar("h")).exclude_dates == ("2027-01-06",)
        grain = silo.client.get_grain(PayGrain, "d")
        row = await grain.register("r", {"cron": "0 0 9 * * *", "calendar": "h"})
        assert row.next_due == datetime(2027, 1, 7, 9, tzinfo=UTC)
        with pytest.raises(ReminderError, match=r"used by 1 reminder\(s\).*force"):
            await mgmt.delete_calendar("h")
        assert [c.name for c in await mgmt.calendars()] == ["h"]
        assert await mgmt.delete_calendar("h", force=True) == 1
        assert await mgmt.calendars() == []
        [detached] = await mgmt.list_for_grain(GrainId("test_calendar.Pay", "d"))
        assert detached.calendar is None
        assert detached.next_due == datetime(2027, 1, 6, 9, tzinfo=UTC)
        with pytest.raises(ReminderError, match="unknown calendar 'h'"):
            await mgmt.get_calendar("h")
        await advance_to(clock, datetime(2027, 1, 6, 9, 30, tzinfo=UTC))
        await wait_for(lambda: len(TICKS) == 1, 5.0, interval=0)


async def test_bad_calendar_input_is_refused_and_writes_nothing() -> None:
    clock = ManualClock(datetime(2027, 1, 6, 8, tzinfo=UTC))
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(PayGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        grain = silo.client.get_grain(PayGrain, "bad")
        mgmt = silo.client.reminders
        cases: list[tuple[dict[str, Any], str]] = [
            ({"cron": "0 0 9 * * *", "calendar": "nope"}, "unknown calendar 'nope'"),
            ({"cron": "0 0 9 * * *", "on_excluded": Excluded.SKIP}, "give calendar= too"),
            ({"cron": "0 0 9 * * *", "calendar": "a b"}, "not a calendar name"),
        ]
        await mgmt.set_calendar("sat", Calendar(exclude_weekdays=[weekdays.SATURDAY]))
        # A schedule the calendar excludes entirely.
        cases.append(({"cron": "0 0 9 * * 6", "calendar": "sat"}, "excludes every slot"))
        for kwargs, message in cases:
            with pytest.raises(ReminderError, match=message):
                await grain.register("r", kwargs)
        with pytest.raises(ReminderError, match="not a calendar name"):
            await mgmt.set_calendar("a|b", Calendar())
        with pytest.raises(ReminderError, match="takes a Calendar"):
            await mgmt.set_calendar("x", {"tz": "UTC"})
        with pytest.raises(ReminderError, match="unknown calendar"):
            await mgmt.delete_calendar("never")
        assert await table.count() == 0
        assert [c.name for c in await mgmt.calendars()] == ["sat"]
        # While a silo lacks the feature, nothing is written either.
        registry = silo.dispatcher.reminders

        def lacking(feature: Feature | str, what: str) -> None:
            name = feature if isinstance(feature, str) else feature.name
            raise FeatureUnavailableError(f"{what}: {name} needs every silo at protocol 2")

        registry.require = lacking
        with pytest.raises(FeatureUnavailableError, match="REMINDER_CALENDARS"):
            await grain.register("r", {"cron": "0 0 9 * * *", "calendar": "sat"})
        with pytest.raises(FeatureUnavailableError, match="REMINDER_LABELS"):
            await grain.register("r", {"period": 60, "labels": {"tenant": "acme"}})
        with pytest.raises(FeatureUnavailableError, match="REMINDER_CALENDARS"):
            await mgmt.set_calendar("sat", Calendar())
        assert await table.count() == 0
        assert (await mgmt.get_calendar("sat")).exclude_weekdays == (weekdays.SATURDAY,)


@pytest.fixture
def declared() -> Iterator[type[Grain]]:
    @register_reminder(
        "close",
        cron="0 0 17 * * *",
        calendar="ops",
        on_excluded=Excluded.NEXT_BUSINESS_DAY,
        labels={"team": "finance"},
    )
    class ClosingGrain(Grain, Remindable, type_name="test_calendar.Closing"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            TICKS.append((name, status))

    try:
        yield ClosingGrain
    finally:
        grain_module._registry.pop("test_calendar.Closing", None)


async def test_a_declaration_takes_its_calendar_from_the_table(declared: type[Grain]) -> None:
    clock = ManualClock(datetime(2027, 1, 8, 12, tzinfo=UTC))  # a Friday
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(declared,), reminders=REMINDERS)
    # No calendar yet: the silo does not start, and writes no row.
    with pytest.raises(ReminderError, match=r"Closing.*unknown calendar 'ops'"):
        async with Silo.local(options, clock=clock, reminder_table=table):
            pass
    assert await table.count() == 0
    await table.write_calendar("ops", Calendar(exclude_weekdays=WEEKEND))
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        [row] = await silo.client.reminders.list_for_grain(GrainId("test_calendar.Closing", ""))
        assert row.labels == {"team": "finance"} and row.calendar == "ops"
        assert row.next_due == datetime(2027, 1, 8, 17, tzinfo=UTC)
        assert await silo.client.reminders.count(labels="team=finance") == 1
        await advance_to(clock, datetime(2027, 1, 8, 17, tzinfo=UTC))
        await advance_to(clock, datetime(2027, 1, 11, 17, tzinfo=UTC))
        # Saturday's and Sunday's slots moved onto Monday's own: one tick.
        await wait_for(lambda: len(TICKS) == 2, 5.0, interval=0)
        assert [s.due_at.day for _, s in TICKS] == [8, 11]
    # Unchanged code keeps the row as it is at the next start.
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        [again] = await silo.client.reminders.list_for_grain(GrainId("test_calendar.Closing", ""))
        assert again.fingerprint == row.fingerprint


async def test_a_cut_short_change_is_finished_by_refresh_and_bulk_registrations_follow() -> None:
    clock = ManualClock(datetime(2027, 1, 6, 8, tzinfo=UTC))  # a Wednesday
    table = InMemoryReminderTable("default")
    options = SiloOptions(grain_types=(PayGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        await silo.client.reminders.set_calendar("ops", Calendar())
        registry = silo.dispatcher.reminders
        count = await registry.register_many(
            Registration(
                GrainId("test_calendar.Pay", f"k{i}"), "r", cron="0 0 9 * * *", calendar="ops"
            )
            for i in range(5)
        )
        assert count == 5
        rows = [r for r in (await table.read_page(None, 10))[0]]
        assert all(r.calendar_rules == Calendar() for r in rows)
        # A change whose walk never ran (its caller died after the write).
        changed = await table.write_calendar("ops", Calendar(exclude_dates=["2027-01-06"]))
        done = await registry.operations.refresh_calendar("ops")
        assert (done.version, done.updated) == (changed.version, 5)
        rows = [r for r in (await table.read_page(None, 10))[0]]
        assert {r.next_due for r in rows} == {datetime(2027, 1, 7, 9, tzinfo=UTC)}
        again = await registry.operations.refresh_calendar("ops")
        assert again.updated == 0  # every row is on the current version
