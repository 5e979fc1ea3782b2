"""Silo processes on PostgreSQL alone (no Redis): reminders tick, rows written
elsewhere arrive through NOTIFY, a SIGKILLed silo's reminders move on; a paused
reminder stays silent, resumes with its missed-tick action, and its fire
history is kept.

The silos poll the reminder table only every 10 minutes, so within this test a
row reaches its owner only through LISTEN/NOTIFY or a ring change.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from orleanspy import ClusterClient, MissedReminderAction
from orleanspy.identity import GrainId, SiloAddress
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.postgres import PostgresMembershipTable
from orleanspy.reminders.model import FireOutcome, ReminderEntry
from orleanspy.reminders.postgres import PostgresReminderTable
from orleanspy.ring import ConsistentRing
from orleanspy.testing.cluster import wait_for
from tests.ready import read_ready, stop_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SILO = Path(__file__).with_name("pg_silo_process.py")
ROOT = Path(__file__).resolve().parents[2]
TYPE = "pg_silo_process.Tick"
GRAINS = 24
# The table pg_silo_process.py writes every tick to.
TICKS_DDL = (
    "CREATE TABLE test_ticks (grain text, name text, silo text, slot timestamptz, "
    "missed integer, at timestamptz NOT NULL DEFAULT clock_timestamp())"
)


def _ready(proc: subprocess.Popen[str], timeout: float = 30) -> SiloAddress:
    return SiloAddress.parse(read_ready(proc, timeout)[0])


@contextmanager
def silo_processes(
    url: str, count: int, *extra: str
) -> Iterator[list[tuple[subprocess.Popen[str], SiloAddress]]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(SILO),
                "--storage-url",
                url,
                "--name",
                f"pg-{i}",
                "--expect",
                str(count),
                *extra,
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(count)
    ]
    try:
        yield [(p, _ready(p)) for p in procs]
    finally:
        stop_processes(procs, 15)


async def test_three_silos_on_postgres_only(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(TICKS_DDL)

        async def ticked(name: str, since: datetime, silos: set[str] | None = None) -> set[str]:
            rows = await conn.fetch(
                "SELECT DISTINCT grain, silo FROM test_ticks WHERE name = $1 AND at > $2",
                name,
                since,
            )
            return {r["grain"] for r in rows if silos is None or r["silo"] in silos}

        with silo_processes(postgres_url, 3) as silos:
            addresses = [a for _, a in silos]
            async with AsyncExitStack() as stack:
                table = PostgresMembershipTable(
                    postgres_url, cluster_id="dev", service_id="default"
                )
                await table.start(stack)
                # The client finds its gateways in the PostgreSQL membership table.
                client = await stack.enter_async_context(ClusterClient(postgres_url))
                await wait_for(lambda: len(client.gateways) == 3, timeout=15, what="3 gateways")

                # Each grain registers on the silo hosting it; the ring owner of
                # its row is often another silo, which hears of it only by NOTIFY.
                t0 = datetime.now(UTC)
                hosts = await asyncio.gather(
                    *(client.get_grain(TYPE, k).start("tick", 500) for k in range(GRAINS))
                )
                ring = ConsistentRing.build(addresses)
                elsewhere = [
                    k
                    for k in range(GRAINS)
                    if str(ring.owner(GrainId(TYPE, k).uniform_hash())) != hosts[k]
                ]
                assert elsewhere, "no row was owned by another silo than its writer"
                everyone = {str(k) for k in range(GRAINS)}

                async def all_ticking() -> bool:
                    return await ticked("tick", t0) == everyone

                await wait_for(all_ticking, timeout=30, what="every reminder ticking")

                # A writer outside the cluster: the row reaches its owner by NOTIFY.
                outside = PostgresReminderTable(postgres_url, service_id="default")
                await outside.start(stack)
                now = datetime.now(UTC)
                await outside.upsert(
                    ReminderEntry(
                        service_id="default",
                        grain_id=GrainId(TYPE, 1000),
                        name="outside",
                        start_at=now,
                        next_due=now + timedelta(milliseconds=300),
                        period=timedelta(milliseconds=500),
                    )
                )

                async def outside_ticks() -> bool:
                    return await ticked("outside", now) == {"1000"}

                await wait_for(outside_ticks, timeout=20, what="the outside row ticking")

                # SIGKILL one silo: once it is Dead, every reminder ticks on the others.
                victim, victim_address = silos[0]
                victim.send_signal(signal.SIGKILL)
                victim.wait(5)

                async def victim_dead() -> bool:
                    return (await table.read_all()).status(victim_address) is SiloStatus.DEAD

                await wait_for(victim_dead, timeout=30, what="the killed silo Dead")
                dead_at = datetime.now(UTC)
                survivors = {str(a) for a in addresses[1:]}

                async def all_moved_on() -> bool:
                    return (
                        await ticked("tick", dead_at + timedelta(seconds=1), survivors) == everyone
                    )

                await wait_for(all_moved_on, timeout=40, what="every reminder ticking on survivors")
                late = await conn.fetchval(
                    "SELECT count(*) FROM test_ticks WHERE silo = $1 AND at > $2",
                    str(victim_address),
                    dead_at,
                )
                assert late == 0
    finally:
        await conn.close()


async def test_pause_and_resume_with_silos_on_postgres_only(postgres_url: str) -> None:
    """Two silo processes: a paused reminder delivers no slot while paused (its
    neighbour keeps ticking), and on resume the missed-tick action applies to
    the slots that passed: one coalesced catch-up tick (FIRE_IMMEDIATELY) or a
    skip (SKIP). The fire history kept in PostgreSQL shows both outcomes."""
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(TICKS_DDL)

        async def ticks(name: str) -> list[tuple[datetime, int]]:
            rows = await conn.fetch(
                "SELECT slot, missed FROM test_ticks WHERE grain = 'g' AND name = $1 ORDER BY at",
                name,
            )
            return [(r["slot"], r["missed"]) for r in rows]

        async def ctrl_ticks(more: int) -> None:
            """Wait for ``more`` ticks of the unpaused reminder: time passed with
            the service delivering."""
            target = len(await ticks("ctrl")) + more

            async def done() -> bool:
                return len(await ticks("ctrl")) >= target

            await wait_for(done, timeout=30, what=f"{more} ctrl ticks")

        with silo_processes(postgres_url, 2, "--grace-ms", "1000", "--allow-client-management"):
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(ClusterClient(postgres_url))
                await wait_for(lambda: len(client.gateways) == 2, timeout=15, what="2 gateways")
                grain = client.get_grain(TYPE, "g")
                gid = GrainId(TYPE, "g")
                await grain.start("ctrl", 250)
                await grain.start("p", 250, int(MissedReminderAction.FIRE_IMMEDIATELY))
                await grain.start("s", 250, int(MissedReminderAction.SKIP))

                async def ticking(name: str, more_than: int) -> bool:
                    return len(await ticks(name)) > more_than

                for name in ("p", "s"):
                    await wait_for(lambda n=name: ticking(n, 1), timeout=30, what=f"{name} ticking")

                mgmt = client.reminders
                for name in ("p", "s"):
                    assert (await mgmt.pause(gid, name)).paused
                await ctrl_ticks(2)  # a tick already running when paused has landed
                held = {name: await ticks(name) for name in ("p", "s")}
                await ctrl_ticks(8)  # two seconds at least: past the grace
                for name in ("p", "s"):
                    assert await ticks(name) == held[name], f"paused {name} delivered a slot"
                stopped = {r.name: r for r in await mgmt.list_for_grain(gid)}
                assert stopped["p"].paused and stopped["s"].paused

                resumed_at = datetime.now(UTC)
                for name in ("p", "s"):
                    assert not (await mgmt.resume(gid, name)).paused

                for name in ("p", "s"):
                    await wait_for(
                        lambda n=name: ticking(n, len(held[n])), timeout=30, what=f"{name} again"
                    )
                # FIRE_IMMEDIATELY: one catch-up for the latest slot that passed while
                # paused, standing for the earlier ones from the slot it stopped at.
                caught_up, missed = (await ticks("p"))[len(held["p"])]
                assert stopped["p"].next_due < caught_up <= datetime.now(UTC), caught_up
                assert missed >= 3, missed
                # SKIP: the slot it stopped at is never delivered; the grid resumes
                # after the resume.
                after = (await ticks("s"))[len(held["s"]) :]
                assert all(s > resumed_at for s, _ in after), (after, resumed_at)

                # History is written behind the ticks, in batches: wait for the
                # records of the catch-up and of the slot the skipping row stopped
                # at, made after the resume. (A tick delivered just as the pause
                # landed may have lost its schedule write to it, so an older record
                # can share that slot.)
                async def since_resume(name: str) -> list[FireOutcome]:
                    slot = caught_up if name == "p" else stopped[name].next_due
                    return [
                        r.outcome
                        for r in await mgmt.history(gid, name)
                        if r.slot == slot and r.at > resumed_at
                    ]

                async def recorded() -> bool:
                    return bool(await since_resume("p")) and bool(await since_resume("s"))

                await wait_for(recorded, timeout=30, what="the resumed slots in the history")
                assert await since_resume("p") == [FireOutcome.OK]
                assert await since_resume("s") == [FireOutcome.MISSED_SKIPPED]
                history = await mgmt.history(gid, "p")
                assert 0 < len(history) <= 20  # ReminderOptions.history_size
                assert [r.slot for r in history] == sorted((r.slot for r in history), reverse=True)
                assert {r.silo for r in history} <= {"pg-0", "pg-1"}
    finally:
        await conn.close()
