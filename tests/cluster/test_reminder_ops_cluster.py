"""Reminder operations against a real silo over its gateway (Redis, gRPC):
orphaned rows in the management API, ``cluster status`` and the metric; bad
input from a client is refused with a clear error, writes nothing, and the silo
keeps serving."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import Grain, Remindable, ReminderError, SiloOptions, TickStatus
from orleanspy._redis import connect
from orleanspy.cluster_status import read_status
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing.cluster import InProcessCluster
from tests.test_metrics import get, series

LIVE = "test_reminder_ops_cluster.Live"


class LiveGrain(Grain, Remindable, type_name=LIVE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        pass


def _row(type_name: str, key: str) -> ReminderEntry:
    return new_entry(
        ReminderSpec(period=3600),
        service_id="default",
        grain_id=GrainId(type_name, key),
        name="r",
        now=datetime.now(UTC),
        options=ReminderOptions(),
    )


@pytest.mark.slow
async def test_orphans_are_flagged_counted_and_bad_input_is_refused(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        await table.upsert_many(
            [_row(LIVE, f"k{i}") for i in range(3)] + [_row("GoneGrain", f"g{i}") for i in range(5)]
        )
    options = SiloOptions(grain_types=(LiveGrain,), allow_client_management=True, metrics_port=0)
    async with InProcessCluster(redis_url, size=1, options=options) as cluster:
        silo = cluster.silos[0]
        client = await cluster.client()
        mgmt = client.reminders
        assert await mgmt.orphans() == {"GoneGrain": 5}
        page = await mgmt.page(None, 100)
        assert len(page.rows) == 8
        assert sorted(k.split("/")[0] for k in page.orphaned) == ["GoneGrain"] * 5
        # The silo's periodic check (run now rather than waiting for its first
        # round) puts the figure in its metric and status record.
        assert silo._orphans is not None
        assert await silo._orphans.check() == {"GoneGrain": 5}
        assert silo.metrics_port
        _, text = await get(silo.metrics_port, "/metrics")
        assert (
            series(text)[("orleanspy_reminder_orphaned_rows", (("grain_type", "GoneGrain"),))] == 5
        )
        # Status records are written every few seconds: poll with a deadline.
        redis = connect(redis_url)
        try:
            async with asyncio.timeout(15):
                while (
                    await read_status(redis, cluster_id="dev", service_id="default")
                ).orphaned_rows != 5:
                    await asyncio.sleep(0.2)
        finally:
            await redis.aclose()

        before = await mgmt.count_all()
        bad_row = ReminderEntry(
            service_id="default",
            grain_id=GrainId(LIVE, "bad"),
            name="r",
            start_at=datetime.now(UTC),
            next_due=datetime.now(UTC),
            period=timedelta(hours=1),
            priority=500,
        )
        for call, match in (
            (mgmt.page("made-up-cursor", 10), "cursor"),
            (mgmt.page(None, 10**9), "1..10000"),
            (mgmt.get("no-slash", "r"), "not a grain"),
            (mgmt.get(12, "r"), "not a grain"),
            (mgmt.set_priority(GrainId(LIVE, "k0"), "r", 1000), "out of range"),
            (mgmt.delete_where("a/b"), "grain type"),
            (mgmt.delete_where(""), "needs a grain type"),
            (mgmt.count("T", 5), "strings"),
            (mgmt.import_rows([_row(LIVE, "ok"), bad_row]), "priority"),
            (mgmt.import_rows(["not a row"]), "not a reminder row"),
        ):
            with pytest.raises(ReminderError, match=match):
                await call
        assert await mgmt.count_all() == before, "a refused call wrote"
        assert await mgmt.delete_where("GoneGrain") == 5
        assert await mgmt.orphans() == {}
