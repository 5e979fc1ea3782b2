"""Grains the rolling-upgrade test (``test_rolling_upgrade.py``) runs on the previous
release and on this one, so they use only API that 0.1.x has.

Silos import this module (``orleanspy silo --import upgrade_grains``, run from
this directory). What the test measures goes to the Redis named by
``UPGRADE_RECORD_URL``: every tick as ``"<key> <slot ms> <pid>"`` on the list
``upgrade:ticks``; stream items are published on the stream provider of
``UPGRADE_STREAMS_URL`` (the cluster's own Redis, or one beside PostgreSQL).
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta

import redis.asyncio as aioredis

from orleanspy import Grain, Remindable, TickStatus, persistent_state
from orleanspy.streams.redis import RedisStreamProvider

STREAM = "upgrade"
_record: aioredis.Redis | None = None
_streams: RedisStreamProvider | None = None
_stack = AsyncExitStack()


def _recorder() -> aioredis.Redis:
    global _record
    if _record is None:
        _record = aioredis.Redis.from_url(os.environ["UPGRADE_RECORD_URL"])
    return _record


async def _provider() -> RedisStreamProvider:
    global _streams
    if _streams is None:
        provider = RedisStreamProvider(os.environ["UPGRADE_STREAMS_URL"], service_id="upgrade")
        await provider.start(_stack)
        _streams = provider
    return _streams


@dataclass
class Count:
    value: int = 0


class UpgradeGrain(Grain, Remindable):
    """A counter in persistent state, a 2-second reminder, and a stream writer."""

    count = persistent_state(Count, storage="default")

    async def start(self) -> None:
        await self.register_or_update_reminder(
            "tick", due=timedelta(seconds=2), period=timedelta(seconds=2)
        )

    async def add(self, n: int) -> int:
        self.count.state.value += n
        await self.count.write()
        return self.count.state.value

    async def value(self) -> int:
        return self.count.state.value

    async def publish(self, n: int) -> str:
        provider = await _provider()
        return await provider.publish(STREAM, {"key": str(self.grain_key), "n": n})

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot_ms = int(status.current_tick_time.timestamp() * 1000)
        await _recorder().rpush("upgrade:ticks", f"{self.grain_key} {slot_ms} {os.getpid()}")
