"""The operator audit log: every management action goes through the auditor and is
recorded with its principal, the row before and after, and its outcome; below the
feature level actions run unaudited; bad input records nothing; the kit fails a
table that breaks the contract."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from orleanspy import Grain, Remindable, ReminderError, Silo, SiloOptions, TickStatus
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.operations import ReminderOperations
from orleanspy.reminders.audit import (
    AuditedReminderTable,
    AuditOutcome,
    AuditQuery,
    AuditRecord,
    AuditRetention,
    acting_as,
)
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import MissedReminderAction, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.reminders.table import ReminderTable
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.reminder_table import (
    check_audit_settle_and_retention,
    check_audited_writes_commit_with_their_record,
)

REMINDERS = ReminderOptions(adaptive=False)
G = GrainId("test_audit_log.Audited", "k")


class AuditedGrain(Grain, Remindable, type_name="test_audit_log.Audited"):
    ticks: list[str] = []

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        if name == "boom":
            raise ValueError("the grain refused the tick")
        AuditedGrain.ticks.append(name)


def _row(clock: ManualClock, name: str = "r") -> ReminderEntry:
    return new_entry(
        ReminderSpec(period=timedelta(hours=1)),
        service_id="default",
        grain_id=G,
        name=name,
        now=clock.now(),
        options=REMINDERS,
    )


async def _ops(level: int = 2) -> tuple[ReminderOperations, InMemoryReminderTable, ManualClock]:
    clock = ManualClock()
    table = InMemoryReminderTable("default")
    await table.start(AsyncExitStack())
    ops = ReminderOperations(
        table,
        service_id="default",
        clock=clock,
        options=REMINDERS,
        level=lambda: level,
        via="silo-x",
    )
    return ops, table, clock


async def _log(table: AuditedReminderTable, **query: Any) -> list[AuditRecord]:
    return await table.read_audit(AuditQuery(limit=1000, **query))


# -- every action goes through the auditor ---------------------------------------------


async def test_a_pause_is_recorded_with_principal_before_after_and_outcome() -> None:
    ops, table, clock = await _ops()
    await table.upsert(_row(clock))
    with acting_as("tls:CN=ops,O=acme"):
        paused = await ops.pause(G, "r")
    (rec,) = await _log(table)
    assert (rec.principal, rec.action, rec.outcome, rec.via) == (
        "tls:CN=ops,O=acme", "pause", AuditOutcome.OK, "silo-x",
    )  # fmt: skip
    assert (rec.grain_id, rec.name, rec.at) == (G, "r", clock.now())
    assert rec.before is not None and not rec.before.paused
    assert rec.after is not None and rec.after.paused
    assert paused.paused and (await table.read(G, "r")) == paused


async def test_without_a_principal_an_action_is_local_and_a_no_op_is_unchanged() -> None:
    ops, table, clock = await _ops()
    await table.upsert(_row(clock))
    await ops.set_priority(G, "r", 0)  # already 0
    await clock.advance(timedelta(seconds=1))
    await ops.set_action(G, "r", MissedReminderAction.NOTIFY)
    newest, first = await _log(table)
    assert (first.action, first.outcome, first.principal) == (
        "set_priority", AuditOutcome.UNCHANGED, "local",
    )  # fmt: skip
    assert json.loads(first.detail or "") == {"priority": 0}
    assert (newest.action, newest.outcome) == ("set_action", AuditOutcome.OK)
    assert newest.after is not None and newest.after.action is MissedReminderAction.NOTIFY


async def test_delete_of_a_missing_row_is_recorded_absent_and_bad_input_records_nothing() -> None:
    ops, table, clock = await _ops()
    await table.upsert(_row(clock))
    assert not await ops.delete(G, "nope")
    with pytest.raises(ReminderError):
        await ops.set_priority(G, "r", 1000)  # out of range: refused before any write
    with pytest.raises(ReminderError):
        await ops.pause(G, "missing")
    (rec,) = await _log(table)
    assert (rec.action, rec.outcome, rec.name) == ("delete", AuditOutcome.ABSENT, "nope")
    assert (await table.read(G, "r")) is not None


async def test_delete_where_records_each_row_under_the_batch_record() -> None:
    ops, table, clock = await _ops()
    for name in ("a", "b", "c"):
        await table.upsert(_row(clock, name))
    with acting_as("cluster-secret"):
        assert await ops.delete_where(G.type_name, dry_run=True) == 3
        assert await _log(table) == []  # a dry run changes nothing and records nothing
        assert await ops.delete_where(G.type_name) == 3
    records = await _log(table)
    batch = [r for r in records if r.grain_id is None]
    rows = [r for r in records if r.grain_id is not None]
    assert len(batch) == 1 and len(rows) == 3
    (summary,) = batch
    assert (summary.action, summary.outcome, summary.principal) == (
        "delete_where", AuditOutcome.OK, "cluster-secret",
    )  # fmt: skip
    assert json.loads(summary.detail or "") == {
        "type": G.type_name, "key_prefix": None, "removed": 3,
    }  # fmt: skip
    assert {r.name for r in rows} == {"a", "b", "c"}
    assert all(r.batch == summary.id and r.after is None and r.before for r in rows)


async def test_import_records_created_and_replaced_rows_and_the_counts() -> None:
    ops, table, clock = await _ops()
    await table.upsert(_row(clock, "old"))
    given = [_row(clock, "new"), replace_priority(_row(clock, "old"), 9)]
    result = await ops.import_rows(given, replace_existing=True)
    assert (result.created, result.replaced) == (1, 1)
    records = await _log(table)
    (summary,) = [r for r in records if r.grain_id is None]
    assert json.loads(summary.detail or "")["created"] == 1
    by_name = {r.name: r for r in records if r.grain_id is not None}
    assert by_name["new"].before is None and by_name["new"].after is not None
    assert by_name["old"].before is not None and by_name["old"].before.priority == 0
    assert by_name["old"].after is not None and by_name["old"].after.priority == 9


def replace_priority(row: ReminderEntry, priority: int) -> ReminderEntry:
    from dataclasses import replace

    return replace(row, priority=priority)


async def test_below_the_feature_level_actions_run_unaudited_as_in_0_1() -> None:
    ops, table, clock = await _ops(level=1)
    await table.upsert(_row(clock))
    assert (await ops.pause(G, "r")).paused
    assert await ops.delete(G, "r")
    assert await _log(table) == []


async def test_reads_see_no_record_past_the_retention() -> None:
    ops, table, clock = await _ops()
    await table.upsert(_row(clock))
    await ops.pause(G, "r")
    assert len(await ops.audit_log(AuditQuery())) == 1
    await clock.advance(REMINDERS.audit_retention + timedelta(seconds=1))
    assert await ops.audit_log(AuditQuery()) == []


# -- through the management grain of a silo ---------------------------------------------


async def test_trigger_is_recorded_pending_first_then_its_outcome() -> None:
    AuditedGrain.ticks.clear()
    async with Silo.local(SiloOptions(reminders=REMINDERS)) as silo:
        mgmt = silo.client.reminders
        ref = silo.client.get_grain(AuditedGrain, "k")
        table = silo.reminder_table
        assert isinstance(table, AuditedReminderTable)
        assert isinstance(table, ReminderTable)
        for name in ("ok", "boom"):
            await table.upsert(new_entry(
                ReminderSpec(period=timedelta(hours=1)), service_id="default",
                grain_id=ref.grain_id, name=name, now=silo.clock.now(), options=REMINDERS,
            ))  # fmt: skip
        with acting_as("dashboard:alice"):
            await mgmt.trigger(ref, "ok")
            with pytest.raises(ValueError, match="refused the tick"):
                await mgmt.trigger(ref, "boom")
        failed, done = await mgmt.audit(AuditQuery(action="trigger"))
        assert AuditedGrain.ticks == ["ok"]
        assert (done.name, done.outcome, done.principal) == ("ok", "ok", "dashboard:alice")
        assert (failed.name, failed.outcome) == ("boom", "failed")
        assert "ValueError: the grain refused the tick" in (failed.detail or "")


# -- the kit fails a table that breaks the contract --------------------------------------


class _RecordsLostRaces(InMemoryReminderTable):
    """Breaks the contract: the record is appended even when the write lost."""

    async def upsert_if_audited(
        self, entry: ReminderEntry, expected_etag: str | None, record: AuditRecord,
        retention: AuditRetention,
    ) -> str | None:  # fmt: skip
        await self.append_audit(record, retention)
        return await self.upsert_if(entry, expected_etag)


class _ForgetsRecords(InMemoryReminderTable):
    """Breaks the contract: the row is removed without its record."""

    async def remove_audited(
        self, grain_id: GrainId, name: str, etag: str, record: AuditRecord,
        retention: AuditRetention,
    ) -> bool:  # fmt: skip
        return await self.remove(grain_id, name, etag)


class _NeverTrims(InMemoryReminderTable):
    """Breaks the contract: retention is ignored."""

    async def append_audit(self, record: AuditRecord, retention: AuditRetention) -> None:
        await super().append_audit(record, AuditRetention(timedelta(days=10_000), 10**9))


def _factory_of(cls: type[InMemoryReminderTable]) -> Any:
    @asynccontextmanager
    async def make() -> AsyncIterator[ReminderTable]:
        async with AsyncExitStack() as stack:
            table = cls("contract")
            await table.start(stack)
            yield table

    return make


@pytest.mark.parametrize(
    ("broken", "check", "match"),
    [
        (
            _RecordsLostRaces,
            check_audited_writes_commit_with_their_record,
            "lost write must append no record",
        ),
        (_ForgetsRecords, check_audited_writes_commit_with_their_record, "remove's record"),
        (_NeverTrims, check_audit_settle_and_retention, "past max_age"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
async def test_the_audit_checks_fail_a_broken_table(
    broken: type[InMemoryReminderTable], check: Any, match: str
) -> None:
    with pytest.raises(AssertionError, match=match):
        await check(_factory_of(broken))


def test_every_backend_keeps_an_audit_log() -> None:
    # So the kit's checks run on each, not skip.
    tables: Sequence[object] = (
        InMemoryReminderTable(),
        RedisReminderTable("redis://x", service_id="s"),
        PostgresReminderTable("postgresql://x/y", service_id="s"),
    )
    assert all(isinstance(t, AuditedReminderTable) for t in tables)
