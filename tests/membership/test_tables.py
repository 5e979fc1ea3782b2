"""The membership table contract suite against the in-memory and the Redis table."""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack

import pytest

from orleanspy._redis import connect
from orleanspy.errors import StorageUnavailableError
from orleanspy.identity import SiloAddress
from orleanspy.membership.memory import InMemoryMembershipTable
from orleanspy.membership.model import MembershipSnapshot, SiloStatus, TableVersion
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.testing import started
from orleanspy.testing.membership_table import (
    MEMBERSHIP_TABLE_CHECKS,
    Check,
    TableFactory,
    check_membership_table,
    make_entry,
)
from orleanspy.testing.redis_server import RedisServer
from orleanspy.versions import __version__


@pytest.fixture(params=["memory", "redis", "redis_cluster", "redis_sentinel"])
def factory(request: pytest.FixtureRequest) -> TableFactory:
    if request.param == "memory":
        return lambda: started(InMemoryMembershipTable())
    url = request.getfixturevalue(f"{request.param}_url")
    return lambda: started(RedisMembershipTable(url, cluster_id=uuid.uuid4().hex, service_id="svc"))


@pytest.mark.parametrize("check", MEMBERSHIP_TABLE_CHECKS, ids=lambda c: c.__name__)
async def test_contract(factory: TableFactory, check: Check) -> None:
    await check(factory)


async def test_check_membership_table_runs_whole_suite_on_fresh_redis_tables(
    redis_url: str,
) -> None:
    await check_membership_table(
        lambda: started(
            RedisMembershipTable(redis_url, cluster_id=uuid.uuid4().hex, service_id="svc")
        )
    )


async def test_check_membership_table_catches_a_broken_table() -> None:
    class NoVersionBump(InMemoryMembershipTable):
        async def read_all(self) -> MembershipSnapshot:
            snap = await super().read_all()
            return MembershipSnapshot(snap.entries, type(snap.version)(0, snap.version.etag))

    with pytest.raises(AssertionError, match="insert_with_current_version"):
        await check_membership_table(lambda: started(NoVersionBump()))


async def test_redis_layout_is_one_hash_with_version_field(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        table = RedisMembershipTable(redis_url, cluster_id="c1", service_id="shop")
        await table.start(stack)
        snap = await table.read_all()
        assert await table.insert_row(make_entry(1), snap.version.next())
        client = connect(redis_url)
        stack.push_async_callback(client.aclose)
        keys = sorted(await client.keys("*"))
        # The row hash, and the schema versions of every Redis provider.
        assert keys == [b"orleanspy:schema", b"orleanspy:shop:cluster:{shop:c1}:members"]
        assert await client.hget("orleanspy:schema", "membership") == b"1|" + __version__.encode()
        fields = await client.hkeys(keys[1])
        assert sorted(fields) == [b"127.0.0.1:1@1", b"version"]


async def test_redis_clusters_and_services_are_isolated(redis_url: str) -> None:
    async with AsyncExitStack() as stack:
        a = RedisMembershipTable(redis_url, cluster_id="a", service_id="svc")
        b = RedisMembershipTable(redis_url, cluster_id="b", service_id="svc")
        await a.start(stack)
        await b.start(stack)
        assert await a.insert_row(make_entry(1), (await a.read_all()).version.next())
        assert len(await b.read_all()) == 0


async def test_redis_table_with_given_client_leaves_it_open(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(client, cluster_id="c", service_id="s")
            await table.start(stack)
            await table.read_all()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_redis_unreachable_raises_storage_unavailable(own_redis: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        table = RedisMembershipTable(own_redis.url, cluster_id="c", service_id="s")
        await table.start(stack)
        await table.read_all()
        own_redis.kill()
        with pytest.raises(StorageUnavailableError):
            await table.read_all()
        with pytest.raises(StorageUnavailableError):
            await table.update_i_am_alive(SiloAddress("127.0.0.1", 1, 1), make_entry(1).start_time)
        own_redis.start()
        # The same table recovers once the server is back (its data is gone).
        snap = await table.read_all()
        assert await table.insert_row(make_entry(1, SiloStatus.ACTIVE), snap.version.next())


def test_snapshot_hosting_lists_the_active_silos_that_host_a_type() -> None:
    rows = [
        make_entry(1, SiloStatus.ACTIVE),  # says nothing: hosts every type
        make_entry(2, SiloStatus.ACTIVE, grain_types=frozenset({"A"})),
        make_entry(3, SiloStatus.ACTIVE, grain_types=frozenset()),
        make_entry(4, SiloStatus.SHUTTING_DOWN, grain_types=frozenset({"A", "B"})),
    ]
    snap = MembershipSnapshot({r.silo: (r, "e") for r in rows}, TableVersion(4, "v"))
    one, two = rows[0].silo, rows[1].silo
    assert snap.hosting("A") == (one, two)
    assert snap.hosting("B") == (one,)
    assert rows[2].hosts("A") is False and rows[0].hosts("anything") is True
