"""The adaptive reminder service across a real cluster: three silos in one process
over real gRPC, membership, directory and reminder table in a real Redis.

Time is real here, so periods are a few hundred milliseconds and every wait is a
poll with a deadline. Deliveries are recorded by the grain with the address of
the silo that hosts it; the silo that *fired* a tick is told apart by the
services' own ``delivered`` counters.

Every test runs twice: on one Redis and on the 6-node Redis Cluster (3 masters,
a replica each), where the reminder table's shards, the change feed's per-master
pub/sub connections and the membership and directory keys are spread over the
masters. All of them, not a subset: the cluster adds about a second per test.
After each test every connection the silos opened must be closed on every node
of the store (``Store.assert_closed_since``, ``CLIENT LIST``).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    MembershipOptions,
    MissedReminderAction,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.reminders.service import ReminderServiceStats
from orleanspy.reminders.table import FencingReminderTable
from orleanspy.runtime.silo import SiloState
from orleanspy.testing.cluster import InProcessCluster, wait_for
from orleanspy.testing.redis_server import RedisClusterServer, RedisServer

MS = timedelta(milliseconds=1)
TYPE = "test_reminders_cluster.Tick"

MEMBERSHIP = MembershipOptions(
    table_refresh_interval=timedelta(milliseconds=300),
    probe_interval=timedelta(milliseconds=300),
    probe_timeout=timedelta(milliseconds=300),
    num_missed_probes_limit=2,
    i_am_alive_interval=timedelta(seconds=1),
    shutdown_timeout=timedelta(seconds=5),
)
FAST = ReminderOptions(
    look_ahead=timedelta(seconds=2),
    poll_interval=timedelta(seconds=1),
    minimum_period=100 * MS,
    base_bucket_size=256,
    permits=16,
    retry_initial=50 * MS,
    retry_max=500 * MS,
    repair_interval=timedelta(seconds=5),
    adaptive=False,
)


@dataclass(frozen=True, slots=True)
class Delivery:
    key: int
    name: str
    slot: datetime
    missed_ticks: int
    host: str
    at: float  # time.monotonic() when received


DELIVERIES: list[Delivery] = []


class ClusterTickGrain(Grain, Remindable, type_name=TYPE):
    """Records every tick with the silo it runs on."""

    def _host(self) -> str:
        return str(self._activation.silo_address)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        DELIVERIES.append(
            Delivery(
                int(self.grain_key),
                name,
                status.current_tick_time,
                status.missed_ticks,
                self._host(),
                time.monotonic(),
            )
        )

    async def start(self, name: str, period_ms: int, due_ms: int, action: int) -> str:
        await self.register_or_update_reminder(
            name,
            due=due_ms * MS,
            period=period_ms * MS,
            action=MissedReminderAction(action),
        )
        return self._host()

    async def where(self) -> str:
        return self._host()


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    DELIVERIES.clear()
    yield
    DELIVERIES.clear()


Cluster = Callable[..., Awaitable[Silo]]


@dataclass(frozen=True, slots=True)
class Store:
    """Where every silo of a test keeps membership, directory and reminder table."""

    url: str
    server: RedisServer | RedisClusterServer

    def connections(self) -> set[tuple[str, str]]:
        """The client connections open on the store's nodes, as (node, id)."""
        return {(c.get("port", ""), c["id"]) for c in self.server.clients()}

    async def assert_closed_since(self, before: set[tuple[str, str]]) -> None:
        """Every connection opened since ``before`` was taken is closed (the
        server learns of a close a moment later: polled for a few seconds)."""
        deadline = time.monotonic() + 5
        while (left := self.connections() - before) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert left == set(), f"connections left open on {self.url}: {sorted(left)}"
        gc.collect()  # an unclosed connection's ResourceWarning fails the test


@pytest.fixture(params=["redis", "redis_cluster"])
def store(request: pytest.FixtureRequest) -> Store:
    """One Redis, or the session's 6-node Redis Cluster (named by a plain URL to
    one node: cluster mode is detected)."""
    if request.param == "redis":
        return Store(request.getfixturevalue("redis_url"), request.getfixturevalue("redis_server"))
    return Store(
        request.getfixturevalue("redis_cluster_url"), request.getfixturevalue("redis_cluster")
    )


