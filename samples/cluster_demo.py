"""The orleanspy cluster demo: three silos in three OS processes, one client.

It starts a private ``redis-server`` (unless ``--redis-url`` is given), three
silo processes joined through the Redis membership table and talking gRPC on
loopback, and a ``ClusterClient``. It counts where calls to 60 counter grains
land, stops one silo gracefully (its grains are re-activated on the others),
calls again. Then a billing grain saves its plan in persistent state (Redis) and
registers a reminder; the demo SIGKILLs the silo that holds it, and the reminder
fires on the survivor, which loads the saved plan. Then it stops everything and
exits 0.

With ``ORLEANSPY_CLUSTER_SECRET`` (or ``ORLEANSPY_CLUSTER_SECRET_FILE``, and TLS
with ``ORLEANSPY_MESSAGING_TLS_*``) set, the silos and the client take them as the
CLI does (``ClusterClient.messaging_from_env``, ``ClusterClient.from_env``), and
the demo shows a client without the secret being refused.

Run: ``make cluster-demo`` (or ``python -m samples.cluster_demo``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

from orleanspy import (
    AuthenticationError,
    ClusterClient,
    Grain,
    GrainCallError,
    Remindable,
    Silo,
    SiloOptions,
    TickStatus,
    persistent_state,
    run,
)
from orleanspy.options import MembershipOptions
from orleanspy.testing.redis_server import RedisServer

SILOS = 3
GRAINS = 60
CLUSTER_ID = "demo"
# Faster failure detection and table reads than Orleans' production defaults,
# so the demo's membership changes show within a second.
MEMBERSHIP = MembershipOptions(
    probe_interval=timedelta(seconds=1),
    probe_timeout=timedelta(seconds=1),
    i_am_alive_interval=timedelta(seconds=5),
    table_refresh_interval=timedelta(seconds=1),
)
T0 = time.monotonic()


def say(what: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {what}", flush=True)


class DemoCounterGrain(Grain):
    """Counts its calls and says which silo it runs on."""

    async def on_activate(self) -> None:
        self.count = 0

    async def add(self, n: int) -> tuple[str, int]:
        self.count += n
        return str(self._activation.silo_address), self.count


@dataclass
class BillingAccount:
    plan: str = "none"
    bills: int = 0
    last_billed_on: str = ""


class DemoBillingGrain(Grain, Remindable):
    """Keeps its plan in persistent state and bills it on a reminder every second."""

    account = persistent_state(BillingAccount)  # "default" storage: the cluster's Redis

    async def subscribe(self, plan: str) -> str:
        self.account.state.plan = plan
        await self.account.write()
        await self.register_or_update_reminder("bill", period=timedelta(seconds=1))
        return str(self._activation.silo_address)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        self.account.state.bills += 1
        self.account.state.last_billed_on = str(self._activation.silo_address)
        await self.account.write()

    async def status(self) -> tuple[str, int, str]:
        a = self.account.state
        return a.plan, a.bills, a.last_billed_on

    async def cancel(self) -> None:
        await self.unregister_reminder("bill")
        await self.account.clear()


# -- one silo (a child process) ------------------------------------------------------


async def serve_silo(redis_url: str, name: str) -> None:
    """Run one silo until SIGTERM/SIGINT, then stop it gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options = SiloOptions(
        cluster_id=CLUSTER_ID,
        redis_url=redis_url,
        name=name,
        gateway_port=0,
        membership=MEMBERSHIP,
        messaging=ClusterClient.messaging_from_env(),  # the secret and TLS, if set
    )
    async with Silo(options) as silo:
        assert silo.membership is not None
        # Announce readiness only once this silo sees every sibling Active, so
        # the demo's first calls are placed over all of them, not a partial view.
        deadline = time.monotonic() + 15
        while len((await silo.membership.refresh()).active_silos()) < SILOS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: the other silos did not join")
            await asyncio.sleep(0.05)
        print(f"READY {silo.address}", flush=True)
        await stop.wait()


# -- the driver ----------------------------------------------------------------------


