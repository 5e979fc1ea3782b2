"""The membership service: join, heartbeat, probes, votes, death, graceful leave.

In-memory table, ``ManualClock`` and a fake network of ping callables, so the
protocol runs minutes of cluster time in milliseconds; one test runs it over
Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import pytest

from orleanspy.errors import SiloDeclaredDeadError, StorageUnavailableError
from orleanspy.identity import SiloAddress
from orleanspy.membership.health import ProbeOutcome, probe_targets, votes_needed
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, SiloStatus, TableVersion
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.membership.service import MembershipService
from orleanspy.membership.table import MembershipTable
from orleanspy.options import MembershipOptions
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.membership_table import make_entry

OPTS = MembershipOptions(
    probe_interval=timedelta(seconds=1),
    probe_timeout=timedelta(milliseconds=500),
    num_missed_probes_limit=3,
    num_votes_for_death_declaration=2,
    death_vote_expiration=timedelta(seconds=60),
    i_am_alive_interval=timedelta(seconds=5),
    table_refresh_interval=timedelta(seconds=10),
    i_am_alive_staleness=timedelta(minutes=5),
    defunct_silo_expiration=timedelta(hours=1),
    defunct_silo_cleanup_interval=timedelta(minutes=10),
    shutdown_timeout=timedelta(seconds=5),
)


@dataclass
class Net:
    """Who can reach whom: crashed silos answer nobody (``refused``: their port
    refuses the connection); cut links fail one way."""

    down: set[SiloAddress] = field(default_factory=set)
    cut: set[tuple[SiloAddress, SiloAddress]] = field(default_factory=set)
    refused: set[SiloAddress] = field(default_factory=set)
    timeout: float = OPTS.probe_timeout.total_seconds()

    def ping_from(
        self, src: SiloAddress
    ) -> Callable[[SiloAddress, float], asyncio.Future[bool | ProbeOutcome]]:
        async def ping(dst: SiloAddress, timeout: float) -> bool | ProbeOutcome:
            assert timeout == self.timeout
            if dst in self.refused and (src, dst) not in self.cut:
                return ProbeOutcome.REFUSED
            return dst not in self.down and (src, dst) not in self.cut

        return ping  # type: ignore[return-value]

    def gossip_from(
        self, src: SiloAddress, nodes: list[Node]
    ) -> Callable[[SiloAddress, int], asyncio.Future[bool]]:
        async def gossip(dst: SiloAddress, version: int) -> bool:
            if dst in self.down or (src, dst) in self.cut:
                raise ConnectionError(f"{dst} unreachable")
            for node in nodes:
                if node.address == dst:
                    node.service.gossip_received(version)
            return True

        return gossip  # type: ignore[return-value]


@dataclass
class Node:
    service: MembershipService
    stack: AsyncExitStack
    dead_calls: list[SiloAddress]

    @property
    def address(self) -> SiloAddress:
        return self.service.address

    async def crash(self) -> None:
        """Stop the loops without leaving: peers must find out by probing."""
        await self.stack.aclose()


class Cluster:
    def __init__(
        self,
        table: MembershipTable,
        clock: ManualClock,
        options: MembershipOptions,
        *,
        gossip: bool = False,
    ):
        self.table, self.clock, self.options = table, clock, options
        self.net = Net(timeout=options.probe_timeout.total_seconds())
        self.nodes: list[Node] = []
        self.gossip = gossip

    def make(self, port: int, table: MembershipTable | None = None) -> Node:
        address = SiloAddress("127.0.0.1", port, 1)
        calls: list[SiloAddress] = []
        service = MembershipService(
            table or self.table,
            address=address,
            name=f"silo-{port}",
            gateway_port=port + 1000,
            ping=self.net.ping_from(address),
            clock=self.clock,
            options=self.options,
            on_declared_dead=lambda: calls.append(address),
            gossip=self.net.gossip_from(address, self.nodes) if self.gossip else None,
        )
        node = Node(service, AsyncExitStack(), calls)
        self.nodes.append(node)
        return node

    async def join(self, port: int, table: MembershipTable | None = None) -> Node:
        node = self.make(port, table)
        await node.service.start(node.stack)
        return node

    async def join_all(self, *ports: int) -> list[Node]:
        """Join silos one by one, then let every silo read the table once (without
        gossip, earlier silos would learn of later ones on their next table
        refresh)."""
        nodes = [await self.join(p) for p in ports]
        for node in nodes:
            await node.service.refresh()
        return nodes

    async def aclose(self) -> None:
        for node in self.nodes:
            await node.stack.aclose()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster(InMemoryMembershipTable(), ManualClock(), OPTS)
    try:
        yield c
    finally:
        await c.aclose()


async def status_of(table: MembershipTable, node: Node) -> SiloStatus | None:
    return (await table.read_all()).status(node.address)


async def voters(table: MembershipTable, node: Node) -> set[SiloAddress]:
    entry = (await table.read_all()).get(node.address)
    assert entry is not None
    return {v for v, _ in entry.suspect_times}


async def test_three_silos_join_and_all_see_three_active(cluster: Cluster) -> None:
    a, b, c = await cluster.join_all(1, 2, 3)
    await cluster.clock.advance(OPTS.table_refresh_interval)
    everyone = tuple(sorted(n.address for n in (a, b, c)))
    for node in (a, b, c):
        assert node.service.active_silos() == everyone
        assert node.service.status == SiloStatus.ACTIVE
    snap = await cluster.table.read_all()
    assert snap.gateways() == [("127.0.0.1", 1001), ("127.0.0.1", 1002), ("127.0.0.1", 1003)]
    # Each join is an insert (Joining) and an update (Active): two versions per silo.
    assert snap.version.version == 6


async def test_concurrent_joins_all_land_despite_version_races(cluster: Cluster) -> None:
    nodes = [cluster.make(p) for p in range(1, 9)]
    await asyncio.gather(*(n.service.start(n.stack) for n in nodes))
    snap = await cluster.table.read_all()
    assert len(snap.active_silos()) == 8
    assert snap.version.version == 16


async def test_crashed_silo_is_declared_dead_by_two_voters(cluster: Cluster) -> None:
    a, b, c = await cluster.join_all(1, 2, 3)
    await c.crash()
    cluster.net.down.add(c.address)

    await cluster.clock.advance(2.5)  # two missed probes: below the limit
    assert await status_of(cluster.table, c) == SiloStatus.ACTIVE
    assert await voters(cluster.table, c) == set()

    await cluster.clock.advance(1)  # the third miss: both vote, the second kills
    assert await status_of(cluster.table, c) == SiloStatus.DEAD
    assert await voters(cluster.table, c) == {a.address, b.address}
    await cluster.clock.advance(OPTS.table_refresh_interval)
    for node in (a, b):
        assert node.service.active_silos() == (a.address, b.address)
        assert node.service.snapshot.status(c.address) == SiloStatus.DEAD
    assert a.dead_calls == b.dead_calls == c.dead_calls == []


async def test_one_vote_is_not_enough_among_three_active(cluster: Cluster) -> None:
    a, _b, c = await cluster.join_all(1, 2, 3)
    cluster.net.cut.add((a.address, c.address))  # only a loses sight of c
    await cluster.clock.advance(10)
    assert await status_of(cluster.table, c) == SiloStatus.ACTIVE
    assert await voters(cluster.table, c) == {a.address}
    assert a.service.health.missed[c.address] >= OPTS.num_missed_probes_limit


async def test_one_vote_suffices_when_two_silos_are_active(cluster: Cluster) -> None:
    a, b = await cluster.join_all(1, 2)
    await b.crash()
    cluster.net.down.add(b.address)
    await cluster.clock.advance(3.5)
    assert await status_of(cluster.table, b) == SiloStatus.DEAD
    assert await voters(cluster.table, b) == {a.address}
    assert a.service.active_silos() == (a.address,)


async def test_expired_votes_do_not_count(cluster: Cluster) -> None:
    a, b, c = await cluster.join_all(1, 2, 3)
    cluster.net.cut.add((b.address, c.address))
    await cluster.clock.advance(3.5)
    assert await voters(cluster.table, c) == {b.address}
    cluster.net.cut.clear()
    await cluster.clock.advance(OPTS.death_vote_expiration)  # b's vote ages out

    cluster.net.cut.add((a.address, c.address))
    await cluster.clock.advance(3.5)
    assert await status_of(cluster.table, c) == SiloStatus.ACTIVE
    assert await voters(cluster.table, c) == {a.address}  # the stale vote was dropped

    # Control: a fresh second vote does kill.
    cluster.net.cut.add((b.address, c.address))
    await cluster.clock.advance(3.5)
    assert await status_of(cluster.table, c) == SiloStatus.DEAD


async def test_suspect_with_stale_heartbeat_is_declared_dead_by_one_voter() -> None:
    options = replace(OPTS, i_am_alive_staleness=timedelta(seconds=30))
    cluster = Cluster(InMemoryMembershipTable(), ManualClock(), options)
    try:
        # Five silos: even with the stale one left out of the count, two votes
        # would be needed; the stale heartbeat is what lets one vote suffice.
        a, *_, e = await cluster.join_all(1, 2, 3, 4, 5)
        await e.crash()  # no more heartbeats, but the others' pings still get answers
        cluster.net.cut.add((a.address, e.address))
        await cluster.clock.advance(20)
        assert await status_of(cluster.table, e) == SiloStatus.ACTIVE
        assert await voters(cluster.table, e) == {a.address}
        await cluster.clock.advance(15)
        assert await status_of(cluster.table, e) == SiloStatus.DEAD
        assert await voters(cluster.table, e) == {a.address}
    finally:
        await cluster.aclose()


async def test_silo_that_reads_itself_dead_calls_on_declared_dead_once(cluster: Cluster) -> None:
    a, b = await cluster.join_all(1, 2)
    snap = await cluster.table.read_all()
    row, etag = snap.get(a.address), snap.etag(a.address)
    assert row is not None and etag is not None
    killed = row.with_status(SiloStatus.DEAD)
    assert await cluster.table.update_row(killed, etag, snap.version.next())

    await cluster.clock.advance(OPTS.table_refresh_interval)
    assert a.dead_calls == [a.address]
    assert a.service.declared_dead
    assert b.dead_calls == []
    when_found = (await cluster.table.read_all()).get(a.address)
    await cluster.clock.advance(OPTS.table_refresh_interval * 3)
    assert a.dead_calls == [a.address]
    # Its loops stopped: no heartbeat since it found itself dead.
    after = (await cluster.table.read_all()).get(a.address)
    assert after is not None and when_found is not None
    assert after.i_am_alive == when_found.i_am_alive
    assert await a.service.shutdown() is False


async def test_restart_of_a_dead_silo_run_is_refused(cluster: Cluster) -> None:
    a = await cluster.join(1)
    assert await a.service.shutdown()
    again = cluster.make(1)
    with pytest.raises(SiloDeclaredDeadError):
        await again.service.start(again.stack)


class RecordingTable(InMemoryMembershipTable):
    """Records the status of every successful row write, per silo."""

    def __init__(self) -> None:
        super().__init__()
        self.written: dict[SiloAddress, list[SiloStatus]] = {}
        self.gate: asyncio.Event | None = None
        self.blocked = asyncio.Event()

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        ok = await super().insert_row(entry, version)
        if ok:
            self.written.setdefault(entry.silo, []).append(entry.status)
        return ok

    async def update_row(self, entry: MembershipEntry, etag: str, version: TableVersion) -> bool:
        if self.gate is not None:
            self.blocked.set()
            await self.gate.wait()
        ok = await super().update_row(entry, etag, version)
        if ok:
            self.written.setdefault(entry.silo, []).append(entry.status)
        return ok


async def test_graceful_shutdown_writes_shutting_down_then_dead() -> None:
    table = RecordingTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        a, b, c = await cluster.join_all(1, 2, 3)
        assert await c.service.shutdown() is True
        assert table.written[c.address] == [
            SiloStatus.JOINING,
            SiloStatus.ACTIVE,
            SiloStatus.SHUTTING_DOWN,
            SiloStatus.DEAD,
        ]
        cluster.net.down.add(c.address)
        await cluster.clock.advance(OPTS.table_refresh_interval)
        for node in (a, b):
            assert node.service.snapshot.status(c.address) == SiloStatus.DEAD
            assert node.service.active_silos() == (a.address, b.address)
        assert await voters(table, c) == set()  # nobody had to vote it out
        assert c.dead_calls == []
        assert not c.service.declared_dead
    finally:
        await cluster.aclose()


async def test_shutdown_finishes_its_writes_when_cancelled() -> None:
    table = RecordingTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        a = await cluster.join(1)
        table.gate = asyncio.Event()
        leaving = asyncio.create_task(a.service.shutdown())
        await asyncio.wait_for(table.blocked.wait(), 5)
        leaving.cancel()
        await asyncio.sleep(0)
        table.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert await status_of(table, a) == SiloStatus.DEAD
    finally:
        await cluster.aclose()


async def test_listeners_see_every_new_version_in_order(cluster: Cluster) -> None:
    a = cluster.make(1)
    seen: list[int] = []
    a.service.add_listener(lambda s: seen.append(s.version.version))
    await a.service.start(a.stack)
    b = await cluster.join(2)
    c = await cluster.join(3)
    for node in (a, b):
        await node.service.refresh()
    await c.crash()
    cluster.net.down.add(c.address)
    await cluster.clock.advance(OPTS.table_refresh_interval)
    assert await status_of(cluster.table, c) == SiloStatus.DEAD
    assert seen == sorted(set(seen))  # strictly increasing
    assert seen[-1] == (await cluster.table.read_all()).version.version
    assert seen[:3] == [0, 1, 2]  # the empty table, then a's own join write by write

    late: list[MembershipSnapshot] = []
    remove = b.service.add_listener(late.append)
    assert [s.version for s in late] == [b.service.snapshot.version]
    remove()
    await b.service.shutdown()
    await a.service.refresh()
    assert len(late) == 1


async def test_listener_exception_does_not_stop_publishing(cluster: Cluster) -> None:
    a = cluster.make(1)
    seen: list[int] = []

    def broken(_: MembershipSnapshot) -> None:
        raise RuntimeError("listener bug")

    a.service.add_listener(broken)
    a.service.add_listener(lambda s: seen.append(s.version.version))
    await a.service.start(a.stack)
    assert seen == [0, 1, 2]


class FlakyTable(InMemoryMembershipTable):
    """Fails every call with StorageUnavailableError while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failures = 0

    def _check(self) -> None:
        if self.down:
            self.failures += 1
            raise StorageUnavailableError("table down (test)")

    async def read_all(self) -> MembershipSnapshot:
        self._check()
        return await super().read_all()

    async def update_i_am_alive(self, silo: SiloAddress, at: datetime) -> None:
        self._check()
        await super().update_i_am_alive(silo, at)

    async def delete_dead_before(self, cutoff: datetime) -> int:
        self._check()
        return await super().delete_dead_before(cutoff)


