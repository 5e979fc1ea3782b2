"""``@register_reminder`` is register-or-update, on real Redis with cluster silos.

The declarations change between two silo starts; three silos starting at the
same time write each declared row exactly once (counted on the table's change
feed, where every whole-row write publishes the row's priority).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    Remindable,
    ReminderOptions,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
)
from orleanspy import grain as grain_module
from orleanspy.identity import GrainId
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.spec import ReminderSpec, new_entry
from orleanspy.testing.cluster import FAST_MEMBERSHIP

pytestmark = pytest.mark.slow

TYPE = "test_declarations_redis.Billing"
REMINDERS = ReminderOptions(adaptive=False, base_bucket_size=64)
PROBE = new_entry(
    ReminderSpec(period=3600),
    service_id="default",
    grain_id=GrainId("Probe", "p"),
    name="probe",
    now=datetime(2030, 1, 1, tzinfo=UTC),
    options=REMINDERS,
)


@pytest.fixture(autouse=True)
def _forget_classes() -> Iterator[None]:
    yield
    grain_module._registry.pop(TYPE, None)


def _v1() -> type[Grain]:
    @register_reminder("report", period=30)
    @register_reminder("audit", cron="0 0 3 * * *", tz="Europe/Berlin")
    @register_reminder("cleanup", period=3600, priority=ReminderPriority.BACKGROUND)
    class BillingV1(Grain, Remindable, type_name=TYPE, reminder_keys=("eu", "us")):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    return BillingV1


def _v2() -> type[Grain]:
    grain_module._registry.pop(TYPE, None)

    # "report" every 60 s, "audit" at 04:00 and CRITICAL, "cleanup" gone,
    # "invoice" new for key "eu" only.
    @register_reminder("report", period=60)
    @register_reminder("audit", cron="0 0 4 * * *", tz="Europe/Berlin", priority=100)
    @register_reminder("invoice", period=120, keys=["eu"])
    class BillingV2(Grain, Remindable, type_name=TYPE, reminder_keys=("eu", "us")):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            pass

    return BillingV2


def _options(redis_url: str, cls: type[Grain], name: str) -> SiloOptions:
    return SiloOptions(
        redis_url=redis_url,
        name=name,
        grain_types=(cls,),
        membership=FAST_MEMBERSHIP,
        reminders=REMINDERS,
    )


async def _rows(table: RedisReminderTable, key: str) -> dict[str, object]:
    return {r.name: r for r in await table.read_grain(GrainId(TYPE, key))}


async def test_changed_declarations_are_applied_between_two_silo_starts(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        first_silo = Silo(_options(redis_url, _v1(), "first"))
        await first_silo.start()
        await first_silo.stop()
        before = {k: await _rows(table, k) for k in ("eu", "us")}
        assert set(before["eu"]) == {"report", "audit", "cleanup"}
        code_row = await table.read(GrainId(TYPE, "eu"), "report")
        assert code_row is not None

        second_silo = Silo(_options(redis_url, _v2(), "second"))
        await second_silo.start()
        await second_silo.stop()
        after = {k: await _rows(table, k) for k in ("eu", "us")}
        assert set(after["eu"]) == {"report", "audit", "invoice"}
        assert set(after["us"]) == {"report", "audit"}
        for key in ("eu", "us"):
            report, audit = after[key]["report"], after[key]["audit"]
            assert report.period == timedelta(seconds=60)  # type: ignore[attr-defined]
            assert audit.cron == "0 0 4 * * *"  # type: ignore[attr-defined]
            assert audit.priority == 100  # type: ignore[attr-defined]
        # A third start with the same declarations changes nothing.
        third_silo = Silo(_options(redis_url, _v2(), "third"))
        await third_silo.start()
        await third_silo.stop()
        assert {k: await _rows(table, k) for k in ("eu", "us")} == after


async def test_three_silos_starting_at_once_write_each_declared_row_exactly_once(
    redis_url: str,
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        feed = table.changes()
        stack.push_async_callback(feed.aclose)
        writes: Counter[tuple[str, str]] = Counter()
        removals: Counter[tuple[str, str]] = Counter()
        markers: list[int] = []
        marker_seen = asyncio.Event()

        async def count() -> None:
            async for change in feed:
                if change.grain_id == PROBE.grain_id:
                    markers.append(1)
                    marker_seen.set()
                elif change.grain_id.type_name == TYPE:
                    key = (str(change.grain_id.key), change.name)
                    if change.next_due is None:
                        removals[key] += 1
                    elif change.priority is not None:
                        writes[key] += 1

        counter = asyncio.create_task(count())
        stack.callback(counter.cancel)

        async def marker() -> None:
            """Write the probe row until its change arrives: every change published
            before it (all silo writes done so far) has been counted by then."""
            marker_seen.clear()
            async with asyncio.timeout(10):
                while not marker_seen.is_set():
                    await table.upsert(PROBE)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(marker_seen.wait(), 0.2)

        async def start_three_at_once(cls: type[Grain], tag: str) -> None:
            silos = [Silo(_options(redis_url, cls, f"{tag}{i}")) for i in range(3)]
            try:
                await asyncio.gather(*(s.start() for s in silos))
            finally:
                for s in reversed(silos):
                    await s.stop()
            await marker()

        await marker()  # the feed subscribes on its first read
        await start_three_at_once(_v1(), "a")
        assert len(writes) == 6, writes
        assert set(writes.values()) == {1}, f"rows created more than once: {writes}"
        assert await table.count() == 6 + 1  # and the probe

        # The next version, three silos at once again: each changed row is
        # updated once, each new row created once, each dropped row removed once.
        writes.clear()
        await start_three_at_once(_v2(), "b")
        assert writes == {
            ("eu", "report"): 1,
            ("us", "report"): 1,
            ("eu", "audit"): 1,
            ("us", "audit"): 1,
            ("eu", "invoice"): 1,
        }, writes
        assert removals == {("eu", "cleanup"): 1, ("us", "cleanup"): 1}, removals
        assert await table.count() == 5 + 1


async def test_an_operators_changes_survive_restarts_until_the_code_changes_on_redis(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id="default")
        await table.start(stack)
        eu = GrainId(TYPE, "eu")
        silo = Silo(_options(redis_url, _v1(), "first"))
        await silo.start()
        mgmt = silo.client.reminders
        await mgmt.set_priority(eu, "report", 90)
        await mgmt.pause(eu, "cleanup")
        declared = await mgmt.get(eu, "report")
        await silo.stop()
        assert declared.declared and declared.fingerprint

        silo = Silo(_options(redis_url, _v1(), "again"))
        await silo.start()
        await silo.stop()
        kept = await _rows(table, "eu")
        assert kept["report"].priority == 90, "a restart undid set-priority"  # type: ignore[attr-defined]
        assert kept["cleanup"].paused, "a restart undid pause"  # type: ignore[attr-defined]

        # v2 changes report's period (not its priority) and drops cleanup.
        with caplog.at_level("WARNING"):
            silo = Silo(_options(redis_url, _v2(), "v2"))
            await silo.start()
            await silo.stop()
        after = await _rows(table, "eu")
        report = after["report"]
        assert report.period == timedelta(seconds=60)  # type: ignore[attr-defined]
        assert report.priority == 90, "a period change undid the operator's priority"  # type: ignore[attr-defined]
        assert "cleanup" not in after
        assert not [r for r in caplog.records if "overrode" in r.getMessage()]
