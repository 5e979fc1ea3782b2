"""``PostgresMembershipTable``: the shared contract suite and what only PostgreSQL has."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack

import pytest

from orleanspy.errors import StorageUnavailableError
from orleanspy.membership.model import INITIAL_VERSION
from orleanspy.membership.postgres import PostgresMembershipTable
from orleanspy.testing import started
from orleanspy.testing.membership_table import (
    MEMBERSHIP_TABLE_CHECKS,
    Check,
    TableFactory,
    check_membership_table,
    make_entry,
)


def fresh_tables(postgres_url: str) -> TableFactory:
    return lambda: started(
        PostgresMembershipTable(postgres_url, cluster_id=uuid.uuid4().hex, service_id="svc")
    )


@pytest.mark.parametrize("check", MEMBERSHIP_TABLE_CHECKS, ids=lambda c: c.__name__)
async def test_contract(postgres_url: str, check: Check) -> None:
    await check(fresh_tables(postgres_url))


async def test_whole_suite_on_fresh_clusters(postgres_url: str) -> None:
    await check_membership_table(fresh_tables(postgres_url))


async def test_clusters_and_services_are_separate(postgres_url: str) -> None:
    async with AsyncExitStack() as stack:
        tables = [
            PostgresMembershipTable(postgres_url, cluster_id=c, service_id=s)
            for c, s in (("a", "svc"), ("b", "svc"), ("a", "other"))
        ]
        for t in tables:
            await t.start(stack)
        assert await tables[0].insert_row(make_entry(11111), INITIAL_VERSION.next())
        for t in tables[1:]:
            snap = await t.read_all()
            assert len(snap) == 0 and snap.version == INITIAL_VERSION
        # Each cluster has its own version: the first insert elsewhere succeeds too.
        assert await tables[1].insert_row(make_entry(11111), INITIAL_VERSION.next())


async def test_concurrent_first_inserts_have_one_winner(postgres_url: str) -> None:
    async with AsyncExitStack() as stack:
        tables = [
            PostgresMembershipTable(postgres_url, cluster_id="race", service_id="svc")
            for _ in range(5)
        ]
        for t in tables:
            await t.start(stack)
        results = await asyncio.gather(
            *(
                t.insert_row(make_entry(11000 + i), INITIAL_VERSION.next())
                for i, t in enumerate(tables)
            )
        )
        assert sorted(results) == [False] * 4 + [True]
        snap = await tables[0].read_all()
        assert len(snap) == 1 and snap.version.version == 1


async def test_unreachable_server_is_storage_unavailable() -> None:
    t = PostgresMembershipTable(
        "postgresql://postgres@127.0.0.1:1/x", cluster_id="c", service_id="s"
    )
    async with AsyncExitStack() as stack:
        with pytest.raises(StorageUnavailableError):
            await t.start(stack)
