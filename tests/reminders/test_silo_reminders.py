"""Reminders in the embedded silo, end to end: grain API, ticks, declared reminders,
the management grain and missed-tick notification, all on a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    MissedReminder,
    MissedReminderAction,
    Remindable,
    ReminderEntry,
    ReminderError,
    ReminderPriority,
    RetryPolicy,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.errors import ConfigurationError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.registry import Registration
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.streams.provider import MISSED_REMINDERS_STREAM
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock

S = timedelta(seconds=1)
REMINDERS = ReminderOptions(
    look_ahead=timedelta(minutes=5),
    poll_interval=timedelta(seconds=30),
    base_bucket_size=64,
    permits=4,
    adaptive=False,
)

#: Ticks received by ``TickGrain``: (key, reminder name, status).
TICKS: list[tuple[Any, str, TickStatus]] = []


class TickGrain(Grain, Remindable, type_name="test_silo_reminders.Tick"):
    """Registers reminders on request and records every tick it receives."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((self.grain_key, name, status))

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)

    async def unregister(self, name: str) -> bool:
        return await self.unregister_reminder(name)

    async def get_one(self, name: str) -> ReminderEntry | None:
        return await self.get_reminder(name)

    async def get_all(self) -> list[ReminderEntry]:
        return await self.get_reminders()


class PlainGrain(Grain, type_name="test_silo_reminders.Plain"):
    """Not Remindable: registering a reminder must fail."""

    async def try_register(self) -> ReminderEntry:
        return await self.register_or_update_reminder("nope", period=timedelta(minutes=1))


@pytest.fixture(autouse=True)
def _clear_ticks() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


def _options(*types: type[Grain]) -> SiloOptions:
    # Only the test's own grain types: declared reminders of classes defined in
    # other test modules must not appear in these silos' tables.
    return SiloOptions(grain_types=types or (TickGrain, PlainGrain), reminders=REMINDERS)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def silo(clock: ManualClock) -> AsyncIterator[Silo]:
    async with Silo.local(_options(), clock=clock) as s:
        yield s


async def _loaded(silo: Silo, n: int) -> None:
    svc = silo.reminder_service
    assert svc is not None
    await wait_for(
        lambda: svc.stats.loaded + svc.stats.queued + svc.stats.in_flight >= n, 5.0, interval=0
    )


def _ticks(name: str) -> list[TickStatus]:
    return [status for _, n, status in TICKS if n == name]


async def test_registered_reminder_ticks_on_its_grid_with_tick_status(
    silo: Silo, clock: ManualClock
) -> None:
    t0 = clock.now()
    g = silo.client.get_grain(TickGrain, "a")
    entry = await g.register(
        "beat",
        {"due": 10 * S, "period": 60 * S, "priority": ReminderPriority.CRITICAL},
    )
    assert entry.etag is not None and entry.next_due == t0 + 10 * S
    await _loaded(silo, 1)

    await clock.advance(9 * S)
    await clock.settle()
    assert _ticks("beat") == []
    await clock.advance(1 * S)
    await wait_for(lambda: len(_ticks("beat")) == 1, 5.0, interval=0)
    await clock.advance(60 * S)
    await wait_for(lambda: len(_ticks("beat")) == 2, 5.0, interval=0)

    first, second = _ticks("beat")
    assert first.current_tick_time == t0 + 10 * S
    assert second.current_tick_time == t0 + 70 * S
    assert first.first_tick_time == t0 + 10 * S
    assert first.period == 60 * S and first.cron is None
    assert first.missed_ticks == 0 and second.missed_ticks == 0
    assert first.priority == ReminderPriority.CRITICAL
    assert first.delivered_at >= first.current_tick_time

    svc = silo.reminder_service
    assert svc is not None
    await svc.wait_persisted()
    stored = await g.get_one("beat")
    assert stored is not None
    assert stored.next_due == t0 + 130 * S
    assert stored.last_fire == second.delivered_at