@pytest.fixture
async def cluster(store: Store) -> AsyncIterator[tuple[list[Silo], Cluster]]:
    """``(silos, add)``: ``await add(reminders=...)`` starts one more silo on
    ``store``; every silo still running at the end is stopped, and then no
    connection the silos opened may be left open on any node of the store."""
    template = SiloOptions(
        membership=MEMBERSHIP,
        reminders=FAST,
        grain_types=(ClusterTickGrain,),
    )
    before = store.connections()
    async with InProcessCluster(store.url, size=0, options=template) as silos:

        async def add(reminders: ReminderOptions = FAST) -> Silo:
            return await silos.add(reminders=reminders)

        yield silos.silos, add
    await store.assert_closed_since(before)


def _running(silos: list[Silo]) -> list[Silo]:
    return [s for s in silos if s.state is SiloState.RUNNING]


async def converged(silos: list[Silo], timeout: float = 15.0) -> None:
    """Wait until every running silo's ring holds exactly the running silos."""
    live = _running(silos)
    want = {s.address for s in live}

    async def refresh() -> None:
        for s in live:
            assert s.membership is not None
            await s.membership.refresh()

    async with asyncio.timeout(timeout):
        while True:
            await refresh()
            if all(s.ring is not None and set(s.ring.ring.silos) == want for s in live):
                return
            await asyncio.sleep(0.05)


def owner_of(silos: list[Silo], key: int) -> Silo:
    h = GrainId(TYPE, key).uniform_hash()
    live = _running(silos)
    owners = [s for s in live if s.ring is not None and s.ring.ring.owner(h) == s.address]
    assert len(owners) == 1
    return owners[0]


def slots_by_reminder(since: float = 0.0) -> dict[tuple[int, str], list[datetime]]:
    out: dict[tuple[int, str], list[datetime]] = defaultdict(list)
    for d in DELIVERIES:
        if d.at >= since:
            out[(d.key, d.name)].append(d.slot)
    return out


async def register(silos: list[Silo], keys: range, period_ms: int, action: int = 2) -> None:
    live = _running(silos)
    await asyncio.gather(
        *(
            live[i % len(live)]
            .client.get_grain(ClusterTickGrain, k)
            .start("r", period_ms, 0, action)
            for i, k in enumerate(keys)
        )
    )


def stats(silo: Silo) -> ReminderServiceStats:
    assert silo.reminder_service is not None
    return silo.reminder_service.stats


def delivered(silo: Silo) -> int:
    return stats(silo).delivered


async def test_every_reminder_fires_once_per_slot_on_one_owner(
    cluster: tuple[list[Silo], Cluster],
) -> None:
    silos, add = cluster
    for _ in range(3):
        await add()
    await converged(silos)
    keys = range(30)
    period = 300
    await register(silos, keys, period)

    await wait_for(
        lambda: len(by := slots_by_reminder()) == 30 and all(len(v) >= 5 for v in by.values()),
        timeout=20,
        what="five ticks of each of 30 reminders",
    )
    triples = Counter((d.key, d.name, d.slot) for d in DELIVERIES)
    dupes = {t: n for t, n in triples.items() if n > 1}
    assert dupes == {}
    # No slot skipped: each reminder's slots are consecutive points of its grid.
    for slots in slots_by_reminder().values():
        ordered = sorted(slots)
        gaps = {b - a for a, b in itertools.pairwise(ordered)}
        assert gaps == {period * MS}
    # The work is partitioned: every silo fired some ticks.
    assert all(delivered(s) > 0 for s in silos)
    assert all(stats(s).cas_conflicts == 0 for s in silos)


