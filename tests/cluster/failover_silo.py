"""One cluster silo as an OS process, for the Redis failover tests.

Run: ``python tests/cluster/failover_silo.py --redis-url URL --name NAME --expect N``.
Prints ``READY <silo address>`` once Active and seeing ``--expect`` Active silos,
then one line ``TICK <key> <unix time>`` per reminder tick its grains receive,
and ``STATUS <status>`` of itself as it reads the membership table every second,
until SIGTERM. Writes use ``RedisOptions(wait_replicas=1)``. Ticks go to stdout,
not to Redis: the store is what the test kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from datetime import timedelta

from orleanspy import Grain, Remindable, ReminderOptions, Silo, SiloOptions, TickStatus, run
from orleanspy.options import RedisOptions
from orleanspy.testing.cluster import FAST_MEMBERSHIP

REMINDERS = ReminderOptions(
    look_ahead=timedelta(seconds=2),
    poll_interval=timedelta(seconds=1),
    minimum_period=timedelta(milliseconds=100),
    retry_initial=timedelta(milliseconds=50),
    retry_max=timedelta(milliseconds=500),
    adaptive=False,
)


class FailoverTickGrain(Grain, Remindable, type_name="failover.Tick"):
    """Prints every tick."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        sys.stdout.write(f"TICK {self.grain_key} {time.time():.3f}\n")
        sys.stdout.flush()


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options = SiloOptions(
        redis_url=args.redis_url,
        name=args.name,
        membership=FAST_MEMBERSHIP,
        reminders=REMINDERS,
        redis=RedisOptions(wait_replicas=1, wait_timeout=timedelta(seconds=1)),
        grain_types=(FailoverTickGrain,),
    )
    async with Silo(options) as silo:
        membership = silo.membership
        assert membership is not None
        while len(membership.active_silos()) < args.expect:
            await membership.refresh()
            await asyncio.sleep(0.05)  # a poll interval: nothing to await here
        print(f"READY {silo.address}", flush=True)
        while not stop.is_set():
            row = membership.snapshot.get(silo.address)
            print(f"STATUS {row.status.name if row else 'NONE'}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--expect", type=int, default=1)
    run(main(parser.parse_args()))
