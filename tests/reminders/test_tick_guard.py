"""``receive_reminder`` takes ticks only from a silo's reminder service: a client's
call or another grain's is refused with a clear error and never runs;
``orleanspy.testing.simulate_tick`` and the management grain's ``trigger``
deliver ticks the service's way. A tick that fails in the grain is logged with
its traceback and recorded with its error. (Against a real silo process and a forged
header: ``tests/cluster/test_faults.py``.)"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from orleanspy import Grain, Remindable, Silo, SiloOptions, TickStatus
from orleanspy.errors import MessageRejectedError
from orleanspy.identity import GrainId
from orleanspy.reminders.model import FireOutcome
from orleanspy.reminders.spec import ReminderSpec
from orleanspy.testing import simulate_tick, wait_for
from orleanspy.testing.clock import ManualClock

TICKS: list[tuple[str, TickStatus]] = []
REFUSED = "reminder ticks come only from the reminder service"


class GuardedGrain(Grain, Remindable, type_name="test_tick_guard.Guarded"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        TICKS.append((name, status))

    async def tick_other(self, key: str, status: TickStatus) -> None:
        await self.get_grain(GuardedGrain, key).receive_reminder("forged", status)


@pytest.fixture
async def silo() -> AsyncIterator[Silo]:
    TICKS.clear()
    options = SiloOptions(grain_types=(GuardedGrain,), allow_client_management=True)
    async with Silo.local(options, clock=ManualClock()) as s:
        yield s
    TICKS.clear()


def _status(silo: Silo) -> TickStatus:
    now = silo.clock.now()
    return TickStatus(now, timedelta(minutes=1), None, now, now)


async def test_a_client_cannot_call_receive_reminder(silo: Silo) -> None:
    g = silo.client.get_grain(GuardedGrain, "a")
    with pytest.raises(MessageRejectedError, match=REFUSED):
        await g.receive_reminder("forged", _status(silo))
    assert TICKS == []


async def test_a_grain_cannot_call_another_grains_receive_reminder(silo: Silo) -> None:
    g = silo.client.get_grain(GuardedGrain, "a")
    with pytest.raises(MessageRejectedError, match=REFUSED):
        await g.tick_other("b", _status(silo))
    assert TICKS == []


async def test_simulate_tick_and_trigger_deliver_ticks(silo: Silo) -> None:
    status = await simulate_tick(silo, GuardedGrain, "a", "beat", missed_ticks=2)
    assert [("beat", status)] == TICKS and status.missed_ticks == 2
    final = await simulate_tick(silo, GuardedGrain, "a", "once", payload={"k": 1}, final=True)
    assert TICKS[-1] == ("once", final) and (final.payload, final.final) == ({"k": 1}, True)
    gid = GrainId("test_tick_guard.Guarded", "a")
    await silo.dispatcher.reminders.register(gid, "r", ReminderSpec(period=60))
    triggered = await silo.client.reminders.trigger(gid, "r")
    assert TICKS[-1] == ("r", triggered) and triggered.triggered


class FailingGrain(Grain, Remindable, type_name="test_tick_guard.Failing"):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        raise ValueError(f"cannot handle {name}")


async def test_a_failing_tick_is_logged_with_its_traceback_and_recorded_with_its_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    options = SiloOptions(grain_types=(FailingGrain,))
    with caplog.at_level(logging.WARNING, logger="orleanspy.reminders"):
        async with Silo.local(options, clock=clock) as silo:
            gid = GrainId("test_tick_guard.Failing", "f")
            await silo.dispatcher.reminders.register(gid, "r", ReminderSpec(due=1, period=60))
            svc = silo.reminder_service
            assert svc is not None
            await wait_for(lambda: svc.stats.loaded == 1, 5.0, interval=0)
            await clock.advance(timedelta(seconds=1))
            await wait_for(lambda: svc.stats.grain_errors == 1, 5.0, interval=0)

            async def recorded() -> bool:
                return bool(await silo.client.reminders.history(gid, "r"))

            await wait_for(recorded, 5.0)
            (record,) = await silo.client.reminders.history(gid, "r")
    assert record.outcome is FireOutcome.GRAIN_ERROR
    assert record.error == "ValueError: cannot handle r"
    (line,) = [r for r in caplog.records if "tick failed in grain" in r.getMessage()]
    assert line.exc_info is not None
    assert "in receive_reminder" in caplog.text  # the grain's own frame
