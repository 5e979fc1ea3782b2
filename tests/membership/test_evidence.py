"""Death needs evidence, death is final, ownership is a lease, a lost store is noticed.

The in-memory cluster of ``test_service`` (``ManualClock``, a fake network of
ping callables): a refused connection votes at once, an isolated silo suspects
itself instead of voting, the lease lapses only without table and peers, and a
table that lost this silo's row or went back in version stops the silo.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from orleanspy.errors import StorageUnavailableError
from orleanspy.membership.lease import ContactLease, LeaseLapsedError, guard, lease_duration
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.membership.model import INITIAL_VERSION, MembershipSnapshot, SiloStatus
from orleanspy.options import MembershipOptions
from orleanspy.testing.clock import ManualClock
from tests.membership.test_service import OPTS, Cluster, status_of, voters


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster(InMemoryMembershipTable(), ManualClock(), OPTS)
    try:
        yield c
    finally:
        await c.aclose()


# -- evidence ------------------------------------------------------------------------


async def test_a_refused_connection_gets_the_silo_declared_dead_in_one_round(
    cluster: Cluster,
) -> None:
    a, b, c = await cluster.join_all(1, 2, 3)
    await c.crash()
    cluster.net.refused.add(c.address)
    await cluster.clock.advance(OPTS.probe_interval)
    # One round, not num_missed_probes_limit (3) of them: both survivors voted.
    assert await status_of(cluster.table, c) == SiloStatus.DEAD
    assert await voters(cluster.table, c) == {a.address, b.address}


async def test_silence_keeps_the_miss_rule(cluster: Cluster) -> None:
    _a, _b, c = await cluster.join_all(1, 2, 3)
    await c.crash()
    cluster.net.down.add(c.address)
    await cluster.clock.advance(OPTS.probe_interval * 2)
    assert await status_of(cluster.table, c) == SiloStatus.ACTIVE


async def test_a_silo_no_peer_answers_suspects_itself_and_votes_no_one_dead(
    cluster: Cluster,
) -> None:
    """The isolated silo is the one declared Dead, and it never voted: its own
    probes went unanswered for longer than probe_timeout x missed-probe limit."""
    nodes = await cluster.join_all(1, 2, 3, 4)
    isolated, others = nodes[0], nodes[1:]
    for other in others:
        cluster.net.cut |= {(isolated.address, other.address), (other.address, isolated.address)}
    for _ in range(8):
        await cluster.clock.advance(OPTS.probe_interval)
    assert await status_of(cluster.table, isolated) == SiloStatus.DEAD
    for other in others:
        assert await status_of(cluster.table, other) == SiloStatus.ACTIVE
        assert isolated.address not in await voters(cluster.table, other)
    assert isolated.service.health.self_suspected
    assert isolated.service.health.votes_withheld > 0
    # It still reaches the table: its next read tells it.
    await cluster.clock.advance(OPTS.table_refresh_interval)
    assert isolated.dead_calls == [isolated.address]


async def test_with_a_single_peer_a_silent_one_is_still_evicted(cluster: Cluster) -> None:
    """Self-suspicion needs two or more peers: a two-silo cluster must still evict."""
    a, b = await cluster.join_all(1, 2)
    await b.crash()
    cluster.net.down.add(b.address)
    for _ in range(4):
        await cluster.clock.advance(OPTS.probe_interval)
    assert await status_of(cluster.table, b) == SiloStatus.DEAD
    assert not a.service.health.self_suspected


# -- death is final ------------------------------------------------------------------


async def test_a_dead_verdict_revokes_the_lease_at_once(cluster: Cluster) -> None:
    a, b, c = await cluster.join_all(1, 2, 3)
    assert c.service.lease.held()
    cluster.net.refused.add(c.address)  # its peers think it gone; it still reads the table
    await cluster.clock.advance(OPTS.probe_interval)
    assert await status_of(cluster.table, c) == SiloStatus.DEAD
    await cluster.clock.advance(OPTS.table_refresh_interval)
    assert c.dead_calls == [c.address]
    assert not c.service.lease.held()
    assert c.service.lease.revoked is not None
    assert c.service.stop_reason == "declared Dead in the membership table"
    # A revoked lease stays revoked, whatever the table says next.
    c.service.lease.table_reached()
    assert not c.service.lease.held()
    assert a.service.lease.held() and b.service.lease.held()


# -- the lease -----------------------------------------------------------------------


def test_lease_duration_is_the_soonest_peers_can_vote() -> None:
    options = MembershipOptions()
    assert lease_duration(options) == timedelta(seconds=3)
    assert lease_duration(OPTS) == OPTS.probe_interval * OPTS.num_missed_probes_limit


async def test_lease_lapses_without_contact_and_only_a_table_read_restores_it() -> None:
    clock = ManualClock()
    peers = True
    lease = ContactLease(clock, timedelta(seconds=3), has_peers=lambda: peers)
    await clock.advance(2.9)
    assert lease.held()
    lease.peer_reached()
    await clock.advance(2.9)
    assert lease.held()  # renewed by the peer
    await clock.advance(0.2)
    assert not lease.held()
    lease.peer_reached()
    assert not lease.held()  # a peer cannot say the table did not declare us Dead
    lease.table_reached()
    assert lease.held()
    assert lease.lapses == 1
    # Alone in the table, nobody could take over: the lease holds without contact.
    peers = False
    await clock.advance(60)
    assert lease.held()


async def test_guard_holds_a_tick_while_the_lease_is_lapsed() -> None:
    clock = ManualClock()
    lease = ContactLease(clock, timedelta(seconds=1), has_peers=lambda: True)
    calls: list[str] = []

    async def deliver(name: str) -> None:
        calls.append(name)

    guarded = guard(deliver, lease)
    await guarded("on time")
    await clock.advance(2)
    waiting = asyncio.ensure_future(guarded("late"))
    await clock.settle()
    assert not waiting.done() and calls == ["on time"]
    lease.table_reached()
    # Regained: the waiting tick is not delivered as it was planned; it is retried.
    with pytest.raises(LeaseLapsedError):
        await waiting
    await guarded("retried")
    assert calls == ["on time", "retried"]


class OutageTable(InMemoryMembershipTable):
    """An in-memory table whose every operation fails while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StorageUnavailableError("store down")

    async def read_all(self) -> MembershipSnapshot:
        self._check()
        return await super().read_all()

    async def update_i_am_alive(self, silo: object, at: datetime) -> None:
        self._check()
        await super().update_i_am_alive(silo, at)  # type: ignore[arg-type]


