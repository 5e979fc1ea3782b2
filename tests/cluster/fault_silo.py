"""One cluster silo as an OS process, for the fault suite (``test_faults.py``).

Run: ``python tests/cluster/fault_silo.py --redis-url URL --name NAME [--port P]
[--gateway-port G] [--expect N] [--slow-detection | --default-options] [--secret S]``.
Prints ``READY <silo address> <gateway port>`` once Active and seeing ``--expect``
Active silos, then serves until SIGTERM or until the silo stops itself (declared
dead).

Grains record what the fault tests measure in the same Redis: every reminder
tick is pushed to the list ``fault:ticks`` as ``"<key> <unix time> <pid> <slot ms>"``.
Failure detection and the reminder service use short intervals so the suite
stays fast; the response timeout keeps its 30 s default, so a call stalled on a
dead silo shows up as such. ``--default-options`` runs membership and reminders
with their defaults instead, as an operator would. The process exits with status
3 when the silo stopped itself (declared dead, or its store lost its data), as
``orleanspy silo`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis

from orleanspy import (
    Grain,
    MembershipOptions,
    MessagingOptions,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
    run,
)
from orleanspy.runtime.silo import SiloState
from orleanspy.testing.cluster import FAST_MEMBERSHIP

MS = timedelta(milliseconds=1)
REMINDERS = ReminderOptions(
    look_ahead=timedelta(seconds=2),
    poll_interval=timedelta(seconds=1),
    minimum_period=100 * MS,
    retry_initial=50 * MS,
    retry_max=500 * MS,
    adaptive=False,
    # Ticks take TICK_WORK each: enough permits that a survivor taking over a
    # dead silo's rows is not throttled by them.
    permits=64,
)
TICK_WORK = 0.3
# Failure detection of Orleans' kind of pace (about ten seconds), for tests where
# what happens before the death declaration matters; the table is re-read only
# every minute, so nothing but the messaging path can learn of a restart sooner.
SLOW_DETECTION = MembershipOptions(
    probe_interval=timedelta(seconds=3),
    probe_timeout=timedelta(seconds=1),
    num_missed_probes_limit=3,
    i_am_alive_interval=timedelta(seconds=1),
)
_redis: aioredis.Redis | None = None


class FaultTickGrain(Grain, Remindable):
    """Records its reminder ticks in Redis; counts read-modify-write updates."""

    async def on_activate(self) -> None:
        self.value = 0

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        assert _redis is not None
        slot_ms = int(status.current_tick_time.timestamp() * 1000)
        await _redis.rpush(
            "fault:ticks", f"{self.grain_key} {time.time():.6f} {os.getpid()} {slot_ms}"
        )
        # Some work per tick, as real handlers do: a crash finds ticks in flight.
        await asyncio.sleep(TICK_WORK)

    async def start(self, period_ms: int) -> str:
        await self.register_or_update_reminder("tick", due=period_ms * MS, period=period_ms * MS)
        return str(self._activation.silo_address)

    async def schedule(self, name: str, cron: str, tz: str | None = None) -> None:
        """Register a cron reminder exactly as a caller describes it."""
        await self.register_or_update_reminder(name, cron=cron, tz=tz)

    async def where(self) -> tuple[str, int]:
        return str(self._activation.silo_address), os.getpid()

    async def add_slowly(self, delay: float) -> int:
        """Read, wait, write: two turns interleaving on this grain would lose one."""
        seen = self.value
        await asyncio.sleep(delay)
        self.value = seen + 1
        return self.value

    async def hold(self, seconds: float) -> None:
        """Say so in ``fault:holding``, then keep this grain busy for ``seconds``."""
        assert _redis is not None
        await _redis.rpush("fault:holding", str(self.grain_key))
        await asyncio.sleep(seconds)

    async def get(self) -> int:
        return self.value

    async def tick_other(self, key: str) -> None:
        """Call another grain's ``receive_reminder`` as a grain may try to."""
        now = datetime.now(UTC)
        status = TickStatus(now, timedelta(seconds=1), None, now, now)
        await self.get_grain(FaultTickGrain, key).receive_reminder("tick", status)


async def main(args: argparse.Namespace) -> int:
    global _redis
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _redis = aioredis.Redis.from_url(args.redis_url)
    messaging = MessagingOptions(cluster_secret=args.secret)
    if args.max_in_flight is not None:
        messaging = MessagingOptions(cluster_secret=args.secret, max_in_flight=args.max_in_flight)
    if args.default_options:
        membership, reminders = MembershipOptions(), ReminderOptions()
    else:
        membership = SLOW_DETECTION if args.slow_detection else FAST_MEMBERSHIP
        reminders = REMINDERS
    options = SiloOptions(
        redis_url=args.redis_url,
        name=args.name,
        silo_port=args.port,
        gateway_port=args.gateway_port,
        membership=membership,
        reminders=reminders,
        messaging=messaging,
    )
    silo = Silo(options)
    async with silo:
        membership = silo.membership
        assert membership is not None
        while len(membership.active_silos()) < args.expect:
            await membership.refresh()
            await asyncio.sleep(0.05)  # a poll interval: nothing to await here
        row = membership.snapshot.get(silo.address)
        assert row is not None
        print(f"READY {silo.address} {row.gateway_port}", flush=True)
        # Serve until told to stop, or until the silo stops itself (declared dead).
        while silo.state is SiloState.RUNNING and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    await _redis.aclose()
    return 3 if silo.declared_dead else 0


if __name__ == "__main__":
    if os.environ.get("FAULT_SILO_LOG"):
        logging.basicConfig(
            level=os.environ["FAULT_SILO_LOG"],
            format=f"%(asctime)s {os.getpid()} %(name)s %(message)s",
        )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--gateway-port", type=int, default=0)
    parser.add_argument("--expect", type=int, default=1, help="Active silos to wait for")
    parser.add_argument("--max-in-flight", type=int, default=None)
    parser.add_argument("--slow-detection", action="store_true")
    parser.add_argument("--default-options", action="store_true")
    parser.add_argument("--secret", default=None)
    raise SystemExit(run(main(parser.parse_args())))
