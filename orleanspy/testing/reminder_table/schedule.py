"""Schedule writes: the CAS of ``update_schedule``, its batch form, and fenced writers."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.model import (
    MissedReminderAction,
    ScheduleUpdate,
)
from orleanspy.reminders.table import (
    BatchingReminderTable,
    FencingReminderTable,
)
from orleanspy.ring import RingRange
from orleanspy.testing.reminder_table._support import (
    T0,
    TableFactory,
    as_stored,
    new_row,
)

__all__ = [
    "check_fenced_writer_loses_its_schedule_writes",
    "check_update_schedule_cas",
    "check_update_schedule_many",
    "check_update_schedule_many_keeps_lanes_and_fields",
]


async def check_update_schedule_cas(factory: TableFactory) -> None:
    """``update_schedule`` moves the row with the right etag; loses the race with a
    stale one or on a removed row, and then changes nothing."""
    async with factory() as table:
        gid = GrainId("ContractGrain", "cas")
        original = new_row(
            table,
            gid,
            cron="0 * * * *",
            period=None,
            tz="UTC",
            priority=5,
            action=MissedReminderAction.NOTIFY,
        )
        first = await table.upsert(original)
        later = T0 + timedelta(hours=1)
        fired = T0 + timedelta(seconds=1, microseconds=1500)
        second = await table.update_schedule(gid, "r", first, later, fired)
        assert second is not None, "CAS with the current etag failed"
        assert second != first, "CAS returned the old etag"
        row = await table.read(gid, "r")
        expected = as_stored(replace(original, next_due=later, last_fire=fired), second)
        assert row == expected, f"after CAS:\n got {row}\nwant {expected}"
        assert await table.update_schedule(gid, "r", first, T0, None) is None, "stale CAS won"
        assert await table.read(gid, "r") == expected, "a lost CAS changed the row"
        third = await table.update_schedule(gid, "r", second, later + timedelta(hours=1), None)
        assert third is not None and third not in (first, second)
        row = await table.read(gid, "r")
        assert row is not None and row.last_fire is None, "CAS could not clear last_fire"
        due = await table.read_due(RingRange.full(), later + timedelta(hours=1), 10)
        assert [r.etag for r in due] == [third], "due index not moved by CAS"
        assert await table.read_due(RingRange.full(), later, 10) == [], "old due time still indexed"
        assert await table.remove(gid, "r", third) is True
        assert await table.update_schedule(gid, "r", third, T0, None) is None, "CAS on removed row"
        assert await table.read(gid, "r") is None, "CAS resurrected a removed row"
        missing = GrainId("ContractGrain", "never")
        assert await table.update_schedule(missing, "r", "x", T0, None) is None


async def check_update_schedule_many(factory: TableFactory) -> None:
    """The batched CAS answers like single calls, in order (skipped when the table
    is not a ``BatchingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, BatchingReminderTable):
            return
        assert await table.update_schedule_many([]) == []
        gids = [GrainId("ContractGrain", f"batch{i}") for i in range(4)]
        etags = [await table.upsert(new_row(table, g)) for g in gids]
        stale = etags[2]
        etags[2] = await table.upsert(new_row(table, gids[2]))
        await table.remove(gids[3], "r", etags[3])
        due = T0 + timedelta(minutes=5)
        updates = [
            ScheduleUpdate(gids[0], "r", etags[0], due, T0),
            ScheduleUpdate(gids[1], "r", etags[1], due, None),
            ScheduleUpdate(gids[2], "r", stale, due, None),  # stale etag
            ScheduleUpdate(gids[3], "r", etags[3], due, None),  # removed row
            ScheduleUpdate(gids[0], "r", etags[0], due, None),  # lost to the first update
        ]
        results = await table.update_schedule_many(updates)
        assert len(results) == 5, f"{len(results)} results for 5 updates"
        assert results[0] is not None and results[1] is not None, f"valid CASes lost: {results}"
        assert results[2:] == [None, None, None], f"lost races reported as wins: {results}"
        assert results[0] != etags[0] and results[1] != etags[1], "batch kept an old etag"
        for gid, etag in ((gids[0], results[0]), (gids[1], results[1])):
            row = await table.read(gid, "r")
            assert row is not None and row.etag == etag and row.next_due == due
        row = await table.read(gids[0], "r")
        assert row is not None and row.last_fire == T0
        row = await table.read(gids[2], "r")
        assert row is not None and row.etag == etags[2] and row.next_due == T0


