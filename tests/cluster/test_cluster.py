"""The cluster end to end in one process: real Redis, real gRPC on loopback.

Three silos join through the Redis membership table; a ``ClusterClient`` calls
grains through their gateways. Failure detection runs with short options
(``FAST_MEMBERSHIP``) so a crash is found in about two seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import timedelta

import grpc
import grpc.aio
import pytest

from orleanspy import ClusterClient, Grain, Silo
from orleanspy.directory.redis import RedisGrainDirectory
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import (
    AuthenticationError,
    GrainMethodNotFoundError,
    UnknownGrainTypeError,
)
from orleanspy.identity import GrainId
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.options import MembershipOptions, MessagingOptions, SiloOptions
from orleanspy.placement import HashBasedPlacement
from orleanspy.runtime.silo import SiloState
from orleanspy.testing.cluster import FAST_MEMBERSHIP, InProcessCluster

pytestmark = pytest.mark.timeout(60)


class ClusterWhereGrain(Grain):
    """Says where it runs and which activation answered."""

    async def on_activate(self) -> None:
        self.activation = uuid.uuid4().hex
        self.calls = 0

    async def where(self) -> str:
        return str(self._activation.silo_address)

    async def hit(self) -> tuple[str, str, int]:
        self.calls += 1
        return str(self._activation.silo_address), self.activation, self.calls


class RelayGrain(Grain, placement=HashBasedPlacement()):
    """Suspends at the start of every turn, so a turn that arrives over the
    network runs its first step at once and goes on as a task."""

    async def on_activate(self) -> None:
        self.log: list[int] = []
        self.inside = 0

    async def bounce(self, other_key: str, depth: int) -> list[str]:
        await asyncio.sleep(0)
        here = str(self._activation.silo_address)
        if depth == 0:
            return [here]
        other = self.get_grain(RelayGrain, other_key)
        return [here, *await other.bounce(str(self.grain_key), depth - 1)]

    async def record(self, i: int) -> tuple[list[int], int]:
        self.inside += 1
        inside = self.inside
        await asyncio.sleep(0)
        self.log.append(i)
        self.inside -= 1
        return list(self.log), inside


def detection_bound(m: MembershipOptions) -> float:
    """A generous upper bound on crash-to-Dead for ``m``: enough missed probes
    to suspect, a vote round from each peer, table reads to see the result,
    all tripled for a loaded test machine."""
    probe_round = (m.probe_interval + m.probe_timeout).total_seconds()
    suspect = (m.num_missed_probes_limit + 1) * probe_round
    return 3 * (suspect + 2 * m.table_refresh_interval.total_seconds())


async def hits(client: ClusterClient, keys: range) -> list[tuple[str, str, int]]:
    return list(await asyncio.gather(*(client.get_grain(ClusterWhereGrain, k).hit() for k in keys)))


async def test_calls_from_a_client_reach_grains_on_all_three_silos(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=3, membership=FAST_MEMBERSHIP) as cluster:
        addresses = {str(s.address) for s in cluster.silos}
        assert all(len(s.membership.active_silos()) == 3 for s in cluster.silos)  # type: ignore[union-attr]
        client = await cluster.client()
        assert len(client.gateways) == 3

        where = [h[0] for h in await hits(client, range(60))]

        # Random placement over 3 silos: all 60 on two silos has odds ~1e-10.
        assert set(where) == addresses
        assert sum(s.activation_count for s in cluster.silos) >= 60


async def test_one_activation_cluster_wide_whatever_the_gateway(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=3, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        # The client round-robins over its three gateways, so consecutive calls
        # enter the cluster at different silos.
        seen = [await client.get_grain(ClusterWhereGrain, "one").hit() for _ in range(6)]
        # And from inside each silo, through its own locator.
        for silo in cluster.silos:
            seen.append(await silo.client.get_grain(ClusterWhereGrain, "one").hit())

        assert len({(where, act) for where, act, _ in seen}) == 1
        assert [calls for _, _, calls in seen] == list(range(1, 10))
        hosting = [s for s in cluster.silos if s.activation_count]
        assert len(hosting) == 1


async def test_an_entry_naming_an_activation_its_silo_no_longer_has_is_replaced(
    redis_url: str,
) -> None:
    """An activation that ended while the directory store was away leaves its
    entry behind (its unregister failed). Calls then reach its silo, which has no
    such activation: the silo clears its own stale entry and activates the grain
    there, instead of forwarding the calls to itself until they are rejected."""
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        home = cluster.silos[1]
        stale = ActivationAddress(home.address, "ended-long-ago")
        directory = RedisGrainDirectory(
            redis_url, service_id=cluster.options.service_id, cluster_id=cluster.options.cluster_id
        )
        async with AsyncExitStack() as stack:
            await directory.start(stack)
            gid = GrainId(ClusterWhereGrain.__name__, "left-behind")
            assert await directory.register(gid, stale) == stale
            client = await cluster.client()
            answers = [
                await client.get_grain(ClusterWhereGrain, "left-behind").hit() for _ in range(4)
            ]
            entry = await directory.lookup(gid)
        assert {where for where, _, _ in answers} == {str(home.address)}
        assert [calls for _, _, calls in answers] == [1, 2, 3, 4]
        assert entry is not None and entry != stale and entry.silo == home.address


async def test_graceful_stop_hands_grains_on_and_writes_dead(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=3, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        before = await hits(client, range(30))
        victim = cluster.index_of(Counter(h[0] for h in before).most_common(1)[0][0])
        moved = [
            k
            for k, h in zip(range(30), before, strict=True)
            if cluster.silos[victim].address.__str__() == h[0]
        ]
        assert moved

        await cluster.stop(victim)

        assert cluster.silos[victim].state is SiloState.STOPPED
        # The client learns of the closed gateway stream asynchronously; calls
        # already on that stream fail (never silently re-sent), so wait for it.
        await cluster.wait_for(lambda: len(client.gateways) == 2, timeout=5)
        after = await hits(client, range(30))
        gone = str(cluster.silos[victim].address)
        assert gone not in {h[0] for h in after}
        for k in moved:
            _where, activation, calls = after[k]
            # A fresh activation elsewhere: new identity, call count restarted.
            assert activation != before[k][1]
            assert calls == 1
        observer = cluster.running[0]
        assert observer.membership is not None
        snap = await observer.membership.refresh()
        assert snap.status(cluster.silos[victim].address) is SiloStatus.DEAD


async def test_killed_silo_is_declared_dead_within_the_bound_and_calls_reroute(
    redis_url: str,
) -> None:
    async with InProcessCluster(redis_url, size=3, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        before = await hits(client, range(30))
        victim = cluster.index_of(Counter(h[0] for h in before).most_common(1)[0][0])
        gone = str(cluster.silos[victim].address)

        await cluster.kill(victim)
        took = await cluster.wait_for(
            lambda: cluster.everyone_sees_dead(victim),
            timeout=detection_bound(FAST_MEMBERSHIP),
            what="the survivors declare the killed silo Dead",
        )

        assert took < detection_bound(FAST_MEMBERSHIP)
        # The Dead row was written by the survivors' votes, not by the victim.
        assert not cluster.silos[victim].declared_dead
        # The client saw the victim's gateway stream end; calls now enter at live silos.
        await cluster.wait_for(lambda: len(client.gateways) == 2, timeout=5)
        after = await hits(client, range(30))
        assert gone not in {h[0] for h in after}
        assert {h[0] for h in after} <= {str(s.address) for s in cluster.running}
        moved = [k for k in range(30) if before[k][0] == gone]
        assert moved and all(after[k][2] == 1 for k in moved)


async def test_silo_declared_dead_while_running_stops_itself(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        victim = cluster.silos[1]
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)
            snap = await table.read_all()
            row, etag = snap.get(victim.address), snap.etag(victim.address)
            assert row is not None and etag is not None
            assert await table.update_row(
                row.with_status(SiloStatus.DEAD), etag, snap.version.next()
            )

        await cluster.wait_for(
            lambda: victim.declared_dead and victim.state is SiloState.STOPPED,
            timeout=10,
            what="the silo reads itself Dead and stops",
        )

        assert victim.membership is not None and victim.membership.declared_dead
        # The survivor still serves and places new grains on itself only.
        survivor = cluster.silos[0]
        await cluster.wait_for(
            lambda: cluster.status_seen_by(survivor, 1) is SiloStatus.DEAD, timeout=5
        )
        where = await survivor.client.get_grain(ClusterWhereGrain, "after-death").where()
        assert where == str(survivor.address)


# -- security and bad input --------------------------------------------------------------

SECRET = MessagingOptions(cluster_secret="s3cret")


@pytest.mark.parametrize("presented", [None, "wrong"])
async def test_client_without_the_cluster_secret_is_refused(
    redis_url: str, presented: str | None
) -> None:
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP, messaging=SECRET):
        client = ClusterClient(
            redis_url=redis_url, options=MessagingOptions(cluster_secret=presented)
        )
        # The refusal is the error, not "none answered".
        with pytest.raises(AuthenticationError, match="refused: wrong or missing cluster secret"):
            await client.start()
        with pytest.raises(Exception, match="not open"):
            client.get_grain(ClusterWhereGrain, "x")


@pytest.mark.parametrize("given_as", ["options", "secret="])
async def test_client_with_the_cluster_secret_works(redis_url: str, given_as: str) -> None:
    async with InProcessCluster(
        redis_url, size=2, membership=FAST_MEMBERSHIP, messaging=SECRET
    ) as cluster:
        client = (
            ClusterClient(redis_url=redis_url, options=SECRET)
            if given_as == "options"
            else ClusterClient(redis_url=redis_url, secret="s3cret")
        )
        async with client:
            where = {await client.get_grain(ClusterWhereGrain, k).where() for k in range(20)}
        # Silo-to-silo traffic carries the secret too: both silos host grains.
        assert where == {str(s.address) for s in cluster.silos}


async def test_garbage_frame_to_the_gateway_is_refused_and_the_silo_keeps_serving(
    redis_url: str,
) -> None:
    async with InProcessCluster(
        redis_url, size=1, membership=FAST_MEMBERSHIP, messaging=SECRET
    ) as cluster:
        silo = cluster.silos[0]
        assert silo.membership is not None
        row = silo.membership.snapshot.get(silo.address)
        assert row is not None and row.gateway_port is not None
        port = row.gateway_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/orleanspy.v1.GatewayService/Connect")(
                metadata=(("x-orleanspy-secret", "s3cret"), ("x-orleanspy-client", "raw"))
            )
            await call.write(b"\xff\xfe this is not a protobuf Batch \x00\x01")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async with asyncio.timeout(5):
                    await call.read()
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        assert silo.state is SiloState.RUNNING
        client = await cluster.client()
        assert await client.get_grain(ClusterWhereGrain, "still").where() == str(silo.address)


async def test_unknown_grain_type_and_method_are_errors_and_the_silo_stays_up(
    redis_url: str,
) -> None:
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        # Straight through the invoker: the client-side proxy would refuse an
        # unknown method before sending, and this proves the silo refuses it.
        with pytest.raises(UnknownGrainTypeError):
            await client.invoke(GrainId("NoSuchGrainType", "x"), "where", (), {})
        with pytest.raises(GrainMethodNotFoundError):
            await client.invoke(GrainId("ClusterWhereGrain", "x"), "no_such_method", (), {})
        with pytest.raises(GrainMethodNotFoundError):
            await client.invoke(GrainId("ClusterWhereGrain", "x"), "on_activate", (), {})

        assert all(s.state is SiloState.RUNNING for s in cluster.silos)
        assert await client.get_grain(ClusterWhereGrain, "x").hit() is not None


async def test_in_process_cluster_add_joins_a_new_silo(redis_url: str) -> None:
    options = SiloOptions(gateway_port=0, membership=FAST_MEMBERSHIP)
    async with InProcessCluster(redis_url, size=1, options=options) as cluster:
        added = await cluster.add()
        assert len(cluster.running) == 2
        assert all(cluster.status_seen_by(s, 1) is SiloStatus.ACTIVE for s in cluster.running)
        assert added.address in cluster.silos[0].membership.active_silos()  # type: ignore[union-attr]
        with pytest.raises(TimeoutError, match="never"):
            await cluster.wait_for(lambda: False, timeout=0.1, what="never")


async def test_turns_that_suspend_keep_their_call_chain_and_their_order(redis_url: str) -> None:
    # A short timeout: a lost call chain would deadlock a -> b -> a until it.
    messaging = MessagingOptions(response_timeout=timedelta(seconds=5))
    async with InProcessCluster(
        redis_url, size=2, membership=FAST_MEMBERSHIP, messaging=messaging
    ) as cluster:
        silos = cluster.silos[0].membership.active_silos()  # type: ignore[union-attr]
        home = {
            k: HashBasedPlacement().choose(GrainId("RelayGrain", k), None, silos)
            for k in map(str, itertools.islice(itertools.count(), 40))
        }
        a = next(k for k in home if home[k] == silos[0])
        b = next(k for k in home if home[k] == silos[1])
        client = await cluster.client()

        # a -> b -> a -> b -> a: each call back in is admitted because the chain
        # set in the turn's first step is still there after it suspended.
        path = await client.get_grain(RelayGrain, a).bounce(b, 4)
        assert path == [str(s) for s in (silos[0], silos[1], silos[0], silos[1], silos[0])]

        # Twenty calls sent together over one stream (silo 0 to b's silo): one
        # turn at a time, in arrival order.
        ref = cluster.silos[0].client.get_grain(RelayGrain, b)
        results = await asyncio.gather(*(ref.record(i) for i in range(20)))
        assert [log for log, _ in results] == [list(range(i + 1)) for i in range(20)]
        assert {inside for _, inside in results} == {1}


async def test_calls_queued_for_a_closing_gateway_go_through_another(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        assert len(client.gateways) == 2
        calls = [
            asyncio.create_task(client.get_grain(ClusterWhereGrain, k).hit()) for k in range(40)
        ]
        # One loop round: every call is queued on a gateway stream (round-robin,
        # so half on each) and no stream writer has run yet.
        await asyncio.sleep(0)
        closing = client._connections[client.gateways[0]]
        await closing.aclose()  # as the client does for a gateway that left the table

        results = await asyncio.gather(*calls)

        assert closing.stats.messages_sent == 0  # nothing left on the closed stream...
        assert len(results) == 40  # ...yet every call was answered, through the other one


async def test_joins_and_leaves_spread_by_gossip_long_before_a_table_refresh(
    redis_url: str,
) -> None:
    # Orleans-like slow timers: without gossip, the others would learn of the
    # newcomer (and of its leaving) only on their next read, a minute away.
    slow = MembershipOptions(
        table_refresh_interval=timedelta(seconds=60), probe_interval=timedelta(seconds=60)
    )
    async with InProcessCluster(redis_url, size=2, membership=slow) as cluster:
        late = Silo(dataclasses.replace(cluster.options, name="late"))

        def everyone_sees_late(status: SiloStatus) -> Callable[[], bool]:
            return lambda: all(
                s.membership.snapshot.status(late.address) is status  # type: ignore[union-attr]
                for s in cluster.silos
            )

        await late.start()
        try:
            await cluster.wait_for(
                everyone_sees_late(SiloStatus.ACTIVE), timeout=5, what="the newcomer Active"
            )
        finally:
            await late.stop()
        await cluster.wait_for(everyone_sees_late(SiloStatus.DEAD), timeout=5, what="it Dead")


class TaskAwareGrain(Grain, placement=HashBasedPlacement()):
    """Uses what binds to the current task: a timeout, a task group."""

    async def same_task_throughout(self) -> bool:
        first = asyncio.current_task()
        await asyncio.sleep(0)
        return asyncio.current_task() is first and first is not None

    async def times_out(self) -> str:
        async with asyncio.timeout(0.05):
            await asyncio.sleep(5)
        return "not reached"

    async def in_a_task_group(self) -> int:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(asyncio.sleep(0, result=i)) for i in range(3)]
        return sum(t.result() for t in tasks)


async def test_turns_from_the_network_run_in_their_own_task(redis_url: str) -> None:
    # A turn is a task of its own, even one that arrives over the network: a
    # timeout entered in its first step must cancel the turn, not the stream
    # that delivered it.
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        client = await cluster.client()
        grain = client.get_grain(TaskAwareGrain, "t")
        assert await grain.same_task_throughout()
        with pytest.raises(TimeoutError):
            await grain.times_out()
        assert await grain.in_a_task_group() == 3
        # The streams that carried the timed-out call still serve.
        hits = await asyncio.gather(
            *(client.get_grain(TaskAwareGrain, k).in_a_task_group() for k in range(20))
        )
        assert hits == [3] * 20


class HostedElsewhereGrain(Grain):
    """Hosted by the cluster's silos, but not by a silo limited to other types."""

    async def where(self) -> str:
        return str(self._activation.silo_address)


