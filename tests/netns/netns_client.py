"""The client of the network fault suite, a process of its own in the root
namespace (so the test driver itself never runs gRPC while it forks).

Run: ``python netns_client.py --gateway HOST:PORT ... [--secret S] --out FILE
[--fire N] [--skip N]``. Registers ``--fire`` one-second FIRE_IMMEDIATELY
reminders (keys ``f<i>``) and ``--skip`` two-second SKIP reminders (``s<i>``),
prints ``REGISTERED``, then calls ``where`` on 40 grains, eight at a time, until
SIGTERM, appending one line per call to ``--out``::

    <start unix time> ok|<error type>
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

from orleanspy import ClusterClient, MessagingOptions, run

CALL_TIMEOUT = 5.0  # a call stuck on an unreachable silo counts as failed after this


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    options = MessagingOptions(cluster_secret=args.secret) if args.secret else MessagingOptions()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - closed below
    async with ClusterClient(gateways=args.gateway, options=options) as client:
        starts = [client.get_grain("NetTickGrain", f"f{i}").start(1000, False)
                  for i in range(args.fire)]  # fmt: skip
        starts += [client.get_grain("NetTickGrain", f"s{i}").start(2000, True)
                   for i in range(args.skip)]  # fmt: skip
        await asyncio.gather(*starts)
        print("REGISTERED", flush=True)

        async def caller(n: int) -> None:
            i = n
            while not stop.is_set():
                started = time.time()
                try:
                    await asyncio.wait_for(
                        client.get_grain("NetTickGrain", f"c{i % 40}").where(), CALL_TIMEOUT
                    )
                    outcome = "ok"
                except Exception as exc:
                    outcome = type(exc).__name__
                out.write(f"{started:.6f} {outcome}\n")
                i += 8
                await asyncio.sleep(0.05)  # a steady trickle, not a flood

        await asyncio.gather(*(caller(n) for n in range(8)))
    out.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", action="append", required=True)
    parser.add_argument("--secret")
    parser.add_argument("--out", required=True)
    parser.add_argument("--fire", type=int, default=0)
    parser.add_argument("--skip", type=int, default=0)
    run(main(parser.parse_args()))
