"""Management operations written once (``remindable.operations``), through the
management grain of an embedded silo: etag-guarded writes, every form of naming
a grain, paging and orphans, export/import, and declared rows that keep an
operator's changes until the code changes."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

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
from orleanspy._cli_output import status_text as _status_text
from orleanspy._cli_reminders import entry_json, export_line, parse_export
from orleanspy.cluster_status import cluster_from, published_types
from orleanspy.grain import DeclaredReminder
from orleanspy.identity import GrainId
from orleanspy.membership.model import MembershipSnapshot, TableVersion
from orleanspy.options import ReminderOptions
from orleanspy.remindable.declarations import fingerprint
from orleanspy.remindable.operations import ReminderOperations, grain_target, parse_grain_id
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry, RetryPolicy
from orleanspy.reminders.spec import ReminderSpec, new_entry
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
        ReminderSpec(period=timedelta(hours=1)),
        service_id="default",
        grain_id=grain,
        name=name,
        now=clock.now(),
        options=REMINDERS,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(autouse=True)
def _forget_declared_classes() -> Iterator[None]:
    """The declared classes these tests make stay out of the registry afterwards: an
    embedded silo of a later test hosts every registered class, and would register
    (and tick) their declarations."""
    yield
    grain_module._registry.pop(TYPE, None)


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
    await registry.register(gid, "r", ReminderSpec(period=3600))
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


def test_the_fingerprint_follows_every_field_a_declaration_sets() -> None:
    base = DeclaredReminder("beat", due=S, period=60 * S, cron=None, tz=None, priority=0,
                            action=MissedReminderAction.SKIP)  # fmt: skip
    at = datetime(2031, 1, 1, tzinfo=UTC)
    variants = [
        dataclasses.replace(base, jitter=5 * S),
        dataclasses.replace(base, starts_at=at),
        dataclasses.replace(base, ends_at=at),
        dataclasses.replace(base, grace=9 * S),
        dataclasses.replace(base, payload={"order": 1}),
        dataclasses.replace(base, payload={"order": 2}),
        dataclasses.replace(base, retry=RetryPolicy(3, S)),
        dataclasses.replace(base, retry=RetryPolicy(4, S)),
    ]
    prints = {fingerprint(d) for d in [base, *variants]}
    assert len(prints) == len(variants) + 1, "a declared field left the fingerprint unchanged"
    # A declaration that sets none of the new fields keeps the fingerprint it had
    # before they existed (rows written then are not re-applied on upgrade).
    assert fingerprint(base).count(":") == 3


async def test_a_changed_payload_or_retry_re_applies_without_moving_the_row(
    clock: ManualClock,
) -> None:
    table = InMemoryReminderTable("default")
    gid = GrainId(TYPE, "")

    def declared(payload: object, retry: RetryPolicy | None) -> type[Grain]:
        grain_module._registry.pop(TYPE, None)

        @register_reminder("beat", due=5, period=60, payload=payload, retry=retry)
        class Declared(Grain, Remindable, type_name=TYPE):
            async def receive_reminder(self, name: str, status: TickStatus) -> None:
                pass

        return Declared

    async def boot(cls: type[Grain]) -> ReminderEntry:
        options = SiloOptions(grain_types=(cls,), reminders=REMINDERS)
        async with Silo.local(options, clock=clock, reminder_table=table):
            pass
        row = await table.read(gid, "beat")
        assert row is not None
        return row

    first = await boot(declared({"v": 1}, None))
    await clock.advance(10 * S)
    same = await boot(declared({"v": 1}, None))
    assert same.etag == first.etag, "an unchanged declaration rewrote its row"
    changed = await boot(declared({"v": 2}, RetryPolicy(3, S)))
    assert (changed.payload, changed.retry) == ({"v": 2}, RetryPolicy(3, S))
    assert changed.next_due == first.next_due, "a payload change re-anchored the row"
    assert changed.fingerprint != first.fingerprint


async def test_a_declaration_past_its_end_keeps_its_row(clock: ManualClock) -> None:
    table = InMemoryReminderTable("default")
    gid = GrainId(TYPE, "")
    ends = clock.now() + 3600 * S

    def declared() -> type[Grain]:
        grain_module._registry.pop(TYPE, None)

        @register_reminder("beat", due=5, period=60, ends_at=ends)
        class Declared(Grain, Remindable, type_name=TYPE):
            async def receive_reminder(self, name: str, status: TickStatus) -> None:
                pass

        return Declared

    options = SiloOptions(grain_types=(declared(),), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table):
        pass
    assert await table.read(gid, "beat") is not None
    await clock.advance(7200 * S)
    # The row is still in the table (no silo ran its last tick): a start-up
    # past ends_at neither creates nor removes it.
    options = SiloOptions(grain_types=(declared(),), reminders=REMINDERS)
    async with Silo.local(options, clock=clock, reminder_table=table):
        pass
    assert await table.read(gid, "beat") is not None, (
        "a start-up removed the row of a declaration that ended"
    )


async def test_import_accepts_one_shot_rows_and_schedule_fields(clock: ManualClock) -> None:
    at = clock.now() + 3600 * S
    rows = [
        new_entry(
            ReminderSpec(at=at, payload=["x", 1]),
            service_id="default",
            grain_id=GrainId("T", "once"),
            name="r",
            now=clock.now(),
            options=REMINDERS,
        ),
        new_entry(
            ReminderSpec(
                period=60 * S,
                jitter=5 * S,
                starts_at=clock.now(),
                ends_at=at + 86400 * S,
                max_ticks=20,
                retry=RetryPolicy(3, S),
                grace=30 * S,
            ),
            service_id="default",
            grain_id=GrainId("T", "shaped"),
            name="r",
            now=clock.now(),
            options=REMINDERS,
        ),
    ]
    lines = [export_line(r) for r in rows]
    target = InMemoryReminderTable("default")
    ops = ReminderOperations(target, service_id="default", clock=clock, options=REMINDERS)
    done = await ops.import_rows(parse_export(lines))
    assert done.created == 2
    for row in rows:
        got = await target.read(row.grain_id, row.name)
        assert got is not None and dataclasses.replace(got, etag=None) == row
    bad = dataclasses.replace(rows[1], name="bad", jitter=120 * S)  # longer than the period
    with pytest.raises(ReminderError, match="jitter"):
        await ops.import_rows([bad])


class _Records:
    """A status store holding fixed records (``StatusStore.read``)."""

    def __init__(self, records: dict[str, dict[str, object]]) -> None:
        self.records = records

    async def read(self) -> dict[str, dict[str, object]]:
        return self.records


async def test_status_records_carry_hosted_types_and_the_newest_orphan_count() -> None:
    store = _Records(
        {
            "a": {"grain_types": ["A", "B"], "orphaned_rows": 7, "updated_ms": 1},
            "b": {"grain_types": ["C", 5], "orphaned_rows": 2, "updated_ms": 2},
            "c": {"grain_types": "not a list"},
        }
    )
    assert await published_types(store) == {"A", "B", "C"}  # type: ignore[arg-type]
    snap = MembershipSnapshot({}, TableVersion(1, "1"))
    status = cluster_from(snap, store.records, cluster_id="dev", service_id="default")
    assert status.orphaned_rows == 2, "not the newest record's count"
    assert status.to_json()["orphaned_reminder_rows"] == 2
    assert "orphaned reminder rows: 2" in _status_text(status)
    quiet = cluster_from(snap, {}, cluster_id="dev", service_id="default")
    assert quiet.orphaned_rows is None and "orphaned" not in _status_text(quiet)