async def check_update_schedule_many_keeps_lanes_and_fields(factory: TableFactory) -> None:
    """A batched CAS keeps every field it does not set (priority, action,
    ``declared``, ...) and files each row in the due order by its stored
    priority: after the batch, ``read_due`` with a small limit still returns the
    highest priority first even when it is due last (skipped when the table is
    not a ``BatchingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, BatchingReminderTable):
            return
        rows = [
            new_row(
                table,
                GrainId("ContractLanes", i),
                priority=priority,
                action=MissedReminderAction.NOTIFY,
                declared=i == 1,
            )
            for i, priority in enumerate((-100, 0, 100))
        ]
        etags = [await table.upsert(row) for row in rows]
        # The lowest priority falls due first, the highest last.
        dues = [T0 + timedelta(minutes=m) for m in (1, 2, 3)]
        fired = T0 + timedelta(seconds=7)
        results = await table.update_schedule_many(
            [
                ScheduleUpdate(row.grain_id, row.name, etag, due, fired)
                for row, etag, due in zip(rows, etags, dues, strict=True)
            ]
        )
        assert all(r is not None for r in results), f"valid CASes lost: {results}"
        for row, etag, due in zip(rows, results, dues, strict=True):
            assert etag is not None
            got = await table.read(row.grain_id, row.name)
            want = as_stored(replace(row, next_due=due, last_fire=fired), etag)
            assert got == want, f"after a batched CAS:\n got {got}\nwant {want}"
        later = T0 + timedelta(hours=1)
        first = await table.read_due(RingRange.full(), later, 1)
        assert [int(r.priority) for r in first] == [100], (
            f"a batched CAS lost the row's priority lane: read_due(limit=1) gave {first}"
        )
        every = await table.read_due(RingRange.full(), later, 10)
        assert [int(r.priority) for r in every] == [100, 0, -100], "not in the due order"


async def check_fenced_writer_loses_its_schedule_writes(factory: TableFactory) -> None:
    """A fenced writer's ``update_schedule`` and ``update_schedule_many`` answer
    ``None`` and change nothing, whatever the etag; other writers (another
    generation on the same endpoint too) and an instance without a writer are
    unaffected; fencing again changes nothing (skipped when the table is not a
    ``FencingReminderTable``)."""
    async with factory() as table:
        if not isinstance(table, FencingReminderTable):
            return
        deposed = SiloAddress("10.9.0.1", 11111, generation=1_000)
        successor = SiloAddress("10.9.0.1", 11111, generation=2_000)
        gid = GrainId("ContractGrain", "fenced")
        first = await table.upsert(new_row(table, gid))
        later = T0 + timedelta(minutes=1)
        table.writer = deposed
        moved = await table.update_schedule(gid, "r", first, later, T0)
        assert moved is not None, "a writer not fenced lost its CAS"
        etag = moved
        await table.fence(deposed, at=T0)
        await table.fence(deposed, at=T0 + timedelta(seconds=1))  # idempotent
        before = await table.read(gid, "r")
        late = later + timedelta(minutes=1)
        lost = await table.update_schedule(gid, "r", etag, late, later)
        assert lost is None, "a fenced writer's update_schedule won"
        if isinstance(table, BatchingReminderTable):
            many = await table.update_schedule_many([ScheduleUpdate(gid, "r", etag, late, later)])
            assert many == [None], f"a fenced writer's update_schedule_many won: {many}"
        assert await table.read(gid, "r") == before, "a fenced writer's CAS changed the row"
        due = await table.read_due(RingRange.full(), late, 10)
        assert [r.next_due for r in due] == [later], "a fenced writer's CAS moved the due index"
        for writer in (successor, None):
            table.writer = writer
            new = await table.update_schedule(gid, "r", etag, late, later)
            assert new is not None, f"writer {writer} lost its CAS to another's fence"
            etag = new
            if isinstance(table, BatchingReminderTable):
                done = await table.update_schedule_many(
                    [ScheduleUpdate(gid, "r", etag, late + timedelta(minutes=1), late)]
                )
                assert done[0] is not None, f"writer {writer} lost a batched CAS to a fence"
                etag = done[0]
        # Pruning drops old fences but never the one being set.
        table.writer = deposed
        await table.fence(deposed, at=T0 + timedelta(days=30), prune_before=T0 + timedelta(days=9))
        assert await table.update_schedule(gid, "r", etag, late, None) is None, (
            "fencing with prune_before dropped the writer's own fence"
        )
