"""Overlap policies and tick deadlines on an embedded silo with a manual clock:
real grains whose ``receive_reminder`` blocks, so a tick outlasts its period
(what each ``OverlapPolicy`` makes of the slots that fall due meanwhile), or
its deadline (cancelled where it runs, handled by the retry policy, counted)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderEntry,
    ReminderError,
    RetryPolicy,
    Silo,
    SiloOptions,
    TickStatus,
    reentrant,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.errors import ConfigurationError, TickDeadlineError
from orleanspy.options import ReminderOptions
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.model import OverlapPolicy
from orleanspy.testing import simulate_tick, wait_for
from orleanspy.testing.clock import ManualClock

S = timedelta(seconds=1)
REMINDERS = ReminderOptions(
    look_ahead=timedelta(minutes=5),
    poll_interval=timedelta(seconds=30),
    base_bucket_size=64,
    permits=8,
    adaptive=False,
    missed_tick_grace=timedelta(seconds=10),
)

#: Ticks that started: (key, name, slot, attempt); and those that returned.
STARTED: list[tuple[str, str, datetime, int]] = []
FINISHED: list[tuple[str, str, datetime]] = []
CANCELLED: list[tuple[str, datetime]] = []
#: Slots (by key) whose tick blocks until its event is set.
GATES: dict[tuple[str, datetime], asyncio.Event] = {}
#: Keys whose every tick blocks until released.
BLOCK_ALL: dict[str, asyncio.Event] = {}


async def _run(key: str, name: str, status: TickStatus) -> None:
    slot = status.current_tick_time
    STARTED.append((key, name, slot, status.attempt))
    gate = GATES.get((key, slot)) or BLOCK_ALL.get(key)
    try:
        if gate is not None:
            await gate.wait()
    except asyncio.CancelledError:
        CANCELLED.append((key, slot))
        raise
    FINISHED.append((key, name, slot))


class SlowGrain(Grain, Remindable, type_name="test_overlap.Slow"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        await _run(str(self.grain_key), name, status)

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)

    async def get_one(self, name: str) -> ReminderEntry | None:
        return await self.get_reminder(name)


@reentrant
class SideBySideGrain(Grain, Remindable, type_name="test_overlap.SideBySide"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        await _run(str(self.grain_key), name, status)

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    for kept in (STARTED, FINISHED, CANCELLED, GATES, BLOCK_ALL):
        kept.clear()
    yield
    for gate in [*GATES.values(), *BLOCK_ALL.values()]:
        gate.set()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def silo(clock: ManualClock) -> AsyncIterator[Silo]:
    options = SiloOptions(grain_types=(SlowGrain, SideBySideGrain), reminders=REMINDERS)
    async with Silo.local(options, clock=clock) as s:
        yield s


async def advance(clock: ManualClock, seconds: float) -> None:
    await clock.settle()
    await clock.advance(seconds)


def slots(key: str) -> list[datetime]:
    return [slot for k, _, slot, _ in STARTED if k == key]


async def counters(
    silo: Silo, key: str, name: str = "r", grain: Any = SlowGrain
) -> ReminderCounters:
    assert silo.reminder_service is not None
    await silo.reminder_service.wait_persisted()
    result: ReminderCounters = await silo.client.reminders.counters((grain, key), name)
    return result


async def started(key: str, n: int) -> None:
    await wait_for(lambda: len(slots(key)) >= n, 5, interval=0, what=f"{n} ticks of {key}")


async def _blocked_first_tick(
    silo: Silo, clock: ManualClock, key: str, overlap: OverlapPolicy | None, hold: float
) -> tuple[datetime, list[datetime]]:
    """Register ``key``'s reminder (period 10 s, first slot in 10 s), block its
    first tick for ``hold`` seconds of the clock, release it, and return the
    first slot and every slot started within 4 s after (before the next slot
    on the grid from there)."""
    kwargs: dict[str, Any] = {"period": 10 * S}
    if overlap is not None:
        kwargs["overlap"] = overlap
    row = await silo.client.get_grain(SlowGrain, key).register("r", kwargs)
    first = row.next_due
    GATES[(key, first)] = gate = asyncio.Event()
    await advance(clock, 10)
    await started(key, 1)
    await advance(clock, hold)
    gate.set()
    await advance(clock, 4)
    return first, slots(key)


async def test_buffer_one_is_the_default_and_delivers_the_slot_that_waited(
    silo: Silo, clock: ManualClock
) -> None:
    # The first tick runs 15 s: the slot at +10 s falls due meanwhile and is
    # delivered as soon as it returns (5 s late, within the 10 s grace), as
    # before 0.2; the next slot comes on the grid.
    first, got = await _blocked_first_tick(silo, clock, "b1", None, 15)
    assert got == [first, first + 10 * S]
    await advance(clock, 10)
    assert slots("b1") == [first, first + 10 * S, first + 20 * S]
    c = await counters(silo, "b1")
    assert (c.delivered, c.skipped()) == (3, 0)


async def test_buffer_one_skips_overlapping_slots_late_past_grace_as_overlap(
    silo: Silo, clock: ManualClock
) -> None:
    # Held 25 s: slots +10 and +20 fell due while it ran: the missed-tick rule
    # (SKIP, the default action) delivers none of them, and they are counted as
    # overlap skips.
    first, got = await _blocked_first_tick(silo, clock, "b2", OverlapPolicy.BUFFER_ONE, 25)
    assert got == [first]
    await advance(clock, 10)
    assert slots("b2") == [first, first + 30 * S]
    c = await counters(silo, "b2")
    assert (c.delivered, c.skipped_overlap, c.skipped_late) == (2, 2, 0)


async def test_skip_drops_a_slot_that_fell_due_while_the_tick_ran(
    silo: Silo, clock: ManualClock
) -> None:
    first, got = await _blocked_first_tick(silo, clock, "s", OverlapPolicy.SKIP, 15)
    assert got == [first]  # +10 s overlapped: skipped although within its grace
    await advance(clock, 10)
    assert slots("s") == [first, first + 20 * S]
    c = await counters(silo, "s")
    assert (c.delivered, c.skipped_overlap) == (2, 1)


async def test_buffer_all_delivers_every_overlapping_slot_in_order(
    silo: Silo, clock: ManualClock
) -> None:
    first, got = await _blocked_first_tick(silo, clock, "ba", OverlapPolicy.BUFFER_ALL, 35)
    # +10, +20, +30 fell due while it ran (the last 5 s ago, the first 25 s:
    # past its grace): each delivered as its own slot, in order, at once.
    assert got == [first + k * 10 * S for k in range(4)]
    statuses = [s for k, _, s, _ in STARTED if k == "ba"]
    assert statuses == sorted(statuses)
    c = await counters(silo, "ba")
    assert (c.delivered, c.skipped()) == (4, 0)


async def test_cancel_other_cancels_the_running_tick_when_the_next_slot_falls_due(
    silo: Silo, clock: ManualClock
) -> None:
    key = "co"
    BLOCK_ALL[key] = asyncio.Event()
    row = await silo.client.get_grain(SlowGrain, key).register(
        "r", {"period": 10 * S, "overlap": OverlapPolicy.CANCEL_OTHER}
    )
    first = row.next_due
    await advance(clock, 10)
    await started(key, 1)
    await advance(clock, 10)  # the next slot falls due: the first run is cut
    await started(key, 2)
    assert [(key, first)] == CANCELLED
    assert slots(key) == [first, first + 10 * S]
    BLOCK_ALL[key].set()
    await wait_for(lambda: FINISHED, 5, interval=0)
    assert [(key, "r", first + 10 * S)] == FINISHED
    c = await counters(silo, key)
    assert (c.delivered, c.skipped_overlap, c.failed) == (1, 1, 0)


async def test_allow_all_runs_ticks_of_one_reminder_side_by_side(
    silo: Silo, clock: ManualClock
) -> None:
    key = "aa"
    BLOCK_ALL[key] = release = asyncio.Event()
    grain = silo.client.get_grain(SideBySideGrain, key)
    row = await grain.register("r", {"period": 10 * S, "overlap": OverlapPolicy.ALLOW_ALL})
    first = row.next_due
    await advance(clock, 10)
    await started(key, 1)
    await advance(clock, 20)
    await started(key, 3)  # +10 and +20 started while the first still ran
    assert slots(key) == [first, first + 10 * S, first + 20 * S]
    assert FINISHED == []
    # The stored schedule stays at the earliest slot still running.
    table = silo.reminder_table
    assert table is not None
    stored = await table.read(row.grain_id, "r")
    assert stored is not None and stored.next_due == first
    release.set()
    await wait_for(lambda: len(FINISHED) == 3, 5, interval=0)
    c = await counters(silo, key, grain=SideBySideGrain)
    assert c.delivered == 3
    stored = await table.read(row.grain_id, "r")
    assert stored is not None and stored.next_due == first + 30 * S


async def test_allow_all_on_a_grain_that_cannot_interleave_is_refused_and_writes_nothing(
    silo: Silo,
) -> None:
    grain = silo.client.get_grain(SlowGrain, "no")
    with pytest.raises(ConfigurationError, match=r"ALLOW_ALL.*not reentrant"):
        await grain.register("r", {"period": 10 * S, "overlap": OverlapPolicy.ALLOW_ALL})
    assert await grain.get_one("r") is None


async def test_allow_all_declared_on_a_class_that_cannot_interleave_stops_the_silo(
    clock: ManualClock,
) -> None:
    @register_reminder("tick", period=10 * S, overlap=OverlapPolicy.ALLOW_ALL)
    class Declared(Grain, Remindable, type_name="test_overlap.Declared"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None: ...

    try:
        options = SiloOptions(grain_types=(Declared,), reminders=REMINDERS)
        silo = Silo.local(options, clock=clock)
        with pytest.raises(ConfigurationError, match=r"@register_reminder\('tick'\) on .*Declared"):
            await silo.start()
        await silo.stop()
    finally:
        # Silos that host every registered class must not meet this one.
        grain_module._registry.pop("test_overlap.Declared", None)


async def test_allow_all_declared_on_a_reentrant_class_starts(clock: ManualClock) -> None:
    @reentrant
    @register_reminder("tick", period=10 * S, overlap=OverlapPolicy.ALLOW_ALL)
    class Fine(Grain, Remindable, type_name="test_overlap.Fine"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None: ...

    try:
        options = SiloOptions(grain_types=(Fine,), reminders=REMINDERS)
        async with Silo.local(options, clock=clock) as silo:
            rows = await silo.client.reminders.list_for_grain(("test_overlap.Fine", ""))
            assert [(r.name, r.overlap) for r in rows] == [("tick", OverlapPolicy.ALLOW_ALL)]
    finally:
        grain_module._registry.pop("test_overlap.Fine", None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"period": 10 * S, "deadline": -1}, "deadline must be between"),
        ({"period": 10 * S, "deadline": 0}, "deadline must be between"),
        ({"period": 10 * S, "deadline": timedelta(days=2)}, "deadline must be between"),
        ({"due": 5 * S, "overlap": OverlapPolicy.SKIP}, "one-shot reminder has one slot"),
        ({"period": 10 * S, "overlap": "skip"}, "overlap must be an OverlapPolicy"),
    ],
)
async def test_bad_overlap_or_deadline_is_a_reminder_error_and_writes_nothing(
    silo: Silo, kwargs: dict[str, Any], match: str
) -> None:
    grain = silo.client.get_grain(SlowGrain, "bad")
    with pytest.raises(ReminderError, match=match):
        await grain.register("r", kwargs)
    assert await grain.get_one("r") is None


# -- deadlines ---------------------------------------------------------------------------


async def test_a_tick_past_its_deadline_is_cancelled_retried_and_dead_lettered(
    silo: Silo, clock: ManualClock
) -> None:
    key = "dl"
    BLOCK_ALL[key] = asyncio.Event()
    row = await silo.client.get_grain(SlowGrain, key).register(
        "r", {"period": 60 * S, "deadline": 2 * S, "retry": RetryPolicy(2, 3 * S)}
    )
    first = row.next_due
    await advance(clock, 60)
    await started(key, 1)
    await advance(clock, 2)  # cut at its deadline
    await wait_for(lambda: len(CANCELLED) == 1, 5, interval=0)
    await advance(clock, 3)  # the retry, after the policy's backoff
    await started(key, 2)
    await advance(clock, 2)
    await wait_for(lambda: len(CANCELLED) == 2, 5, interval=0)
    assert [(s, a) for k, _, s, a in STARTED if k == key] == [(first, 1), (first, 2)]
    c = await counters(silo, key)
    assert (c.failed, c.deadline_exceeded, c.dead_lettered, c.delivered) == (2, 2, 1, 0)
    assert c.last_error is not None and c.last_error.startswith("TickDeadlineError")
    page = await silo.client.reminders.dead_letters((SlowGrain, key))
    [letter] = page.letters
    assert (letter.slot, letter.attempts, letter.error_type) == (first, 2, "TickDeadlineError")
    assert letter.deadline == 2 * S
    assert "TickDeadlineError" in letter.traceback
    stats = silo.reminder_service.stats if silo.reminder_service else None
    assert stats is not None and stats.deadline_exceeded == 2 and stats.dead_lettered == 1


async def test_the_options_default_deadline_applies_to_rows_without_one(clock: ManualClock) -> None:
    options = SiloOptions(
        grain_types=(SlowGrain,),
        reminders=ReminderOptions(
            look_ahead=timedelta(minutes=5), adaptive=False, tick_deadline=timedelta(seconds=4)
        ),
    )
    async with Silo.local(options, clock=clock) as silo:
        BLOCK_ALL["od"] = asyncio.Event()
        await silo.client.get_grain(SlowGrain, "od").register("r", {"period": 60 * S})
        await advance(clock, 60)
        await started("od", 1)
        await advance(clock, 3)
        assert CANCELLED == []
        await advance(clock, 1)
        await wait_for(lambda: CANCELLED, 5, interval=0)
        c = await counters(silo, "od")
        assert (c.deadline_exceeded, c.dead_lettered) == (1, 1)


async def test_simulate_tick_enforces_a_deadline_with_the_manual_clock(
    silo: Silo, clock: ManualClock
) -> None:
    BLOCK_ALL["sim"] = asyncio.Event()
    run = asyncio.ensure_future(
        simulate_tick(silo, SlowGrain, "sim", "r", deadline=timedelta(seconds=5))
    )
    await started("sim", 1)
    await advance(clock, 4)
    assert not run.done()
    await advance(clock, 1)
    with pytest.raises(TickDeadlineError, match="deadline of 5 s"):
        await run
    assert [("sim", slots("sim")[0])] == CANCELLED
