"""Reminders registered while the ring changes tick once per slot.

On ``orleanspy silo`` processes over one Redis, with default options: 600
one-second reminders are registered (many at once) while two silos join a
first one at once, or while one of three leaves gracefully (SIGTERM). Every tick is recorded
(``failover_grains.FailoverTickGrain``) with its slot; no slot of any reminder
may tick twice, and every reminder ticks after the change.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from orleanspy import ClusterClient
from orleanspy.errors import SiloUnavailableError
from tests.cluster.cli_silos import Silos, silos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REMINDERS = 600
RECORD_KEY = "races:ticks"
#: How long the reminders tick after the change before the slots are counted.
SETTLE_S = 15.0


async def _register(client: ClusterClient, keys: range) -> None:
    """Register every key's reminder, 50 calls at a time; a call that met the
    silo that is leaving is made again (registering is idempotent)."""

    async def one(key: int) -> None:
        for _attempt in range(10):
            try:
                await client.get_grain("FailoverTickGrain", key).start()
                return
            except SiloUnavailableError:
                await asyncio.sleep(0.2)
        await client.get_grain("FailoverTickGrain", key).start()

    for chunk in range(keys.start, keys.stop, 50):
        await asyncio.gather(*(one(k) for k in range(chunk, min(chunk + 50, keys.stop))))


async def _check(record: aioredis.Redis, group: Silos, changed_ms: int) -> None:
    lines = [line.split() for line in await record.lrange(RECORD_KEY, 0, -1)]
    slots = Counter((key, slot) for key, slot, _pid in lines)
    twice = sorted(k for k, n in slots.items() if n > 1)
    keys = {int(key) for key, _slot, _pid in lines}
    after = {int(key) for key, slot, _pid in lines if int(slot) > changed_ms}
    print(
        f"\n{len(lines)} ticks of {len(keys)} reminders, {len(twice)} slots twice "
        f"({len({k for k, _ in twice})} reminders)"
    )
    assert not twice, f"{len(twice)} slots ticked twice, e.g. {twice[:5]}"
    assert after == set(range(REMINDERS)), f"{REMINDERS - len(after)} reminders stranded"
    assert group.tracebacks() == {}


async def test_reminders_registered_while_a_silo_joins_tick_once_per_slot(
    redis_url: str, tmp_path: Path
) -> None:
    record = aioredis.Redis.from_url(redis_url)
    env = {"FAILOVER_RECORD_URL": redis_url, "FAILOVER_RECORD_KEY": RECORD_KEY}
    python = Path(os.sys.executable)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(record.aclose)
        group = stack.enter_context(silos(redis_url, "failover_grains", env, tmp_path))
        group.start("a", python)
        client = await stack.enter_async_context(ClusterClient(membership_url=redis_url))
        await _register(client, range(0, 50))
        # Two silos join at once while the rest is registered.
        joining = [
            asyncio.create_task(asyncio.to_thread(group.start, name, python)) for name in "bc"
        ]
        await _register(client, range(50, REMINDERS))
        await asyncio.gather(*joining)
        changed_ms = int(time.time() * 1000)
        await asyncio.sleep(SETTLE_S)  # the reminders tick under the new ring
        await _check(record, group, changed_ms)


async def test_reminders_registered_while_a_silo_leaves_tick_once_per_slot(
    redis_url: str, tmp_path: Path
) -> None:
    record = aioredis.Redis.from_url(redis_url)
    env = {"FAILOVER_RECORD_URL": redis_url, "FAILOVER_RECORD_KEY": RECORD_KEY}
    python = Path(os.sys.executable)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(record.aclose)
        group = stack.enter_context(silos(redis_url, "failover_grains", env, tmp_path))
        for name in ("a", "b", "c"):
            group.start(name, python)
        client = await stack.enter_async_context(ClusterClient(membership_url=redis_url))
        await _register(client, range(0, 50))
        leaving = asyncio.create_task(asyncio.to_thread(group.stop, "c"))
        await _register(client, range(50, REMINDERS))
        await leaving
        changed_ms = int(time.time() * 1000)
        await asyncio.sleep(SETTLE_S)  # the reminders tick under the new ring
        await _check(record, group, changed_ms)
