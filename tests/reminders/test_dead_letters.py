"""Dead letters, replay and discard on an embedded silo with a manual clock: a
tick that fails its last attempt is kept with its slot, occurrence and error;
``replay`` delivers it as that slot again (so a state that committed it dedupes
it) and removes it once that succeeds; ``discard`` removes it; counters count
it. Real Redis and PostgreSQL: tests/reminders/test_dead_letters_stores.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
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
    persistent_state,
)
from orleanspy.options import ReminderOptions
from orleanspy.reminders.letters import DeadLetter
from orleanspy.storage.memory import InMemoryGrainStorage
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
#: (key, slot, occurrence id, attempt) of every run of receive_reminder.
RUNS: list[tuple[str, datetime, str, int]] = []
#: Keys whose ticks raise.
FAILING: set[str] = set()


@dataclass
class Ledger:
    slots: list[str] = field(default_factory=list)


class FlakyGrain(Grain, Remindable, type_name="test_dead_letters.Flaky"):
    """Raises ``ValueError`` while its key is in ``FAILING``."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        key = str(self.grain_key)
        RUNS.append((key, status.current_tick_time, status.occurrence_id, status.attempt))
        if key in FAILING:
            raise ValueError(f"{key} cannot take slot {status.current_tick_time:%H:%M:%S}")

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)


class CommittingGrain(Grain, Remindable, type_name="test_dead_letters.Committing"):
    """Commits the tick with its state, then raises (while failing): its slot is
    a dead letter although the state holds it."""

    ledger = persistent_state(Ledger)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        key = str(self.grain_key)
        RUNS.append((key, status.current_tick_time, status.occurrence_id, status.attempt))
        self.ledger.state.slots.append(status.current_tick_time.isoformat())
        await self.ledger.write(tick=status)
        if key in FAILING:
            raise ValueError("failed after the commit")

    async def register(self, name: str, kwargs: dict[str, Any]) -> ReminderEntry:
        return await self.register_or_update_reminder(name, **kwargs)

    async def slots(self) -> list[str]:
        return self.ledger.state.slots


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    RUNS.clear()
    FAILING.clear()
    yield
    RUNS.clear()
    FAILING.clear()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def silo(clock: ManualClock) -> AsyncIterator[Silo]:
    options = SiloOptions(
        grain_types=(FlakyGrain, CommittingGrain),
        reminders=REMINDERS,
        storage={"default": InMemoryGrainStorage()},
    )
    async with Silo.local(options, clock=clock) as s:
        yield s


async def advance(clock: ManualClock, seconds: float) -> None:
    await clock.settle()
    await clock.advance(seconds)


async def letters_of(silo: Silo, n: int) -> list[DeadLetter]:
    async def enough() -> bool:
        return await silo.client.reminders.count_dead_letters() >= n

    await wait_for(enough, 5, interval=0.01, what=f"{n} dead letters")
    # The letters are written ahead of their batch: let the batch (its counters) land.
    assert silo.reminder_service is not None
    await silo.reminder_service.wait_persisted()
    page = await silo.client.reminders.dead_letters(limit=100)
    return list(page.letters)


async def test_a_failed_tick_becomes_a_dead_letter_with_its_slot_occurrence_and_error(
    silo: Silo, clock: ManualClock
) -> None:
    FAILING.add("k")
    row = await silo.client.get_grain(FlakyGrain, "k").register("r", {"period": 60 * S})
    await advance(clock, 60)
    [letter] = await letters_of(silo, 1)
    [(_, _slot, occurrence, _attempt)] = RUNS
    assert (letter.grain_id, letter.name, letter.slot) == (row.grain_id, "r", row.next_due)
    assert letter.id == letter.occurrence_id == occurrence
    assert (letter.attempts, letter.error_type) == (1, "ValueError")
    assert letter.message.startswith("k cannot take slot")
    assert "receive_reminder" in letter.traceback and "ValueError" in letter.traceback
    assert letter.first_tick_time == row.start_at and letter.period == 60 * S
    assert letter.at == row.next_due  # the silo clock when it failed: at its slot
    assert letter.silo == silo.name
    assert await silo.client.reminders.dead_letter(letter.id) == letter
    # The schedule moved on: the next slot is delivered (and fails: a second letter).
    await advance(clock, 60)
    assert len(await letters_of(silo, 2)) == 2
    counters = await silo.client.reminders.counters((FlakyGrain, "k"), "r")
    assert (counters.failed, counters.dead_lettered, counters.delivered) == (2, 2, 0)
    assert counters.last_error is not None and counters.last_error.startswith("ValueError: k")


async def test_only_the_last_attempt_of_a_retry_policy_is_dead_lettered(
    silo: Silo, clock: ManualClock
) -> None:
    FAILING.add("rp")
    await silo.client.get_grain(FlakyGrain, "rp").register(
        "r", {"period": 60 * S, "retry": RetryPolicy(3, 2 * S)}
    )
    await advance(clock, 60)
    await advance(clock, 2)
    await advance(clock, 2)
    [letter] = await letters_of(silo, 1)
    assert [a for _, _, _, a in RUNS] == [1, 2, 3]
    assert letter.attempts == 3
    assert len({o for _, _, o, _ in RUNS}) == 1, "retries of one slot share its occurrence id"


