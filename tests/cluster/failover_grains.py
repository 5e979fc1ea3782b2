"""Grains of the Redis failover tests on CLI silos (``test_failover_calls.py``,
``test_registration_races.py``).

``FailoverLoadGrain.bump`` touches every Redis concern on a grain call's path: a
new key is a directory lookup, placement and registration; the call reads
(on activation) and writes the grain's state, and appends to a stream through
a ``RedisStreamProvider`` on ``FAILOVER_STORE_URL`` (the store the test fails
over). ``FailoverTickGrain`` registers a one-second reminder and records each
tick as ``"<key> <slot ms> <pid>"`` on the list ``FAILOVER_RECORD_KEY`` of the
separate Redis at ``FAILOVER_RECORD_URL`` (never the store that is killed).
"""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta

import redis.asyncio as aioredis

from orleanspy import Grain, Remindable, TickStatus, persistent_state
from orleanspy.streams.redis import RedisStreamProvider

_record: aioredis.Redis | None = None
_streams: RedisStreamProvider | None = None
_streams_lock = asyncio.Lock()
_stack = AsyncExitStack()


def _recorder() -> aioredis.Redis:
    global _record
    if _record is None:
        _record = aioredis.Redis.from_url(os.environ["FAILOVER_RECORD_URL"])
    return _record


async def _stream_provider() -> RedisStreamProvider:
    global _streams
    async with _streams_lock:
        if _streams is None:
            provider = RedisStreamProvider(os.environ["FAILOVER_STORE_URL"], service_id="failover")
            await provider.start(_stack)
            _streams = provider
    return _streams


@dataclass
class Count:
    n: int = 0


class FailoverLoadGrain(Grain):
    count = persistent_state(Count)

    async def bump(self) -> int:
        self.count.state.n += 1
        await self.count.write()
        streams = await _stream_provider()
        await streams.publish(f"bumps-{self.grain_key % 8}", [self.grain_key, self.count.state.n])
        return self.count.state.n


class FailoverTickGrain(Grain, Remindable):
    async def start(self) -> None:
        await self.register_or_update_reminder(
            "tick", due=timedelta(seconds=1), period=timedelta(seconds=1)
        )

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot = int(status.current_tick_time.timestamp() * 1000)
        await _recorder().rpush(
            os.environ["FAILOVER_RECORD_KEY"], f"{self.grain_key} {slot} {os.getpid()}"
        )