async def test_loops_survive_a_storage_outage() -> None:
    table = FlakyTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        a, b = await cluster.join_all(1, 2)
        await b.crash()
        cluster.net.down.add(b.address)
        table.down = True
        await cluster.clock.advance(OPTS.defunct_silo_cleanup_interval)
        assert table.failures > 10  # heartbeats, refreshes, votes and a cleanup all failed
        table.down = False
        assert await status_of(table, b) == SiloStatus.ACTIVE  # no vote got through
        await cluster.clock.advance(OPTS.i_am_alive_interval)
        row = (await table.read_all()).get(a.address)
        assert row is not None and row.i_am_alive == cluster.clock.now()
        assert await status_of(table, b) == SiloStatus.DEAD  # probing resumed and voted
    finally:
        await cluster.aclose()


async def test_old_dead_rows_are_swept(cluster: Cluster) -> None:
    a = await cluster.join(1)
    snap = await cluster.table.read_all()
    ghost = make_entry(9, SiloStatus.DEAD, at=cluster.clock.now() - timedelta(hours=2))
    recent = make_entry(8, SiloStatus.DEAD, at=cluster.clock.now())
    assert await cluster.table.insert_row(ghost, snap.version.next())
    snap = await cluster.table.read_all()
    assert await cluster.table.insert_row(recent, snap.version.next())
    await cluster.clock.advance(OPTS.defunct_silo_cleanup_interval)
    left = set((await cluster.table.read_all()).entries)
    assert left == {a.address, recent.silo}


