"""The catch-up window (with the grace and the missed-tick action), per-row
counters by skip reason, and the gates that keep 0.2's options off a cluster
whose silos do not all know them: the service on the memory table with a
manual clock, an embedded silo, and the registry and management operations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy import Grain, Remindable, ReminderError, Silo, SiloOptions, TickStatus
from orleanspy.errors import StorageUnavailableError, TickDeadlineError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.membership.agreement import require_feature
from orleanspy.membership.model import (
    INITIAL_VERSION,
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
)
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import read_counters
from orleanspy.reminders._service.counting import Counts
from orleanspy.reminders._service.features import ServiceFeatures
from orleanspy.reminders.counters import DELIVERED
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import MissedReminderAction, OverlapPolicy, ReminderEntry
from orleanspy.reminders.service import ReminderService
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.ring import RingRange
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from orleanspy.versions import FeatureUnavailableError, ProtocolWindow

T0 = datetime(2030, 1, 1, tzinfo=UTC)
S = timedelta(seconds=1)
OPTIONS = ReminderOptions(
    look_ahead=timedelta(minutes=5),
    poll_interval=timedelta(seconds=30),
    base_bucket_size=64,
    permits=4,
    adaptive=False,
    missed_tick_grace=timedelta(seconds=10),
)
FIRE = MissedReminderAction.FIRE_IMMEDIATELY


class Recorder:
    """A fake ``deliver``: keeps every status; raises what ``fail`` holds."""

    def __init__(self) -> None:
        self.statuses: list[TickStatus] = []
        self.fail: BaseException | None = None

    async def __call__(self, entry: ReminderEntry, status: TickStatus, wait: float) -> None:
        self.statuses.append(status)
        if self.fail is not None:
            raise self.fail


def row(key: str, *, registered: datetime, **kw: Any) -> ReminderEntry:
    return new_entry(
        ReminderSpec(**kw),
        service_id="default",
        grain_id=GrainId("G", key),
        name="r",
        now=registered,
        options=OPTIONS,
    )


@asynccontextmanager
async def service_over(
    table: InMemoryReminderTable, clock: ManualClock, recorder: Recorder, level: int = 2
) -> AsyncIterator[ReminderService]:
    async with AsyncExitStack() as stack:
        service = ReminderService(
            table, deliver=recorder, clock=clock, options=OPTIONS, level=lambda: level
        )
        service.set_ranges([RingRange.full()])
        await service.start(stack)
        await service.refill_now()
        yield service


@pytest.fixture
async def table() -> AsyncIterator[InMemoryReminderTable]:
    async with AsyncExitStack() as stack:
        t = InMemoryReminderTable()
        await t.start(stack)
        yield t


async def settle(clock: ManualClock, service: ReminderService) -> None:
    await clock.advance(0)
    await wait_for(
        lambda: service.stats.in_flight == 0 and service.stats.queued == 0, 5, interval=0
    )
    await service.wait_persisted()


# -- the catch-up window -------------------------------------------------------------


async def test_fire_immediately_catches_up_the_latest_slot_and_coalesces_only_the_window(
    table: InMemoryReminderTable,
) -> None:
    # Every 10 s since T0; the service first gets to the row at T0 + 100.5 s,
    # with a catch-up window of 35 s: slots 70..100 lie in it (100 is delivered,
    # 70, 80, 90 coalesced into it), slots 10..60 are outside it.
    clock = ManualClock(T0 + timedelta(seconds=100, milliseconds=500))
    entry = row("w", registered=T0, period=10 * S, action=FIRE, catchup_window=35 * S)
    await table.upsert(entry)
    recorder = Recorder()
    async with service_over(table, clock, recorder) as service:
        await settle(clock, service)
        [status] = recorder.statuses
        assert (status.current_tick_time, status.missed_ticks) == (T0 + 100 * S, 3)
        counters = await read_counters(table, entry.grain_id, "r")
        assert (counters.delivered, counters.skipped_late) == (1, 3)
        assert counters.skipped_catchup_window == 6
        stored = await table.read(entry.grain_id, "r")
        assert stored is not None and stored.next_due == T0 + 110 * S
        assert service.stats.catchup_skipped == 6


async def test_a_latest_slot_older_than_the_window_is_skipped_and_nothing_delivered(
    table: InMemoryReminderTable,
) -> None:
    # Every 60 s; reached at T0 + 150 s: slots 60 and 120 passed, the latest 30 s
    # ago, outside a 20 s window: no catch-up tick.
    clock = ManualClock(T0 + 150 * S)
    entry = row("out", registered=T0, period=60 * S, action=FIRE, catchup_window=20 * S)
    await table.upsert(entry)
    recorder = Recorder()
    async with service_over(table, clock, recorder) as service:
        await settle(clock, service)
        assert recorder.statuses == []
        counters = await read_counters(table, entry.grain_id, "r")
        assert (counters.skipped_catchup_window, counters.delivered) == (2, 0)
        stored = await table.read(entry.grain_id, "r")
        assert stored is not None and stored.next_due == T0 + 180 * S


async def test_without_a_window_fire_immediately_coalesces_every_passed_slot(
    table: InMemoryReminderTable,
) -> None:
    clock = ManualClock(T0 + timedelta(seconds=100, milliseconds=500))
    entry = row("all", registered=T0, period=10 * S, action=FIRE)
    await table.upsert(entry)
    recorder = Recorder()
    async with service_over(table, clock, recorder) as service:
        await settle(clock, service)
        [status] = recorder.statuses
        assert (status.current_tick_time, status.missed_ticks) == (T0 + 100 * S, 9)
        counters = await read_counters(table, entry.grain_id, "r")
        assert (counters.skipped_late, counters.skipped_catchup_window) == (9, 0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"catchup_window": 5 * S}, "shorter than the grace of 0:00:10"),
        ({"catchup_window": 30 * S, "grace": 40 * S}, "shorter than the grace of 0:00:40"),
        ({"catchup_window": 60 * S, "action": MissedReminderAction.SKIP}, "action=SKIP never"),
        ({"catchup_window": 60 * S, "action": MissedReminderAction.NOTIFY}, "action=NOTIFY"),
        ({"catchup_window": -1, "action": FIRE}, "catchup_window must be between"),
    ],
)
def test_a_catchup_window_inconsistent_with_grace_or_action_is_refused(
    kw: dict[str, Any], match: str
) -> None:
    kw = {"action": FIRE, **kw}
    with pytest.raises(ReminderError, match=match):
        row("bad", registered=T0, period=60 * S, **kw)


def test_a_window_as_long_as_the_grace_is_accepted() -> None:
    entry = row("ok", registered=T0, period=60 * S, action=FIRE, catchup_window=10 * S)
    assert entry.catchup_window == 10 * S


# -- counters by reason --------------------------------------------------------------


async def test_late_slots_count_as_late_and_paused_ones_as_paused(
    table: InMemoryReminderTable,
) -> None:
    # Two rows reached at T0 + 45.5 s with slots 10..40 passed under SKIP: one
    # plain (late), one resumed at T0 + 45 s after a pause (paused).
    clock = ManualClock(T0 + timedelta(seconds=45, milliseconds=500))
    late = row("late", registered=T0, period=10 * S)
    paused = replace(row("paused", registered=T0, period=10 * S), resumed_at=T0 + 45 * S)
    for entry in (late, paused):
        await table.upsert(entry)
    recorder = Recorder()
    async with service_over(table, clock, recorder) as service:
        await settle(clock, service)
        assert recorder.statuses == []
        c_late = await read_counters(table, late.grain_id, "r")
        c_paused = await read_counters(table, paused.grain_id, "r")
        assert (c_late.skipped_late, c_late.skipped_paused) == (4, 0)
        assert (c_paused.skipped_paused, c_paused.skipped_late) == (4, 0)


async def test_resume_through_the_management_grain_counts_the_pause_as_paused() -> None:
    class Beat(Grain, Remindable, type_name="test_catchup.Beat"):
        async def receive_reminder(self, name: str, status: TickStatus) -> None: ...

        async def start(self) -> None:
            await self.register_or_update_reminder("r", period=10 * S)

    clock = ManualClock(T0)
    options = SiloOptions(grain_types=(Beat,), reminders=OPTIONS)
    async with Silo.local(options, clock=clock) as silo:
        await silo.client.get_grain(Beat, "k").start()
        await clock.settle()
        await clock.advance(10)  # the first slot is delivered
        await silo.client.reminders.pause((Beat, "k"), "r")
        await clock.advance(35)  # 20, 30, 40 pass while paused
        resumed = await silo.client.reminders.resume((Beat, "k"), "r")
        assert resumed.resumed_at == clock.now()
        await clock.advance(0)
        assert silo.reminder_service is not None

        async def counted() -> bool:
            c = await silo.client.reminders.counters((Beat, "k"), "r")
            return c.skipped_paused == 3

        await wait_for(counted, 5, interval=0.01)
        c = await silo.client.reminders.counters((Beat, "k"), "r")
        assert (c.delivered, c.skipped_late) == (1, 0)


# -- gates ---------------------------------------------------------------------------


def _snapshot(*windows: ProtocolWindow | None) -> MembershipSnapshot:
    entries = {}
    for i, window in enumerate(windows):
        silo = SiloAddress("10.0.0.1", 11111 + i, 1)
        entry = MembershipEntry(
            silo=silo,
            status=SiloStatus.ACTIVE,
            name=f"s{i}",
            start_time=T0,
            i_am_alive=T0,
            release=None if window is None else "0.2.0",
            protocols=window,
        )
        entries[silo] = (entry, str(i))
    return MembershipSnapshot(entries, INITIAL_VERSION)


def test_require_feature_names_the_feature_and_every_silo_that_lacks_it() -> None:
    mixed = _snapshot(ProtocolWindow(1, 2), None)
    with pytest.raises(FeatureUnavailableError) as err:
        require_feature(mixed, "OVERLAP_POLICY", "reminder 'r' of G/k")
    message = str(err.value)
    assert "reminder 'r' of G/k needs the cluster feature OVERLAP_POLICY" in message
    assert "10.0.0.1:11112" in message and "0.1.x" in message
    assert "10.0.0.1:11111" not in message
    assert err.value.lacking and err.value.feature == "OVERLAP_POLICY"
    require_feature(_snapshot(ProtocolWindow(1, 2)), "OVERLAP_POLICY", "x")


class Gated(Grain, Remindable, type_name="test_catchup.Gated"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None: ...

    async def register(self, kwargs: dict[str, Any]) -> ReminderEntry:
        if "action" in kwargs:  # an enum arrives as its int through the codec
            kwargs["action"] = MissedReminderAction(kwargs["action"])
        return await self.register_or_update_reminder("r", **kwargs)

    async def get(self) -> ReminderEntry | None:
        return await self.get_reminder("r")


@pytest.mark.parametrize(
    ("kw", "feature"),
    [
        ({"overlap": OverlapPolicy.SKIP}, "OVERLAP_POLICY"),
        ({"catchup_window": 60 * S, "action": FIRE}, "CATCHUP_WINDOW"),
        ({"deadline": 5 * S}, "TICK_DEADLINE"),
    ],
)
async def test_options_a_mixed_cluster_lacks_are_refused_and_nothing_is_written(
    kw: dict[str, Any], feature: str
) -> None:
    async with Silo.local(SiloOptions(grain_types=(Gated,), reminders=OPTIONS)) as silo:
        mixed = _snapshot(ProtocolWindow(1, 2), None)
        silo.dispatcher.reminders.require = lambda f, what: require_feature(mixed, f, what)
        grain = silo.client.get_grain(Gated, "k")
        with pytest.raises(FeatureUnavailableError, match=feature):
            await grain.register({"period": 60 * S, **kw})
        assert await grain.get() is None
        # Without the new options the registration is 0.1's, and goes through.
        assert (await grain.register({"period": 60 * S})).overlap is None
        # An import of a row that needs the feature is refused as well.
        row_with = row("imp", registered=T0, period=60 * S, **kw)
        with pytest.raises(FeatureUnavailableError, match=feature):
            await silo.client.reminders.import_rows([row_with])
        assert await silo.client.reminders.count_all() == 1


async def test_below_the_feature_level_the_service_behaves_as_0_1(
    table: InMemoryReminderTable,
) -> None:
    # Level 1 (a 0.1 silo is live): no deadline travels, no dead letter and no
    # counter is written, whatever the row asks for.
    clock = ManualClock(T0)
    entry = row("old", registered=T0, period=10 * S, deadline=2 * S)
    await table.upsert(entry)
    recorder = Recorder()
    recorder.fail = TickDeadlineError("cut")
    async with service_over(table, clock, recorder, level=1) as service:
        await clock.advance(10)
        await settle(clock, service)
        [status] = recorder.statuses
        assert status.deadline is None
        assert await table.count_dead_letters() == 0
        assert (await read_counters(table, entry.grain_id, "r")).failed == 0
        assert service.stats.dead_lettered == 1  # counted by the silo, kept nowhere


async def test_at_the_feature_level_the_same_row_sends_its_deadline_and_keeps_its_letter(
    table: InMemoryReminderTable,
) -> None:
    clock = ManualClock(T0)
    entry = row("new", registered=T0, period=10 * S, deadline=2 * S)
    await table.upsert(entry)
    recorder = Recorder()
    recorder.fail = TickDeadlineError("cut")
    async with service_over(table, clock, recorder, level=2) as service:
        await clock.advance(10)
        await settle(clock, service)
        [status] = recorder.statuses
        assert status.deadline == 2 * S
        assert await table.count_dead_letters() == 1
        counters = await read_counters(table, entry.grain_id, "r")
        assert (counters.failed, counters.deadline_exceeded, counters.dead_lettered) == (1, 1, 1)


# -- export and import ---------------------------------------------------------------


def test_export_lines_carry_the_new_options() -> None:
    from orleanspy._cli_reminders import entry_json, export_line, parse_export

    entry = replace(
        row(
            "x",
            registered=T0,
            period=60 * S,
            action=FIRE,
            overlap=OverlapPolicy.BUFFER_ALL,
            catchup_window=timedelta(minutes=5),
            deadline=30 * S,
        ),
        resumed_at=T0 + S,
    )
    [back] = parse_export([export_line(entry)])
    assert back == entry
    doc = entry_json(entry)
    assert (doc["overlap"], doc["catchup_window_seconds"], doc["deadline_seconds"]) == (
        "BUFFER_ALL",
        300.0,
        30.0,
    )


# -- counts on their way to the table ------------------------------------------------


class _FlakyCounts(InMemoryReminderTable):
    """Fails ``add_counts`` while ``failing``."""

    failing = False

    async def add_counts(self, deltas: Any) -> None:
        if self.failing:
            raise StorageUnavailableError("down")
        await super().add_counts(deltas)


async def test_a_batch_writes_its_rows_counts_and_those_of_rows_with_nothing_waiting() -> None:
    table = _FlakyCounts()
    rows = {k: row(k, registered=T0, period=10 * S) for k in "abc"}
    for entry in rows.values():
        await table.upsert(entry)
    counts = Counts(table, ServiceFeatures())
    counts.waiting = lambda key: key == rows["b"].key  # b's update is in a later batch
    for k, entry in rows.items():
        counts.add(entry.key, entry, DELIVERED, n=ord(k) - ord("a") + 1)
    await counts.write([rows["a"].key])
    got = {k: (await read_counters(table, e.grain_id, "r")).delivered for k, e in rows.items()}
    assert got == {"a": 1, "b": 0, "c": 3} and counts.pending == 1
    # A failed write keeps the deltas, merged with those that arrive meanwhile.
    table.failing = True
    counts.add(rows["b"].key, rows["b"], DELIVERED)
    await counts.write()
    assert counts.pending == 1 and counts.failures == 1
    counts.add(rows["b"].key, rows["b"], DELIVERED)
    table.failing = False
    await counts.write()
    assert (await read_counters(table, rows["b"].grain_id, "r")).delivered == 4
    assert counts.pending == 0


def test_dead_letter_lines_round_trip_and_row_only_readers_skip_them() -> None:
    from orleanspy._cli_reminders import export_line, letter_line, parse_export, parse_export_all
    from orleanspy.reminders.letters import DeadLetter

    entry = row("x", registered=T0, period=60 * S)
    letter = DeadLetter(
        id="ab" * 16, grain_id=entry.grain_id, name="r", slot=T0, first_tick_time=T0,
        attempts=3, error_type="KeyError", message="'k'", traceback="Traceback ...",
        at=T0 + S, silo="s", payload={"raw": b"\x00"}, deadline=2 * S,
    )  # fmt: skip
    lines = [export_line(entry), letter_line(letter), ""]
    assert list(parse_export_all(lines)) == [entry, letter]
    assert list(parse_export(lines)) == [entry]
    with pytest.raises(ReminderError, match="line 1 is not a reminder export line"):
        list(parse_export_all(['{"v": 1, "dead_letter": {"i": "x"}}']))
