"""Grains of the effectively-once fault test (``test_effectively_once_faults.py``).

Each ``OnceGrain`` appends every tick's slot to its persistent state and commits
the tick with it (``write(tick=status)``), so a slot in the state twice is a tick
whose effect happened twice. Each run of ``receive_reminder`` is also pushed,
before the write, to the list ``once:runs`` in the Redis of ``ONCE_RECORD_URL``
as ``"<key> <slot ms> <pid>"``: runs that a crash cut short show there.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from datetime import timedelta

import redis.asyncio as aioredis

from orleanspy import Grain, Remindable, TickStatus, persistent_state

_record: aioredis.Redis | None = None


def _recorder() -> aioredis.Redis:
    global _record
    if _record is None:
        _record = aioredis.Redis.from_url(os.environ["ONCE_RECORD_URL"])
    return _record


@dataclass
class Applied:
    slots: list[int] = field(default_factory=list)


class OnceGrain(Grain, Remindable):
    applied = persistent_state(Applied)

    async def start(self) -> None:
        await self.register_or_update_reminder(
            "tick", due=timedelta(seconds=1), period=timedelta(seconds=1)
        )

    async def slots(self) -> list[int]:
        return self.applied.state.slots

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot = int(status.current_tick_time.timestamp() * 1000)
        await _recorder().rpush("once:runs", f"{self.grain_key} {slot} {os.getpid()}")
        self.applied.state.slots.append(slot)
        # Bounded: the test reads the recent slots; older ones are never redelivered.
        del self.applied.state.slots[:-120]
        await self.applied.write(tick=status)


class CrashAfterCommitGrain(Grain, Remindable):
    """Like ``OnceGrain``, but the first of its ticks to win the flag
    ``once:crashed`` kills its own silo right after the commit: before the
    reminder service can persist the slot's progress, which is the crash that
    makes the next owner deliver the slot again."""

    applied = persistent_state(Applied)

    async def start(self) -> None:
        # A period longer than the failover: the crashed slot is the only one
        # passed when the next owner reaches it, so it is delivered again (a
        # shorter one would have several passed, and SKIP delivers none).
        await self.register_or_update_reminder(
            "tick", due=timedelta(seconds=1), period=timedelta(seconds=6)
        )

    async def slots(self) -> list[int]:
        return self.applied.state.slots

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        slot = int(status.current_tick_time.timestamp() * 1000)
        record = _recorder()
        await record.rpush("once:runs", f"{self.grain_key} {slot} {os.getpid()}")
        self.applied.state.slots.append(slot)
        await self.applied.write(tick=status)
        if await record.set("once:crashed", f"{slot} {os.getpid()}", nx=True):
            os.kill(os.getpid(), signal.SIGKILL)
