"""Effectively-once ticks through crashes, on real silo processes with default
options: 150 grains whose reminder ticks every second commit each slot with
their state (``once_grains.py``); one silo is killed with SIGKILL, one stopped
with SIGTERM and replaced, and another killed and replaced, 15 s apart. On Redis
and on PostgreSQL:

- no slot is in any grain's state twice (the tick that a crash hands to the next
  owner after its write is recognised as done, not run again);
- no reminder is stranded: each has committed a slot in the last
  ``STRANDED_AFTER`` seconds (failure detection plus two periods) at the end, and
  after each step every reminder commits a slot past the step;
- no silo wrote a traceback.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from orleanspy import ClusterClient
from orleanspy.errors import OrleansPyError
from orleanspy.testing.cluster import wait_for
from tests.cluster.cli_silos import Silos, silos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GRAIN = "OnceGrain"
GRAINS = 150
STEP_S = 15.0
# Default failure detection (a few seconds for a killed process) plus two periods.
STRANDED_AFTER = 12.0


async def _states(client: ClusterClient) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for key in range(GRAINS):
        for _attempt in range(20):
            try:
                out[key] = await client.get_grain(GRAIN, key).slots()
                break
            except OrleansPyError:
                await asyncio.sleep(0.25)  # a silo is being replaced: ask again
        else:
            pytest.fail(f"grain {key} did not answer")
    return out


async def _every_grain_commits_after(client: ClusterClient, since_ms: int, step: str) -> None:
    left: set[int] = set(range(GRAINS))

    async def committed() -> bool:
        states = await _states(client)
        left.intersection_update(
            k for k, slots in states.items() if max(slots, default=0) <= since_ms
        )
        return not left

    try:
        await wait_for(committed, STRANDED_AFTER + 10, interval=0.5)
    except TimeoutError:
        pytest.fail(f"after {step}: {len(left)} reminders stranded, e.g. {sorted(left)[:5]}")


@pytest.mark.parametrize("store", ["redis", "postgres"])
async def test_kills_and_replacements_apply_no_slot_twice_and_strand_none(
    store: str, redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    store_url = redis_url if store == "redis" else postgres_url
    python = Path(os.sys.executable)
    record = aioredis.Redis.from_url(redis_url)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(record.aclose)
        group: Silos = stack.enter_context(
            silos(store_url, "once_grains", {"ONCE_RECORD_URL": redis_url}, tmp_path)
        )
        for name in ("a", "b", "c"):
            group.start(name, python)
        client = await stack.enter_async_context(ClusterClient(membership_url=store_url))
        for chunk in range(0, GRAINS, 50):
            await asyncio.gather(
                *(client.get_grain(GRAIN, k).start() for k in range(chunk, chunk + 50))
            )
        await _every_grain_commits_after(client, 0, "the start")

        async def step(what: str, action: object) -> None:
            await asyncio.sleep(STEP_S)  # the cluster runs under its ticks for a while
            at = int(time.time() * 1000)
            await asyncio.to_thread(action)  # type: ignore[arg-type]
            await _every_grain_commits_after(client, at, what)

        await step("kill -9 of a", lambda: group.kill("a"))
        await step(
            "SIGTERM of b and a replacement", lambda: (group.stop("b"), group.start("d", python))
        )
        await step(
            "kill -9 of c and a replacement", lambda: (group.kill("c"), group.start("e", python))
        )

        states = await _states(client)
        now_ms = time.time() * 1000
        twice = {k: [s for s, n in Counter(v).items() if n > 1] for k, v in states.items()}
        twice = {k: v for k, v in twice.items() if v}
        stale = [k for k, v in states.items() if now_ms - max(v, default=0) > STRANDED_AFTER * 1000]
        runs = Counter(
            tuple(r.decode().split()[:2]) for r in await record.lrange("once:runs", 0, -1)
        )
        rerun = sum(1 for n in runs.values() if n > 1)
        print(
            f"\n{store}: {sum(len(v) for v in states.values())} slots in state, {len(runs)} "
            f"slots run, {rerun} run more than once (cut short before their commit), "
            f"{len(twice)} grains with a slot twice, {len(stale)} stranded"
        )
        assert not twice, f"slots applied twice: {dict(list(twice.items())[:5])}"
        assert not stale, f"stranded: {stale[:5]}"
        assert group.tracebacks() == {}


@pytest.mark.parametrize("store", ["redis", "postgres"])
async def test_a_crash_after_the_commit_is_redelivered_and_recognised_as_done(
    store: str, redis_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """The window the other test can only hope to hit: the silo dies right after
    the grain committed the tick, before the slot's progress is persisted. The
    next owner delivers the slot again, the grain's state says it is done, and
    the slot is in the state once, run once, recorded as deduplicated."""
    from orleanspy.reminders.model import FireOutcome

    store_url = redis_url if store == "redis" else postgres_url
    python = Path(os.sys.executable)
    record = aioredis.Redis.from_url(redis_url)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(record.aclose)
        group = stack.enter_context(
            silos(store_url, "once_grains", {"ONCE_RECORD_URL": redis_url}, tmp_path)
        )
        for name in ("a", "b"):
            group.start(name, python)
        client = await stack.enter_async_context(ClusterClient(membership_url=store_url))
        grain = client.get_grain("CrashAfterCommitGrain", "x")
        await grain.start()
        await wait_for(lambda: record.exists("once:crashed"), 20, what="the crash")
        slot_text, pid_text = (await record.get("once:crashed")).decode().split()
        crashed_slot, pid = int(slot_text), int(pid_text)
        dead = next(n for n, p in group.procs.items() if p.pid == pid)
        group.procs[dead].wait(10)  # it killed itself
        group.kill(dead)  # collect it
        group.start("c", python)  # so that two silos share the rows again

        async def moved_on() -> bool:
            try:
                return max(await grain.slots()) > crashed_slot + 1000
            except OrleansPyError:
                return False

        await wait_for(moved_on, STRANDED_AFTER + 20, interval=0.5, what="the next slots")
        slots = await grain.slots()
        runs = [r.decode().split() for r in await record.lrange("once:runs", 0, -1)]
        assert slots.count(crashed_slot) == 1, slots
        assert [int(s) for _k, s, _p in runs].count(crashed_slot) == 1, runs
        assert len(slots) == len(set(slots)), slots
        history = await client.reminders.history(("CrashAfterCommitGrain", "x"), "tick")
        assert FireOutcome.DEDUPLICATED in {r.outcome for r in history}, history
        assert group.tracebacks() == {}
