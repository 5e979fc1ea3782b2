"""Dead letters and replay through a cluster of two silos on real stores: Redis,
a Redis Cluster, and PostgreSQL (for the reminder table; membership on Redis).
A client calls the management grain through a gateway, so the letters, their
pages and the counters cross the wire; real time, every wait a poll."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest

from orleanspy import (
    Grain,
    MembershipOptions,
    Remindable,
    ReminderError,
    ReminderOptions,
    SiloOptions,
    TickStatus,
)
from orleanspy.client import ClusterClient
from orleanspy.testing import InProcessCluster, wait_for

pytestmark = pytest.mark.timeout(90)

MS = timedelta(milliseconds=1)
TYPE = "test_dead_letters_stores.Flaky"
#: (key, reminder, occurrence id) of every run.
RUNS: list[tuple[str, str, str]] = []
FAILING: set[str] = set()


class StoreFlakyGrain(Grain, Remindable, type_name=TYPE):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        key = str(self.grain_key)
        RUNS.append((key, name, status.occurrence_id))
        if key in FAILING:
            raise ValueError(f"{key} refuses {name}")

    async def once(self) -> None:
        await self.register_or_update_reminder("once", due=200 * MS)

    async def beat(self) -> None:
        await self.register_or_update_reminder("beat", period=300 * MS)

    async def stop(self) -> None:
        await self.unregister_reminder("beat")


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    RUNS.clear()
    FAILING.clear()
    yield
    RUNS.clear()
    FAILING.clear()


OPTIONS = SiloOptions(
    grain_types=(StoreFlakyGrain,),
    allow_client_management=True,
    membership=MembershipOptions(
        table_refresh_interval=timedelta(milliseconds=300),
        probe_interval=timedelta(milliseconds=300),
        probe_timeout=timedelta(milliseconds=300),
        i_am_alive_interval=timedelta(milliseconds=500),
    ),
    reminders=ReminderOptions(
        look_ahead=timedelta(seconds=6),
        poll_interval=timedelta(seconds=1),
        minimum_period=100 * MS,
        adaptive=False,
    ),
)


@pytest.fixture(params=["redis", "redis_cluster", "postgres"])
def store(request: pytest.FixtureRequest) -> tuple[str, SiloOptions]:
    """The membership URL and the silos' options of each store (fixtures that
    start servers are set up here, outside the event loop)."""
    if request.param == "postgres":
        tables = request.getfixturevalue("postgres_url")
        options = dataclasses.replace(OPTIONS, reminder_table_url=tables)
        return request.getfixturevalue("redis_url"), options
    return request.getfixturevalue(f"{request.param}_url"), OPTIONS


@pytest.fixture
async def client(store: tuple[str, SiloOptions]) -> AsyncIterator[ClusterClient]:
    url, options = store
    async with InProcessCluster(url, size=2, options=options) as cluster:
        yield await cluster.client()


async def test_dead_letters_replay_and_discard_through_a_gateway(client: ClusterClient) -> None:
    mgmt = client.reminders
    FAILING.update({"a", "b"})
    await client.get_grain(StoreFlakyGrain, "a").once()
    await client.get_grain(StoreFlakyGrain, "b").beat()

    async def letters(n: int) -> bool:
        return int(await mgmt.count_dead_letters()) >= n

    await wait_for(lambda: letters(3), 20, what="three dead letters")
    await client.get_grain(StoreFlakyGrain, "b").stop()
    page = await mgmt.dead_letters((StoreFlakyGrain, "a"))
    [once] = page.letters
    assert (once.name, once.final, once.error_type) == ("once", True, "ValueError")
    assert once.message == "a refuses once" and "refuses once" in once.traceback
    assert once.id in {o for k, n, o in RUNS if (k, n) == ("a", "once")}

    # Pages, newest first, every letter once.
    seen, cursor = [], None
    while True:
        part = await mgmt.dead_letters(limit=1, cursor=cursor)
        seen += part.letters
        if (cursor := part.cursor) is None:
            break
    assert len(seen) == len({d.id for d in seen}) == int(await mgmt.count_dead_letters())
    assert [d.at for d in seen] == sorted((d.at for d in seen), reverse=True)

    # The row's counters: every failure, each slot dead-lettered.
    beat_letters = [d for d in seen if d.name == "beat"]

    async def counted() -> bool:
        try:
            c = await mgmt.counters((StoreFlakyGrain, "b"), "beat")
        except ReminderError:  # unregistered: its counters went with it
            return True
        return c.failed >= len(beat_letters)

    await wait_for(counted, 10, what="counters")

    # Replay: delivered again as its slot, same occurrence id; removed on success.
    FAILING.discard("a")
    status = await mgmt.replay(once.id)
    assert (status.current_tick_time, status.attempt, status.final) == (once.slot, 2, True)
    assert RUNS[-1] == ("a", "once", once.id)
    with pytest.raises(ReminderError, match="no dead letter"):
        await mgmt.dead_letter(once.id)
    # A replay that fails again keeps the letter, one attempt more.
    first = beat_letters[-1]
    with pytest.raises(ValueError, match="b refuses beat"):
        await mgmt.replay(first.id)
    kept = await mgmt.dead_letter(first.id)
    assert kept.attempts == first.attempts + 1
    # Discard removes without delivering; unknown ids are refused, nothing changes.
    runs = len(RUNS)
    before = int(await mgmt.count_dead_letters())
    assert (await mgmt.discard(first.id)).id == first.id
    assert len(RUNS) == runs
    assert int(await mgmt.count_dead_letters()) == before - 1
    with pytest.raises(ReminderError, match="no dead letter"):
        await mgmt.discard(first.id)
    assert int(await mgmt.count_dead_letters()) == before - 1
