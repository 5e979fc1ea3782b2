"""One cluster silo as an OS process with the dashboard on, for the browser tests.

Run: ``python tests/dashboard/dash_silo.py --storage-url URL --name NAME``.
Prints ``READY <silo address> <gateway port> <dashboard port>`` once the silo is
Active and sees ``--expect`` Active silos, then serves until SIGTERM (graceful)
or SIGKILL (a crash). Failure detection uses the short ``FAST_MEMBERSHIP``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from orleanspy import Grain, Remindable, ReminderPriority, Silo, SiloOptions, TickStatus, run
from orleanspy.testing.cluster import FAST_MEMBERSHIP


class DashTickGrain(Grain, Remindable):
    """Counts the ticks it receives; registers one reminder on ``start``."""

    async def on_activate(self) -> None:
        self.received = 0
        self.triggered = 0
        self.filled = 0

    async def start(self, period: float, critical: bool = False) -> None:
        priority = ReminderPriority.CRITICAL if critical else ReminderPriority.NORMAL
        await self.register_or_update_reminder("beat", due=period, period=period, priority=priority)

    async def weekday(self) -> None:
        await self.register_or_update_reminder("standup", cron="0 0 9 * * 1-5",
                                               tz="Europe/Berlin")  # fmt: skip

    async def ticks(self) -> tuple[int, int]:
        return self.received, self.triggered

    async def backfilled(self) -> int:
        return self.filled

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        self.received += 1
        if status.triggered:
            self.triggered += 1
        if status.backfill:
            self.filled += 1


async def main(url: str, name: str, expect: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options = SiloOptions(
        storage_url=url, name=name, gateway_port=0, membership=FAST_MEMBERSHIP,
        dashboard_port=0, allow_client_management=True,
    )  # fmt: skip
    async with Silo(options) as silo:
        membership = silo.membership
        assert membership is not None
        while len(membership.active_silos()) < expect:
            await membership.refresh()
            await asyncio.sleep(0.05)  # a poll interval: nothing to await here
        row = membership.snapshot.get(silo.address)
        assert row is not None
        print(f"READY {silo.address} {row.gateway_port} {silo.dashboard_port}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--expect", type=int, default=1)
    args = parser.parse_args()
    run(main(args.storage_url, args.name, args.expect))