@contextlib.contextmanager
def silo_processes(redis_url: str) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Start the silo processes; yield ``{address: process}`` once all are up.
    Every child is stopped on the way out, whatever happened."""
    # gRPC's core logs connection teardown at INFO; keep the demo readable.
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "samples.cluster_demo",
                "--silo",
                name,
                "--redis-url",
                redis_url,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in (f"silo-{i}" for i in range(SILOS))
    }
    try:
        by_address: dict[str, subprocess.Popen[str]] = {}
        for name, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("READY "):
                raise RuntimeError(f"{name} did not start (exit code {proc.poll()})")
            by_address[line.split()[1]] = proc
            say(f"{name} is up at {line.split()[1]} (pid {proc.pid})")
        yield by_address
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


async def call_round(client: ClusterClient, names: dict[str, str], n: int) -> Counter[str]:
    """Call every counter once; count the answers by silo name."""
    answers = await asyncio.gather(
        *(client.get_grain(DemoCounterGrain, k).add(1) for k in range(GRAINS))
    )
    spread = Counter(names[where] for where, _ in answers)
    counts = Counter(count for _, count in answers)
    say(
        f"round {n}: per-silo "
        + " ".join(f"{name}={spread[name]}" for name in sorted(names.values()))
        + f" | counter values {dict(sorted(counts.items()))}"
    )
    return spread


async def drive(redis_url: str) -> None:
    with silo_processes(redis_url) as procs:
        names = {address: f"silo-{i}" for i, address in enumerate(procs)}
        client = ClusterClient.from_env(membership_url=redis_url, cluster_id=CLUSTER_ID)
        async with client:
            say(f"client connected to gateways {client.gateways}")
            if ClusterClient.messaging_from_env().cluster_secret:
                await without_the_secret_is_refused(redis_url)
            await call_round(client, names, 1)
            spread = await call_round(client, names, 2)

            # Stop the busiest silo gracefully: it writes ShuttingDown, deactivates
            # its grains, writes Dead; the next calls re-activate them elsewhere.
            address, name = max(names.items(), key=lambda item: spread[item[1]])
            say(f"stopping {name} gracefully (it hosts {spread[name]} grains)")
            proc = procs[address]
            proc.terminate()
            await asyncio.to_thread(proc.wait, 15)
            say(f"{name} exited with code {proc.returncode}")
            await call_round(client, names, 3)
            say("grains moved from the stopped silo started over at 1; the others kept counting")
            await billing_survives_sigkill(client, names, procs)
        say("client closed; stopping the remaining silos")
    say("done")


async def without_the_secret_is_refused(redis_url: str) -> None:
    """The silos require the secret: a client that lacks it does not get in."""
    try:
        async with ClusterClient(membership_url=redis_url, cluster_id=CLUSTER_ID):
            pass
    except AuthenticationError as exc:
        say(f"the silos require the cluster secret: a client without it was refused ({exc})")
        return
    raise RuntimeError("a client without the cluster secret was let in")


async def billing_survives_sigkill(
    client: ClusterClient, names: dict[str, str], procs: dict[str, subprocess.Popen[str]]
) -> None:
    """Save state, kill the silo holding the grain, see a survivor's reminder read it."""
    billing = client.get_grain(DemoBillingGrain, "acme")
    holder = await billing.subscribe("gold")
    say(f"billing grain acme saved plan 'gold' on {names[holder]} and bills every second")
    while (await billing.status())[1] < 1:
        await asyncio.sleep(0.1)
    plan, bills, _ = await billing.status()
    say(f"{names[holder]} billed plan {plan!r}: {bills} bill so far")
    procs[holder].send_signal(signal.SIGKILL)
    procs[holder].wait()
    say(f"SIGKILLed {names[holder]}: no goodbye, its activation of acme is lost")
    deadline = time.monotonic() + 30
    while True:
        try:
            plan, bills, where = await billing.status()
            if where and where != holder:
                break
        except GrainCallError:
            pass  # until the survivors declare the killed silo dead
        if time.monotonic() > deadline:
            raise TimeoutError("the reminder did not fire on a survivor")
        await asyncio.sleep(0.2)
    say(f"reminder fired on {names[where]}, which loaded plan {plan!r} from storage: {bills} bills")
    await billing.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="an existing Redis (default: start a private one)")
    parser.add_argument("--silo", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.silo:
        run(serve_silo(args.redis_url, args.silo))
        return
    if args.redis_url:
        run(drive(args.redis_url))
        return
    with RedisServer() as redis:
        say(f"started a private redis-server at {redis.url}")
        run(drive(redis.url))


if __name__ == "__main__":
    main()
