"""The Redis providers on a real Redis Cluster and behind Sentinel: URLs, key spread,
WAIT, error translation, and a primary killed under writes."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rexc

from orleanspy._redis import connect, is_cluster, reply_error, resolve, translate_errors
from orleanspy.cluster_status import other_clusters
from orleanspy.directory.redis import RedisGrainDirectory
from orleanspy.directory.table import ActivationAddress
from orleanspy.errors import StorageError, StorageUnavailableError
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.membership.model import INITIAL_VERSION, MembershipEntry, SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.options import RedisOptions
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.ring import RingRange
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.redis_server import RedisClusterServer, RedisSentinelSet

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _entry(service_id: str, i: int) -> ReminderEntry:
    return ReminderEntry(
        service_id=service_id,
        grain_id=GrainId("spread", i),
        name="r",
        start_at=T0,
        next_due=T0 + timedelta(seconds=i % 97),
        period=timedelta(minutes=1),
    )


def _member(port: int) -> MembershipEntry:
    return MembershipEntry(
        silo=SiloAddress("127.0.0.1", port, 1),
        status=SiloStatus.JOINING,
        name=f"silo-{port}",
        start_time=T0,
        i_am_alive=T0,
    )


@asynccontextmanager
async def _started(*providers: object) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for p in providers:
            await p.start(stack)  # type: ignore[attr-defined]
        yield


async def test_a_plain_url_to_any_node_is_detected_and_cluster_urls_force_it(
    redis_cluster: RedisClusterServer,
) -> None:
    redis_cluster.wait_healthy()
    replica = next(p for p, role in redis_cluster.roles().items() if role == "slave")
    for url in (
        redis_cluster.url,
        f"redis://127.0.0.1:{replica}",  # a replica is a way in too
        redis_cluster.cluster_url,
    ):
        client = await resolve(connect(url))
        try:
            assert is_cluster(client), url
            await client.set("{probe}k", b"v")
            assert await client.get("{probe}k") == b"v"
        finally:
            await client.aclose()


async def test_a_single_redis_stays_a_plain_client(redis_url: str) -> None:
    client = await resolve(connect(redis_url))
    try:
        assert not is_cluster(client)
        assert isinstance(client, aioredis.Redis)
    finally:
        await client.aclose()


async def test_keys_spread_over_the_masters(redis_cluster: RedisClusterServer) -> None:
    """The reminder table (256 shards), grain state and the directory (256 shards)
    each spread over the 3 masters: none holds more than twice its fair share.
    Membership is one key (one slot) by design."""
    redis_cluster.wait_healthy()
    redis_cluster.flushall()
    url = redis_cluster.url
    sid = f"s{uuid.uuid4().hex[:6]}"
    table = RedisReminderTable(url, service_id=sid)
    storage = RedisGrainStorage(url, service_id=sid)
    directory = RedisGrainDirectory(url, cluster_id="c", service_id=sid)
    async with _started(table, storage, directory):
        await table.upsert_many([_entry(sid, i) for i in range(3000)])
        for i in range(0, 900, 100):
            await asyncio.gather(
                *(storage.write(GrainId("st", j), "s", b"x", None) for j in range(i, i + 100))
            )
        silo = SiloAddress("127.0.0.1", 1, 1)
        for i in range(0, 900, 100):
            await asyncio.gather(
                *(
                    directory.register(GrainId("d", j), ActivationAddress(silo, f"a{j}"))
                    for j in range(i, i + 100)
                )
            )
    masters = redis_cluster.master_ports()
    counts = {port: redis_cluster.dbsize(port) for port in masters}
    total = sum(counts.values())
    assert len(masters) == 3
    assert total >= 3 * 256 + 900  # rows/due/grain/etag per touched shard, states, dir
    fair = total / len(masters)
    assert max(counts.values()) <= 2 * fair, counts


async def test_other_clusters_scans_every_master(redis_cluster_url: str) -> None:
    tables = [
        RedisMembershipTable(redis_cluster_url, cluster_id=f"c{i}", service_id="svc")
        for i in range(12)
    ]
    async with _started(*tables):
        for i, t in enumerate(tables):
            assert await t.insert_row(_member(1000 + i), INITIAL_VERSION.next())
        client = connect(redis_cluster_url)
        try:
            found = await other_clusters(client)
            masters = {
                (await resolve(client)).get_node_from_key(t.key).name  # type: ignore[union-attr]
                for t in tables
            }
        finally:
            await client.aclose()
    assert {k for k in found if k[0] == "svc"} == {("svc", f"c{i}") for i in range(12)}
    assert len(masters) > 1  # the tables did live on several masters


async def test_wait_replicas_acknowledged_or_unavailable(redis_cluster_url: str) -> None:
    """With one replica per master, wait_replicas=1 writes go through; asking for 2
    cannot be met and raises StorageUnavailableError within the wait timeout."""
    sid = f"w{uuid.uuid4().hex[:6]}"
    ok = RedisOptions(wait_replicas=1, wait_timeout=timedelta(seconds=2))
    too_many = RedisOptions(wait_replicas=2, wait_timeout=timedelta(milliseconds=200))
    for options, expect_ok in ((ok, True), (too_many, False)):
        table = RedisReminderTable(redis_cluster_url, service_id=sid, options=options)
        storage = RedisGrainStorage(redis_cluster_url, service_id=sid, options=options)
        members = RedisMembershipTable(
            redis_cluster_url, cluster_id=uuid.uuid4().hex[:6], service_id=sid, options=options
        )
        async with _started(table, storage, members):
            writes = [
                lambda: table.upsert(_entry(sid, 1)),
                lambda: table.upsert_many([_entry(sid, i) for i in range(50)]),
                lambda: storage.write(GrainId("w", 1), "s", b"x", None),
                lambda: members.insert_row(_member(1), INITIAL_VERSION.next()),
            ]
            for write in writes:
                started = time.monotonic()
                if expect_ok:
                    assert await write()
                else:
                    with pytest.raises(StorageUnavailableError, match="replicated"):
                        await write()
                    assert time.monotonic() - started < 2.0


async def test_translate_errors_sorts_cluster_failures_into_unavailable() -> None:
    unavailable = [
        rexc.SlotNotCoveredError("slot 5 not covered"),
        rexc.RedisClusterException("Redis Cluster cannot be connected"),
        rexc.MovedError("14275 127.0.0.1:7103"),
        rexc.ClusterDownError("CLUSTERDOWN The cluster is down"),
        rexc.TryAgainError("TRYAGAIN"),
        rexc.ReadOnlyError("READONLY You can't write against a read only replica."),
        rexc.ResponseError("ERR Script attempted to access a non local key in a cluster node"),
    ]
    for exc in unavailable:
        with pytest.raises(StorageUnavailableError), translate_errors("x"):
            raise exc
    with pytest.raises(StorageError) as info, translate_errors("x"):
        raise rexc.ResponseError("WRONGTYPE Operation against a key")
    assert not isinstance(info.value, StorageUnavailableError)


async def test_reply_errors_in_a_batch_are_sorted_like_raised_ones() -> None:
    """A command's failure returned among a pipeline's replies (a connection
    lost mid-batch, a script key whose slot moved) is unavailable, as it would
    be if raised; a bad request stays a plain StorageError."""
    for exc in (
        rexc.ConnectionError("Connection closed by server."),
        rexc.ResponseError("ERR Script attempted to access a non local key in a cluster node"),
        rexc.AskError("3999 127.0.0.1:7101"),
        rexc.TryAgainError("TRYAGAIN"),
    ):
        assert isinstance(reply_error(exc, "x"), StorageUnavailableError), exc
    plain = reply_error(rexc.ResponseError("WRONGTYPE Operation against a key"), "x")
    assert isinstance(plain, StorageError) and not isinstance(plain, StorageUnavailableError)
    assert "WRONGTYPE" in str(plain)


async def test_translate_errors_maps_redis_pys_failover_attribute_error_only() -> None:
    def inside_redis_py() -> None:
        # The shape redis-py 8.1 raised in a read during a failover.
        code = compile(
            "None.writelines([])", "/x/site-packages/redis/asyncio/connection.py", "exec"
        )
        exec(code)

    with pytest.raises(StorageUnavailableError), translate_errors("read"):
        inside_redis_py()
    with pytest.raises(AttributeError), translate_errors("read"):
        None.writelines([])  # type: ignore[attr-defined]  # our own bug stays a bug


@pytest.mark.slow
async def test_cluster_master_killed_keeps_every_acknowledged_row(
    own_redis_cluster: RedisClusterServer,
) -> None:
    """Rows upserted with wait_replicas=1 survive a master's kill -9: the replica is
    promoted, nothing acknowledged is lost, grain states read back. Until the dead
    master rejoins (as a replica) its slots have no replica, so WAIT cannot be met
    there: those writes are refused (unavailable), never acknowledged."""
    cluster = own_redis_cluster
    master = cluster.master_ports()[0]
    replica = cluster.replica_of(master)
    assert replica is not None

    def promoted() -> bool:
        return cluster.roles().get(replica) == "master"

    await _kill_primary_under_writes(
        url=cluster.url,
        kill=lambda: cluster.kill(master),
        promoted=promoted,
        heal=lambda: cluster.restart(master),
        bound_s=cluster.node_timeout_ms / 1000 + 10,
    )
    cluster.wait_healthy()
    assert cluster.roles()[replica] == "master"


@pytest.mark.slow
async def test_sentinel_primary_killed_keeps_every_acknowledged_row(
    own_redis_sentinel: RedisSentinelSet,
) -> None:
    """The same behind Sentinel: the client follows the sentinels to the promoted
    replica; the old primary comes back as its replica."""
    sentinels = own_redis_sentinel
    old = sentinels.primary_port()
    assert old is not None

    def promoted() -> bool:
        now = sentinels.primary_port()
        return now is not None and now != old

    await _kill_primary_under_writes(
        url=sentinels.url,
        kill=lambda: sentinels.kill(old),
        promoted=promoted,
        heal=lambda: sentinels.restart(old),
        # The sentinels turn the restarted primary into a replica on their next
        # INFO round (every 10 s): until then WAIT cannot be met.
        bound_s=sentinels.down_after_ms / 1000 + 10 + 8,
    )
    assert sentinels.primary_port() not in (None, old)


async def _kill_primary_under_writes(
    *,
    url: str,
    kill: Callable[[], None],
    promoted: Callable[[], bool],
    heal: Callable[[], None],
    bound_s: float,
) -> float:
    """Upsert rows and write grain states one by one with wait_replicas=1; kill the
    primary after 300; once a replica is promoted, restart the dead node; stop 300
    acknowledged rows after the writes resumed. Every acknowledged write must read
    back; only StorageUnavailableError may be raised meanwhile. Returns the
    seconds from the kill to the first write acknowledged after one was refused
    (writes are retried in order, so that is the dead node's slots back)."""
    sid = f"f{uuid.uuid4().hex[:6]}"
    options = RedisOptions(wait_replicas=1, wait_timeout=timedelta(seconds=1))
    table = RedisReminderTable(url, service_id=sid, options=options)
    storage = RedisGrainStorage(url, service_id=sid, options=options)
    acked: set[int] = set()
    states: dict[int, str] = {}
    async with _started(table, storage):
        i = 0
        killed_at: float | None = None
        resumed_at: float | None = None
        healed = False
        failed = False  # a write after the kill was refused: it reached the dead node
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if i == 300 and killed_at is None:
                kill()
                killed_at = time.monotonic()
            try:
                await table.upsert(_entry(sid, i))
                etag = await storage.write(GrainId("f", i), "s", str(i).encode(), None)
                if etag is None:  # a retried write that had landed: read its etag
                    stored = await storage.read(GrainId("f", i), "s")
                    assert stored is not None
                    etag = stored.etag
                acked.add(i)
                states[i] = etag
                if failed and resumed_at is None:
                    resumed_at = time.monotonic()
                if resumed_at is not None and i >= 600:
                    break
                i += 1
            except StorageUnavailableError:
                # Not acknowledged: the same row is tried again (etags make the
                # retry safe); nothing else may be raised.
                failed = True
                if killed_at is not None and not healed and promoted():
                    heal()
                    healed = True
                await asyncio.sleep(0.05)
        assert killed_at is not None and failed, "no write reached the killed node"
        assert resumed_at is not None, "writes never resumed"
        assert resumed_at - killed_at < bound_s
        rows = {row.grain_id.key for row in await table.read_range(RingRange(0, 0))}
        missing = {i for i in acked if i not in rows}
        assert not missing, f"{len(missing)} acknowledged rows lost: {sorted(missing)[:10]}"
        for i, etag in states.items():
            stored = await storage.read(GrainId("f", i), "s")
            assert stored is not None and stored.etag == etag and stored.data == str(i).encode()
    return resumed_at - killed_at


def test_bad_redis_urls_are_clear_configuration_errors() -> None:
    from orleanspy.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="names the master"):
        connect("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="only database 0"):
        connect("redis+cluster://127.0.0.1:7000/3")
    with pytest.raises(ConfigurationError, match="bad host:port"):
        connect("redis+cluster://127.0.0.1:x")
    with pytest.raises(ConfigurationError, match="unsupported Redis URL scheme"):
        connect("memcached://127.0.0.1:11211")


async def test_sentinel_url_finds_the_primary(redis_sentinel_url: str) -> None:
    client = await resolve(connect(redis_sentinel_url))
    try:
        assert not is_cluster(client)
        await client.set("k", b"v")
        info = await client.info("replication")
        assert info["role"] == "master"
    finally:
        await client.aclose()


async def test_sentinel_callers_beyond_the_pool_wait_for_a_connection(
    redis_sentinel_url: str,
) -> None:
    """More commands at once than the pool has connections: each waits for a free
    one, as on a plain URL, and none fails with "Too many connections" (which the
    providers would report as Redis being unavailable)."""
    client = await resolve(connect(redis_sentinel_url, max_connections=2))
    try:
        # BLPOP on an empty list holds its connection for its whole timeout.
        replies = await asyncio.gather(
            *(client.blpop([f"empty:{i}"], timeout=0.2) for i in range(8))
        )
        assert replies == [None] * 8
        pool = client.connection_pool
        assert len(pool._in_use_connections) == 0  # every connection came back
        assert await client.ping()
    finally:
        await client.aclose()


async def test_noscript_on_one_node_resends_only_the_calls_that_did_not_run(
    redis_cluster: RedisClusterServer,
) -> None:
    """A promoted replica has no scripts. With one master's script cache emptied,
    a batch over every node must apply each row exactly once: the calls answered
    NOSCRIPT are sent again, the ones that ran elsewhere are not (each shard's
    etag counter counts one increment per row per batch)."""
    redis_cluster.wait_healthy()
    redis_cluster.flushall()
    sid = f"n{uuid.uuid4().hex[:6]}"
    table = RedisReminderTable(redis_cluster.url, service_id=sid, shards=16)
    async with _started(table):
        entries = [_entry(sid, i) for i in range(400)]
        await table.upsert_many(entries)
        from orleanspy.testing.redis_server import _send

        _send("127.0.0.1", redis_cluster.master_ports()[0], "SCRIPT", "FLUSH")
        etags = await table.upsert_many(entries)
        per_shard: dict[int, int] = {}
        for e in entries:
            per_shard[table.shard_of(e.hash)] = per_shard.get(table.shard_of(e.hash), 0) + 1
        client = await resolve(connect(redis_cluster.url))
        try:
            for shard, n in per_shard.items():
                counter = await client.get(table._key(shard, "etag"))
                assert int(counter) == 2 * n, (shard, counter, n)
        finally:
            await client.aclose()
        # The per-node schedule CAS after another flush: every update applies once.
        _send("127.0.0.1", redis_cluster.master_ports()[1], "SCRIPT", "FLUSH")
        from orleanspy.reminders.model import ScheduleUpdate

        updates = [
            ScheduleUpdate(e.grain_id, e.name, etag, e.next_due + timedelta(minutes=1), None)
            for e, etag in zip(entries, etags, strict=True)
        ]
        results = await table.update_schedule_many(updates)
        assert all(r is not None for r in results)
        rows = {r.grain_id.key: r for r in await table.read_range(RingRange(0, 0))}
        assert all(rows[e.grain_id.key].etag == r for e, r in zip(entries, results, strict=True))


async def test_a_cluster_client_that_lost_a_node_closes_every_connection(
    own_redis_cluster: RedisClusterServer,
) -> None:
    """A connection error that outlived redis-py's retries (a master killed)
    leaves its cluster client waiting to re-read the slot map, a state in which
    redis-py 8.1's own close does nothing; the client ``connect`` makes still
    closes every connection it holds on the surviving nodes."""
    cluster = own_redis_cluster
    client = await resolve(connect(cluster.url))
    assert isinstance(client, aioredis.RedisCluster)
    keys = [f"k{i}" for i in range(50)]
    for key in keys:
        await client.set(key, "v")  # a connection to every master
    victim = cluster.master_ports()[0]
    lost = next(k for k in keys if client.get_node_from_key(k).port == victim)
    cluster.kill(victim)
    with pytest.raises(StorageUnavailableError), translate_errors("get"):
        await client.get(lost)
    assert cluster.clients(), "the client holds connections to the surviving nodes"
    await client.aclose()
    deadline = time.monotonic() + 5
    while cluster.clients() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert cluster.clients() == []
    gc.collect()  # an unclosed connection's ResourceWarning fails the test


class _FakeSentinel:
    """What one sentinel answers to ``SENTINEL MASTERS`` (or the error it raises)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer

    async def sentinel_masters(self) -> object:
        if isinstance(answer := self.answer, Exception):
            raise answer
        return answer


def _naming(port: int, *, sdown: bool = False) -> dict[str, dict[str, object]]:
    state = {"ip": "127.0.0.1", "port": port, "is_master": True, "is_sdown": sdown,
             "is_odown": False, "num-other-sentinels": 2}  # fmt: skip
    return {"m": state}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        # One sentinel has not heard of the failover yet: the other two win.
        ([_naming(7001), _naming(7002), _naming(7002)], 7002),
        ([_naming(7002), _naming(7002), rexc.ConnectionError("down")], 7002),
        # No majority: one each, or one naming it and one seeing it down.
        ([_naming(7001), _naming(7002), rexc.ConnectionError("down")], None),
        ([_naming(7002), _naming(7002, sdown=True), {}], None),
    ],
    ids=["a-lagging-sentinel", "one-sentinel-down", "split", "seen-down"],
)
async def test_the_sentinel_client_follows_the_primary_most_sentinels_name(
    answers: list[object], expected: int | None
) -> None:
    from orleanspy._redis_sentinel import _MajoritySentinel

    sentinel = _MajoritySentinel([("127.0.0.1", 1)] * 3)
    real = sentinel.sentinels
    sentinel.sentinels = [_FakeSentinel(a) for a in answers]  # type: ignore[misc]
    try:
        if expected is None:
            with pytest.raises(rexc.ConnectionError, match="sentinels must name one"):
                await sentinel.discover_master("m")
        else:
            assert await sentinel.discover_master("m") == ("127.0.0.1", expected)
    finally:
        for s in real:
            await s.aclose()