async def test_ranges_move_on_join_and_graceful_leave_and_reminders_keep_firing(
    cluster: tuple[list[Silo], Cluster],
) -> None:
    silos, add = cluster
    await add()
    await add()
    await converged(silos)
    keys = range(30)
    await register(silos, keys, 300)
    await wait_for(
        lambda: len(by := slots_by_reminder()) == 30 and all(len(v) >= 2 for v in by.values()),
        timeout=15,
        what="ticks of every reminder on two silos",
    )

    newcomer = await add()
    await converged(silos)
    joined = time.monotonic()
    await wait_for(
        lambda: (
            len(by := slots_by_reminder(joined)) == 30 and all(len(v) >= 3 for v in by.values())
        ),
        timeout=15,
        what="every reminder ticking after a silo joined",
    )
    assert newcomer.reminder_service is not None
    assert newcomer.reminder_service.ranges
    assert delivered(newcomer) > 0  # it took over a share of the rows

    leaver = silos[0]
    await leaver.stop()
    await converged(silos)
    left = time.monotonic()
    count_at_leave = delivered(leaver)
    await wait_for(
        lambda: len(by := slots_by_reminder(left)) == 30 and all(len(v) >= 3 for v in by.values()),
        timeout=15,
        what="every reminder ticking after a silo left",
    )
    assert delivered(leaver) == count_at_leave  # a stopped silo fires nothing more
    assert all(d.host != str(leaver.address) for d in DELIVERIES if d.at >= left + 0.5)


async def test_fire_immediately_catches_up_on_new_owner_after_a_crash(
    store: Store, cluster: tuple[list[Silo], Cluster]
) -> None:
    silos, add = cluster
    opts = ReminderOptions(
        look_ahead=timedelta(seconds=2),
        poll_interval=timedelta(seconds=1),
        minimum_period=100 * MS,
        # Slots that pass unowned while the crash is detected are coalesced into
        # one catch-up tick past this grace.
        missed_tick_grace=50 * MS,
        base_bucket_size=256,
        permits=16,
        retry_initial=50 * MS,
        retry_max=300 * MS,
        adaptive=False,
    )
    for _ in range(3):
        await add(opts)
    await converged(silos)
    victim = silos[2]
    # Rows owned by the victim, of grains hosted elsewhere: the test is about the
    # row moving to a new owner, not about re-activating a grain.
    keys: list[int] = []
    for k in range(400):
        if len(keys) == 5:
            break
        if owner_of(silos, k) is not victim:
            continue
        if await silos[0].client.get_grain(ClusterTickGrain, k).where() != str(victim.address):
            keys.append(k)
    assert len(keys) == 5
    for k in keys:
        await (
            silos[0]
            .client.get_grain(ClusterTickGrain, k)
            .start("r", 100, 100, int(MissedReminderAction.FIRE_IMMEDIATELY))
        )
    await wait_for(
        lambda: len(by := slots_by_reminder()) == 5 and all(len(v) >= 2 for v in by.values()),
        timeout=10,
        what="the victim's reminders ticking",
    )

    await victim.abort()
    crashed = time.monotonic()
    await converged(silos, timeout=20)
    # Each survivor fenced the victim's incarnation before it read the rows it
    # took over: the table now refuses that incarnation's schedule writes.
    await wait_for(
        lambda: all(stats(s).fenced >= 1 for s in silos[:2]),
        timeout=10,
        what="the survivors fencing the crashed silo",
    )
    for survivor in silos[:2]:
        assert isinstance(survivor.reminder_table, FencingReminderTable)
        assert survivor.reminder_table.writer == survivor.address
    await wait_for(
        lambda: all(sum(1 for d in DELIVERIES if d.key == k and d.at > crashed) >= 3 for k in keys),
        timeout=10,
        what="every reminder of the crashed owner ticking on its new owner",
    )
    period = 100 * MS
    coalesced = 0
    for k in keys:
        mine = sorted((d for d in DELIVERIES if d.key == k), key=lambda d: d.slot)
        # Every slot is delivered or counted: the gap before a delivery is at most
        # the slots it says it stands for (more when a slot the crashed owner
        # delivered but did not persist comes again: at least once).
        for a, b in itertools.pairwise(mine):
            assert b.slot - a.slot <= period * (1 + b.missed_ticks), (k, a, b)
        # Never a burst: one catch-up at most, standing for every slot it missed.
        catch_ups = [d for d in mine if d.at > crashed and d.missed_ticks]
        assert len(catch_ups) <= 1, catch_ups
        coalesced += len(catch_ups)
    # How many slots passed unowned depends on how fast the crash is detected (a
    # refused connection is strong evidence: often less than one period here).
    print(f"\ncatch-ups coalescing missed slots: {coalesced} of {len(keys)} reminders")
    survivors_missed = sum(stats(s).missed for s in silos[:2])
    assert survivors_missed >= coalesced
    await _assert_fenced(store.url, victim, opts, GrainId(TYPE, keys[0]))


