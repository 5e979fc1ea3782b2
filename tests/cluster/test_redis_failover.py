"""A Redis primary killed with kill -9 under 600 one-second reminders on 3 silo
processes, on a Redis Cluster and behind Sentinel.

The rows and grain states are written with ``wait_replicas=1`` before the kill.
After it: the replica is promoted; every row and state reads back; every
reminder ticks again within node timeout + detection + 2 periods of the kill;
the silos stay Active. The dead node is restarted once its replica took over
(it rejoins as a replica), so ``WAIT`` can be met again.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orleanspy.identity import GrainId
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.options import RedisOptions
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable
from orleanspy.ring import RingRange
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.cluster import wait_for
from orleanspy.testing.redis_server import RedisClusterServer, RedisSentinelSet
from tests.ready import read_ready, stop_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SILO = Path(__file__).with_name("failover_silo.py")
ROOT = Path(__file__).resolve().parents[2]
TYPE = "failover.Tick"
REMINDERS = 600
PERIOD = timedelta(seconds=1)
WAIT = RedisOptions(wait_replicas=1, wait_timeout=timedelta(seconds=2))
# Detection: the client's redirection retries, the reminder service's backoff
# (retry_max 0.5 s) and the loader's poll (1 s).
DETECTION_S = 2.0


class Ticks:
    """The last tick per reminder key and each silo's last status, read from the
    silos' stdout by one thread per silo."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.status: dict[int, str] = {}
        self._lock = threading.Lock()

    def follow(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            with self._lock:
                if parts[:1] == ["TICK"]:
                    self.last[int(parts[1])] = float(parts[2])
                elif parts[:1] == ["STATUS"]:
                    self.status[index] = parts[1]

    def ticked_since(self, t: float) -> int:
        with self._lock:
            return sum(1 for v in self.last.values() if v >= t)


async def _seed(url: str, service_id: str) -> dict[int, str]:
    """The 600 rows (first slots spread over one period) and one grain state each,
    all acknowledged with wait_replicas=1; returns the states' etags."""
    now = datetime.now(UTC) + timedelta(seconds=2)
    entries = [
        ReminderEntry(
            service_id=service_id,
            grain_id=GrainId(TYPE, i),
            name="r",
            start_at=now + PERIOD * i / REMINDERS,
            next_due=now + PERIOD * i / REMINDERS,
            period=PERIOD,
        )
        for i in range(REMINDERS)
    ]
    etags: dict[int, str] = {}
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=service_id, options=WAIT)
        storage = RedisGrainStorage(url, service_id=service_id, options=WAIT)
        await table.start(stack)
        await storage.start(stack)
        await table.upsert_many(entries)
        for i in range(REMINDERS):
            etag = await storage.write(GrainId("failover.State", i), "s", b"%d" % i, None)
            assert etag is not None
            etags[i] = etag
    return etags


async def _check_after(url: str, service_id: str, etags: dict[int, str]) -> None:
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(url, service_id=service_id)
        storage = RedisGrainStorage(url, service_id=service_id)
        await table.start(stack)
        await storage.start(stack)
        rows = await table.read_range(RingRange(0, 0))
        assert {int(r.grain_id.key) for r in rows} == set(range(REMINDERS))
        for i, etag in etags.items():
            state = await storage.read(GrainId("failover.State", i), "s")
            assert state is not None and (state.etag, state.data) == (etag, b"%d" % i)


async def _run(
    url: str,
    kill: Callable[[], None],
    promoted: Callable[[], bool],
    heal: Callable[[], None],
    promotion_s: float,
) -> None:
    service_id = "default"  # the silos' default service id
    etags = await _seed(url, service_id)
    ticks = Ticks()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SILO), "--redis-url", url, "--name", f"f{i}", "--expect", "3"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(3)
    ]
    try:
        for proc in procs:
            read_ready(proc, 30)
        for i, proc in enumerate(procs):
            threading.Thread(target=ticks.follow, args=(i, proc), daemon=True).start()
        started = time.time()
        await wait_for(
            lambda: ticks.ticked_since(started) == REMINDERS,
            timeout=10,
            what="every reminder ticking before the kill",
        )
        kill()
        killed = time.time()
        await wait_for(promoted, timeout=promotion_s, what="the replica promoted")
        promoted_at = time.time()
        heal()
        # From the kill: the promotion, detection, then two periods for every
        # reminder to tick (again) with the new primary serving.
        bound = promotion_s + DETECTION_S + 2 * PERIOD.total_seconds()
        await wait_for(
            lambda: ticks.ticked_since(promoted_at) == REMINDERS,
            timeout=max(0.1, killed + bound - time.time()),
            what="every reminder ticking again after the failover",
        )
        assert all(p.poll() is None for p in procs), "a silo process died"
        await wait_for(
            lambda: ticks.status == {0: "ACTIVE", 1: "ACTIVE", 2: "ACTIVE"},
            timeout=3,
            what="every silo reading itself Active",
        )
        async with AsyncExitStack() as stack:
            members = RedisMembershipTable(url, cluster_id="dev", service_id=service_id)
            await members.start(stack)
            snap = await members.read_all()
            statuses = [entry.status for entry, _ in snap.entries.values()]
            assert statuses.count(SiloStatus.ACTIVE) == 3, statuses
        await _check_after(url, service_id, etags)
    finally:
        stop_processes(procs, 10)


async def test_cluster_master_killed_under_600_reminders_on_3_silos(
    own_redis_cluster: RedisClusterServer,
) -> None:
    cluster = own_redis_cluster
    master = cluster.master_ports()[0]
    replica = cluster.replica_of(master)
    assert replica is not None
    await _run(
        cluster.url,
        kill=lambda: cluster.kill(master),
        promoted=lambda: cluster.roles().get(replica) == "master",
        heal=lambda: cluster.restart(master),
        # cluster-node-timeout, then the replica's election (about a second).
        promotion_s=cluster.node_timeout_ms / 1000 + 3,
    )


async def test_sentinel_primary_killed_under_600_reminders_on_3_silos(
    own_redis_sentinel: RedisSentinelSet,
) -> None:
    sentinels = own_redis_sentinel
    old = sentinels.primary_port()
    assert old is not None
    await _run(
        sentinels.url,
        kill=lambda: sentinels.kill(old),
        promoted=lambda: sentinels.primary_port() not in (None, old),
        heal=lambda: sentinels.restart(old),
        # down-after-milliseconds, the sentinels' vote and the promotion.
        promotion_s=sentinels.down_after_ms / 1000 + 5,
    )