async def test_unregister_stops_ticks(silo: Silo, clock: ManualClock) -> None:
    g = silo.client.get_grain(TickGrain, "u")
    await g.register("r", {"due": 5 * S, "period": 5 * S})
    await _loaded(silo, 1)
    await clock.advance(5 * S)
    await wait_for(lambda: len(_ticks("r")) == 1, 5.0, interval=0)

    assert await g.unregister("r") is True
    assert await g.unregister("r") is False
    for _ in range(6):
        await clock.advance(5 * S)
    await clock.settle()
    assert len(_ticks("r")) == 1
    assert await g.get_one("r") is None


async def test_get_reminder_and_get_reminders(silo: Silo) -> None:
    g = silo.client.get_grain(TickGrain, "g")
    assert await g.get_one("x") is None
    assert await g.get_all() == []
    await g.register("x", {"period": 60 * S})
    await g.register("y", {"cron": "0 0 9 * * 1-5", "tz": "Europe/Berlin"})
    await silo.client.get_grain(TickGrain, "other").register("x", {"period": 60 * S})

    x = await g.get_one("x")
    assert x is not None and x.period == 60 * S and x.cron is None
    rows = await g.get_all()
    assert sorted(r.name for r in rows) == ["x", "y"]
    y = next(r for r in rows if r.name == "y")
    assert y.cron == "0 0 9 * * 1-5" and y.tz == "Europe/Berlin" and y.period is None


async def test_registering_again_replaces_and_reanchors(silo: Silo, clock: ManualClock) -> None:
    g = silo.client.get_grain(TickGrain, "re")
    first = await g.register("r", {"due": 10 * S, "period": 60 * S})
    await clock.advance(3 * S)
    second = await g.register("r", {"due": 20 * S, "period": 30 * S})
    assert second.etag != first.etag
    assert second.start_at == clock.now() + 20 * S
    rows = await g.get_all()
    assert len(rows) == 1 and rows[0].period == 30 * S


async def test_registering_on_a_grain_that_is_not_remindable_raises(silo: Silo) -> None:
    with pytest.raises(ReminderError, match="Remindable"):
        await silo.client.get_grain(PlainGrain, "p").try_register()


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("c", {"cron": "not a cron"}, "cron"),
        ("b", {"period": 60, "cron": "0 * * * *"}, None),
        ("n", {}, None),
        ("m", {"period": 0.5}, "minimum"),
        ("z", {"cron": "0 * * * *", "tz": "Mars/Olympus"}, None),
        ("x" * 300, {"period": 60}, None),
        ("p", {"period": 60, "priority": 128}, "priority"),
        ("q", {"period": 60, "priority": -129}, "priority"),
        ("", {"period": 60}, None),
        ("d", {"due": -1, "period": 60}, None),
    ],
    ids=[
        "bad-cron",
        "both",
        "neither",
        "below-minimum",
        "unknown-zone",
        "long-name",
        "priority-high",
        "priority-low",
        "empty-name",
        "negative-due",
    ],
)
async def test_validation_errors_surface_as_reminder_error(
    silo: Silo, name: str, kwargs: dict[str, Any], match: str
) -> None:
    g = silo.client.get_grain(TickGrain, "v")
    with pytest.raises(ReminderError, match=match):
        await g.register(name, kwargs)
    assert await g.get_all() == []


@pytest.fixture
def declared_grain() -> Iterator[type[Grain]]:
    """A grain class with declared reminders, removed from the global registry
    afterwards so that other tests' silos do not create its rows."""

    @register_reminder("daily", period=timedelta(days=1), priority=ReminderPriority.BACKGROUND)
    @register_reminder("soon", due=5, period=60, action=MissedReminderAction.FIRE_IMMEDIATELY)
    class DeclaredGrain(
        Grain, Remindable, type_name="test_silo_reminders.Declared", reminder_keys=("k1", "k2")
    ):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            TICKS.append((self.grain_key, name, status))

    try:
        yield DeclaredGrain
    finally:
        grain_module._registry.pop("test_silo_reminders.Declared", None)


