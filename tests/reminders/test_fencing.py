"""A deposed owner's late tick is never persisted: the new owner fences it first.

Silo A owns a row and is delivering its tick when it is deposed (declared Dead
while it does not yet know). Silo B fences A's incarnation, takes the ring
over and reads the row. A's tick then finishes and A tries to persist the next
slot against the etag it holds, which is still the row's: without the fence it
would win and B would take A's late progress for its own. With it, the table
refuses A's write, and B's progress stands.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.reminders.memory import InMemoryReminderTable
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.service import ReminderService
from orleanspy.ring import RingRange
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from tests.reminders.test_service import OPTIONS, START, Recorder, advance, entry

A = SiloAddress("10.0.0.1", 11111, generation=1_000)
B = SiloAddress("10.0.0.2", 11111, generation=2_000)
PERIOD = timedelta(seconds=10)
WAIT = 10.0


@asynccontextmanager
async def two_writers(
    backend: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Any, Any]]:
    """The table as written by A and by B: the same rows, each with its writer."""
    async with AsyncExitStack() as stack:
        if backend == "memory":
            table = InMemoryReminderTable("default")
            await table.start(stack)
            yield table.writer_view(A), table.writer_view(B)
            return
        url = request.getfixturevalue("redis_url")
        sid = f"fence-{uuid.uuid4().hex[:8]}"
        tables = []
        for writer in (A, B):
            t = RedisReminderTable(url, service_id=sid, shards=16)
            t.writer = writer
            await t.start(stack)
            tables.append(t)
        yield tables[0], tables[1]


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
async def test_a_deposed_owners_late_tick_is_not_persisted(
    backend: str, fenced: bool, request: pytest.FixtureRequest
) -> None:
    clock = ManualClock(START)
    async with two_writers(backend, request) as (table_a, table_b), AsyncExitStack() as stack:
        row = entry(clock, "fenced", period=10)
        await table_a.upsert(row)
        gid = GrainId("G", "fenced")

        # A owns the ring and is delivering slot START+10 when it is deposed.
        rec_a = Recorder()
        rec_a.gate = gate_a = asyncio.Event()
        a = ReminderService(table_a, deliver=rec_a, clock=clock, options=OPTIONS, name="a")
        a.set_ranges([RingRange.full()])
        await a.start(stack)
        await a.refill_now()
        await advance(clock, 10)
        await wait_for(lambda: rec_a.blocked == 1, WAIT)

        # B sees A Dead: fences it (or, as the control, does not), takes the
        # ring over and reads the row, whose etag A still holds.
        rec_b = Recorder()
        rec_b.gate = gate_b = asyncio.Event()
        b = ReminderService(table_b, deliver=rec_b, clock=clock, options=OPTIONS, name="b")
        if fenced:
            b.fence(A)
        b.set_ranges([RingRange.full()])
        await b.start(stack)
        await b.refill_now()
        assert b.stats.fenced == (1 if fenced else 0)
        await wait_for(lambda: rec_b.blocked == 1, WAIT)
        held = await table_b.read(gid, "r")
        assert held is not None

        # A's late tick finishes; any delivery after it blocks again.
        rec_a.gate = asyncio.Event()
        gate_a.set()
        await wait_for(lambda: len(rec_a.calls) == 1, WAIT)
        # A's write has been answered: taken (the control), or refused as a lost CAS.
        await wait_for(lambda: a.stats.persisted + a.stats.cas_conflicts == 1, WAIT)
        after_a = await table_b.read(gid, "r")
        assert after_a is not None
        if not fenced:
            # The control: without the fence the late tick is taken as progress.
            assert after_a.etag != held.etag and after_a.next_due == held.next_due + PERIOD
            return
        assert after_a == held, "the deposed owner's late tick was persisted"
        assert a.stats.persisted == 0 and a.stats.cas_conflicts == 1

        # B's tick of the same slot is its own progress, and it stands.
        gate_b.set()
        await wait_for(lambda: len(rec_b.calls) == 1, WAIT)
        await b.wait_persisted()
        final = await table_b.read(gid, "r")
        assert final is not None and final.etag != held.etag
        assert final.next_due == held.next_due + PERIOD
        assert b.stats.persisted == 1 and b.stats.cas_conflicts == 0
