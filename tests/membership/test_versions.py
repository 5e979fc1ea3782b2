"""Versions in the membership table: what a row records, which joiners are refused
(and that a refusal writes nothing), the cluster's feature level, and the ring a
silo that follows the cluster builds and records (in-memory table and manual
clock; real processes of two releases in tests/cluster/test_rolling_upgrade.py)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from orleanspy.errors import ConfigurationError
from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import (
    RING_BALANCED,
    RING_HASHED,
    check_versions,
    cluster_level,
    cluster_ring_mode,
    require_feature,
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
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock
from orleanspy.versions import (
    OLDEST_PROTOCOL,
    PROTOCOL,
    Feature,
    FeatureUnavailableError,
    IncompatibleVersionError,
    ProtocolWindow,
    __version__,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ME = SiloAddress("10.0.0.9", 11111, 500)
OPTIONS = MembershipOptions()


def row(
    port: int,
    *,
    window: ProtocolWindow | None = None,
    release: str | None = None,
    mode: str | None = RING_BALANCED,
    follows: bool = False,
    status: SiloStatus = SiloStatus.ACTIVE,
) -> MembershipEntry:
    return MembershipEntry(
        silo=SiloAddress("10.0.0.1", port, 1),
        status=status,
        name=f"m{port}",
        start_time=NOW,
        i_am_alive=NOW,
        ring_mode=mode,
        ring_follows=follows,
        release=release,
        protocols=window,
    )


def snapshot(*rows: MembershipEntry) -> MembershipSnapshot:
    return MembershipSnapshot({r.silo: (r, "1") for r in rows}, TableVersion(1, "1"))


def test_a_row_records_release_window_and_schemas_and_keeps_keys_it_does_not_know() -> None:
    entry = replace(
        row(1, window=ProtocolWindow(1, 2), release="0.2.0", follows=True),
        schemas=(("redis:membership", 1), ("redis:reminders", 1)),
    )
    record = entry.to_record()
    assert record["pw"] == "1-2" and record["rv"] == "0.2.0" and record["rf"] == 1
    record["zz"] = [1, 2]  # a key of a newer release
    back = MembershipEntry.from_record(record)
    assert back == entry
    assert back.extra == {"zz": [1, 2]}
    assert back.with_status(SiloStatus.DEAD).to_record()["zz"] == [1, 2]


def test_a_row_of_0_1_speaks_protocol_1_alone() -> None:
    old = MembershipEntry.from_record(row(1).to_record())
    assert old.protocols is None and old.release is None
    assert old.window == ProtocolWindow(1, 1)
    # A window that does not parse reads as unknown, not as an error for the reader.
    bad = {**row(1).to_record(), "pw": "x-y"}
    assert MembershipEntry.from_record(bad).window == ProtocolWindow(1, 1)


def test_the_protocol_window_parses_what_peers_send_and_refuses_garbage() -> None:
    assert ProtocolWindow.parse(None) == ProtocolWindow(1, 1)
    assert ProtocolWindow.parse("1-2") == ProtocolWindow(1, 2)
    assert ProtocolWindow.parse("3") == ProtocolWindow(3, 3)
    for garbage in ("", "a-b", "2-1", "0-1", "-1", "1-2-3", "9" * 40):
        with pytest.raises(IncompatibleVersionError, match="malformed protocol window"):
            ProtocolWindow.parse(garbage)
    assert ProtocolWindow.mine() == ProtocolWindow(OLDEST_PROTOCOL, PROTOCOL)


def test_the_previous_release_and_this_one_join_each_other() -> None:
    check_versions(snapshot(row(1)), ME, NOW, OPTIONS)  # a 0.1.x member
    check_versions(snapshot(row(1, window=ProtocolWindow(1, 2))), ME, NOW, OPTIONS)
    # A 0.1.x silo's view of a 0.2 member: its window (1-1) overlaps ours.
    check_versions(snapshot(row(1, window=ProtocolWindow(1, 2))), ME, NOW, OPTIONS,
                   mine=ProtocolWindow(1, 1))  # fmt: skip


def test_a_member_too_new_is_refused_with_both_versions_and_the_way_out() -> None:
    newer = row(1, window=ProtocolWindow(3, 4), release="0.4.0")
    with pytest.raises(IncompatibleVersionError, match="refusing to join") as caught:
        check_versions(snapshot(newer), ME, NOW, OPTIONS)
    text = str(caught.value)
    assert f"orleanspy {__version__}" in text and "orleanspy 0.4.0" in text
    assert f"protocols {OLDEST_PROTOCOL}-{PROTOCOL}" in text and "protocols 3-4" in text
    assert "this release is too old for it" in text
    assert "Nothing was written to the membership table" in text


def test_a_member_too_old_is_refused_and_told_to_upgrade_one_step_at_a_time() -> None:
    mine = ProtocolWindow(3, 4)  # a release two minors on
    with pytest.raises(IncompatibleVersionError) as caught:
        check_versions(snapshot(row(1)), ME, NOW, OPTIONS, mine=mine)
    text = str(caught.value)
    assert "orleanspy 0.1.x" in text and "protocol 1 (0.1.x)" in text
    assert "it is too old for this release" in text and "one minor release at a time" in text


def test_dead_rows_do_not_refuse_a_joiner_and_do_not_lower_the_level() -> None:
    gone = row(1, window=ProtocolWindow(9, 9), status=SiloStatus.DEAD)
    check_versions(snapshot(gone), ME, NOW, OPTIONS)
    assert cluster_level(snapshot(gone)) == PROTOCOL


def test_the_cluster_level_is_what_every_live_silo_speaks() -> None:
    new = row(1, window=ProtocolWindow(1, 2))
    assert cluster_level(snapshot()) == PROTOCOL
    assert cluster_level(snapshot(new)) == 2
    assert cluster_level(snapshot(new, row(2))) == 1  # a 0.1.x silo is Active
    assert cluster_level(snapshot(new, row(2, status=SiloStatus.JOINING))) == 1
    assert cluster_level(snapshot(new, row(2, status=SiloStatus.SHUTTING_DOWN))) == 1
    assert cluster_level(snapshot(new), mine=1) == 1


def test_the_cluster_ring_is_that_of_the_silos_that_insist_else_balanced() -> None:
    follower = row(1, window=ProtocolWindow(1, 2), mode=RING_HASHED, follows=True)
    assert cluster_ring_mode(snapshot()) == RING_BALANCED
    assert cluster_ring_mode(snapshot(follower)) == RING_BALANCED
    assert cluster_ring_mode(snapshot(follower, row(2, mode=RING_HASHED))) == RING_HASHED
    assert cluster_ring_mode(snapshot(follower, row(2, mode=None))) == RING_HASHED  # pre-0.1
    assert cluster_ring_mode(snapshot(follower, row(2, mode=RING_BALANCED))) == RING_BALANCED
    # A joining insister does not decide yet: it is not on the ring.
    joining = row(2, mode=RING_HASHED, status=SiloStatus.JOINING)
    assert cluster_ring_mode(snapshot(follower, joining)) == RING_BALANCED


def _service(
    table: InMemoryMembershipTable, port: int, *, mode: str | None, follows: bool
) -> MembershipService:
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
        ring_follows=follows,
        schemas=[("memory:membership", 1)],
    )


async def test_a_follower_joins_a_hashed_cluster_records_it_and_then_the_switch() -> None:
    """A silo that insists on the hashed ring (as 0.1.x silos set up with
    balanced_ring=False do) runs; a follower joins it (no refusal), records the
    hashed ring, and records the balanced one once it builds that."""
    table = InMemoryMembershipTable()
    async with AsyncExitStack() as stack:
        old = _service(table, 1, mode=RING_HASHED, follows=False)
        await old.start(stack)
        new = _service(table, 2, mode=None, follows=True)
        await new.start(stack)
        mine = (await table.read_all()).get(new.address)
        assert mine is not None
        assert (mine.ring_mode, mine.ring_follows) == (RING_HASHED, True)
        assert mine.release == __version__ and mine.protocols == ProtocolWindow.mine()
        assert mine.schemas == (("memory:membership", 1),)
        await old.shutdown()
        new.ring_built(RING_BALANCED)  # what the ring follower calls when it switches

        async def recorded() -> bool:
            entry = (await table.read_all()).get(new.address)
            return entry is not None and entry.ring_mode == RING_BALANCED

        await wait_for(recorded, timeout=5)


async def test_a_row_rewritten_by_an_older_silo_gets_its_fields_back() -> None:
    """A 0.1.x silo that votes on a 0.2 row writes back only the fields it knows;
    the silo notices on its next read and restores them."""
    table = InMemoryMembershipTable()
    async with AsyncExitStack() as stack:
        new = _service(table, 2, mode=None, follows=True)
        await new.start(stack)
        snap = await table.read_all()
        mine, etag = snap.get(new.address), snap.etag(new.address)
        assert mine is not None and etag is not None
        stripped = replace(mine, release=None, protocols=None, schemas=None, ring_follows=False)
        assert await table.update_row(stripped, etag, snap.version.next())
        await new.refresh()

        async def restored() -> bool:
            entry = (await table.read_all()).get(new.address)
            return entry is not None and entry.protocols == ProtocolWindow.mine()

        await wait_for(restored, timeout=5)
        entry = (await table.read_all()).get(new.address)
        assert entry is not None and entry.release == __version__ and entry.ring_follows


async def test_a_refused_joiner_writes_nothing() -> None:
    table = InMemoryMembershipTable()
    snap = await table.read_all()
    future = replace(row(1, window=ProtocolWindow(4, 5), release="0.5.0"), i_am_alive=NOW)
    assert await table.insert_row(future, snap.version.next())
    before = await table.read_all()
    async with AsyncExitStack() as stack:
        joiner = _service(table, 3, mode=None, follows=True)
        with pytest.raises(IncompatibleVersionError, match=r"orleanspy 0\.5\.0") as caught:
            await joiner.start(stack)
    assert "speaks protocols 4-5" in str(caught.value)
    assert "run a release that speaks protocol 4 or newer here" in str(caught.value)
    after = await table.read_all()
    assert after.version == before.version and set(after.entries) == set(before.entries)


def test_a_feature_is_refused_while_a_live_silo_lacks_it_naming_the_silos() -> None:
    new = row(1, window=ProtocolWindow(1, 2), release=__version__)
    require_feature(snapshot(new), Feature.REMINDER_CALENDARS)  # every live silo has it
    gone = row(3, status=SiloStatus.DEAD)  # a dead 0.1.x row does not count
    require_feature(snapshot(new, gone), Feature.REMINDER_LABELS)
    old = row(2)  # a 0.1.x row: protocol 1
    for feature in (Feature.REMINDER_LABELS, Feature.REMINDER_CALENDARS, Feature.REMINDER_BACKFILL):
        with pytest.raises(FeatureUnavailableError) as caught:
            require_feature(snapshot(new, old), feature)
        message = str(caught.value)
        assert feature.name in message and "10.0.0.1:2" in message and "0.1.x" in message
        assert "10.0.0.1:1" not in message and "nothing was written" in message.lower()
    assert isinstance(caught.value, ConfigurationError)
