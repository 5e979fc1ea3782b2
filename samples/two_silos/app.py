"""The grains and the client of the two-silo compose example (``docker-compose.yml``
beside this file; docs/clusters.md).

The silos run ``orleanspy silo --import samples.two_silos.app``; the client runs
``python -m samples.two_silos.app``, which calls twenty grains through the
gateways and prints which silo each lives on, then exits 0 once calls landed on
both silos (the compose file runs it after both silos report ready).
"""

from __future__ import annotations

import asyncio
import sys

from orleanspy import ClusterClient, Grain, run


class WhereGrain(Grain):
    """Says which silo it is active on."""

    async def where(self) -> str:
        return str(self._activation.silo_address)


async def main(expected_silos: int = 2) -> int:
    async with ClusterClient.from_env() as client:
        print(f"connected to gateways {', '.join(client.gateways)}", flush=True)
        places = await asyncio.gather(
            *(client.get_grain(WhereGrain, f"k{i}").where() for i in range(20))
        )
    for silo in sorted(set(places)):
        print(f"{places.count(silo):2d} grains on {silo}", flush=True)
    return 0 if len(set(places)) >= expected_silos else 1


if __name__ == "__main__":
    sys.exit(run(main()))