def test_probe_targets_are_ring_successors_and_spread_evenly() -> None:
    now = datetime(2030, 1, 1).astimezone()
    rows = [make_entry(100 + i, SiloStatus.ACTIVE, at=now) for i in range(6)]
    rows.append(make_entry(200, SiloStatus.JOINING, at=now))  # not probed until Active
    snap = MembershipSnapshot({r.silo: (r, "1") for r in rows}, TableVersion(1, "1"))
    silos = [r.silo for r in rows[:6]]
    ring = sorted(silos, key=lambda s: s.uniform_hash())
    watched_by = dict.fromkeys(silos, 0)
    for i, me in enumerate(ring):
        targets = probe_targets(snap, me, 2)
        assert targets == [ring[(i + 1) % 6], ring[(i + 2) % 6]]
        for t in targets:
            watched_by[t] += 1
    assert set(watched_by.values()) == {2}
    assert len(probe_targets(snap, ring[0], 10)) == 5  # never itself


def test_votes_needed_follows_orleans_rule() -> None:
    now = datetime(2030, 1, 1).astimezone()

    def snap(active: int, stale: int = 0) -> MembershipSnapshot:
        rows = [make_entry(p, SiloStatus.ACTIVE, at=now) for p in range(active)]
        rows += [
            make_entry(100 + p, SiloStatus.ACTIVE, at=now - timedelta(hours=1))
            for p in range(stale)
        ]
        rows.append(make_entry(999, SiloStatus.DEAD, at=now))
        return MembershipSnapshot({r.silo: (r, "1") for r in rows}, TableVersion(1, "1"))

    three = replace(OPTS, num_votes_for_death_declaration=3)
    assert [votes_needed(snap(n), now, OPTS) for n in (1, 2, 3, 4, 5, 9)] == [1, 1, 2, 2, 2, 2]
    assert [votes_needed(snap(n), now, three) for n in (3, 4, 5, 9)] == [2, 2, 3, 3]
    assert votes_needed(snap(2, stale=3), now, OPTS) == 1  # stale silos do not count