async def test_a_storage_outage_keeps_every_lease_while_peers_answer() -> None:
    table = OutageTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        nodes = await cluster.join_all(1, 2, 3)
        table.down = True
        for _ in range(10):
            await cluster.clock.advance(OPTS.probe_interval)
        assert all(n.service.lease.held() for n in nodes)
    finally:
        table.down = False
        await cluster.aclose()


async def test_a_silo_cut_from_table_and_peers_loses_its_lease_until_it_reads_the_table() -> None:
    table = OutageTable()
    cluster = Cluster(table, ManualClock(), OPTS)
    try:
        nodes = await cluster.join_all(1, 2, 3)
        isolated = nodes[0]
        # Its own view of the store fails; its links to the peers are cut.
        mine = OutageTable()
        mine._rows, mine._version = table._rows, table._version
        isolated.service._table = mine
        isolated.service.health._table = mine
        mine.down = True
        for other in nodes[1:]:
            pair = (isolated.address, other.address)
            cluster.net.cut |= {pair, (pair[1], pair[0])}
        await cluster.clock.advance(lease_duration(OPTS) - timedelta(milliseconds=100))
        assert isolated.service.lease.held()
        await cluster.clock.advance(OPTS.probe_interval)
        assert not isolated.service.lease.held()
        # The peers, reaching each other, keep theirs.
        assert all(n.service.lease.held() for n in nodes[1:])
    finally:
        await cluster.aclose()


# -- a store that lost its data ------------------------------------------------------


