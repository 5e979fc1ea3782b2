"""The ring mode every silo of a cluster must share: which rows it is checked
against, what a refusal says, and that the membership service writes nothing
when it refuses (on the in-memory table; Redis and PostgreSQL in
tests/cluster/test_trust.py, real processes in tests/cluster/test_cli.py)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import (
    RING_BALANCED,
    RING_HASHED,
    RingModeMismatchError,
    check_ring_mode,
    cluster_ring_mode,
    ring_mode,
    row_ring_mode,
)
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.membership.model import (
    MembershipEntry,
    MembershipSnapshot,
    SiloStatus,
    TableVersion,
)
from orleanspy.membership.service import MembershipService
from orleanspy.options import MembershipOptions
from orleanspy.testing.clock import ManualClock

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ME = SiloAddress("10.0.0.9", 11111, 500)
OPTIONS = MembershipOptions()
MEMBER = SiloAddress("10.0.0.1", 11111, 1)


def row(
    silo: SiloAddress,
    mode: str | None,
    status: SiloStatus = SiloStatus.ACTIVE,
    alive: datetime = NOW,
) -> MembershipEntry:
    return MembershipEntry(
        silo=silo, status=status, name="m", start_time=alive, i_am_alive=alive, ring_mode=mode
    )


def snapshot(*rows: MembershipEntry) -> MembershipSnapshot:
    return MembershipSnapshot({r.silo: (r, "1") for r in rows}, TableVersion(1, "1"))


def test_by_default_a_silo_follows_the_cluster_and_insists_on_nothing() -> None:
    assert MembershipOptions().balanced_ring is None
    assert ring_mode(None) is None
    assert ring_mode(True) == RING_BALANCED and ring_mode(False) == RING_HASHED
    assert row_ring_mode(row(MEMBER, None)) == RING_HASHED  # an older version's row
    assert row_ring_mode(row(MEMBER, RING_BALANCED)) == RING_BALANCED


def test_a_balanced_silo_is_refused_by_a_hashed_cluster_and_told_how_to_fix_it() -> None:
    with pytest.raises(RingModeMismatchError, match="refusing to join") as caught:
        check_ring_mode(RING_BALANCED, snapshot(row(MEMBER, RING_HASHED)), ME, NOW, OPTIONS)
    text = str(caught.value)
    assert "this silo builds the balanced ring (MembershipOptions.balanced_ring=True)" in text
    assert f"the cluster the hashed ring (member {MEMBER}, ACTIVE: balanced_ring=False)" in text
    assert "nothing was written to the membership table" in text
    assert "--set membership.balanced_ring=false" in text
    assert "ORLEANSPY_MEMBERSHIP_BALANCED_RING=false" in text
    assert "stop every silo, then start them all with balanced_ring=True" in text


def test_a_hashed_silo_is_refused_by_a_balanced_cluster() -> None:
    with pytest.raises(RingModeMismatchError) as caught:
        check_ring_mode(RING_HASHED, snapshot(row(MEMBER, RING_BALANCED)), ME, NOW, OPTIONS)
    text = str(caught.value)
    assert "this silo builds the hashed ring (MembershipOptions.balanced_ring=False)" in text
    assert "the cluster the balanced ring" in text
    assert "start this silo with balanced_ring=True (the default: drop the setting)" in text
    assert "stop every silo, then start them all with balanced_ring=False" in text


def test_rows_without_a_ring_mode_count_as_hashed() -> None:
    """A cluster of an older version can only have built the hashed ring: a silo
    that insists on the balanced one refuses to roll into it (one that follows,
    the default, joins: test_versions.py)."""
    old = snapshot(row(MEMBER, None, SiloStatus.JOINING))
    with pytest.raises(RingModeMismatchError, match="written before ring modes") as caught:
        check_ring_mode(RING_BALANCED, old, ME, NOW, OPTIONS)
    assert "JOINING" in str(caught.value)
    check_ring_mode(RING_HASHED, old, ME, NOW, OPTIONS)


def test_only_live_members_of_other_runs_are_compared() -> None:
    stale = NOW - OPTIONS.i_am_alive_staleness - timedelta(seconds=1)
    snap = snapshot(
        row(SiloAddress("10.0.0.1", 1, 1), RING_HASHED, SiloStatus.DEAD),
        row(SiloAddress("10.0.0.2", 1, 1), RING_HASHED, alive=stale),
        row(SiloAddress(ME.host, ME.port, ME.generation - 1), RING_HASHED),  # my earlier run
        row(ME, RING_HASHED),  # my own row: a retried start of this run
        row(SiloAddress("10.0.0.4", 1, 1), RING_BALANCED, SiloStatus.SHUTTING_DOWN),
    )
    check_ring_mode(RING_BALANCED, snap, ME, NOW, OPTIONS)
    check_ring_mode(None, snapshot(row(MEMBER, RING_HASHED)), ME, NOW, OPTIONS)
    for status in (SiloStatus.JOINING, SiloStatus.ACTIVE, SiloStatus.SHUTTING_DOWN):
        with pytest.raises(RingModeMismatchError):
            check_ring_mode(RING_BALANCED, snapshot(row(MEMBER, None, status)), ME, NOW, OPTIONS)


def test_a_mode_this_version_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(RingModeMismatchError, match="ring mode 'weighted'"):
        check_ring_mode(RING_BALANCED, snapshot(row(MEMBER, "weighted")), ME, NOW, OPTIONS)


def test_the_cluster_ring_reads_what_the_active_silos_record() -> None:
    other = SiloAddress("10.0.0.2", 1, 1)
    assert cluster_ring_mode(snapshot()) == RING_BALANCED  # nobody Active: the default
    both = snapshot(row(MEMBER, RING_BALANCED), row(other, RING_BALANCED))
    assert cluster_ring_mode(both) == RING_BALANCED
    assert cluster_ring_mode(snapshot(row(MEMBER, None))) == RING_HASHED
    # A Dead hashed row of an earlier cluster does not count.
    dead = row(other, RING_HASHED, SiloStatus.DEAD)
    assert cluster_ring_mode(snapshot(row(MEMBER, RING_BALANCED), dead)) == RING_BALANCED


def _service(table: InMemoryMembershipTable, port: int, mode: str) -> MembershipService:
    async def ping(silo: SiloAddress, timeout: float) -> bool:
        return True

    return MembershipService(
        table,
        address=SiloAddress("127.0.0.1", port, 1),
        name=f"silo-{port}",
        gateway_port=None,
        ping=ping,
        clock=ManualClock(NOW),
        options=OPTIONS,
        on_declared_dead=lambda: None,
        ring_mode=mode,
    )


async def test_the_service_records_its_mode_and_a_refused_join_writes_nothing() -> None:
    table = InMemoryMembershipTable()
    async with AsyncExitStack() as stack:
        first = _service(table, 1, RING_HASHED)
        await first.start(stack)
        before = await table.read_all()
        entry = before.get(first.address)
        assert entry is not None and entry.ring_mode == RING_HASHED
        rogue = _service(table, 2, RING_BALANCED)
        async with AsyncExitStack() as rogue_stack:
            with pytest.raises(RingModeMismatchError, match="refusing to join"):
                await rogue.start(rogue_stack)
        after = await table.read_all()
        assert after.version == before.version
        assert set(after.entries) == {first.address}
        assert after.get(first.address) == entry
        # One with the cluster's mode joins.
        second = _service(table, 3, RING_HASHED)
        await second.start(stack)
        assert set((await table.read_all()).entries) == {first.address, second.address}


class RacyTable(InMemoryMembershipTable):
    """Yields to the event loop after each read, so two joiners both read the
    table before either writes; counts the inserts that lost."""

    def __init__(self) -> None:
        super().__init__()
        self.lost_inserts = 0

    async def read_all(self) -> MembershipSnapshot:
        snap = await super().read_all()
        await asyncio.sleep(0)
        return snap

    async def insert_row(self, entry: MembershipEntry, version: TableVersion) -> bool:
        ok = await super().insert_row(entry, version)
        self.lost_inserts += not ok
        return ok


async def test_two_silos_of_different_modes_joining_at_once_cannot_both_join() -> None:
    """Both read the empty table; the join is a compare-and-swap on its version,
    so one insert loses, re-reads, sees the other's row and refuses."""
    table = RacyTable()
    async with AsyncExitStack() as stack:
        a, b = _service(table, 1, RING_HASHED), _service(table, 2, RING_BALANCED)
        results = await asyncio.gather(a.start(stack), b.start(stack), return_exceptions=True)
        refused = [r for r in results if isinstance(r, RingModeMismatchError)]
        assert len(refused) == 1 and results.count(None) == 1, results
        assert table.lost_inserts == 1  # the two did race
        snap = await table.read_all()
        assert len(snap.entries) == 1
        ((entry, _etag),) = snap.entries.values()
        assert entry.status is SiloStatus.ACTIVE


@pytest.mark.parametrize("mode", [RING_BALANCED, RING_HASHED, None])
def test_cluster_status_reports_the_shares_of_the_ring_the_silos_record(mode: str | None) -> None:
    from orleanspy.cluster_status import cluster_from
    from orleanspy.ring import HASH_SPACE, ConsistentRing, ranges_size

    silos = [SiloAddress("10.0.0.1", p, 1) for p in (1, 2, 3)]
    status = cluster_from(
        snapshot(*(row(s, mode) for s in silos)), {}, cluster_id="c", service_id="s"
    )
    ring = ConsistentRing.build(silos, balanced=mode == RING_BALANCED)
    other = ConsistentRing.build(silos, balanced=mode != RING_BALANCED)
    want = {str(s): 100 * ranges_size(ring.ranges_of(s)) / HASH_SPACE for s in silos}
    assert {r.address: r.ring_share for r in status.silos} == want
    assert want != {str(s): 100 * ranges_size(other.ranges_of(s)) / HASH_SPACE for s in silos}
