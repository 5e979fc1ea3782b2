"""Silos as separate OS processes: one is SIGKILLed, the rest carry on.

Each silo runs ``silo_process.py`` in its own interpreter; the test holds only
a ``ClusterClient`` and a membership-table reader. Every child is terminated
(then killed) in ``finally``, so none outlives the test.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path

import pytest

from orleanspy import ClusterClient
from orleanspy.identity import SiloAddress
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.testing.cluster import wait_for
from tests.ready import read_ready, stop_processes

pytestmark = pytest.mark.timeout(60)

SILO = Path(__file__).with_name("silo_process.py")
ROOT = Path(__file__).resolve().parents[2]


class SiloProcess:
    def __init__(self, proc: subprocess.Popen[str], address: SiloAddress) -> None:
        self.proc = proc
        self.address = address


def _start(redis_url: str, name: str, expect: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, str(SILO)),
            *("--redis-url", redis_url, "--name", name, "--expect", str(expect)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _ready(proc: subprocess.Popen[str], timeout: float = 20) -> SiloAddress:
    return SiloAddress.parse(read_ready(proc, timeout)[0])


@contextmanager
def silo_processes(redis_url: str, count: int) -> Iterator[list[SiloProcess]]:
    # Each silo reports ready once it sees all of them, so the first calls
    # already spread over the whole cluster.
    procs = [_start(redis_url, f"proc-{i}", count) for i in range(count)]
    try:
        yield [SiloProcess(p, _ready(p)) for p in procs]
    finally:
        stop_processes(procs, 10)


async def test_sigkilled_silo_process_is_declared_dead_and_calls_keep_working(
    redis_url: str,
) -> None:
    with silo_processes(redis_url, 3) as silos:
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)

            async def all_active() -> bool:
                return len((await table.read_all()).active_silos()) == 3

            await wait_for(all_active, timeout=10, what="three Active silos")
            client = await stack.enter_async_context(ClusterClient(redis_url=redis_url))
            await wait_for(lambda: len(client.gateways) == 3, timeout=10)

            async def hits() -> list[tuple[str, int, int]]:
                calls = (client.get_grain("ProcWhereGrain", k).hit() for k in range(30))
                return list(await asyncio.gather(*calls))

            before = await hits()
            by_pid = {pid for _, pid, _ in before}
            assert by_pid == {s.proc.pid for s in silos}

            victim = silos[0]
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(5)
            killed_at = time.monotonic()

            async def victim_dead() -> bool:
                return (await table.read_all()).status(victim.address) is SiloStatus.DEAD

            await wait_for(victim_dead, timeout=15, what="the killed silo Dead in the table")
            detection = time.monotonic() - killed_at
            assert detection < 15

            # The client drops the dead gateway; a survivor whose send to the
            # dead silo fails re-reads the table, finds it Dead and re-places.
            await wait_for(lambda: len(client.gateways) == 2, timeout=5)
            after = await hits()
            assert {pid for _, pid, _ in after} == {s.proc.pid for s in silos[1:]}
            moved = [k for k in range(30) if before[k][1] == victim.proc.pid]
            assert moved
            assert all(after[k][2] == 1 for k in moved)


@pytest.mark.slow
async def test_grain_state_written_before_a_sigkill_is_read_on_a_survivor(
    redis_url: str,
) -> None:
    with silo_processes(redis_url, 2) as silos:
        async with AsyncExitStack() as stack:
            table = RedisMembershipTable(redis_url, cluster_id="dev", service_id="default")
            await table.start(stack)
            client = await stack.enter_async_context(ClusterClient(redis_url=redis_url))
            await wait_for(lambda: len(client.gateways) == 2, timeout=10)
            victim, survivor = silos
            keys = range(20)
            writers = await asyncio.gather(
                *(client.get_grain("ProcStateGrain", k).set_plan(f"plan-{k}") for k in keys)
            )
            on_victim = [k for k in keys if writers[k] == victim.proc.pid]
            assert on_victim, "placement put no grain on the first silo"

            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(5)

            async def victim_dead() -> bool:
                return (await table.read_all()).status(victim.address) is SiloStatus.DEAD

            await wait_for(victim_dead, timeout=15, what="the killed silo Dead in the table")
            await wait_for(lambda: len(client.gateways) == 1, timeout=5)
            answers = await asyncio.gather(
                *(client.get_grain("ProcStateGrain", k).get_plan() for k in keys)
            )
            for k in keys:
                plan, written_by, answered_by = answers[k]
                assert (plan, written_by) == (f"plan-{k}", writers[k])
                assert answered_by == survivor.proc.pid
            assert any(answers[k][1] == victim.proc.pid for k in on_victim)


def test_cluster_demo_runs_and_spreads_calls_over_three_silos() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "samples.cluster_demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    rounds = {}
    for line in result.stdout.splitlines():
        match = re.search(r"round (\d+): per-silo ((?:silo-\d+=\d+ ?)+)", line)
        if match:
            pairs = (p.split("=") for p in match.group(2).split())
            rounds[int(match.group(1))] = {name: int(n) for name, n in pairs}
    assert set(rounds) == {1, 2, 3}
    assert len(rounds[1]) == 3 and all(n > 0 for n in rounds[1].values())
    assert sum(rounds[1].values()) == 60
    # After the graceful stop exactly one silo serves nothing and the rest serve all.
    assert sorted(rounds[3].values())[0] == 0
    assert sum(rounds[3].values()) == 60
    # The billing grain's state outlived the SIGKILL of the silo that held it.
    fired = re.search(r"reminder fired on (silo-\d+), which loaded plan 'gold'", result.stdout)
    killed = re.search(r"SIGKILLed (silo-\d+)", result.stdout)
    assert fired and killed and fired.group(1) != killed.group(1), result.stdout
    assert "done" in result.stdout.splitlines()[-1]
