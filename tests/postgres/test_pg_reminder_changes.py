"""The PostgreSQL reminder change payload (priority of whole-row writes) and what
``upsert_if``/``upsert_many`` add beyond the shared contract kit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy.clock import to_ms
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderChange, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.postgres import feed as pg_feed

T0 = datetime(2030, 1, 1, tzinfo=UTC)
G = GrainId("P", "a|b")  # a key with the separator in it


def entry(grain: GrainId, name: str = "r", due: datetime = T0, priority: int = 0) -> ReminderEntry:
    return ReminderEntry(
        service_id="svc",
        grain_id=grain,
        name=name,
        start_at=T0,
        next_due=due,
        period=timedelta(minutes=1),
        priority=priority,
    )


@asynccontextmanager
async def table_at(url: str) -> AsyncIterator[PostgresReminderTable]:
    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(url, service_id="svc")
        await table.start(stack)
        yield table


def test_payloads_decode_with_and_without_priority() -> None:
    due = str(to_ms(T0))
    with_priority = pg_feed._decode(f"123:-128|{due}|{G.canonical}|n")
    assert with_priority == ReminderChange(G, "n", T0)
    assert isinstance(with_priority, ReminderChange) and with_priority.priority == -128
    cas = pg_feed._decode(f"123|{due}|{G.canonical}|n")
    assert isinstance(cas, ReminderChange) and cas.priority is None and cas.next_due == T0
    removal = pg_feed._decode(f"123||{G.canonical}|n")
    assert removal == ReminderChange(G, "n", None)
    assert pg_feed._decode("123|!") is pg_feed._GAP


@pytest.mark.parametrize(
    "payload",
    [
        "garbage",
        "",
        "1|2|3",
        f"1:128|5|{G.canonical}|n",  # priority out of range
        f"1:-129|5|{G.canonical}|n",
        f"1:|5|{G.canonical}|n",  # empty priority
        f"1:9{'9' * 5000}|5|{G.canonical}|n",  # a huge number
        f"1:\uff11\uff12|5|{G.canonical}|n",  # non-ASCII digits
        f"1:--1|5|{G.canonical}|n",
        f"1:1.5|5|{G.canonical}|n",
        f"1|{'9' * 5000}|{G.canonical}|n",  # a huge next_due
        f"1|99999999999999999|{G.canonical}|n",  # beyond the datetime range
        "1|5|not-a-grain|n",
        f"{'1' * 5000}:1|5|{G.canonical}|n",
    ],
)
def test_hostile_payloads_are_ignored(payload: str) -> None:
    assert pg_feed._decode(payload) is None


async def test_whole_row_writes_publish_the_priority(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        feed = table.changes()
        try:
            # Hostile notifications on the channel are dropped; the feed goes on.
            await table._p.execute("SELECT pg_notify($1, $2)", table._channel, "1:999|5|x/s:a|n")
            etag = await table.upsert_if(entry(G, priority=127), None)
            assert etag is not None
            change = await asyncio.wait_for(anext(feed), 10)
            assert change == ReminderChange(G, "r", T0) and change.priority == 127
            # A refused upsert_if publishes nothing: the next change is the bulk's.
            assert await table.upsert_if(entry(G, priority=5), None) is None
            assert await table.upsert_if(entry(G, priority=5), "123") is None
            later = T0 + timedelta(minutes=1)
            assert await table.upsert_if(entry(G, due=later, priority=-3), etag) is not None
            change = await asyncio.wait_for(anext(feed), 10)
            assert change == ReminderChange(G, "r", later) and change.priority == -3
            await table.upsert_many([entry(G, "m", priority=-100)])
            change = await asyncio.wait_for(anext(feed), 10)
            assert change == ReminderChange(G, "m", T0) and change.priority == -100
        finally:
            await feed.aclose()


async def test_upsert_many_with_a_key_twice_keeps_the_last(postgres_url: str) -> None:
    async with table_at(postgres_url) as table:
        rows = [entry(GrainId("M", i % 3), due=T0 + timedelta(seconds=i)) for i in range(7)]
        etags = await table.upsert_many(rows)
        assert len(set(etags)) == 7, etags
        for i in (4, 5, 6):  # the last entry of each key
            got = await table.read(rows[i].grain_id, "r")
            assert got is not None and got.etag == etags[i] and got.next_due == rows[i].next_due
        assert await table.count() == 3


async def test_upsert_many_beyond_one_statement(postgres_url: str) -> None:
    """More rows than one statement carries: every row is written, etags in order."""
    async with table_at(postgres_url) as table:
        rows = [entry(GrainId("Big", i), priority=i % 3) for i in range(2_500)]
        etags = await table.upsert_many(rows)
        assert await table.count() == 2_500
        for i in (0, 999, 1000, 2499):
            got = await table.read(rows[i].grain_id, "r")
            assert got == replace(rows[i], etag=etags[i])