async def _assert_fenced(redis_url: str, victim: Silo, opts: ReminderOptions, gid: GrainId) -> None:
    """The table refuses ``victim``'s schedule writes to ``gid``'s row, and takes
    the same write (same etag) from another incarnation on its endpoint: the
    refusal is the fence, not a stale etag. The row's owner keeps ticking, so a
    write can lose to it; a few tries give the control one that does not."""
    async with AsyncExitStack() as stack:
        tables = []
        later = replace(victim.address, generation=victim.address.generation + 1)
        for writer in (victim.address, later):
            table = RedisReminderTable(
                redis_url, service_id=victim.options.service_id, shards=opts.shards
            )
            table.writer = writer
            await table.start(stack)
            tables.append(table)
        deposed, control = tables
        for _ in range(20):
            row = await deposed.read(gid, "r")
            assert row is not None and row.etag is not None
            args = (gid, "r", row.etag, row.next_due, row.last_fire)
            assert await deposed.update_schedule(*args) is None, "the crashed silo was not fenced"
            if await control.update_schedule(*args) is not None:
                return
        raise AssertionError("no write of the control incarnation won in 20 tries")


async def test_a_row_written_on_another_silo_is_picked_up_from_the_change_feed(
    cluster: tuple[list[Silo], Cluster],
) -> None:
    silos, add = cluster
    slow_poll = ReminderOptions(
        look_ahead=timedelta(seconds=60),
        poll_interval=timedelta(seconds=30),
        minimum_period=100 * MS,
        base_bucket_size=256,
        permits=16,
        adaptive=False,
        # Ranges taken over at the joins are read at once, not half a second
        # later: the refills below are then the last ones.
        handover_delay=timedelta(0),
    )
    for _ in range(3):
        await add(slow_poll)
    await converged(silos)
    # Let the refills caused by the joins finish: from now on only the feed
    # (or the 30 s poll) can bring a new row in.
    for s in silos:
        assert s.reminder_service is not None
        await s.reminder_service.refill_now()

    # A grain hosted on one silo whose reminder row is owned by another.
    chosen: tuple[int, Silo, Silo] | None = None
    for k in range(100):
        host = await silos[k % 3].client.get_grain(ClusterTickGrain, k).where()
        owner = owner_of(silos, k)
        if host != str(owner.address):
            chosen = (k, next(s for s in silos if str(s.address) == host), owner)
            break
    assert chosen is not None
    key, host_silo, owner = chosen
    refills = [stats(s).refills for s in silos]

    started = time.monotonic()
    await host_silo.client.get_grain(ClusterTickGrain, key).start("feed", 5000, 500, 2)
    await wait_for(lambda: any(d.key == key for d in DELIVERIES), timeout=5, what="the first tick")
    first = next(d for d in DELIVERIES if d.key == key)
    assert first.at - started < 3.0
    assert first.missed_ticks == 0
    # The grain records the tick during the call; the owner counts it when the
    # call returns, a moment later.
    await wait_for(lambda: delivered(owner) == 1, timeout=5, what="the owner counting the tick")
    assert all(delivered(s) == 0 for s in silos if s is not owner)
    # No refill ran: the owner learnt of the row from the change feed alone.
    assert [stats(s).refills for s in silos] == refills


async def test_silos_stopping_while_the_ring_changes_leave_no_connection_open(
    store: Store, cluster: tuple[list[Silo], Cluster]
) -> None:
    """Each stop changes the survivors' rings, so their change feeds re-subscribe
    (on a cluster: open pub/sub connections per master) while the next silo
    stops: a graceful stop and a crash at once, then the last silo. Whatever a
    stopped silo opened is closed, on every node of the store."""
    silos, add = cluster
    before = store.connections()
    for _ in range(3):
        await add()
    await converged(silos)
    await register(silos, range(30), 300)
    await wait_for(
        lambda: len(slots_by_reminder()) == 30, timeout=15, what="every reminder ticking"
    )
    await asyncio.gather(silos[0].stop(), silos[1].abort())
    await silos[2].stop()
    await store.assert_closed_since(before)