async def test_declared_reminders_are_created_at_start_without_activation(
    clock: ManualClock, declared_grain: type[Grain]
) -> None:
    table = InMemoryReminderTable("default")
    async with Silo.local(_options(declared_grain), clock=clock, reminder_table=table) as silo:
        assert silo.activation_count == 0
        assert await silo.client.reminders.count_all() == 4
        gid = GrainId("test_silo_reminders.Declared", "k1")
        rows = {r.name: r for r in await silo.client.reminders.list_for_grain(gid)}
        assert set(rows) == {"daily", "soon"}
        assert rows["daily"].priority == ReminderPriority.BACKGROUND
        assert rows["soon"].action is MissedReminderAction.FIRE_IMMEDIATELY
        assert rows["soon"].next_due == clock.now() + 5 * S
        # Reading rows activated the management grain only.
        catalog = silo.dispatcher.catalog
        assert catalog.get(gid) is None
        assert catalog.get(GrainId("test_silo_reminders.Declared", "k2")) is None

        # The declared rows tick like any other: the grain activates on its tick.
        await _loaded(silo, 2)  # the daily rows fall outside the look-ahead
        await clock.advance(5 * S)
        await wait_for(lambda: len(_ticks("soon")) == 2, 5.0, interval=0)
        assert sorted(k for k, _, _ in TICKS) == ["k1", "k2"]
        assert catalog.get(gid) is not None


async def test_declarations_are_register_or_update(
    clock: ManualClock, declared_grain: type[Grain]
) -> None:
    table = InMemoryReminderTable("default")
    k1 = GrainId("test_silo_reminders.Declared", "k1")
    async with Silo.local(_options(declared_grain), clock=clock, reminder_table=table):
        pass  # the first start creates every declared row
    first = {r.name: r for r in await table.read_grain(k1)}
    assert set(first) == {"daily", "soon"} and all(r.declared for r in first.values())
    # A row registered from code, and a declared row changed behind the declaration.
    await table.upsert(
        new_entry(
            ReminderSpec(period=timedelta(hours=1)),
            service_id="default",
            grain_id=k1,
            name="from-code",
            now=clock.now(),
            options=REMINDERS,
        )
    )
    await table.upsert(replace(first["soon"], period=timedelta(hours=3)))
    await clock.advance(10 * S)
    async with Silo.local(_options(declared_grain), clock=clock, reminder_table=table):
        pass
    second = {r.name: r for r in await table.read_grain(k1)}
    # The declarations did not change: both rows untouched (same etag, next_due,
    # last_fire), the one changed behind the declaration too (an operator's
    # change stands until the code changes).
    assert second["daily"] == first["daily"]
    assert second["soon"].period == 3 * 3600 * S and second["soon"].declared
    assert not second["from-code"].declared

    # The next version of the class: "daily" is gone, "soon" changes priority
    # only, "extra" is new and declared for key k9 alone.
    grain_module._registry.pop("test_silo_reminders.Declared", None)

    @register_reminder("extra", cron="0 0 9 * * *", tz="Europe/Berlin", keys=["k9"])
    @register_reminder("soon", due=5, period=60, priority=ReminderPriority.CRITICAL)
    class DeclaredGrainV2(
        Grain, Remindable, type_name="test_silo_reminders.Declared", reminder_keys=("k1", "k2")
    ):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            TICKS.append((self.grain_key, name, status))

    await clock.advance(10 * S)
    async with Silo.local(_options(DeclaredGrainV2), clock=clock, reminder_table=table):
        pass
    third = {r.name: r for r in await table.read_grain(k1)}
    assert set(third) == {"soon", "from-code"}, "the row of a removed declaration stayed"
    assert third["soon"].priority == ReminderPriority.CRITICAL
    assert third["soon"].next_due == second["soon"].next_due, "a priority change re-anchored"
    assert third["from-code"] == second["from-code"], "a row registered from code was touched"
    assert [r.name for r in await table.read_grain(GrainId(k1.type_name, "k2"))] == ["soon"]
    (extra,) = await table.read_grain(GrainId(k1.type_name, "k9"))
    assert extra.name == "extra" and extra.cron == "0 0 9 * * *" and extra.declared


