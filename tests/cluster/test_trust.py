"""Trust in a deployment, on real stores with real gRPC: a silo with the wrong
credentials or another ring refuses to join before it writes anything, and a store that lost
its data stops the silo with a WARNING, on Redis and on PostgreSQL."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import Any

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis

from orleanspy import Grain, Remindable, Silo, SiloOptions, TickStatus, register_reminder
from orleanspy import grain as grain_module
from orleanspy.errors import SiloUnavailableError, StorageUnavailableError
from orleanspy.identity import SiloAddress
from orleanspy.membership.agreement import RingModeMismatchError, ring_mode
from orleanspy.membership.credentials import CredentialsMismatchError, cluster_verifier
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.postgres import PostgresMembershipTable
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.membership.table import MembershipTable
from orleanspy.messaging.grpc import GrpcTransport
from orleanspy.messaging.message import Message
from orleanspy.messaging.transport import ProbeOutcome
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


@pytest.mark.parametrize("cluster_balanced", [True, False])
async def test_a_silo_on_another_ring_refuses_to_start_and_writes_nothing(
    store: str, cluster_balanced: bool
) -> None:
    """Every silo must build the same ring: the other setting is refused before
    the rogue writes anything, and the row of the running silo records its mode."""
    healthy_options = replace(
        options(store, None), membership=replace(FAST_MEMBERSHIP, balanced_ring=cluster_balanced)
    )
    rogue_options = replace(
        healthy_options,
        membership=replace(FAST_MEMBERSHIP, balanced_ring=not cluster_balanced),
    )
    async with Silo(healthy_options) as healthy, table_of(store) as table:
        before = await table.read_all()
        row = before.get(healthy.address)
        assert row is not None and row.ring_mode == ring_mode(cluster_balanced)
        rogue = Silo(rogue_options)
        with pytest.raises(RingModeMismatchError, match="refusing to join") as caught:
            await rogue.start()
        assert f"balanced_ring={not cluster_balanced}" in str(caught.value)
        assert f"balanced_ring={cluster_balanced}" in str(caught.value)
        assert str(healthy.address) in str(caught.value)
        after = await table.read_all()
        assert after.version == before.version
        assert set(after.entries) == {healthy.address}
        assert after.get(healthy.address) == row.with_i_am_alive(
            after.entries[healthy.address][0].i_am_alive
        )
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
        client = aioredis.Redis.from_url(redis_url)
        try:
            raw = await client.hgetall(table.key)  # type: ignore[attr-defined,misc]
        finally:
            await client.aclose()
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


# -- the ownership lease on an isolated silo -----------------------------------------


class Cut:
    """Whether the isolated silo is cut off, and when that began."""

    def __init__(self) -> None:
        self.since: float | None = None

    @property
    def on(self) -> bool:
        return self.since is not None


class CutOffStore:
    """A store seen through a link that ``cut`` can sever: while it is on, every
    call the silo makes fails as an unreachable store would."""

    def __init__(self, inner: Any, cut: Cut) -> None:
        self._inner, self._cut = inner, cut

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name in ("start", "changes", "scoped_changes") or not inspect.iscoroutinefunction(value):
            return value

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self._cut.on:
                raise StorageUnavailableError(f"{name}: the host is isolated")
            return await value(*args, **kwargs)

        return call


class CutOffTransport(GrpcTransport):
    """gRPC whose traffic to and from peers stops while ``cut`` is on (as a
    host whose link is down: sends fail, probes go unanswered both ways)."""

    def __init__(self, cut: Cut, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cut = cut

    def send(self, target: SiloAddress, message: Message) -> None:
        if self._cut.on and self._sink is not None:
            self._later(message, SiloUnavailableError(f"silo {target}: host isolated"))
            return
        super().send(target, message)

    async def probe(
        self, target: SiloAddress, timeout: float, table_version: int = 0
    ) -> ProbeOutcome:
        if self._cut.on:
            return ProbeOutcome.SILENT
        return await super().probe(target, timeout, table_version)

    async def _serve_ping(self, request: bytes, context: Any) -> bytes:
        if self._cut.on:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "host isolated")
        return await super()._serve_ping(request, context)


LEASE_TICKS: list[tuple[str, str, float]] = []


LEASE_TYPE = "TrustLeaseTickGrain"


def lease_grain() -> type[Grain]:
    """Declared reminders: registered at start without activating the grain, so
    each grain is activated on the silo that owns its reminder (reminder-affine
    placement) and its ticks are local there, as an isolated host's would be.
    Made per test and forgotten after it: a declared class in the registry
    would be registered by every later silo that hosts every type."""

    @register_reminder("tick", due=1, period=1, keys=[f"k{i}" for i in range(40)])
    class LeaseTickGrain(Grain, Remindable, type_name=LEASE_TYPE):
        async def receive_reminder(self, name: str, status: TickStatus) -> None:
            LEASE_TICKS.append(
                (str(self.grain_key), str(self._activation.silo_address), time.time())
            )

    return LeaseTickGrain


@pytest.fixture
def lease_tick_grain() -> Iterator[type[Grain]]:
    try:
        yield lease_grain()
    finally:
        grain_module._registry.pop(LEASE_TYPE, None)


async def test_an_isolated_silo_stops_ticking_before_its_peers_take_over(
    redis_url: str, lease_tick_grain: type[Grain]
) -> None:
    """Default membership options. One of three silos loses its link to the store
    and to its peers. Its peers declare it Dead and take its reminders over; by
    then its lease has lapsed and it delivers nothing more, so no reminder ticks
    on two silos after the Dead write (the target allows 5 s)."""
    from orleanspy.directory.redis import RedisGrainDirectory
    from orleanspy.reminders.redis import RedisReminderTable

    LEASE_TICKS.clear()
    cut = Cut()
    base = SiloOptions(redis_url=redis_url, gateway_port=0, grain_types=[lease_tick_grain])
    keys = {f"k{i}" for i in range(40)}
    async with AsyncExitStack() as stack:
        # First and alone, it owns every reminder: each grain is activated on it,
        # so its own ticks stay local when it is cut off, as on a real host.
        isolated = Silo(
            base,
            membership_table=CutOffStore(
                RedisMembershipTable(redis_url, cluster_id="dev", service_id="default"), cut
            ),
            directory=CutOffStore(
                RedisGrainDirectory(redis_url, cluster_id="dev", service_id="default"), cut
            ),
            reminder_table=CutOffStore(RedisReminderTable(redis_url, service_id="default"), cut),
            transport=CutOffTransport(
                cut, host="127.0.0.1", port=0, gateway_port=0, options=MessagingOptions()
            ),
        )
        await isolated.start()
        stack.push_async_callback(isolated.stop)
        me = str(isolated.address)
        await wait_for(lambda: {k for k, _, _ in LEASE_TICKS} >= keys, 20, what="every tick")
        healthy = [await stack.enter_async_context(Silo(base)) for _ in range(2)]
        everyone = (*healthy, isolated)
        await wait_for(
            lambda: all(len(s.membership.active_silos()) == 3 for s in everyone),  # type: ignore[union-attr]
            10,
        )
        service = isolated.reminder_service
        assert service is not None and isolated.membership is not None
        # Its share of the ring, still ticking locally.
        before = service.stats.delivered
        await wait_for(lambda: service.stats.delivered > before + 5, 10, what="its own ticks")
        deliveries: list[tuple[float, int]] = []

        async def sample() -> None:
            while True:
                deliveries.append((time.time(), service.stats.delivered))
                await asyncio.sleep(0.02)

        sampler = asyncio.ensure_future(sample())
        async with table_of(redis_url) as table:
            cut.since = time.time()

            async def dead() -> bool:
                return (await table.read_all()).status(isolated.address) is SiloStatus.DEAD

            await wait_for(dead, 30, interval=0.02, what="the isolated silo declared Dead")
            dead_at = time.time()

        def taken_over() -> bool:
            return {k for k, s, at in LEASE_TICKS if s != me and at > dead_at} >= keys

        await wait_for(taken_over, 20, what="every reminder ticking on the peers")
        await asyncio.sleep(1.0)  # a period more of watching the cut-off silo
        sampler.cancel()
        final = deliveries[-1][1]
        last = next(t for t, n in deliveries if n == final)
        lease = isolated.membership.lease
        print(
            f"\nisolated host: declared dead {dead_at - cut.since:.2f}s after the cut; it "
            f"delivered its last tick {last - cut.since:.2f}s after the cut "
            f"({last - dead_at:+.2f}s from the Dead write); "
            f"lease {lease.duration.total_seconds():.0f}s"
        )
        assert not lease.held() and lease.lapsed_at is not None
        lapsed = lease.lapsed_at.timestamp()
        # The lease lapsed within its bound of the cut, at most a probe interval
        # after the earliest possible Dead write, and nothing was delivered after.
        assert lapsed - cut.since <= lease.duration.total_seconds() + 0.5
        assert lapsed - dead_at <= 1.0 + 0.5
        assert last <= lapsed + 0.1
        assert last - dead_at < 5.0
        cut.since = None


async def test_a_redis_restarted_without_persistence_stops_the_silo_once_it_is_back(
    own_redis: Any,
) -> None:
    """Redis killed and started again empty. While it is down the silo rides the
    outage (nothing to judge); once it answers again without the silo's row, the
    silo says so and stops."""
    silo = Silo(options(own_redis.url, None))
    await silo.start()
    try:
        own_redis.kill()
        await asyncio.sleep(FAST_MEMBERSHIP.table_refresh_interval.total_seconds() * 3)
        assert not silo.declared_dead  # an outage is not a loss
        own_redis.start()
        await wait_for(lambda: silo.declared_dead, 15, what="the silo to notice")
        assert silo.stop_reason is not None and "lost its data" in silo.stop_reason
        await wait_for(lambda: silo.state is SiloState.STOPPED, 15, what="the silo to stop")
    finally:
        await silo.stop()
