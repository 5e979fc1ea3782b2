"""Fire history: appends, trims, removal with the row, ended rows keeping theirs."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
)
from orleanspy.reminders.table import (
    EndingReminderTable,
    PausableReminderTable,
)
from orleanspy.ring import RingRange
from orleanspy.testing.reminder_table._support import (
    T0,
    TableFactory,
    new_row,
    next_change,
    prime,
)

__all__ = [
    "check_ended_rows_keep_their_history",
    "check_fire_history",
]


async def check_fire_history(factory: TableFactory) -> None:
    """``append_history`` keeps the newest ``keep`` records per row, newest first,
    field by field; ``upsert`` keeps the history, ``remove`` deletes it, and
    records of a missing row are dropped. Skipped for tables that are not a
    ``PausableReminderTable``."""
    async with factory() as table:
        if not isinstance(table, PausableReminderTable):
            return
        gid, other = GrainId("History", "h"), GrainId("History", "o")
        await table.upsert(new_row(table, gid))
        await table.upsert(new_row(table, other))

        def record(i: int, g: GrainId = gid, **fields: object) -> FireRecord:
            base = FireRecord(
                grain_id=g, name="r", slot=T0 + timedelta(minutes=i),
                at=T0 + timedelta(minutes=i, milliseconds=250), outcome=FireOutcome.OK,
                silo="silo-a",
            )  # fmt: skip
            return replace(base, **fields)  # type: ignore[arg-type]

        assert await table.read_history(gid, "r") == []
        failed = record(1, outcome=FireOutcome.GRAIN_ERROR, error="ValueError: bad ✓ input",
                        backfill=True)  # fmt: skip
        await table.append_history([record(0), failed], 3)
        await table.append_history([record(2, other), record(2, GrainId("History", "missing"))], 3)
        got = await table.read_history(gid, "r")
        assert got == [failed, record(0)], got
        assert got[0].lateness == timedelta(milliseconds=250)
        assert await table.read_history(GrainId("History", "missing"), "r") == []
        assert [r.slot for r in await table.read_history(other, "r")] == [T0 + timedelta(minutes=2)]
        odd = [
            record(2, outcome=FireOutcome.MISSED_SKIPPED, silo="silo-b"),
            record(3, outcome=FireOutcome.NOTIFIED),
            record(4, triggered=True),
        ]
        await table.append_history(odd, 3)
        got = await table.read_history(gid, "r")
        assert got == odd[::-1], f"history not trimmed to the newest 3: {got}"
        await table.upsert(new_row(table, gid, due=T0 + timedelta(days=1)))
        assert len(await table.read_history(gid, "r")) == 3, "upsert dropped the history"
        row = await table.read(gid, "r")
        assert row is not None and row.etag is not None
        assert await table.remove(gid, "r", row.etag) is True
        assert await table.read_history(gid, "r") == [], "remove kept the history"
        await table.upsert(new_row(table, gid))
        assert await table.read_history(gid, "r") == [], "a new row inherited a history"


async def check_ended_rows_keep_their_history(factory: TableFactory) -> None:
    """``end`` removes the row as ``remove`` does (the etag checked, the row out of
    ``read``, the due index and ``count``, a removal published) and keeps its fire
    history readable; ``remove`` of a row written again under that key deletes
    every record. Skipped for tables that are not an ``EndingReminderTable``."""
    async with factory() as table:
        if not isinstance(table, EndingReminderTable):
            return
        gid = GrainId("Ended", "e")
        etag = await table.upsert(new_row(table, gid))
        records = [
            FireRecord(gid, "r", T0, T0, FireOutcome.RETRYING, "silo-a", attempt=1),
            FireRecord(gid, "r", T0, T0, FireOutcome.OK, "silo-a", attempt=2, final=True),
        ]
        await table.append_history(records, 5)
        feed = table.changes()
        try:
            await prime(table, feed)
            assert await table.end(gid, "r", "0") is False, "end ignored the etag"
            assert await table.read(gid, "r") is not None, "a refused end removed the row"
            counted = await table.count()
            assert await table.end(gid, "r", etag) is True, "end refused the row's etag"
            change = await next_change(feed)
            assert (change.grain_id, change.next_due) == (gid, None), f"end published {change}"
        finally:
            await feed.aclose()
        assert await table.read(gid, "r") is None, "end kept the row"
        assert await table.count() == counted - 1, "end left the row counted"
        due = await table.read_due(RingRange.full(), T0 + timedelta(days=1), 10)
        assert gid not in {e.grain_id for e in due}, "end left the row in the due index"
        got = await table.read_history(gid, "r")
        assert got == records[::-1], f"end dropped the history: {got}"
        assert await table.end(gid, "r", etag) is False, "end of a missing row succeeded"
        # Written again and then removed by an operator: nothing is left.
        etag = await table.upsert(new_row(table, gid))
        assert await table.remove(gid, "r", etag) is True
        assert await table.read_history(gid, "r") == [], "remove kept an ended history"