async def test_bad_declaration_names_its_class_and_reminder(clock: ManualClock) -> None:
    @register_reminder("nightly", cron="0 0 25 * * *")
    class BadlyDeclared(Grain, Remindable, type_name="test_silo_reminders.BadlyDeclared"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    try:
        with pytest.raises(
            ReminderError,
            match=r"register_reminder\('nightly'\) on .*BadlyDeclared",
        ):
            async with Silo.local(_options(BadlyDeclared), clock=clock):
                pass
    finally:
        grain_module._registry.pop("test_silo_reminders.BadlyDeclared", None)


async def test_management_grain_operations(silo: Silo, clock: ManualClock) -> None:
    mgmt = silo.client.reminders
    a = silo.client.get_grain(TickGrain, "ma")
    b = silo.client.get_grain(TickGrain, "mb")
    await a.register("soon", {"due": 30 * S, "period": 60 * S})
    await a.register("later", {"due": 20 * 60 * S, "period": 3600 * S})
    await b.register("mid", {"due": 5 * 60 * S, "period": 3600 * S})
    gid_a = GrainId("test_silo_reminders.Tick", "ma")
    gid_b = GrainId("test_silo_reminders.Tick", "mb")

    assert await mgmt.count_all() == 3
    upcoming = await mgmt.upcoming(timedelta(minutes=10))
    assert [(r.grain_id, r.name) for r in upcoming] == [(gid_a, "soon"), (gid_b, "mid")]
    assert [r.name for r in await mgmt.upcoming(timedelta(minutes=10), 1)] == ["soon"]
    assert sorted(r.name for r in await mgmt.list_for_grain(gid_a)) == ["later", "soon"]

    updated = await mgmt.set_priority(gid_a, "soon", ReminderPriority.CRITICAL)
    assert updated.priority == ReminderPriority.CRITICAL
    with pytest.raises(ReminderError):
        await mgmt.set_priority(gid_a, "soon", 500)
    updated = await mgmt.set_action(gid_a, "soon", MissedReminderAction.NOTIFY)
    assert updated.action is MissedReminderAction.NOTIFY
    stored = await a.get_one("soon")
    assert stored is not None
    assert stored.priority == ReminderPriority.CRITICAL
    assert stored.action is MissedReminderAction.NOTIFY
    with pytest.raises(ReminderError):
        await mgmt.set_action(gid_a, "missing", MissedReminderAction.SKIP)

    # repair moves next_due to the first slot after now.
    row = await a.get_one("later")
    assert row is not None
    await silo.dispatcher.reminders.store(replace(row, next_due=row.next_due - timedelta(days=3)))
    repaired = await mgmt.repair(gid_a, "later")
    assert clock.now() < repaired.next_due <= clock.now() + 3600 * S
    assert (repaired.next_due - row.start_at) % timedelta(hours=1) == timedelta(0)

    assert await mgmt.delete(gid_b, "mid") is True
    assert await mgmt.delete(gid_b, "mid") is False
    assert await mgmt.count_all() == 2


async def test_notify_publishes_missed_reminder_on_the_stream(clock: ManualClock) -> None:
    table = InMemoryReminderTable("default")
    gid = GrainId("test_silo_reminders.Tick", "late")
    entry = new_entry(
        ReminderSpec(
            due=timedelta(minutes=1),
            period=timedelta(minutes=1),
            action=MissedReminderAction.NOTIFY,
        ),
        service_id="default",
        grain_id=gid,
        name="n",
        now=clock.now() - timedelta(minutes=10),
        options=REMINDERS,
    )
    # The row was due nine minutes ago: far beyond the grace (poll_interval).
    await table.upsert(entry)
    async with Silo.local(_options(), clock=clock, reminder_table=table) as silo:
        events: list[MissedReminder] = []

        async def poll() -> None:
            while not events:
                items = await silo.streams.read(MISSED_REMINDERS_STREAM)
                events.extend(i.item for i in items)
                await asyncio.sleep(0)

        async with asyncio.timeout(5):
            await poll()
        event = events[0]
        assert isinstance(event, MissedReminder)
        assert event.grain_id == gid and event.name == "n"
        assert event.scheduled == entry.next_due
        assert event.missed_ticks >= 9
        assert event.next_due > clock.now()
        assert _ticks("n") == []  # NOTIFY skips: no delivery
        svc = silo.reminder_service
        assert svc is not None
        await svc.wait_persisted()
        stored = await table.read(gid, "n")
        assert stored is not None and stored.next_due == event.next_due


async def test_register_many_writes_every_row_and_the_service_ticks_them(
    silo: Silo, clock: ManualClock
) -> None:
    registry = silo.dispatcher.reminders
    regs = [
        Registration(GrainId("test_silo_reminders.Tick", f"bulk{i}"), "r", due=5, period=60)
        for i in range(1200)
    ]
    assert await registry.register_many(regs, batch=256) == 1200
    assert await silo.client.reminders.count_all() == 1200
    await _loaded(silo, 64)  # the window (64 rows) filled from the local hints
    await clock.advance(5 * S)
    await wait_for(lambda: len(_ticks("r")) >= 64, 5.0, interval=0)


async def test_register_many_validates_everything_before_writing(silo: Silo) -> None:
    registry = silo.dispatcher.reminders
    regs = [Registration(GrainId("test_silo_reminders.Tick", i), "r", period=60) for i in range(10)]
    regs.insert(7, Registration(GrainId("test_silo_reminders.Tick", "x"), "r", period=60, cron="*"))
    with pytest.raises(ReminderError, match=r"registration #7 .* exactly one of period"):
        await registry.register_many(regs)
    plain = [Registration(GrainId("test_silo_reminders.Plain", 1), "r", period=60)]
    with pytest.raises(ReminderError, match="cannot have reminders"):
        await registry.register_many(plain)
    assert await silo.client.reminders.count_all() == 0


class GatedTickGrain(Grain, Remindable, type_name="test_silo_reminders.GatedTick"):
    """Holds its tick's turn until the test opens the gate; records what ran when."""

    gate: asyncio.Event | None = None
    events: list[str] = []

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        GatedTickGrain.events.append("tick started")
        assert GatedTickGrain.gate is not None
        await GatedTickGrain.gate.wait()
        GatedTickGrain.events.append("tick ended")

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)

    async def poke(self) -> None:
        GatedTickGrain.events.append("poke")


