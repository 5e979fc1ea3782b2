"""A reminder's own missed-tick grace: validated at registration, stored, set by
``@register_reminder`` and the management grain, and applied to its ticks (a
change to a held row at once); rows without one use the default (10 s)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.options import DEFAULT_MISSED_TICK_GRACE, ReminderOptions
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.spec import MAX_GRACE, ReminderSpec, new_entry
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

S = timedelta(seconds=1)
# The default grace, not stated: rows without a grace of their own use it.
REMINDERS = ReminderOptions(base_bucket_size=64, permits=4, adaptive=False)
TICKS: list[tuple[str, TickStatus]] = []


class GraceGrain(Grain, Remindable, type_name="test_grace.Grace"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((name, status))

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


@pytest.fixture(autouse=True)
def _clear_ticks() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _names() -> list[str]:
    return [name for name, _ in TICKS]


async def _held(silo: Silo, n: int) -> None:
    svc = silo.reminder_service
    assert svc is not None
    await wait_for(lambda: svc.stats.loaded >= n, 5.0, interval=0)


def test_grace_is_validated_and_stored_to_the_ms() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)

    def make(grace: Any) -> ReminderEntry:
        return new_entry(
            ReminderSpec(period=60, grace=grace),
            service_id="s",
            grain_id=GrainId("G", 1),
            name="r",
            now=now,
            options=REMINDERS,
        )

    assert make(None).grace is None
    assert make(2.5).grace == timedelta(seconds=2.5)
    assert make(timedelta(microseconds=1500)).grace == timedelta(milliseconds=1)
    assert make(0).grace == timedelta(0)
    assert make(MAX_GRACE).grace == MAX_GRACE
    for bad in (-1, MAX_GRACE + S, "5", float("nan"), True):
        with pytest.raises(ReminderError, match="grace"):
            make(bad)


async def test_a_row_with_its_own_grace_is_missed_past_it(clock: ManualClock) -> None:
    assert DEFAULT_MISSED_TICK_GRACE == 10 * S
    table = InMemoryReminderTable("default")
    gid = GrainId("test_grace.Grace", "a")
    # Both rows were due 3 s ago when the silo starts: past 2 s, inside 10 s.
    for name, grace in (("own", 2), ("default", None)):
        row = new_entry(
            ReminderSpec(due=10, period=60, grace=grace),
            service_id="default",
            grain_id=gid,
            name=name,
            now=clock.now() - 13 * S,
            options=REMINDERS,
        )
        await table.upsert(row)
    options = SiloOptions(grain_types=(GraceGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table) as silo:
        svc = silo.reminder_service
        assert svc is not None
        await wait_for(lambda: svc.stats.delivered + svc.stats.skipped == 2, 5.0, interval=0)
        assert _names() == ["default"]
        assert svc.stats.skipped == 1 and svc.stats.missed == 1
        await svc.wait_persisted()
        stored = {r.name: r for r in await silo.client.reminders.list_for_grain(gid)}
    assert stored["own"].next_due == clock.now() + 57 * S  # the skipped slot is gone
    assert stored["own"].grace == 2 * S and stored["default"].grace is None


class GateGrain(Grain, Remindable, type_name="test_grace.Gate"):
    """Its tick holds the only delivery permit until ``GATE`` is set."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        await GATE.wait()


GATE = asyncio.Event()


async def test_management_set_grace_applies_to_the_held_row_at_once(clock: ManualClock) -> None:
    GATE.clear()
    options = SiloOptions(
        grain_types=(GraceGrain, GateGrain), reminders=replace(REMINDERS, permits=1)
    )
    async with Silo.local(options, clock=clock) as silo:
        g = silo.client.get_grain(GraceGrain, "b")
        gate = GrainId("test_grace.Gate", "")
        await silo.dispatcher.reminders.register(gate, "gate", ReminderSpec(due=9, period=3600))
        await g.register("r", {"due": 10, "period": 60})
        await _held(silo, 2)
        gid = GrainId("test_grace.Grace", "b")
        # No wait between the change and the clock: it must hold on the row now.
        row = await silo.client.reminders.set_grace(gid, "r", timedelta(seconds=1))
        assert row.grace == S
        with pytest.raises(ReminderError, match="grace"):
            await silo.client.reminders.set_grace(gid, "r", -5)
        svc = silo.reminder_service
        assert svc is not None
        await clock.advance(9 * S)  # the gate's tick takes the only permit
        await wait_for(lambda: svc.stats.in_flight == 1, 5.0, interval=0)
        await clock.advance(3 * S)  # "r" falls due at +10 and waits
        GATE.set()  # "r" is reached at +12: 2 s late, past its 1 s grace
        await wait_for(lambda: svc.stats.skipped == 1, 5.0, interval=0)
        assert TICKS == []
        # Back to the default grace: an on-time slot is delivered.
        await silo.client.reminders.set_grace(gid, "r", None)
        await clock.advance(58 * S)
        await wait_for(lambda: len(TICKS) == 1, 5.0, interval=0)
        assert TICKS[0][1].current_tick_time == clock.now()


@pytest.fixture
def declared() -> Iterator[type[Grain]]:
    @register_reminder("graced", due=5, period=60, grace=timedelta(seconds=3))
    class DeclaredGraceGrain(Grain, Remindable, type_name="test_grace.Declared"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            TICKS.append((name, status))

    try:
        yield DeclaredGraceGrain
    finally:
        grain_module._registry.pop("test_grace.Declared", None)


async def test_a_declared_grace_is_stored_and_a_changed_one_updated_in_place(
    clock: ManualClock, declared: type[Grain]
) -> None:
    table = InMemoryReminderTable("default")
    gid = GrainId("test_grace.Declared", "")
    options = SiloOptions(grain_types=(declared,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table):
        pass
    first = await table.read(gid, "graced")
    assert first is not None and first.grace == 3 * S and first.declared

    register_reminder("graced", due=5, period=60, grace=7)(declared)
    async with Silo.local(options, clock=clock, reminder_table=table):
        pass
    again = await table.read(gid, "graced")
    assert again is not None and again.grace == 7 * S
    assert again.next_due == first.next_due  # a changed grace alone keeps the schedule