async def advance_until(
    clock: ManualClock, step: float, condition: Callable[[], object], *, real_limit: float = 10
) -> None:
    """Advance ``clock`` by ``step`` until ``condition()`` (awaited) holds; real I/O
    needs real time between steps, bounded by ``real_limit`` seconds."""
    deadline = time.monotonic() + real_limit
    while not await condition():  # type: ignore[misc]
        assert time.monotonic() < deadline, "condition not reached in time"
        await clock.advance(step)
        await asyncio.sleep(0.01)


async def test_redis_two_silos_join_and_a_crashed_one_is_declared_dead(redis_url: str) -> None:
    clock = ManualClock()

    def table() -> RedisMembershipTable:
        return RedisMembershipTable(redis_url, cluster_id="c1", service_id="svc")

    # Each silo has its own table object and client, as separate processes would.
    ta, tb = table(), table()
    async with AsyncExitStack() as tables:
        await ta.start(tables)
        await tb.start(tables)
        cluster = Cluster(ta, clock, OPTS)
        try:
            a = await cluster.join(1)
            b = await cluster.join(2, tb)
            everyone = (a.address, b.address)
            assert (await a.service.refresh()).active_silos() == everyone
            assert (await b.service.refresh()).active_silos() == everyone

            await b.crash()
            cluster.net.down.add(b.address)

            async def b_is_dead() -> bool:
                return await status_of(ta, b) == SiloStatus.DEAD

            await advance_until(clock, 1, b_is_dead)
            assert await voters(ta, b) == {a.address}
            await a.service.refresh()
            assert a.service.active_silos() == (a.address,)
        finally:
            await cluster.aclose()


