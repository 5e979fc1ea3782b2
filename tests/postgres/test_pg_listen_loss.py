"""The LISTEN connection of a silo's reminder table is killed on the server
(``pg_terminate_backend``) and kept from coming back while other writers add
rows: once it listens again the silo re-reads, and every row ticks. The silo
polls only every 10 minutes, so nothing else could bring the rows in."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus
from orleanspy.identity import GrainId
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.reminders.postgres import feed as pg_feed
from orleanspy.testing.cluster import wait_for

TYPE = "test_pg_listen_loss.Tick"
TICKS: dict[str, int] = {}


class ListenLossGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        key = f"{self.grain_key}/{name}"
        TICKS[key] = TICKS.get(key, 0) + 1


def _row(key: int, name: str) -> ReminderEntry:
    now = datetime.now(UTC)
    return ReminderEntry(
        service_id="svc",
        grain_id=GrainId(TYPE, key),
        name=name,
        start_at=now,
        next_due=now + timedelta(milliseconds=300),
        period=timedelta(milliseconds=500),
    )


@pytest.mark.timeout(60)
async def test_no_reminder_is_missed_when_the_listen_connection_dies(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    TICKS.clear()
    options = SiloOptions(
        service_id="svc",
        reminders=ReminderOptions(
            look_ahead=timedelta(minutes=20),
            poll_interval=timedelta(minutes=10),
            minimum_period=timedelta(milliseconds=100),
            retry_initial=timedelta(milliseconds=50),
            retry_max=timedelta(milliseconds=200),
        ),
    )
    gate = asyncio.Event()
    reconnecting = asyncio.Event()
    real_connect = pg_feed.connect

    async def held_connect(source: Any) -> Any:
        reconnecting.set()
        await gate.wait()
        return await real_connect(source)

    async with AsyncExitStack() as stack:
        table = PostgresReminderTable(postgres_url, service_id="svc")
        writer = PostgresReminderTable(postgres_url, service_id="svc")
        await writer.start(stack)
        silo = await stack.enter_async_context(Silo.local(options, reminder_table=table))
        service = silo.reminder_service
        assert service is not None

        # Before the loss: a row from another writer arrives by NOTIFY.
        await writer.upsert(_row(0, "before"))
        await wait_for(lambda: TICKS.get("0/before", 0) >= 1, timeout=15, what="first tick")

        monkeypatch.setattr(pg_feed, "connect", held_connect)
        killed = await writer._p.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
        assert killed >= 1
        await asyncio.wait_for(reconnecting.wait(), 30)
        # Nobody of this silo listens now: these notifications go nowhere.
        for k in range(1, 6):
            await writer.upsert(_row(k, "during"))
        gate.set()

        expected = {f"{k}/during" for k in range(1, 6)}
        await wait_for(
            lambda: expected <= {k for k, n in TICKS.items() if n >= 2},
            timeout=20,
            what="every row written during the outage ticking",
        )
        # And the feed works again: a row written now arrives too.
        await writer.upsert(_row(9, "after"))
        await wait_for(lambda: TICKS.get("9/after", 0) >= 1, timeout=15, what="after tick")