async def test_a_tick_to_an_idle_local_activation_keeps_turn_rules(clock: ManualClock) -> None:
    # The grain is active and idle here, so the tick runs as a turn in the
    # delivery task itself (Activation.enter_inline). It is still a turn: a call
    # arriving meanwhile waits for it, and the turn counts as activity.
    GatedTickGrain.gate, GatedTickGrain.events = asyncio.Event(), []
    async with Silo.local(_options(GatedTickGrain), clock=clock) as silo:
        g = silo.client.get_grain(GatedTickGrain, "g")
        await g.register("r", {"due": 5 * S, "period": 60 * S})
        await _loaded(silo, 1)
        act = silo.dispatcher.catalog.get(GrainId("test_silo_reminders.GatedTick", "g"))
        assert act is not None and act.idle_and_valid()
        before = act.last_activity_ms
        await clock.advance(5 * S)
        await wait_for(lambda: GatedTickGrain.events == ["tick started"], 5.0, interval=0)
        assert not act.idle_and_valid()
        poke = asyncio.ensure_future(g.poke())
        await clock.settle()
        assert GatedTickGrain.events == ["tick started"], "a call interleaved with the tick"
        GatedTickGrain.gate.set()
        await poke
        assert GatedTickGrain.events == ["tick started", "tick ended", "poke"]
        assert act.last_activity_ms > before
        svc = silo.reminder_service
        assert svc is not None
        await wait_for(lambda: svc.stats.delivered == 1, 5.0, interval=0)


# -- one-shot, jitter, bounds, payload, retry through the grain API ----------------------


async def test_a_one_shot_with_a_payload_fires_once_through_the_grain_and_goes(
    silo: Silo, clock: ManualClock
) -> None:
    g = silo.client.get_grain(TickGrain, "once")
    at = clock.now() + 30 * S
    payload = {"order": 42, "due": at, "tags": ["a", "b"]}
    entry = await g.register("ping", {"at": at, "payload": payload})
    assert entry.one_shot and entry.next_due == at and entry.payload == payload
    shown = await silo.client.reminders.list_for_grain(g.grain_id)
    assert [(r.name, r.payload) for r in shown] == [("ping", payload)]
    await _loaded(silo, 1)
    await clock.advance(30 * S)
    await wait_for(lambda: len(_ticks("ping")) == 1, 5.0, interval=0)
    [status] = _ticks("ping")
    assert status.payload == payload and status.final and status.current_tick_time == at

    async def gone() -> bool:
        return await g.get_one("ping") is None

    await wait_for(gone, 5.0, interval=0.01)
    for _ in range(3):
        await clock.advance(60 * S)
    await clock.settle()
    assert len(_ticks("ping")) == 1


