"""Reminder-affine placement across a real cluster (three silos in one process over
real gRPC, with membership, directory and reminder table in a real Redis).

A grain that a reminder tick activates is placed on the silo that owns the
reminder; a class declared with ``reminder_affinity=False`` keeps its strategy.
Rows are written straight into the table, so no call activates a grain first.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import pytest

from orleanspy import (
    Grain,
    MembershipOptions,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.placement import HashBasedPlacement
from orleanspy.reminders.model import ReminderEntry
from orleanspy.reminders.redis import RedisReminderTable

pytestmark = pytest.mark.slow

MS = timedelta(milliseconds=1)
KEYS = range(24)
MEMBERSHIP = MembershipOptions(
    table_refresh_interval=timedelta(milliseconds=300),
    probe_interval=timedelta(milliseconds=300),
    probe_timeout=timedelta(milliseconds=300),
    num_missed_probes_limit=2,
    i_am_alive_interval=timedelta(seconds=1),
    shutdown_timeout=timedelta(seconds=5),
)
REMINDERS = ReminderOptions(
    look_ahead=timedelta(seconds=2),
    poll_interval=timedelta(seconds=1),
    minimum_period=100 * MS,
    base_bucket_size=256,
    adaptive=False,
)

#: (type name, key) -> the silo address the grain ran on when ticked.
HOSTS: dict[tuple[str, int], str] = {}


class _Recorder(Grain, Remindable):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        HOSTS[(self.grain_id.type_name, int(self.grain_key))] = str(self._activation.silo_address)


class AffineGrain(_Recorder, type_name="test_reminder_placement.Affine"):
    """Default placement (random), reminder affinity on (the default)."""


class OptedOutGrain(
    _Recorder,
    type_name="test_reminder_placement.OptedOut",
    placement=HashBasedPlacement(),
    reminder_affinity=False,
):
    """Placed by hash even when a reminder tick activates it."""


@pytest.fixture
async def silos(redis_url: str) -> AsyncIterator[list[Silo]]:
    HOSTS.clear()
    started: list[Silo] = []
    try:
        for i in range(3):
            silo = Silo(
                SiloOptions(
                    redis_url=redis_url,
                    name=f"p{i}",
                    membership=MEMBERSHIP,
                    reminders=REMINDERS,
                    grain_types=(AffineGrain, OptedOutGrain),
                )
            )
            await silo.start()
            started.append(silo)
        yield started
    finally:
        for silo in reversed(started):
            await silo.stop()


async def _converged(silos: list[Silo]) -> None:
    want = {s.address for s in silos}
    async with asyncio.timeout(20):
        while True:
            for s in silos:
                assert s.membership is not None
                await s.membership.refresh()
            if all(s.ring is not None and set(s.ring.ring.silos) == want for s in silos):
                return
            await asyncio.sleep(0.05)


def _owner(silos: list[Silo], gid: GrainId) -> str:
    h = gid.uniform_hash()
    owners = [s for s in silos if s.ring is not None and s.ring.ring.owner(h) == s.address]
    assert len(owners) == 1
    return str(owners[0].address)


async def test_a_grain_activated_by_a_tick_lives_on_the_reminders_owner(
    silos: list[Silo], redis_url: str
) -> None:
    await _converged(silos)
    service_id = silos[0].options.service_id
    start = datetime.now(UTC) + timedelta(milliseconds=300)
    gids = [
        cls.__grain_definition__.grain_id(k) for cls in (AffineGrain, OptedOutGrain) for k in KEYS
    ]
    async with AsyncExitStack() as stack:
        table = RedisReminderTable(redis_url, service_id=service_id)
        await table.start(stack)
        for gid in gids:
            await table.upsert(
                ReminderEntry(
                    service_id=service_id,
                    grain_id=gid,
                    name="r",
                    start_at=start,
                    next_due=start,
                    period=500 * MS,
                )
            )
    async with asyncio.timeout(30):
        while len(HOSTS) < len(gids):
            await asyncio.sleep(0.05)

    affine = [g for g in gids if g.type_name == AffineGrain.__grain_definition__.type_name]
    for gid in affine:
        assert HOSTS[(gid.type_name, int(gid.key))] == _owner(silos, gid), gid

    # Opted out: where the hash puts it, which is often not the owner.
    addresses = sorted(s.address for s in silos)
    opted = [g for g in gids if g not in affine]
    for gid in opted:
        expected = str(HashBasedPlacement().choose(gid, None, addresses))
        assert HOSTS[(gid.type_name, int(gid.key))] == expected, gid
    assert any(HOSTS[(g.type_name, int(g.key))] != _owner(silos, g) for g in opted)
