"""Effectively-once ticks on an embedded silo (memory storage, manual clock): the
occurrence id, ``write(tick=...)``, the check before a tick runs, and what the
reminder service does with a tick that was already committed. Real processes
and stores: tests/cluster/test_effectively_once_faults.py; every provider:
``check_grain_storage``'s tick commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderError,
    Silo,
    SiloOptions,
    TickStatus,
    persistent_state,
)
from orleanspy.grain import definition_of
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import FireOutcome, bind_tick, occurrence_of
from orleanspy.state import STATE_FORMAT_VERSION, TICK_FORMAT_VERSION
from orleanspy.storage.memory import InMemoryGrainStorage
from orleanspy.testing import simulate_tick, wait_for
from orleanspy.testing.clock import ManualClock

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
#: Deliveries that ran receive_reminder: (key, occurrence id, slot).
RAN: list[tuple[str, str, datetime]] = []


@dataclass
class Ledger:
    slots: list[str] = field(default_factory=list)


class LedgerGrain(Grain, Remindable, type_name="test_effectively_once.Ledger"):
    """Appends each tick's slot to its state, committing the tick with it. A tick
    of reminder ``flaky`` fails after its commit with a call-path error, as a
    crash after the write would look to the reminder service."""

    ledger = persistent_state(Ledger)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RAN.append((str(self.grain_key), status.occurrence_id, status.current_tick_time))
        self.ledger.state.slots.append(status.current_tick_time.isoformat())
        await self.ledger.write(tick=status)
        if name == "flaky":
            from orleanspy.errors import SiloUnavailableError

            raise SiloUnavailableError("the silo died after the write (simulated)")

    async def slots(self) -> list[str]:
        return self.ledger.state.slots

    async def plain_write(self) -> None:
        await self.ledger.write()

    async def start(self, name: str) -> None:
        await self.register_or_update_reminder(name, due=S, period=10 * S)

    async def leave(self) -> None:
        self.deactivate_on_idle()


@pytest.fixture
async def silo() -> AsyncIterator[Silo]:
    RAN.clear()
    storage = InMemoryGrainStorage()
    options = SiloOptions(storage={"default": storage})
    async with Silo.local(options, clock=ManualClock(T0)) as silo:
        yield silo


async def _tick(silo: Silo, key: str, slot: datetime, **kw: object) -> TickStatus:
    return await simulate_tick(silo, LedgerGrain, key, "r", slot=slot, first_tick=T0, **kw)


async def _reactivate(silo: Silo, key: str) -> None:
    """Deactivate the grain and wait until it is gone: its next call loads anew."""
    await silo.client.get_grain(LedgerGrain, key).leave()
    gid = GrainId(definition_of(LedgerGrain).type_name, key)
    await wait_for(lambda: gid not in silo.dispatcher.catalog.activations_by_id, 5)


async def test_a_committed_tick_is_not_run_again_warm_or_cold(silo: Silo) -> None:
    grain = silo.client.get_grain(LedgerGrain, "a")
    await _tick(silo, "a", T0)
    await _tick(silo, "a", T0)  # a redelivery to the warm activation
    assert len(RAN) == 1
    await _reactivate(silo, "a")
    await _tick(silo, "a", T0)  # a redelivery to a new activation
    assert len(RAN) == 1
    assert await grain.slots() == [T0.isoformat()]
    # The next slot runs; an older one than the last committed does not.
    await _tick(silo, "a", T0 + 10 * S)
    await _tick(silo, "a", T0 + 5 * S)
    assert [slot for _k, _o, slot in RAN] == [T0, T0 + 10 * S]


async def test_a_plain_write_keeps_the_commits(silo: Silo) -> None:
    await _tick(silo, "b", T0)
    await silo.client.get_grain(LedgerGrain, "b").plain_write()
    await _reactivate(silo, "b")
    await _tick(silo, "b", T0)
    assert len(RAN) == 1


async def test_triggers_and_registrations_are_occurrences_of_their_own(silo: Silo) -> None:
    await _tick(silo, "c", T0)
    await _tick(silo, "c", T0 + S, triggered=True)  # a trigger: its own occurrence
    await _tick(silo, "c", T0 + S, triggered=True)  # the same trigger again
    await _tick(silo, "c", T0 + 2 * S, triggered=True)  # another trigger
    # A new registration (its first tick moved): its first slot runs.
    await simulate_tick(silo, LedgerGrain, "c", "r", slot=T0, first_tick=T0 + S)
    assert [slot for _k, _o, slot in RAN] == [T0, T0 + S, T0 + 2 * S, T0]
    assert len({occ for _k, occ, _s in RAN}) == 4


def test_occurrence_ids_are_stable_per_slot_and_distinct_otherwise() -> None:
    gid = GrainId("T", "k")

    def status(slot: datetime, *, first: datetime = T0, triggered: bool = False) -> TickStatus:
        s = TickStatus(first, 10 * S, None, slot, T0 + 99 * S, triggered=triggered, attempt=3)
        bind_tick(s, "svc", gid, "r")
        return s

    one = status(T0).occurrence_id
    assert len(one) == 32 and int(one, 16) >= 0
    assert status(T0).occurrence_id == one  # another delivery, retry or silo
    assert status(T0 + S).occurrence_id != one
    assert status(T0, triggered=True).occurrence_id != one
    assert status(T0, first=T0 + S).occurrence_id != one
    assert occurrence_of("other", gid, "r", status(T0)) != one
    unbound = TickStatus(T0, 10 * S, None, T0, T0)
    with pytest.raises(ReminderError, match="was not delivered by a silo"):
        _ = unbound.occurrence_id
    assert unbound.reminder is None and status(T0).reminder == "r"


async def test_a_commit_is_one_write_in_the_tick_format(silo: Silo) -> None:
    storage = silo.dispatcher.grain_storage["default"]
    assert isinstance(storage, InMemoryGrainStorage)
    writes = 0
    real = storage.write

    async def counted(*args: object, **kwargs: object) -> str | None:
        nonlocal writes
        writes += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    storage.write = counted  # type: ignore[method-assign]
    await _tick(silo, "d", T0)
    assert writes == 1
    gid = GrainId(definition_of(LedgerGrain).type_name, "d")
    stored = await storage.read(gid, "ledger")
    assert stored is not None and stored.data[0] == TICK_FORMAT_VERSION


async def test_below_the_feature_level_a_commit_is_a_plain_write(silo: Silo) -> None:
    """While a 0.1 silo is live (level 1) the state is written as 0.1 reads it,
    and a redelivery to a new activation runs again: at least once."""
    silo.dispatcher.feature_level = lambda: 1
    await _tick(silo, "e", T0)
    storage = silo.dispatcher.grain_storage["default"]
    gid = GrainId(definition_of(LedgerGrain).type_name, "e")
    stored = await storage.read(gid, "ledger")
    assert stored is not None and stored.data[0] == STATE_FORMAT_VERSION
    await _tick(silo, "e", T0)  # warm: the commit is still known in memory
    assert len(RAN) == 1
    await _reactivate(silo, "e")
    await _tick(silo, "e", T0)
    assert len(RAN) == 2


async def test_the_service_persists_a_deduplicated_tick_and_counts_it() -> None:
    """A tick that committed and then failed on the call path (the silo died after
    the write, as far as the service can tell) is delivered again; the grain's
    state says it is done, so it does not run twice, and the service counts it
    and records it in the history."""
    RAN.clear()
    clock = ManualClock(T0)
    options = SiloOptions(
        reminders=ReminderOptions(
            retry_initial=timedelta(milliseconds=50), minimum_period=S, adaptive=False
        )
    )
    async with Silo.local(options, clock=clock) as silo:
        await silo.client.get_grain(LedgerGrain, "f").start("flaky")
        service = silo.reminder_service
        assert service is not None

        async def deduplicated() -> bool:
            await clock.advance(0.1)  # the first slot, then the retry's backoff
            return service.stats.deduplicated >= 1

        await wait_for(deduplicated, 10)
        assert service.stats.deduplicated == 1
        assert [key for key, _o, _s in RAN] == ["f"]
        gid = GrainId(definition_of(LedgerGrain).type_name, "f")

        async def recorded() -> bool:
            history = await silo.client.reminders.history(gid, "flaky")
            return [r.outcome for r in history] == [FireOutcome.DEDUPLICATED]

        await wait_for(recorded, 10)  # history is appended in batches
        row = await silo.reminder_table.read(gid, "flaky")
        assert row is not None and row.next_due == T0 + 11 * S  # moved on, as if it ran
        assert await silo.client.get_grain(LedgerGrain, "f").slots() == [(T0 + S).isoformat()]
