"""What ``orleanspy._redis`` asks of redis-py's cluster client, checked on the
redis-py installed, so that a release that renames or reshapes one of them fails
here, by name, rather than as a slot map that silently stops following a
reshard. CI runs this file on the lowest redis-py the dependency range allows
and on the highest (the pins): ``make test-redis-lowest``.
"""

from __future__ import annotations

import asyncio
import inspect
from contextlib import AsyncExitStack

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, NodesManager

from orleanspy._redis import connect, current_slot_map, refresh_slot_map, resolve
from orleanspy.testing.redis_server import RedisClusterServer
from tests.cluster.test_redis_reshard import _keyslot, _move_slot, _node_id, _slot_owners


def _params(fn: object) -> set[str]:
    return set(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_cluster_client_surface_the_project_uses_exists() -> None:
    assert redis.__version__
    assert inspect.iscoroutinefunction(aioredis.RedisCluster.initialize)
    assert inspect.iscoroutinefunction(NodesManager.initialize)
    assert {"key", "replica"} <= _params(aioredis.RedisCluster.get_node_from_key)
    assert {"raise_on_error", "allow_redirections"} <= _params(ClusterPipeline.execute)
    assert inspect.iscoroutinefunction(ClusterNode.disconnect)
    node = ClusterNode("127.0.0.1", 1)
    assert hasattr(node, "connection_class") and hasattr(node, "connection_kwargs")
    manager = NodesManager([node], False, {})
    assert isinstance(manager.nodes_cache, dict)
    assert isinstance(manager.startup_nodes, dict)


async def test_refresh_slot_map_follows_a_slot_that_moved_without_a_redirection(
    own_redis_cluster: RedisClusterServer,
) -> None:
    """A slot moved behind the client's back is found by ``refresh_slot_map`` at
    once (no command met MOVED, so redis-py itself has not asked for a re-read),
    and ``current_slot_map`` leaves a current map alone."""
    cluster = own_redis_cluster
    async with AsyncExitStack() as stack:
        client = await resolve(connect(cluster.url))
        stack.push_async_callback(client.aclose)
        assert isinstance(client, aioredis.RedisCluster)
        key = "surface:{a}"
        await client.set(key, "v")
        slot = _keyslot(cluster, key)
        ids = {_node_id(cluster, p): p for p in cluster.master_ports()}
        src = ids[_slot_owners(cluster)[slot]]
        dst = next(p for p in cluster.master_ports() if p != src)
        before = client.get_node_from_key(key)
        assert before is not None and before.port == src
        await asyncio.to_thread(_move_slot, cluster, slot, src, dst)
        await current_slot_map(client)  # nothing asked for a re-read: the old map stays
        stale = client.get_node_from_key(key)
        assert stale is not None and stale.port == src
        await asyncio.gather(refresh_slot_map(client), refresh_slot_map(client))
        after = client.get_node_from_key(key)
        assert after is not None and after.port == dst
        assert await client.get(key) == b"v"


async def test_refresh_slot_map_follows_a_promotion_and_retry_failover_rides_it(
    own_redis_cluster: RedisClusterServer,
) -> None:
    """What ``retry_failover`` asks of the client during a failover: the slot map
    re-read after a primary was killed names the promoted replica, and a command
    retried through the loop reaches it (``nodes_manager`` on a live client, not
    only on one built by hand)."""
    from redis.asyncio.cluster import NodesManager as Manager

    from orleanspy._redis import retry_failover
    from orleanspy._retry import within

    cluster = own_redis_cluster
    async with AsyncExitStack() as stack:
        client = await resolve(connect(cluster.url))
        stack.push_async_callback(client.aclose)
        assert isinstance(client, aioredis.RedisCluster)
        assert isinstance(client.nodes_manager, Manager)
        key = "surface:{b}"
        await client.set(key, "v")
        node = client.get_node_from_key(key)
        assert node is not None
        replica = cluster.replica_of(node.port)
        assert replica is not None
        # The key is on the replica before its primary dies.
        assert await client.execute_command("WAIT", 1, 2000, target_nodes=node) == 1
        cluster.kill(node.port)
        within(cluster.node_timeout_ms / 1000 + 10)
        assert await retry_failover(client, "get", lambda _n: client.get(key)) == b"v"
        await refresh_slot_map(client)
        after = client.get_node_from_key(key)
        assert after is not None and after.port == replica
