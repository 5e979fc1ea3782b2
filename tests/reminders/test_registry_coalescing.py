"""Concurrent registrations on one silo are coalesced into batched table writes,
each caller still told its own result (``remindable.registry``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from orleanspy.clock import SystemClock
from orleanspy.errors import StorageUnavailableError
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.spec import ReminderSpec
from orleanspy.testing import wait_for

TYPE = "test_registry_coalescing.G"


class _Remindable:
    remindable = True


class SlowTable(InMemoryReminderTable):
    """Every write takes one loop round trip (as a store does); counts them."""

    def __init__(self) -> None:
        super().__init__("default")
        self.single = 0
        self.batches: list[int] = []
        self.fail_next_batch = False

    async def upsert(self, entry: ReminderEntry) -> str:
        self.single += 1
        await asyncio.sleep(0.001)
        return await super().upsert(entry)

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        self.batches.append(len(entries))
        await asyncio.sleep(0.001)
        if self.fail_next_batch:
            self.fail_next_batch = False
            raise StorageUnavailableError("the store went away")
        return [await InMemoryReminderTable.upsert(self, e) for e in entries]


def _registry(table: SlowTable) -> ReminderRegistry:
    def definitions(type_name: str) -> Any:
        return _Remindable() if type_name == TYPE else None

    return ReminderRegistry(
        table,
        service_id="default",
        clock=SystemClock(),
        options=ReminderOptions(),
        definitions=definitions,
    )


async def test_64_concurrent_registrations_take_a_few_round_trips_and_each_gets_its_row() -> None:
    table = SlowTable()
    registry = _registry(table)
    heard: list[str] = []
    registry.add_listener(lambda change: heard.append(change.name))
    entries = await asyncio.gather(
        *(registry.register(GrainId(TYPE, i), "r", ReminderSpec(period=60 + i)) for i in range(64))
    )
    # The first caller writes its row alone; the 63 that queued behind it split
    # over both round trips (one of 63 beside one of 1 would not overlap).
    assert (table.single, table.batches) == (1, [32, 31])
    for i, entry in enumerate(entries):
        stored = await table.read(GrainId(TYPE, i), "r")
        assert stored is not None and entry.etag == stored.etag, "a caller got another's etag"
        assert entry.period is not None and entry.period.total_seconds() == 60 + i
    assert len(heard) == 64


async def test_a_lone_registration_is_one_plain_upsert() -> None:
    table = SlowTable()
    registry = _registry(table)
    for i in range(3):
        await registry.register(GrainId(TYPE, i), "r", ReminderSpec(period=60))
    assert (table.single, table.batches) == (3, [])


async def test_a_failed_batch_fails_its_callers_only_and_later_ones_go_through() -> None:
    table = SlowTable()
    registry = _registry(table)
    table.fail_next_batch = True
    results = await asyncio.gather(
        *(registry.register(GrainId(TYPE, i), "r", ReminderSpec(period=60)) for i in range(10)),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    assert table.batches == [5, 4], table.batches  # the lone write, then 9 in two halves
    assert len(failed) == 5 and all(isinstance(r, StorageUnavailableError) for r in failed)
    assert all(isinstance(r, ReminderEntry) for r in (results[0], *results[6:])), (
        "a caller outside the failed batch failed"
    )
    assert await table.count() == 5, "a failed batch wrote rows"
    again = await asyncio.gather(
        *(registry.register(GrainId(TYPE, i), "r", ReminderSpec(period=60)) for i in range(10))
    )
    assert len(again) == 10 and await table.count() == 10


async def test_two_registrations_of_one_row_end_as_the_later() -> None:
    table = SlowTable()
    registry = _registry(table)
    gid = GrainId(TYPE, "same")
    await asyncio.gather(
        registry.register(GrainId(TYPE, "x"), "r", ReminderSpec(period=60)),  # the lone writer
        *(registry.register(gid, "r", ReminderSpec(period=60 + i)) for i in range(5)),
    )
    stored = await table.read(gid, "r")
    assert stored is not None and stored.period is not None
    assert stored.period.total_seconds() == 64


@pytest.mark.parametrize("rows", [1, 4500])
async def test_register_many_writes_each_row_once_with_batches_in_flight(rows: int) -> None:
    from orleanspy.remindable.registry import Registration

    table = SlowTable()
    registry = _registry(table)
    regs = [Registration(GrainId(TYPE, i % 4000), "r", period=60 + i) for i in range(rows)]
    assert await registry.register_many(regs, batch=1000) == rows
    assert await table.count() == min(rows, 4000)
    if rows > 4000:
        last = await table.read(GrainId(TYPE, 7), "r")
        assert last is not None and last.period is not None
        assert last.period.total_seconds() == 60 + 4007, "not the last registration"


class GatedTable(SlowTable):
    """``SlowTable`` whose batch writes wait at a gate (each counted as it is
    sent); records how many were out at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.out = 0
        self.most_out = 0

    async def upsert_many(self, entries: Sequence[ReminderEntry]) -> list[str]:
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        self.batches.append(len(entries))
        try:
            await self.gate.wait()
            return [await InMemoryReminderTable.upsert(self, e) for e in entries]
        finally:
            self.out -= 1


async def test_two_batches_are_out_at_once_and_the_rest_wait_for_one_to_land() -> None:
    table = GatedTable()
    registry = _registry(table)
    lone = asyncio.create_task(
        registry.register(GrainId(TYPE, "lone"), "r", ReminderSpec(period=60))
    )
    first = [
        asyncio.create_task(registry.register(GrainId(TYPE, f"a{i}"), "r", ReminderSpec(period=60)))
        for i in range(10)
    ]
    # Beside the lone write, half of the 11 rows go; the rest take the round
    # trip that the lone write frees (plain upserts are not gated).
    await lone
    await wait_for(lambda: table.batches == [6, 4], 5, interval=0)
    second = [
        asyncio.create_task(registry.register(GrainId(TYPE, f"b{i}"), "r", ReminderSpec(period=60)))
        for i in range(10)
    ]
    for _ in range(50):
        await asyncio.sleep(0)
    assert table.batches == [6, 4], "a third round trip went out"
    table.gate.set()
    entries = await asyncio.gather(*first, *second)
    assert sum(table.batches) == 20 and len(table.batches) <= 4 and table.most_out == 2
    for entry in entries:
        stored = await table.read(entry.grain_id, "r")
        assert stored is not None and stored.etag == entry.etag


async def test_a_row_still_on_its_way_holds_back_its_next_registration() -> None:
    # Two round trips may be answered in either order: the later registration of
    # a row must not be sent while the earlier one is out, or it could land first
    # and be overwritten by the earlier one.
    table = GatedTable()
    registry = _registry(table)
    gid = GrainId(TYPE, "same")
    lone = asyncio.create_task(
        registry.register(GrainId(TYPE, "lone"), "r", ReminderSpec(period=60))
    )
    earlier = asyncio.create_task(registry.register(gid, "r", ReminderSpec(period=61)))
    await lone
    await wait_for(lambda: table.batches == [1], 5, interval=0)
    later = asyncio.create_task(registry.register(gid, "r", ReminderSpec(period=62)))
    for _ in range(50):
        await asyncio.sleep(0)
    assert table.batches == [1], "the later registration went out beside the earlier one"
    table.gate.set()
    await asyncio.gather(earlier, later)
    assert table.batches == [1, 1]
    stored = await table.read(gid, "r")
    assert stored is not None and stored.period is not None
    assert stored.period.total_seconds() == 62