async def test_management_shows_jitter_bounds_and_retry(silo: Silo, clock: ManualClock) -> None:
    g = silo.client.get_grain(TickGrain, "shaped")
    ends = clock.now() + timedelta(hours=2)
    retry = RetryPolicy(4, 3 * S)
    await g.register(
        "r",
        {"period": 60 * S, "jitter": 20 * S, "ends_at": ends, "max_ticks": 50, "retry": retry},
    )
    mgmt = silo.client.reminders
    [row] = await mgmt.list_for_grain(g.grain_id)
    assert (row.jitter, row.ends_at, row.max_ticks, row.retry) == (20 * S, ends, 50, retry)
    assert row.final_due == row.start_at + 49 * 60 * S
    [soon] = await mgmt.upcoming(timedelta(minutes=10))
    assert soon == row
    # The first tick comes within the jitter of its nominal slot.
    assert row.start_at <= row.next_due < row.start_at + 20 * S


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"at": "soon"}, "timezone-aware datetime"),
        ({"period": 60, "max_ticks": 0}, "max_ticks"),
        ({"period": 60, "jitter": 61}, "jitter"),
        ({"period": 60, "payload": "x" * 5000}, "MAX_PAYLOAD_BYTES"),
        ({"due": 5, "ends_at": None, "max_ticks": 3}, "one-shot"),
    ],
    ids=[
        "at-not-a-datetime",
        "max-ticks-zero",
        "jitter-past-period",
        "big-payload",
        "bounded-once",
    ],
)
async def test_schedule_option_errors_surface_as_reminder_error(
    silo: Silo, kwargs: dict[str, Any], match: str
) -> None:
    g = silo.client.get_grain(TickGrain, "bad")
    with pytest.raises(ReminderError, match=match):
        await g.register("r", kwargs)
    assert await g.get_all() == []


async def test_declared_reminders_take_jitter_bounds_payload_and_retry(
    clock: ManualClock,
) -> None:
    ends = clock.now() + timedelta(days=30)

    @register_reminder(
        "shaped",
        period=timedelta(minutes=1),
        jitter=timedelta(seconds=15),
        ends_at=ends,
        payload={"kind": "report"},
        retry=RetryPolicy(2, timedelta(seconds=5)),
    )
    @register_reminder("over", period=60, ends_at=clock.now() - timedelta(seconds=1))
    class ShapedGrain(Grain, Remindable, type_name="test_silo_reminders.Shaped"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            TICKS.append((self.grain_key, name, status))

    try:
        table = InMemoryReminderTable("default")
        async with Silo.local(_options(ShapedGrain), clock=clock, reminder_table=table):
            gid = GrainId("test_silo_reminders.Shaped", "")
            rows = {r.name: r for r in await table.read_grain(gid)}
        # The declaration past its end creates no row.
        assert set(rows) == {"shaped"}
        row = rows["shaped"]
        assert (row.jitter, row.ends_at, row.payload, row.retry) == (
            timedelta(seconds=15),
            ends,
            {"kind": "report"},
            RetryPolicy(2, timedelta(seconds=5)),
        )
        # An unchanged declaration leaves the row alone at the next start.
        async with Silo.local(_options(ShapedGrain), clock=clock, reminder_table=table):
            again = await table.read(row.grain_id, "shaped")
        assert again is not None and again.etag == row.etag
    finally:
        grain_module._registry.pop("test_silo_reminders.Shaped", None)


def test_a_declared_one_shot_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="one-shot"):

        @register_reminder("once", due=5)
        class OnceGrain(Grain, Remindable, type_name="test_silo_reminders.Once"):
            async def receive_reminder(self, name: str, status: TickStatus) -> None:
                pass
