"""Labels, calendars and backfills on a cluster of two silos, on one Redis and on
a Redis Cluster: a calendar change reaches the reminder its owner holds, live;
a backfill whose silo is killed goes on from its progress on the other."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Calendar,
    Excluded,
    Grain,
    Remindable,
    ReminderEntry,
    ReminderOptions,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.describe import next_fire_times
from orleanspy.testing import wait_for
from orleanspy.testing.cluster import FAST_MEMBERSHIP, InProcessCluster

pytestmark = pytest.mark.slow

TICKS: list[tuple[str, str, TickStatus]] = []
S = timedelta(seconds=1)


class ScheduledGrain(Grain, Remindable, type_name="test_schedules.Scheduled"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((str(self.grain_id.key), name, status))

    async def start(self, name: str, period: float, calendar: str | None = None) -> None:
        await self.register_or_update_reminder(
            name, period=period, calendar=calendar, labels={"tenant": "acme", "name": name}
        )


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    TICKS.clear()
    yield
    TICKS.clear()


@pytest.fixture(params=["redis_url", "redis_cluster_url"])
def store(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


def options(service: str) -> SiloOptions:
    return SiloOptions(
        service_id=service,
        # The test's client changes calendars and asks for backfills.
        allow_client_management=True,
        grain_types=(ScheduledGrain,),
        reminders=ReminderOptions(
            poll_interval=timedelta(seconds=1),
            look_ahead=timedelta(seconds=10),
            missed_tick_grace=timedelta(seconds=2),
            backfill_rate=4.0,
            handover_delay=timedelta(0),
        ),
    )


async def test_a_calendar_change_reaches_the_held_row_live(store: str) -> None:
    service = f"cal-{uuid.uuid4().hex[:8]}"
    async with InProcessCluster(
        store, size=2, options=options(service), membership=FAST_MEMBERSHIP
    ) as cluster:
        client = await cluster.client()
        mgmt = client.reminders
        await mgmt.set_calendar("maint", Calendar())
        await client.get_grain(ScheduledGrain, "p").start("pulse", 1.0, "maint")
        await wait_for(lambda: len(TICKS) >= 2, 30, what="pulse ticking")
        assert await mgmt.count(labels={"tenant": "acme"}) == 1
        # A maintenance window from 2 s ahead, for 4 s: set through whichever
        # silo hosts the management grain; the owner holds the row.
        begin = datetime.now(UTC).replace(microsecond=0) + 3 * S
        window = (begin, begin + 4 * S)
        change = await mgmt.set_calendar("maint", Calendar(exclude_ranges=[window]))
        assert change.updated == 1
        await wait_for(
            lambda: any(s.due_at is not None and s.due_at >= window[1] for _, _, s in TICKS),
            30,
            what="pulse ticking after the window",
        )
        inside = [s.due_at for _, _, s in TICKS if s.due_at and window[0] <= s.due_at < window[1]]
        assert inside == [], f"ticks inside the excluded window: {inside}"
        [row] = await mgmt.list_for_grain(GrainId("test_schedules.Scheduled", "p"))
        assert row.calendar == "maint" and row.calendar_version == change.version
        # The Berlin payday, described from the row as stored and its calendar.
        await mgmt.set_calendar(
            "de",
            Calendar(tz="Europe/Berlin", exclude_dates=["2026-12-25"], exclude_weekdays=[5, 6]),
        )
        pay = ReminderEntry(
            service_id=service,
            grain_id=row.grain_id,
            name="pay",
            start_at=datetime(2026, 12, 1, tzinfo=UTC),
            next_due=datetime(2026, 12, 1, tzinfo=UTC),
            cron="0 0 9 25 * *",
            tz="Europe/Berlin",
            calendar="de",
            on_excluded=Excluded.PREVIOUS_BUSINESS_DAY,
        )
        fires = next_fire_times(pay, await mgmt.get_calendar("de"), 3, pay.start_at)
        assert [f.at.isoformat() for f in fires] == [
            "2026-12-24T08:00:00+00:00",
            "2027-01-25T08:00:00+00:00",
            "2027-02-25T08:00:00+00:00",
        ]


async def test_a_backfill_goes_on_after_its_silo_is_killed(store: str) -> None:
    service = f"fill-{uuid.uuid4().hex[:8]}"
    async with InProcessCluster(
        store, size=2, options=options(service), membership=FAST_MEMBERSHIP
    ) as cluster:
        client = await cluster.client()
        gid = GrainId("test_schedules.Scheduled", "b")
        await client.get_grain(ScheduledGrain, "b").start("minutely", 60.0)
        end = datetime.now(UTC).replace(microsecond=0)
        start = end - timedelta(minutes=24)
        job = await client.reminders.backfill(gid, "minutely", start, end)
        assert job.total == 24

        def filled() -> list[datetime]:
            return [s.current_tick_time for _, _, s in TICKS if s.backfill]

        def runner() -> int:
            for i, silo in enumerate(cluster.silos):
                svc = silo.reminder_service
                if svc is not None and svc.stats.backfills_running:
                    return i
            return -1

        await wait_for(lambda: len(filled()) >= 6 and runner() >= 0, 60, what="backfill running")
        owner = runner()
        await cluster.kill(owner)
        before = len(filled())
        await wait_for(lambda: len(filled()) >= 24, 90, what="backfill finished by the survivor")
        got = filled()
        # Every slot, in order; only the slot in flight when the owner died may
        # come twice, and none from before it.
        # The slots lie on the reminder's grid (start_at - k minutes), inside the range.
        row = await client.reminders.get(gid, "minutely")
        first = row.start_at - ((row.start_at - start) // timedelta(minutes=1)) * timedelta(
            minutes=1
        )
        assert sorted(set(got)) == [first + i * timedelta(minutes=1) for i in range(24)]
        assert len(got) - len(set(got)) <= 1, got
        assert got[: before - 1] == sorted(got[: before - 1])
        survivor = cluster.silos[1 - owner]
        await wait_for(
            lambda: (
                survivor.reminder_service is not None
                and survivor.reminder_service.stats.backfilled >= 24 - before
            ),
            30,
        )
        assert await client.reminders.backfills() == []