async def test_grains_are_placed_only_on_silos_that_host_their_type(redis_url: str) -> None:
    async with InProcessCluster(redis_url, size=2, membership=FAST_MEMBERSHIP) as cluster:
        limited = Silo(
            dataclasses.replace(cluster.options, name="limited", grain_types=(ClusterWhereGrain,))
        )
        await limited.start()
        try:
            await cluster.refresh_all()
            assert limited.membership is not None
            await limited.membership.refresh()
            client = await cluster.client()
            assert len(client.gateways) == 3  # the limited silo is a gateway too
            here = str(limited.address)

            # Through every gateway, the limited one included: never placed there.
            elsewhere = await asyncio.gather(
                *(client.get_grain(HostedElsewhereGrain, k).where() for k in range(60))
            )
            assert here not in elsewhere
            # A call made inside the limited silo is sent on to a silo that hosts it.
            assert await limited.client.get_grain(HostedElsewhereGrain, "x").where() != here
            # A type it does host still lands on it (random placement over three:
            # none of 60 keys there has odds of about 1e-11).
            spread = {h[0] for h in await hits(client, range(60))}
            assert here in spread
            # A type nobody hosts is refused by name.
            with pytest.raises(UnknownGrainTypeError, match="NobodyHostsThis"):
                await client.invoke(GrainId("NobodyHostsThis", 1), "where", (), {})
        finally:
            await limited.stop()
