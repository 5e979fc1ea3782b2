"""Trust in a deployment, on real stores with real gRPC: a silo with the wrong
credentials refuses to join before it writes anything, and a store that lost
its data stops the silo with a WARNING, on Redis and on PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import asyncpg
import pytest
import redis.asyncio as aioredis

from orleanspy import Silo, SiloOptions
from orleanspy.membership.credentials import CredentialsMismatchError, cluster_verifier
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.postgres import PostgresMembershipTable
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.membership.table import MembershipTable
from orleanspy.options import MessagingOptions
from orleanspy.runtime.silo import SiloState
from orleanspy.testing.cluster import FAST_MEMBERSHIP, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture(params=["redis", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh Redis or PostgreSQL store (the fixture's own, per test)."""
    name = "redis_url" if request.param == "redis" else "postgres_url"
    url: str = request.getfixturevalue(name)
    return url


@asynccontextmanager
async def table_of(url: str) -> AsyncIterator[MembershipTable]:
    async with AsyncExitStack() as stack:
        table: MembershipTable
        if url.startswith("postgres"):
            table = PostgresMembershipTable(url, cluster_id="dev", service_id="default")
        else:
            table = RedisMembershipTable(url, cluster_id="dev", service_id="default")
        await table.start(stack)
        yield table


def options(url: str, secret: str | None) -> SiloOptions:
    return SiloOptions(
        storage_url=url,
        gateway_port=0,
        membership=FAST_MEMBERSHIP,
        messaging=MessagingOptions(cluster_secret=secret),
    )


@pytest.mark.parametrize(
    ("cluster_secret", "rogue_secret", "says"),
    [
        ("s3cret", None, "has no cluster secret"),
        ("s3cret", "wrong", "cluster secret (MessagingOptions.cluster_secret, --secret) differs"),
        (None, "s3cret", "runs without one"),
    ],
)
async def test_a_silo_with_other_credentials_refuses_to_start_and_writes_nothing(
    store: str, cluster_secret: str | None, rogue_secret: str | None, says: str
) -> None:
    async with Silo(options(store, cluster_secret)) as healthy, table_of(store) as table:
        before = await table.read_all()
        rogue = Silo(options(store, rogue_secret))
        with pytest.raises(CredentialsMismatchError, match="refusing to join") as caught:
            await rogue.start()
        assert says in str(caught.value)
        assert "nothing was written" in str(caught.value)
        after = await table.read_all()
        # Not a row, not a vote, not a version: the table is as it was.
        assert after.version == before.version
        assert set(after.entries) == {healthy.address}
        row = after.get(healthy.address)
        assert row is not None and row.status is SiloStatus.ACTIVE and not row.suspect_times
        assert rogue.state is SiloState.STOPPED
        assert healthy.state is SiloState.RUNNING


async def test_the_verifier_in_the_table_never_holds_the_secret(redis_url: str) -> None:
    secret = "correct horse battery staple"
    async with Silo(options(redis_url, secret)) as silo, table_of(redis_url) as table:
        row = (await table.read_all()).get(silo.address)
        assert row is not None
        assert row.verifier == cluster_verifier(
            MessagingOptions(cluster_secret=secret), service_id="default", cluster_id="dev"
        )
        raw = await aioredis.Redis.from_url(redis_url).hgetall(table.key)  # type: ignore[attr-defined,misc]
        assert all(secret.encode() not in value for value in raw.values())
        # The same secret in another cluster gives another verifier (salted).
        assert row.verifier != cluster_verifier(
            MessagingOptions(cluster_secret=secret), service_id="default", cluster_id="other"
        )


async def _lose_data(url: str) -> None:
    if url.startswith("postgres"):
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("TRUNCATE orleanspy_membership, orleanspy_membership_version")
        finally:
            await conn.close()
    else:
        client = aioredis.Redis.from_url(url)
        await client.flushall()
        await client.aclose()


async def test_a_store_that_lost_its_data_stops_the_silo_with_a_warning(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis restarted empty (FLUSHALL) or the PostgreSQL table truncated: the
    silo notices at its next table read, says what happened, is not ready, and
    stops (a restart joins it again as a new incarnation)."""
    silo = Silo(options(store, None))
    await silo.start()
    try:
        with caplog.at_level(logging.WARNING, logger="orleanspy"):
            await _lose_data(store)
            await wait_for(lambda: silo.declared_dead, 10, what="the silo to notice")
            checks = await silo._readiness()
            assert not checks["membership"].ok
            assert not checks["lease"].ok
            await wait_for(lambda: silo.state is SiloState.STOPPED, 10, what="the silo to stop")
        assert silo.stop_reason is not None and "lost its data" in silo.stop_reason
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("membership store lost its data" in w for w in warnings), warnings
    finally:
        await silo.stop()
    # Its reminder service delivered nothing after the loss: the lease is revoked.
    membership = silo.membership
    assert membership is not None and membership.lease.revoked is not None


@pytest.mark.parametrize("presented", [None, "wrong"])
async def test_a_client_with_the_wrong_secret_is_told_so(store: str, presented: str | None) -> None:
    from orleanspy import ClusterClient
    from orleanspy.errors import AuthenticationError

    async with Silo(options(store, "s3cret")):
        client = ClusterClient(
            membership_url=store, options=MessagingOptions(cluster_secret=presented)
        )
        with pytest.raises(AuthenticationError, match="refused: wrong or missing cluster secret"):
            await client.start()
        async with ClusterClient(
            membership_url=store, options=MessagingOptions(cluster_secret="s3cret")
        ) as good:
            assert good.gateways
