"""``check_membership_table``: the conformance suite for ``MembershipTable`` backends.

A provider author proves a backend with ``await check_membership_table(factory)``,
where each call of ``factory()`` returns an async context manager yielding a
new, started table over an empty store (for a shared server, a fresh cluster id
per call), as every kit in ``orleanspy.testing`` takes (``orleanspy.testing._kit``).

Test suites that want one test case per check parametrise over
``MEMBERSHIP_TABLE_CHECKS`` and await ``check(factory)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from orleanspy.identity import SiloAddress
from orleanspy.membership.model import MembershipEntry, MembershipSnapshot, SiloStatus, TableVersion
from orleanspy.membership.table import MembershipTable
from orleanspy.testing._kit import ProviderFactory, on_one_provider, run_checks

__all__ = [
    "MEMBERSHIP_TABLE_CHECKS",
    "Check",
    "TableFactory",
    "check_membership_table",
    "make_entry",
]

TableFactory = ProviderFactory[MembershipTable]
Check = Callable[[TableFactory], Awaitable[None]]

_T0 = datetime(2030, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)


def make_entry(
    port: int,
    status: SiloStatus = SiloStatus.JOINING,
    *,
    generation: int = 1,
    at: datetime = _T0,
    **fields: object,
) -> MembershipEntry:
    """A row for silo ``127.0.0.1:<port>@<generation>``, started and alive at ``at``."""
    silo = SiloAddress("127.0.0.1", port, generation)
    base: dict[str, object] = {
        "silo": silo,
        "status": status,
        "name": f"silo-{port}",
        "start_time": at,
        "i_am_alive": at,
    }
    base.update(fields)
    return MembershipEntry(**base)  # type: ignore[arg-type]


def _fail(message: str) -> AssertionError:
    return AssertionError(f"membership table contract: {message}")


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise _fail(message)


async def _insert(table: MembershipTable, entry: MembershipEntry) -> MembershipSnapshot:
    snap = await table.read_all()
    _expect(await table.insert_row(entry, snap.version.next()), f"insert of {entry.silo} failed")
    return await table.read_all()


async def check_empty_table(table: MembershipTable) -> None:
    snap = await table.read_all()
    _expect(len(snap) == 0, "a new table must be empty")
    _expect(snap.version == TableVersion(0, ""), f"empty table version is {snap.version}")


async def check_insert_with_current_version(table: MembershipTable) -> None:
    entry = make_entry(1)
    before = await table.read_all()
    _expect(await table.insert_row(entry, before.version.next()), "insert with next version")
    after = await table.read_all()
    _expect(after.get(entry.silo) == entry, "inserted row reads back unchanged")
    _expect(after.version.version == before.version.version + 1, "version number +1")
    _expect(after.version.etag != before.version.etag, "version etag changes on insert")
    _expect(bool(after.etag(entry.silo)), "inserted row has a non-empty etag")


async def check_insert_with_stale_version(table: MembershipTable) -> None:
    stale = (await table.read_all()).version
    await _insert(table, make_entry(1))
    _expect(not await table.insert_row(make_entry(2), stale.next()), "stale-version insert won")
    snap = await table.read_all()
    _expect(snap.get(make_entry(2).silo) is None, "a lost insert must write nothing")
    _expect(snap.version.version == 1, "a lost insert must not bump the version")


async def check_duplicate_insert(table: MembershipTable) -> None:
    snap = await _insert(table, make_entry(1))
    again = make_entry(1, SiloStatus.ACTIVE)
    _expect(not await table.insert_row(again, snap.version.next()), "duplicate insert won")
    after = await table.read_all()
    _expect(after.status(again.silo) == SiloStatus.JOINING, "duplicate insert overwrote")
    _expect(after.version == snap.version, "a lost insert must not touch the version")


async def check_version_must_advance(table: MembershipTable) -> None:
    snap = await _insert(table, make_entry(1))
    try:
        await table.insert_row(make_entry(2), snap.version)
    except ValueError:
        pass
    else:
        raise _fail("insert with a matching etag but no .next() must raise ValueError")
    _expect((await table.read_all()).get(make_entry(2).silo) is None, "refused write stored")


async def check_update_row(table: MembershipTable) -> None:
    entry = make_entry(1)
    snap = await _insert(table, entry)
    etag = snap.etag(entry.silo)
    assert etag is not None
    active = entry.with_status(SiloStatus.ACTIVE)
    _expect(await table.update_row(active, etag, snap.version.next()), "update with fresh etags")
    after = await table.read_all()
    _expect(after.get(entry.silo) == active, "updated row reads back")
    _expect(after.etag(entry.silo) != etag, "row etag changes on update")
    _expect(after.version.version == snap.version.version + 1, "update bumps the version")


async def check_update_with_stale_row_etag(table: MembershipTable) -> None:
    entry = make_entry(1)
    first = await _insert(table, entry)
    old_etag = first.etag(entry.silo)
    assert old_etag is not None
    active = entry.with_status(SiloStatus.ACTIVE)
    _expect(await table.update_row(active, old_etag, first.version.next()), "first update")
    snap = await table.read_all()
    dead = entry.with_status(SiloStatus.DEAD)
    # The version is current; only the row etag is stale.
    _expect(not await table.update_row(dead, old_etag, snap.version.next()), "stale etag won")
    after = await table.read_all()
    _expect(after.status(entry.silo) == SiloStatus.ACTIVE, "a lost update must write nothing")
    _expect(after.version == snap.version, "a lost update must not touch the version")


async def check_update_with_stale_version(table: MembershipTable) -> None:
    a, b = make_entry(1), make_entry(2)
    stale = await _insert(table, a)
    await _insert(table, b)
    etag = stale.etag(a.silo)
    assert etag is not None
    # The row etag is current; only the table version is stale (b's insert moved it).
    ok = await table.update_row(a.with_status(SiloStatus.ACTIVE), etag, stale.version.next())
    _expect(not ok, "update with a stale table version won")
    _expect((await table.read_all()).status(a.silo) == SiloStatus.JOINING, "lost update wrote")


async def check_update_missing_row(table: MembershipTable) -> None:
    snap = await table.read_all()
    _expect(not await table.update_row(make_entry(9), "1", snap.version.next()), "updated nothing")
    _expect(len(await table.read_all()) == 0, "an update must not create a row")


async def check_i_am_alive_is_a_dirty_write(table: MembershipTable) -> None:
    entry = make_entry(1)
    snap = await _insert(table, entry)
    later = _T0 + timedelta(seconds=30, milliseconds=7)
    await table.update_i_am_alive(entry.silo, later)
    after = await table.read_all()
    _expect(after.get(entry.silo) == entry.with_i_am_alive(later), "heartbeat written, rest kept")
    _expect(after.version == snap.version, "update_i_am_alive must not touch the version")
    _expect(after.etag(entry.silo) == snap.etag(entry.silo), "nor the row etag")
    # The etags read before the heartbeat still win a compare-and-swap.
    etag = snap.etag(entry.silo)
    assert etag is not None
    ok = await table.update_row(entry.with_status(SiloStatus.ACTIVE), etag, snap.version.next())
    _expect(ok, "a heartbeat must not fail another writer's CAS")
    await table.update_i_am_alive(SiloAddress("127.0.0.1", 9, 9), later)
    _expect(len(await table.read_all()) == 1, "a heartbeat for a missing row creates nothing")


async def check_read_all_is_atomic(table: MembershipTable) -> None:
    # Each write stamps its own version number into the row's name; a snapshot
    # is atomic iff the highest stamp it shows equals its version number.
    writes = 40
    entries = [make_entry(p) for p in range(1, 5)]
    done = asyncio.Event()
    seen: list[MembershipSnapshot] = []

    async def writer() -> None:
        for i in range(writes):
            snap = await table.read_all()
            target = entries[i % len(entries)]
            stamped = MembershipEntry(
                target.silo, target.status, f"v{snap.version.version + 1}",
                target.start_time, target.i_am_alive,
            )  # fmt: skip
            etag = snap.etag(target.silo)
            nxt = snap.version.next()
            ok = await (
                table.insert_row(stamped, nxt)
                if etag is None
                else table.update_row(stamped, etag, nxt)
            )
            _expect(ok, "an uncontended write failed")
        done.set()

    async def reader() -> None:
        while not done.is_set():
            seen.append(await table.read_all())
            # An in-memory table never suspends; let the writer run.
            await asyncio.sleep(0)

    await asyncio.gather(writer(), reader(), reader())
    seen.append(await table.read_all())
    for snap in seen:
        stamps = [int(e.name[1:]) for e, _ in snap.entries.values()]
        top = max(stamps, default=0)
        _expect(top == snap.version.version, f"snapshot rows at v{top}, version {snap.version}")
    _expect(seen[-1].version.version == writes, "every write bumped the version once")


async def check_concurrent_cas_one_winner(table: MembershipTable) -> None:
    entry = make_entry(1)
    await _insert(table, entry)
    for round_ in range(5):
        snap = await table.read_all()
        etag = snap.etag(entry.silo)
        assert etag is not None
        attempts = [
            table.update_row(
                entry.with_vote(SiloAddress("10.0.0.1", w, round_), _T0, timedelta(hours=1)),
                etag,
                snap.version.next(),
            )
            for w in range(10)
        ]
        results = await asyncio.gather(*attempts)
        _expect(sum(results) == 1, f"{sum(results)} of 10 concurrent updates won, not 1")
        after = await table.read_all()
        _expect(after.version.version == snap.version.version + 1, "one version per winner")
    # Inserts of different silos compete on the table version alone.
    snap = await table.read_all()
    inserts = [table.insert_row(make_entry(100 + w), snap.version.next()) for w in range(10)]
    results = await asyncio.gather(*inserts)
    _expect(sum(results) == 1, f"{sum(results)} of 10 concurrent inserts won, not 1")
    _expect(len(await table.read_all()) == 2, "exactly one of the inserted rows exists")


async def check_delete_dead_before(table: MembershipTable) -> None:
    old, new = _T0, _T0 + timedelta(hours=2)
    rows = [
        make_entry(1, SiloStatus.DEAD, at=old),
        make_entry(2, SiloStatus.DEAD, at=new),
        make_entry(3, SiloStatus.ACTIVE, at=old),
        make_entry(4, SiloStatus.SHUTTING_DOWN, at=old),
        make_entry(5, SiloStatus.DEAD, at=old, generation=2),
    ]
    for row in rows:
        await _insert(table, row)
    before = await table.read_all()
    cutoff = _T0 + timedelta(hours=1)
    _expect(await table.delete_dead_before(cutoff) == 2, "two old Dead rows deleted")
    after = await table.read_all()
    _expect(
        set(after.entries) == {rows[1].silo, rows[2].silo, rows[3].silo},
        f"left {sorted(map(str, after.entries))}",
    )
    _expect(after.version == before.version, "deleting dead rows leaves the version alone")
    _expect(await table.delete_dead_before(cutoff) == 0, "a second sweep deletes nothing")


async def check_round_trip_all_fields(table: MembershipTable) -> None:
    voter_a = SiloAddress("10.1.2.3", 11111, 1_900_000_000_123)
    voter_b = SiloAddress("::1", 22222, 7)
    full = MembershipEntry(
        silo=SiloAddress("fe80::1", 30000, 1_893_456_000_999),
        status=SiloStatus.SHUTTING_DOWN,
        name="silo-ünïcode",
        start_time=_T0,
        i_am_alive=_T0 + timedelta(seconds=1, milliseconds=1),
        suspect_times=((voter_a, _T0 + timedelta(milliseconds=5)), (voter_b, _T0)),
        gateway_port=30001,
        host_name="host.example",
        grain_types=frozenset({"CounterGrain", "module.Other", "ünï"}),
        verifier="v1;secret=0123456789abcdef0123456789abcdef;ca=none",
        ring_mode="balanced",
    )
    hosts_nothing = MembershipEntry(
        silo=SiloAddress("127.0.0.2", 2, 0),
        status=SiloStatus.ACTIVE,
        name="gateway-only",
        start_time=_T0,
        i_am_alive=_T0,
        grain_types=frozenset(),
    )
    bare = MembershipEntry(
        silo=SiloAddress("127.0.0.1", 1, 0),
        status=SiloStatus.CREATED,
        name="",
        start_time=_T0,
        i_am_alive=_T0,
    )
    for entry in (full, hosts_nothing, bare):
        snap = await _insert(table, entry)
        _expect(snap.get(entry.silo) == entry, f"round trip changed {entry}")
        # A heartbeat rewrites the stored row; nothing else may change with it.
        beat = _T0 + timedelta(minutes=1)
        await table.update_i_am_alive(entry.silo, beat)
        got = (await table.read_all()).get(entry.silo)
        _expect(got == entry.with_i_am_alive(beat), f"heartbeat changed other fields: {got}")
    for status in SiloStatus:
        snap = await table.read_all()
        etag = snap.etag(bare.silo)
        assert etag is not None
        changed = bare.with_status(status)
        _expect(await table.update_row(changed, etag, snap.version.next()), f"update to {status}")
        _expect((await table.read_all()).status(bare.silo) == status, f"{status} round trip")


MEMBERSHIP_TABLE_CHECKS: tuple[Check, ...] = tuple(
    on_one_provider(check)
    for check in (
        check_empty_table,
        check_insert_with_current_version,
        check_insert_with_stale_version,
        check_duplicate_insert,
        check_version_must_advance,
        check_update_row,
        check_update_with_stale_row_etag,
        check_update_with_stale_version,
        check_update_missing_row,
        check_i_am_alive_is_a_dirty_write,
        check_read_all_is_atomic,
        check_concurrent_cas_one_winner,
        check_delete_dead_before,
        check_round_trip_all_fields,
    )
)
"""Every check, each taking the factory and running on one fresh, started table."""


async def check_membership_table(factory: TableFactory) -> None:
    """Run every check, each on a fresh table from ``factory``. Raises
    ``AssertionError`` naming the first check that fails and what it saw."""
    await run_checks(MEMBERSHIP_TABLE_CHECKS, factory)
