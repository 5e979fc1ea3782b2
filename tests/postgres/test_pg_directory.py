"""``PostgresGrainDirectory`` against the shared directory contract suite."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack

import pytest

from orleanspy.directory.postgres import PostgresGrainDirectory
from orleanspy.directory.table import ActivationAddress
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.testing import started
from orleanspy.testing.grain_directory import GRAIN_DIRECTORY_CHECKS, Check


@pytest.mark.parametrize("check", GRAIN_DIRECTORY_CHECKS, ids=lambda c: c.__name__)
async def test_contract(postgres_url: str, check: Check) -> None:
    await check(
        lambda: started(
            PostgresGrainDirectory(postgres_url, cluster_id=uuid.uuid4().hex, service_id="s")
        )
    )


async def test_racing_registers_from_separate_pools_agree(postgres_url: str) -> None:
    """Registers from several silos (each its own pool) at once: one winner, and
    every caller is told that winner."""
    async with AsyncExitStack() as stack:
        dirs = [
            PostgresGrainDirectory(postgres_url, cluster_id="c", service_id="s") for _ in range(4)
        ]
        for d in dirs:
            await d.start(stack)
        for n in range(20):
            g = GrainId("Race", n)
            mine = [
                ActivationAddress(SiloAddress("127.0.0.1", 11000 + i, 1), "a") for i in range(4)
            ]
            winners = await asyncio.gather(*(d.register(g, a) for d, a in zip(dirs, mine)))
            assert len(set(winners)) == 1 and winners[0] in mine
            assert await dirs[0].lookup(g) == winners[0]
