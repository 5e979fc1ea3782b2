"""One cluster silo as an OS process on PostgreSQL alone (no Redis anywhere).

Run: ``python tests/postgres/pg_silo_process.py --storage-url URL --name NAME``.
Prints ``READY <silo address>`` once the silo is Active and sees ``--expect``
Active silos, then serves until SIGTERM/SIGINT or SIGKILL. The reminder poll is
10 minutes, so within a test only change notifications and ring changes can
bring a row into a silo; ``--grace-ms`` sets the missed-tick grace (default:
the poll interval); ``--allow-client-management`` lets clients pause and
resume reminders without a cluster secret. Every tick is written to the table ``test_ticks`` (grain
key, reminder name, the silo that hosted the grain, the tick's slot and its
missed-tick count); the test creates it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from dataclasses import replace
from datetime import timedelta
from typing import Any

import asyncpg

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
    run,
)
from orleanspy.testing.cluster import FAST_MEMBERSHIP

TICK_POLL = ReminderOptions(
    look_ahead=timedelta(minutes=20),
    poll_interval=timedelta(minutes=10),
    minimum_period=timedelta(milliseconds=100),
    retry_initial=timedelta(milliseconds=50),
    retry_max=timedelta(milliseconds=500),
)

_pool: Any = None
_url = ""


class PgTickGrain(Grain, Remindable, type_name="pg_silo_process.Tick"):
    """Writes every tick it receives to ``test_ticks``."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        global _pool
        if _pool is None:
            _pool = await asyncpg.create_pool(_url, min_size=1, max_size=2)
        await _pool.execute(
            "INSERT INTO test_ticks (grain, name, silo, slot, missed) VALUES ($1, $2, $3, $4, $5)",
            str(self.grain_key),
            name,
            str(self._activation.silo_address),
            status.current_tick_time,
            status.missed_ticks,
        )

    async def start(self, name: str, period_ms: int, action: int | None = None) -> str:
        await self.register_or_update_reminder(
            name,
            due=timedelta(milliseconds=200),
            period=timedelta(milliseconds=period_ms),
            action=None if action is None else MissedReminderAction(action),
        )
        return str(self._activation.silo_address)


async def main(url: str, name: str, expect: int, grace_ms: int | None, manage: bool) -> None:
    global _url
    _url = url
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options = SiloOptions(
        storage_url=url,
        name=name,
        gateway_port=0,
        membership=FAST_MEMBERSHIP,
        allow_client_management=manage,
        reminders=TICK_POLL
        if grace_ms is None
        else replace(TICK_POLL, missed_tick_grace=timedelta(milliseconds=grace_ms)),
    )
    async with Silo(options) as silo:
        membership = silo.membership
        assert membership is not None
        while len(membership.active_silos()) < expect:
            await membership.refresh()
            await asyncio.sleep(0.05)  # a poll interval: nothing to await here
        print(f"READY {silo.address}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--expect", type=int, default=1)
    parser.add_argument("--grace-ms", type=int, default=None)
    parser.add_argument("--allow-client-management", action="store_true")
    args = parser.parse_args()
    run(main(args.storage_url, args.name, args.expect, args.grace_ms, args.allow_client_management))
