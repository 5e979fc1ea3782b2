"""Pause, resume, trigger and fire history on real Redis with two silos, and a
pause held across a restart of the whole cluster."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderOptions,
    Silo,
    SiloOptions,
    TickStatus,
)
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome
from orleanspy.testing import wait_for
from orleanspy.testing.cluster import FAST_MEMBERSHIP

pytestmark = pytest.mark.slow

#: (reminder name, status) of every tick delivered in this process.
RECEIVED: list[tuple[str, TickStatus]] = []


class PausableGrain(Grain, Remindable):
    async def start(self) -> None:
        await self.register_or_update_reminder("ctrl", due=1, period=1)
        await self.register_or_update_reminder(
            "p", due=1, period=1, action=MissedReminderAction.FIRE_IMMEDIATELY
        )
        for name, action in (("s", MissedReminderAction.SKIP), ("n", MissedReminderAction.NOTIFY)):
            await self.register_or_update_reminder(name, due=1, period=1, action=action)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        RECEIVED.append((name, status))


def ticks(name: str, *, triggered: bool = False) -> int:
    return sum(1 for n, s in RECEIVED if n == name and s.triggered == triggered)


async def ctrl_ticks(more: int) -> None:
    """Wait for ``more`` ticks of the unpaused reminder: proof that time passed
    with the service delivering."""
    target = ticks("ctrl") + more
    await wait_for(lambda: ticks("ctrl") >= target, timeout=60, what=f"{more} ctrl ticks")


def silo(redis_url: str, name: str) -> Silo:
    return Silo(
        SiloOptions(
            redis_url=redis_url,
            name=name,
            membership=FAST_MEMBERSHIP,
            grain_types=(PausableGrain,),
            reminders=ReminderOptions(
                missed_tick_grace=timedelta(seconds=2),
                poll_interval=timedelta(seconds=2),
                look_ahead=timedelta(seconds=10),
                history_size=5,
            ),
        )
    )


async def test_pause_holds_across_a_restart_resume_catches_up_trigger_is_off_schedule(
    redis_url: str,
) -> None:
    RECEIVED.clear()
    gid = GrainId("PausableGrain", "g")
    async with silo(redis_url, "a") as a, silo(redis_url, "b") as b:
        assert a.membership is not None
        await wait_for(lambda: len(a.membership.active_silos()) == 2, timeout=30)
        await a.client.get_grain(PausableGrain, "g").start()
        await wait_for(lambda: ticks("p") >= 2, timeout=60, what="p ticking")
        mgmt = a.client.reminders
        row = await mgmt.pause(gid, "p")
        assert row.paused
        for name in ("s", "n"):
            await mgmt.pause(gid, name)
        await ctrl_ticks(2)  # a tick of p already running when paused has landed
        held = ticks("p")
        await ctrl_ticks(3)
        assert ticks("p") == held, "a paused reminder ticked"

        before = await mgmt.list_for_grain(gid)
        status = await mgmt.trigger(gid, "p")
        assert status.triggered
        assert ticks("p", triggered=True) == 1  # delivered before trigger returned
        after = await mgmt.list_for_grain(gid)
        assert [r.next_due for r in after] == [r.next_due for r in before]
        assert ticks("p") == held  # the scheduled count did not move
        history = await mgmt.history(gid, "p")
        assert history[0].triggered and history[0].outcome is FireOutcome.OK
        assert history[0].silo in (str(a.address), str(b.address))  # where the call ran
        delivered = history[1:]
        assert delivered and all(r.outcome is FireOutcome.OK for r in delivered)
        assert {r.silo for r in delivered} <= {"a", "b"}
        assert [r.slot for r in delivered] == sorted((r.slot for r in delivered), reverse=True)
        assert all(timedelta(0) <= r.lateness < timedelta(seconds=5) for r in delivered)

    # The whole cluster restarts: the pause is in the table, not in memory.
    async with silo(redis_url, "c") as c:
        await ctrl_ticks(3)
        assert ticks("p") == held, "a paused reminder ticked after a restart"
        [p] = [r for r in await c.client.reminders.list_for_grain(gid) if r.name == "p"]
        assert p.paused
        resumed = await c.client.reminders.resume(gid, "p")
        assert not resumed.paused
        await wait_for(lambda: ticks("p") > held, timeout=60, what="p ticking again")
        catch_up = [s for n, s in RECEIVED if n == "p" and not s.triggered][held]
        # Paused for several periods, past the grace: FIRE_IMMEDIATELY sends one
        # coalesced tick standing for the slots skipped.
        assert catch_up.missed_ticks >= 3, catch_up
        await wait_for(lambda: ticks("p") >= held + 3, timeout=60, what="p back on its grid")
        for name in ("s", "n"):
            await c.client.reminders.resume(gid, name)
        mgmt = c.client.reminders

        async def outcome_of(name: str, outcome: FireOutcome) -> bool:
            return any(r.outcome is outcome for r in await mgmt.history(gid, name))

        await wait_for(lambda: outcome_of("s", FireOutcome.MISSED_SKIPPED), timeout=60)
        await wait_for(lambda: outcome_of("n", FireOutcome.NOTIFIED), timeout=60)
        await wait_for(lambda: _newest_by(mgmt, gid, "p", "c"), timeout=60)
        history = await mgmt.history(gid, "p")
        assert len(history) == 5  # bounded by ReminderOptions.history_size


async def _newest_by(mgmt, gid: GrainId, name: str, silo: str) -> bool:
    history = await mgmt.history(gid, name)
    return bool(history) and history[0].silo == silo
