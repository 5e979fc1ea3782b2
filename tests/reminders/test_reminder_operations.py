"""Management operations written once (``remindable.operations``), through the
management grain of an embedded silo: etag-guarded writes, every form of naming
a grain, paging and orphans, export/import, and declared rows that keep an
operator's changes until the code changes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderError,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy._cli_reminders import entry_json, export_line, parse_export
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import ReminderOperations, grain_target, parse_grain_id
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.spec import new_entry
from orleanspy.testing.clock import ManualClock

S = timedelta(seconds=1)
REMINDERS = ReminderOptions(adaptive=False)
TYPE = "test_reminder_operations.Declared"


class OpsGrain(Grain, Remindable, type_name="test_reminder_operations.Ops"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass


def _declared_class(priority: int = 0, period: int = 60) -> type[Grain]:
    grain_module._registry.pop(TYPE, None)

    @register_reminder("beat", due=5, period=period, priority=priority)
    class Declared(Grain, Remindable, type_name=TYPE):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    return Declared


def _row(clock: ManualClock, grain: GrainId, name: str = "r") -> ReminderEntry:
    return new_entry(
        service_id="default",
        grain_id=grain,
        name=name,
        now=clock.now(),
        options=REMINDERS,
        period=timedelta(hours=1),
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def silo(clock: ManualClock) -> AsyncIterator[Silo]:
    options = SiloOptions(grain_types=(OpsGrain,), reminders=REMINDERS)
    async with Silo.local(options, clock=clock) as s:
        yield s


def test_grain_target_reads_every_form() -> None:
    gid = GrainId("test_reminder_operations.Ops", "k")
    assert grain_target(gid) == gid
    assert grain_target("test_reminder_operations.Ops/k") == gid
    assert grain_target("test_reminder_operations.Ops/s:k") == gid
    assert grain_target((OpsGrain, "k")) == gid
    assert grain_target(["test_reminder_operations.Ops", "k"]) == gid
    assert grain_target(OpsGrain, "k") == gid
    assert grain_target("T/i:42") == GrainId("T", 42)
    # ``reminders list`` prints the empty key as ``Type/``: that form reads back.
    assert parse_grain_id("ReportGrain/") == GrainId("ReportGrain", "")
    assert parse_grain_id(str(GrainId("ReportGrain", ""))) == GrainId("ReportGrain", "")
    for bad in ("no-slash", "/k", 3.5, (OpsGrain, 1.5)):
        with pytest.raises(ReminderError):
            grain_target(bad)


async def test_management_grain_takes_a_proxy_a_class_and_key_and_text(
    silo: Silo, clock: ManualClock
) -> None:
    gid = GrainId("test_reminder_operations.Ops", "a")
    proxy = silo.client.get_grain(OpsGrain, "a")
    mgmt = silo.client.reminders
    registry = silo._dispatcher.reminders  # type: ignore[union-attr]
    await registry.register(gid, "r", period=3600)
    by_id = await mgmt.get(gid, "r")
    assert await mgmt.get(proxy, "r") == by_id
    assert await mgmt.get((OpsGrain, "a"), "r") == by_id
    assert await mgmt.get("test_reminder_operations.Ops/a", "r") == by_id
    changed = await mgmt.set_priority((OpsGrain, "a"), "r", 100)
    assert changed.priority == 100 and changed.etag != by_id.etag
    assert (await mgmt.set_action(proxy, "r", MissedReminderAction.NOTIFY)).action == (
        MissedReminderAction.NOTIFY
    )
    with pytest.raises(ReminderError, match="no reminder"):
        await mgmt.get(proxy, "nope")


async def test_writes_are_guarded_by_the_etag_and_reapplied_after_a_lost_race(
    clock: ManualClock,
) -> None:
    table = InMemoryReminderTable("default")
    ops = ReminderOperations(table, service_id="default", clock=clock, options=REMINDERS)
    gid = GrainId("T", "k")
    await table.upsert(_row(clock, gid))
    real = table.upsert_if
    raced: list[str | None] = []

    async def racing(entry: ReminderEntry, etag: str | None) -> str | None:
        # A tick moves the row between the operation's read and its write.
        if not raced:
            row = await table.read(gid, "r")
            assert row is not None and row.etag is not None
            moved = await table.update_schedule(
                gid, "r", row.etag, row.next_due + timedelta(hours=1), row.next_due
            )
            raced.append(moved)
        return await real(entry, etag)

    table.upsert_if = racing  # type: ignore[method-assign]
    result = await ops.set_priority(gid, "r", 7)
    stored = await table.read(gid, "r")
    assert raced and raced[0] is not None
    # The tick's move stands (not undone by a stale copy), and so does the change.
    assert stored == result and stored.priority == 7
    assert stored.last_fire is not None, "the write undid the tick's schedule CAS"


async def test_paging_filters_and_orphans(clock: ManualClock) -> None:
    table = InMemoryReminderTable("default")

    async def hosted() -> list[str]:
        return ["Live"]

    ops = ReminderOperations(
        table, service_id="default", clock=clock, options=REMINDERS, hosted_types=hosted
    )
    for i in range(30):
        await table.upsert(_row(clock, GrainId("Live", f"k{i}")))
    for i in range(12):
        await table.upsert(_row(clock, GrainId("Gone", f"tenant-{i % 3}-{i}")))
    assert await ops.count(type_name="Gone") == 12
    assert await ops.count(type_name="Gone", key_prefix="tenant-1-") == 4
    assert await ops.orphans() == {"Gone": 12}
    page = await ops.page(None, 50)
    assert len(page.rows) == 42 and page.cursor is None
    flagged = {r.grain_id.type_name for r in page.rows if page.is_orphaned(r)}
    assert flagged == {"Gone"} and len(page.orphaned) == 12
    assert await ops.delete_where(type_name="Gone", key_prefix="tenant-1-", dry_run=True) == 4
    assert await table.count() == 42, "a dry run removed rows"
    assert await ops.delete_where(type_name="Gone", key_prefix="tenant-1-") == 4
    assert await ops.count(type_name="Gone") == 8
    assert await ops.delete_where(type_name="Gone") == 8
    assert await ops.orphans() == {} and await table.count() == 30


async def test_export_then_import_keeps_schedules_and_never_overwrites(
    clock: ManualClock,
) -> None:
    source = InMemoryReminderTable("default")
    gid = GrainId("T", "k")
    await source.upsert(_row(clock, gid))
    row = await source.read(gid, "r")
    assert row is not None and row.etag is not None
    await source.update_schedule(gid, "r", row.etag, row.next_due + S * 3600, row.next_due)
    await source.upsert(_row(clock, GrainId("T", "p")))
    lines = [export_line(r) for r in (await source.read_page(None, 10))[0]]
    target = InMemoryReminderTable("other")
    ops = ReminderOperations(target, service_id="other", clock=clock, options=REMINDERS)
    dry = await ops.import_rows(parse_export(lines), dry_run=True)
    assert (dry.created, await target.count()) == (2, 0)
    done = await ops.import_rows(parse_export(lines))
    assert done.created == 2
    moved = await target.read(gid, "r")
    original = await source.read(gid, "r")
    assert moved is not None and original is not None
    assert (moved.next_due, moved.last_fire, moved.start_at, moved.period) == (
        original.next_due,
        original.last_fire,
        original.start_at,
        original.period,
    )
    assert moved.service_id == "other"
    again = await ops.import_rows(parse_export(lines))
    assert (again.created, again.exist) == (0, 2), "an import overwrote live rows"
    with pytest.raises(ReminderError, match="line 2"):
        list(parse_export([lines[0], "{not json"]))


async def test_operator_changes_to_declared_rows_survive_restarts_until_the_code_changes(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    table = InMemoryReminderTable("default")
    gid = GrainId(TYPE, "")

    def options(cls: type[Grain]) -> SiloOptions:
        return SiloOptions(grain_types=(cls,), reminders=REMINDERS)

    cls = _declared_class()
    async with Silo.local(options(cls), clock=clock, reminder_table=table) as silo:
        mgmt = silo.client.reminders
        first = await mgmt.get(gid, "beat")
        assert first.declared and first.fingerprint is not None
        assert entry_json(first)["declared"] is True
        await mgmt.set_priority(gid, "beat", ReminderPriority.CRITICAL)
        await mgmt.set_grace(gid, "beat", 30)
        await mgmt.pause(gid, "beat")
    await clock.advance(10 * S)
    async with Silo.local(options(_declared_class()), clock=clock, reminder_table=table):
        pass
    kept = await table.read(gid, "beat")
    assert kept is not None
    assert kept.priority == ReminderPriority.CRITICAL and kept.paused, "a restart undid it"
    assert kept.grace == 30 * S, "a restart undid set-grace"

    # The code changes the period only: re-anchored, the operator's priority stays.
    await clock.advance(10 * S)
    with caplog.at_level(logging.WARNING):
        async with Silo.local(
            options(_declared_class(period=120)), clock=clock, reminder_table=table
        ):
            pass
    rescheduled = await table.read(gid, "beat")
    assert rescheduled is not None and rescheduled.period == 120 * S
    assert rescheduled.priority == ReminderPriority.CRITICAL and rescheduled.paused
    assert not [r for r in caplog.records if "overrode" in r.getMessage()]

    # The code changes the priority: the code wins, with a warning naming it.
    with caplog.at_level(logging.WARNING):
        async with Silo.local(
            options(_declared_class(priority=5, period=120)), clock=clock, reminder_table=table
        ):
            pass
    final = await table.read(gid, "beat")
    assert final is not None and final.priority == 5
    warnings = [r.getMessage() for r in caplog.records if "overrode" in r.getMessage()]
    assert len(warnings) == 1 and "priority 100 -> 5" in warnings[0]
    grain_module._registry.pop(TYPE, None)
