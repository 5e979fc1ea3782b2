"""The change feed: what each write publishes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from orleanspy.identity import GrainId
from orleanspy.reminders.model import (
    ReminderChange,
    ScheduleUpdate,
)
from orleanspy.reminders.table import (
    BatchingReminderTable,
    BulkReminderTable,
    ChangeFeed,
)
from orleanspy.testing.reminder_table._support import (
    CHANGE_DEADLINE_S,
    T0,
    TableFactory,
    new_row,
    next_change,
    prime,
)

__all__ = [
    "check_changes_feed",
]


async def check_changes_feed(factory: TableFactory) -> None:
    """Every successful upsert and remove reaches every subscriber; schedule
    CASes and lost races publish nothing; ``aclose`` ends a subscription."""
    async with factory() as table:
        first = table.changes()
        second = table.changes()
        for it in (first, second):
            assert isinstance(it, ChangeFeed), "changes() must return an iterator with aclose()"
        try:
            await prime(table, first)
            await prime(table, second)
            gid = GrainId("ContractGrain", "feed")
            due = T0 + timedelta(minutes=3)
            etag = await table.upsert(new_row(table, gid, "n", due=due, priority=-7))
            for it in (first, second):
                change = await next_change(it)
                assert change == ReminderChange(gid, "n", due), "upsert change"
                assert change.priority == -7, "an upsert's change must carry the row's priority"
            moved = T0 + timedelta(minutes=9)
            assert await table.update_schedule(gid, "n", "stale", T0, None) is None
            assert await table.remove(gid, "n", "stale") is False
            new_etag = await table.update_schedule(gid, "n", etag, moved, due)
            assert new_etag is not None
            if isinstance(table, BatchingReminderTable):
                update = ScheduleUpdate(gid, "n", new_etag, moved + timedelta(minutes=1), None)
                new_etag = (await table.update_schedule_many([update]))[0]
                assert new_etag is not None
            assert await table.remove(gid, "n", new_etag) is True
            for it in (first, second):
                # Neither the lost races above nor the schedule CASes that won
                # published anything: the removal is the next change.
                change = await next_change(it)
                assert change == ReminderChange(gid, "n", None), (
                    f"expected the removal, got {change} (a schedule CAS must not publish)"
                )
                assert change.priority is None, "a removal's change carries no priority"
            if isinstance(table, BulkReminderTable):
                await table.upsert_many([new_row(table, gid, "m", due=due, priority=42)])
                change = await next_change(first)
                assert change == ReminderChange(gid, "m", due), "upsert_many change"
                assert change.priority == 42, "an upsert_many change must carry the priority"
        finally:
            await first.aclose()
        # A reader blocked in another task is released by aclose. Changes already
        # buffered (second did not read the batch's) may come out first; then the end.
        reader = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        await second.aclose()
        try:
            async with asyncio.timeout(CHANGE_DEADLINE_S):
                await reader
                for _ in range(100):
                    await anext(second)
            raise AssertionError("changes kept coming after aclose()")
        except StopAsyncIteration:
            pass
        except TimeoutError:
            raise AssertionError("aclose() did not end the change stream") from None
