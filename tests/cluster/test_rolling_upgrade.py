"""A rolling upgrade from the previous release to the checkout, and back, on real
processes of both releases (``previous_release.py`` builds 0.1.0 from history).

Three silos of 0.1.0 run with default options over one store (Redis, or
PostgreSQL) with 300 reminders ticking every 2 s, counters in grain state, items
on a stream and a client calling throughout. Each old silo is replaced by a
silo of the checkout, one at a time: the new one starts (and joins: nothing
refuses it), then the old one gets SIGTERM. Then the same backwards. What must
hold, at every step and at the end:

- every silo joins and is Active; the rows of the new ones record their release;
- no reminder is stranded: after each step every reminder ticks again within two
  periods and a handover (``STEP_DEADLINE``);
- no slot is delivered twice (every stop is graceful, so at-least-once never
  needs to repeat one);
- counters hold every acknowledged add (and no more than were sent), and the
  stream holds every acknowledged item in order, whichever release wrote them;
- at most 2 % of the client's calls fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from orleanspy import ClusterClient, __version__
from orleanspy.errors import OrleansPyError
from orleanspy.identity import SiloAddress
from orleanspy.streams.redis import RedisStreamProvider
from orleanspy.testing.cluster import wait_for
from tests.cluster.cli_silos import Silos, silos
from tests.cluster.previous_release import PREVIOUS_VERSION, previous_release_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
GRAIN = "UpgradeGrain"
REMINDERS = 300
COUNTERS = 20
PERIOD_S = 2.0
STEP_DEADLINE = 2 * PERIOD_S + 8.0


@dataclass
class Load:
    """The client's traffic: adds to counters and items on the stream."""

    ok: Counter[int] = field(default_factory=Counter)
    sent: Counter[int] = field(default_factory=Counter)
    published: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    calls: int = 0

    async def run(self, client: ClusterClient, stop: asyncio.Event) -> None:
        rng = random.Random(7)
        n = 0
        while not stop.is_set():
            n += 1
            key = rng.randrange(COUNTERS)
            grain = client.get_grain(GRAIN, key)
            self.calls += 1
            self.sent[key] += 1
            try:
                await grain.add(1)
                self.ok[key] += 1
                if n % 10 == 0:
                    self.calls += 1
                    await grain.publish(n)
                    self.published.append(n)
            except OrleansPyError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.01)


async def _ticks(record: aioredis.Redis) -> list[tuple[str, int]]:
    rows = await record.lrange("upgrade:ticks", 0, -1)
    out = []
    for row in rows:
        key, slot, _pid = row.decode().split()
        out.append((key, int(slot)))
    return out


async def _every_reminder_ticks_after(
    record: aioredis.Redis, since_ms: int, step: str, times: int = 1
) -> None:
    """Every reminder delivers ``times`` slots after ``since_ms`` within
    STEP_DEADLINE (plus a period for each tick past the first)."""
    pending: set[str] = set()

    async def all_ticked() -> bool:
        counts = Counter(key for key, slot in await _ticks(record) if slot > since_ms)
        seen = {key for key, n in counts.items() if n >= times}
        pending.clear()
        pending.update(str(k) for k in range(REMINDERS) if str(k) not in seen)
        return not pending

    try:
        await wait_for(all_ticked, STEP_DEADLINE + (times - 1) * PERIOD_S, interval=0.25)
    except TimeoutError:
        pytest.fail(f"after {step}: {len(pending)} reminders stranded, e.g. {sorted(pending)[:5]}")


async def _releases(client_url: str) -> dict[SiloAddress, tuple[str | None, str, str | None]]:
    """Each row's release, status and the ring it records."""
    from orleanspy.tables import TableConnections

    async with AsyncExitStack() as stack:
        table = await TableConnections(stack).membership_table(
            client_url, cluster_id="dev", service_id="default"
        )
        await table.start(stack)
        snap = await table.read_all()
    return {s: (e.release, e.status.name, e.ring_mode) for s, (e, _etag) in snap.entries.items()}


