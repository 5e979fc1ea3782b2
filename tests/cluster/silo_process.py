"""One cluster silo as an OS process, for the multi-process tests.

Run: ``python tests/cluster/silo_process.py --redis-url URL --name NAME``.
Prints ``READY <silo address> <gateway port>`` once the silo is Active and sees
``--expect`` Active silos (so its placement already spreads over all of them), then
serves until SIGTERM or SIGINT (graceful stop) or SIGKILL (a crash).
Failure detection uses the short ``FAST_MEMBERSHIP`` options.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from dataclasses import dataclass

from orleanspy import Grain, Silo, SiloOptions, persistent_state, run
from orleanspy.testing.cluster import FAST_MEMBERSHIP


class ProcWhereGrain(Grain):
    """Says which silo and which OS process it runs in."""

    async def on_activate(self) -> None:
        self.calls = 0

    async def where(self) -> str:
        return str(self._activation.silo_address)

    async def hit(self) -> tuple[str, int, int]:
        self.calls += 1
        return str(self._activation.silo_address), os.getpid(), self.calls


@dataclass
class ProcPlan:
    plan: str = "free"
    written_by: int = 0


class ProcStateGrain(Grain):
    """Keeps a plan in persistent state (the silo's default storage: Redis)."""

    account = persistent_state(ProcPlan)

    async def set_plan(self, plan: str) -> int:
        self.account.state = ProcPlan(plan, os.getpid())
        await self.account.write()
        return os.getpid()

    async def get_plan(self) -> tuple[str, int, int]:
        """The plan, the pid that wrote it, and the pid answering."""
        return self.account.state.plan, self.account.state.written_by, os.getpid()


async def main(redis_url: str, name: str, expect: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options = SiloOptions(
        redis_url=redis_url, name=name, gateway_port=0, membership=FAST_MEMBERSHIP
    )
    async with Silo(options) as silo:
        membership = silo.membership
        assert membership is not None
        while len(membership.active_silos()) < expect:
            await membership.refresh()
            await asyncio.sleep(0.05)  # a poll interval: nothing to await here
        row = membership.snapshot.get(silo.address)
        assert row is not None
        print(f"READY {silo.address} {row.gateway_port}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--expect", type=int, default=1, help="Active silos to wait for")
    args = parser.parse_args()
    run(main(args.redis_url, args.name, args.expect))