async def test_replay_delivers_the_slot_again_with_its_occurrence_id_and_removes_it(
    silo: Silo, clock: ManualClock
) -> None:
    FAILING.add("rep")
    await silo.client.get_grain(FlakyGrain, "rep").register("r", {"period": 600 * S})
    await advance(clock, 600)
    [letter] = await letters_of(silo, 1)
    FAILING.discard("rep")
    status = await silo.client.reminders.replay(letter.id)
    assert RUNS[-1] == ("rep", letter.slot, letter.id, 2)
    assert (status.current_tick_time, status.attempt) == (letter.slot, 2)
    assert await silo.client.reminders.count_dead_letters() == 0
    with pytest.raises(ReminderError, match="no dead letter"):
        await silo.client.reminders.replay(letter.id)


async def test_a_replay_that_fails_again_keeps_the_letter_with_the_new_failure(
    silo: Silo, clock: ManualClock
) -> None:
    FAILING.add("again")
    await silo.client.get_grain(FlakyGrain, "again").register("r", {"period": 600 * S})
    await advance(clock, 600)
    [letter] = await letters_of(silo, 1)
    await advance(clock, 30)
    with pytest.raises(ValueError, match="cannot take slot"):
        await silo.client.reminders.replay(letter.id)
    kept = await silo.client.reminders.dead_letter(letter.id)
    assert (kept.attempts, kept.at, kept.slot) == (2, clock.now(), letter.slot)
    assert await silo.client.reminders.count_dead_letters() == 1


async def test_replay_of_a_slot_the_state_committed_is_deduplicated(
    silo: Silo, clock: ManualClock
) -> None:
    # The grain committed the tick with its state, then raised: the slot is a
    # dead letter, but a replay must not run it again (same occurrence id).
    FAILING.add("c")
    grain = silo.client.get_grain(CommittingGrain, "c")
    await grain.register("r", {"period": 600 * S})
    await advance(clock, 600)
    [letter] = await letters_of(silo, 1)
    runs = len(RUNS)
    await silo.client.reminders.replay(letter.id)
    assert len(RUNS) == runs, "a committed occurrence ran again"
    assert len(await grain.slots()) == 1
    assert await silo.client.reminders.count_dead_letters() == 0


async def test_discard_removes_a_letter_and_unknown_ids_are_refused(
    silo: Silo, clock: ManualClock
) -> None:
    FAILING.add("d")
    await silo.client.get_grain(FlakyGrain, "d").register("r", {"period": 60 * S})
    await advance(clock, 60)
    [letter] = await letters_of(silo, 1)
    for call in (
        silo.client.reminders.discard,
        silo.client.reminders.replay,
        silo.client.reminders.dead_letter,
    ):
        with pytest.raises(ReminderError, match=r"no dead letter 'f+'"):
            await call("f" * 32)
    assert await silo.client.reminders.count_dead_letters() == 1, "a refused call changed it"
    assert (await silo.client.reminders.discard(letter.id)).id == letter.id
    assert await silo.client.reminders.count_dead_letters() == 0
    assert [r for r in RUNS if r[0] == "d"] == RUNS[:1], "discard delivered the tick"


async def test_dead_letters_page_newest_first_and_filter_by_grain_and_name(
    silo: Silo, clock: ManualClock
) -> None:
    for key in ("p1", "p2"):
        FAILING.add(key)
        grain = silo.client.get_grain(FlakyGrain, key)
        await grain.register("a", {"period": 60 * S})
        await grain.register("b", {"period": 60 * S, "due": 90 * S})
    await advance(clock, 60)
    await advance(clock, 30)
    every = await letters_of(silo, 4)
    assert [d.at for d in every] == sorted((d.at for d in every), reverse=True)
    seen, cursor = [], None
    while True:
        page = await silo.client.reminders.dead_letters(limit=1, cursor=cursor)
        seen += page.letters
        cursor = page.cursor
        if cursor is None:
            break
    assert [d.id for d in seen] == [d.id for d in every]
    only = await silo.client.reminders.dead_letters((FlakyGrain, "p1"), "b")
    assert [(d.grain_id.key, d.name) for d in only.letters] == [("p1", "b")]
    with pytest.raises(ReminderError, match="a page holds"):
        await silo.client.reminders.dead_letters(limit=0)
    with pytest.raises(ReminderError, match="not a dead letter cursor"):
        await silo.client.reminders.dead_letters(cursor="nope")


async def test_dead_letters_are_bounded_by_count_and_retention(clock: ManualClock) -> None:
    options = SiloOptions(
        grain_types=(FlakyGrain,),
        reminders=ReminderOptions(
            look_ahead=timedelta(minutes=5),
            adaptive=False,
            max_dead_letters=3,
            dead_letter_retention=timedelta(minutes=10),
        ),
    )
    async with Silo.local(options, clock=clock) as silo:
        FAILING.add("b")
        await silo.client.get_grain(FlakyGrain, "b").register("r", {"period": 60 * S})
        for _ in range(5):
            await advance(clock, 60)
        await wait_for(lambda: len(RUNS) == 5, 5, interval=0)
        assert silo.reminder_service is not None
        await silo.reminder_service.wait_persisted()
        page = await silo.client.reminders.dead_letters()
        assert [d.slot for d in page.letters] == sorted({r[1] for r in RUNS}, reverse=True)[:3]
        await advance(clock, 60 * 10)  # every letter older than the retention
        await wait_for(lambda: len(RUNS) == 15, 5, interval=0)
        await silo.reminder_service.wait_persisted()
        page = await silo.client.reminders.dead_letters()
        assert all(clock.now() - d.at <= timedelta(minutes=10) for d in page.letters)
        assert len(page.letters) == 3