async def test_a_vanished_row_stops_the_silo_with_a_warning(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    a, _b = await cluster.join_all(1, 2)
    table = cluster.table
    assert isinstance(table, InMemoryMembershipTable)
    # The store restarted empty.
    table._rows.clear()
    table._version = INITIAL_VERSION
    with caplog.at_level(logging.WARNING, logger="orleanspy.membership"):
        await a.service.refresh()
    assert a.dead_calls == [a.address]
    assert a.service.stop_reason is not None
    assert "lost its data" in a.service.stop_reason
    assert not a.service.lease.held()
    assert any("store lost its data" in r.getMessage() for r in caplog.records)


async def test_a_table_that_went_back_with_the_row_intact_is_adopted(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    _a, b = await cluster.join_all(1, 2)
    table = cluster.table
    assert isinstance(table, InMemoryMembershipTable)
    # A replica that missed the last writes took over: the rows are there, older.
    table._version = type(table._version)(1, "1")
    seen: list[int] = []
    b.service.add_listener(lambda snap: seen.append(snap.version.version))
    with caplog.at_level(logging.WARNING, logger="orleanspy.membership"):
        snap = await b.service.refresh()
    assert b.dead_calls == [] and b.service.stop_reason is None
    assert b.service.lease.held()
    assert snap.version.version == 1 and b.service.rewinds == 1
    assert seen[-1] == 1  # the listeners (the ring among them) were told
    assert any("table went back" in r.getMessage() for r in caplog.records)


async def test_a_table_that_went_back_past_this_silos_status_stops_the_silo(
    cluster: Cluster,
) -> None:
    _a, b = await cluster.join_all(1, 2)
    table = cluster.table
    assert isinstance(table, InMemoryMembershipTable)
    # Older than this silo's own Active row: it reads itself Joining.
    entry, etag = table._rows[b.address]
    table._rows[b.address] = (replace(entry, status=SiloStatus.JOINING), etag)
    table._version = type(table._version)(1, "1")
    await b.service.refresh()
    assert b.dead_calls == [b.address]
    assert b.service.stop_reason is not None
    assert "version went back" in b.service.stop_reason


class GatedTable:
    """One silo's view of a shared table, which fails while ``down`` (its host is
    cut off from the store)."""

    def __init__(self, table: InMemoryMembershipTable) -> None:
        self._table = table
        self.down = False

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._table, name)
        if not callable(attr) or name == "start":
            return attr

        async def call(*args: object, **kwargs: object) -> object:
            if self.down:
                raise StorageUnavailableError("the store is unreachable from this host")
            return await attr(*args, **kwargs)

        return call


async def test_a_healed_silo_never_regains_its_lease_before_its_dead_verdict(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The host of c is cut from its peers and the store; its peers declare it Dead.
    # When it heals, the first thing it hears from the table is its heartbeat
    # write (which says nothing of its status) or the read that says Dead: the
    # lease must go from lapsed to revoked, never back to held in between.
    assert isinstance(cluster.table, InMemoryMembershipTable)
    gated = GatedTable(cluster.table)
    a, b = await cluster.join(1), await cluster.join(2)
    c = await cluster.join(3, gated)  # type: ignore[arg-type]
    for node in (a, b, c):
        await node.service.refresh()
    cluster.net.down.add(c.address)
    cluster.net.cut |= {(c.address, a.address), (c.address, b.address)}
    gated.down = True
    await cluster.clock.advance(OPTS.probe_interval * (OPTS.num_missed_probes_limit + 3))
    assert await status_of(cluster.table, c) == SiloStatus.DEAD
    assert not c.service.lease.held() and c.service.lease.revoked is None
    held_after: list[bool] = []
    table_reached = c.service.lease.table_reached

    def watched() -> None:
        table_reached()
        held_after.append(c.service.lease.held())

    c.service.lease.table_reached = watched  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="orleanspy.membership"):
        gated.down = False
        await c.service._heartbeat()
        assert not c.service.lease.held()  # a heartbeat cannot end a lapse
        await c.service.refresh()
    assert c.service.lease.revoked is not None
    assert not c.service.lease.held()
    assert True not in held_after
    assert not any("lease regained" in r.getMessage() for r in caplog.records)