def _status(store_url: str) -> dict[str, dict[str, object]]:
    """``orleanspy cluster status --json`` of the checkout, by silo name."""
    done = subprocess.run(
        [os.sys.executable, "-P", "-m", "orleanspy", "--storage-url", store_url,
         "cluster", "status", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    doc = json.loads(done.stdout)
    return {s["name"]: s for s in doc["silos"] if s["status"] == "active"}


async def _roll(
    group: Silos, record: aioredis.Redis, load: Load, old: list[str], new: list[str], python: Path
) -> None:
    """Replace each silo named in ``old`` by one named in ``new`` on ``python``."""
    for gone, coming in zip(old, new, strict=True):
        group.start(coming, python)
        if gone == "old-0":  # the first mixed cluster: each silo's versions are shown
            status = _status(group.store_url)
            shown = {name: (s["version"], s["protocols"]) for name, s in status.items()}
            old = ("0.1.0", "1")
            want = {"old-0": old, "old-1": old, "old-2": old, coming: (__version__, "1-2")}
            assert shown == want, shown
        group.stop(gone)
        step_ms = int(time.time() * 1000)
        # Two periods each: the mixed cluster runs for a while at every step.
        await _every_reminder_ticks_after(record, step_ms, f"{gone} -> {coming}", times=2)
        assert load.calls > 0


@pytest.mark.parametrize(
    ("store", "old_settings"),
    [("redis", ()), ("postgres", ()), ("redis", ("membership.balanced_ring=false",))],
    ids=["redis", "postgres", "redis-hashed-ring"],
)
async def test_a_cluster_rolls_from_the_previous_release_and_back(
    store: str, old_settings: tuple[str, ...], redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """With ``old_settings`` the 0.1.0 silos build the hashed ring, as 0.1.0's
    upgrade notes told clusters of earlier code to: the new silos follow it, and
    switch the cluster to the balanced ring when the last old silo leaves (the
    roll back then uses 0.1.0's defaults, which build the balanced ring)."""
    old_python = previous_release_python()
    new_python = Path(os.sys.executable)
    store_url = redis_url if store == "redis" else postgres_url
    record = aioredis.Redis.from_url(redis_url)
    load = Load()
    async with AsyncExitStack() as stack:
        stack.push_async_callback(record.aclose)
        env = {"UPGRADE_RECORD_URL": redis_url, "UPGRADE_STREAMS_URL": redis_url}
        group = stack.enter_context(silos(store_url, "upgrade_grains", env, tmp_path))
        for i in range(3):
            group.start(f"old-{i}", old_python, *old_settings)
        client = await stack.enter_async_context(ClusterClient(membership_url=store_url))
        for chunk in range(0, REMINDERS, 50):
            await asyncio.gather(
                *(client.get_grain(GRAIN, k).start() for k in range(chunk, chunk + 50))
            )
        await _every_reminder_ticks_after(record, 0, "the start on 0.1.0")
        stop = asyncio.Event()
        traffic = asyncio.create_task(load.run(client, stop))
        try:
            await _roll(group, record, load, ["old-0", "old-1", "old-2"],
                        ["new-0", "new-1", "new-2"], new_python)  # fmt: skip
            rows = await _releases(store_url)
            live = {(rel, ring) for rel, status, ring in rows.values() if status == "ACTIVE"}
            # Every silo new, so the cluster builds the balanced ring, whatever the old one.
            assert live == {(__version__, "balanced")}, rows
            await _roll(group, record, load, ["new-0", "new-1", "new-2"],
                        ["back-0", "back-1", "back-2"], old_python)  # fmt: skip
            rows = await _releases(store_url)
            live = {release for release, status, _ring in rows.values() if status == "ACTIVE"}
            assert live == {None}, rows  # 0.1.0 records no release
        finally:
            stop.set()
            await traffic

        ticks = await _ticks(record)
        doubled = [pair for pair, n in Counter(ticks).items() if n > 1]
        assert not doubled, f"{len(doubled)} slots delivered twice, e.g. {doubled[:5]}"
        for key in range(COUNTERS):
            value = await client.get_grain(GRAIN, key).value()
            assert load.ok[key] <= value <= load.sent[key], (key, value, load.ok[key])
        provider = RedisStreamProvider(redis_url, service_id="upgrade")
        await provider.start(stack)
        items = await provider.read("upgrade", limit=100_000)
        numbers = [item.item["n"] for item in items]
        assert [n for n in numbers if n in set(load.published)] == load.published
        failed = len(load.failures) / max(1, load.calls)
        print(
            f"\n{store}: {PREVIOUS_VERSION} -> {__version__} -> {PREVIOUS_VERSION}: "
            f"{len(ticks)} ticks, 0 doubled, {load.calls} calls, {len(load.failures)} failed "
            f"({100 * failed:.2f} %): {load.failures[:3]}"
        )
        assert failed <= 0.02, load.failures[:5]
        assert group.tracebacks() == {}