class CountingTable(InMemoryMembershipTable):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read_all(self) -> MembershipSnapshot:
        self.reads += 1
        return await super().read_all()


async def settle(predicate: Callable[[], bool]) -> None:
    """Let background tasks run (gossip and the reads it causes need no clock
    time) until ``predicate`` holds; fail after 2 s of real time."""
    async with asyncio.timeout(2):
        while not predicate():
            await asyncio.sleep(0.001)


async def test_gossip_spreads_joins_leaves_and_deaths_without_periodic_reads() -> None:
    cluster = Cluster(InMemoryMembershipTable(), ManualClock(), OPTS, gossip=True)
    try:
        # No join_all, and the clock never reaches a refresh: only gossip tells.
        start = cluster.clock.now()
        a = await cluster.join(1)
        b = await cluster.join(2)
        c = await cluster.join(3)
        everyone = (a.address, b.address, c.address)
        await settle(lambda: all(n.service.active_silos() == everyone for n in (a, b, c)))

        assert await c.service.shutdown() is True
        await settle(lambda: all(n.service.active_silos() == everyone[:2] for n in (a, b)))

        d = await cluster.join(4)
        await settle(lambda: a.service.snapshot.status(d.address) == SiloStatus.ACTIVE)
        await d.crash()
        cluster.net.down.add(d.address)
        # a and b each vote d out; the second vote declares it Dead, and the
        # first voter hears of that by gossip (the clock stands still now, so
        # no probe round or refresh of its own can tell it).
        for _ in range(OPTS.num_missed_probes_limit):
            await cluster.clock.advance(OPTS.probe_interval)
        await settle(
            lambda: all(n.service.snapshot.status(d.address) == SiloStatus.DEAD for n in (a, b))
        )
        assert cluster.clock.now() - start < OPTS.table_refresh_interval
    finally:
        await cluster.aclose()


async def test_gossip_about_a_version_already_seen_reads_nothing() -> None:
    table = CountingTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        (a,) = await cluster.join_all(1)
        seen = a.service.snapshot.version.version
        reads = table.reads

        a.service.gossip_received(seen)
        a.service.gossip_received(seen - 1)
        await asyncio.sleep(0.01)
        assert table.reads == reads

        # A burst of news while one read runs costs one more read, not five.
        for _ in range(5):
            a.service.gossip_received(seen + 1)
        await asyncio.sleep(0.01)
        assert reads + 1 <= table.reads <= reads + 2
    finally:
        await cluster.aclose()
