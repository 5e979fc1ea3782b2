"""``call_at``: one timer on a clock, on the real clock, the manual one, and a
clock that only knows how to sleep."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
import uvloop

from orleanspy.clock import SystemClock, call_at, to_ms
from orleanspy.testing import wait_for
from orleanspy.testing.clock import ManualClock


async def test_manual_clock_timer_fires_at_its_time_and_can_be_called_off() -> None:
    clock = ManualClock()
    fired: list[datetime] = []
    start = clock.now()
    call_at(clock, start + timedelta(seconds=5), lambda: fired.append(clock.now()))
    off = call_at(clock, start + timedelta(seconds=3), lambda: fired.append(start))
    off.cancel()
    await clock.advance(4)
    assert fired == []
    await clock.advance(1)
    assert fired == [start + timedelta(seconds=5)]
    call_at(clock, start, lambda: fired.append(clock.now()))  # already due: soon
    await clock.settle()
    assert fired[-1] == clock.now()
    assert clock.sleepers == 0


async def test_system_clock_timer_fires_and_a_cancelled_one_does_not() -> None:
    clock = SystemClock()
    fired: list[str] = []
    call_at(clock, clock.now() + timedelta(milliseconds=20), lambda: fired.append("due"))
    off = call_at(clock, clock.now() + timedelta(milliseconds=10), lambda: fired.append("off"))
    off.cancel()
    await wait_for(lambda: fired == ["due"], 5.0)
    assert fired == ["due"]


class SleepOnlyClock:
    """A ``Clock`` written before ``call_at`` existed: it can only sleep."""

    def __init__(self) -> None:
        self._inner = ManualClock()

    def now(self) -> datetime:
        return self._inner.now()

    def now_ms(self) -> int:
        return to_ms(self._inner.now())

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

    async def sleep_until(self, when: datetime) -> None:
        await self._inner.sleep_until(when)

    async def advance(self, seconds: float) -> None:
        await self._inner.advance(seconds)


async def test_a_clock_without_call_at_gets_a_sleeping_task() -> None:
    clock = SleepOnlyClock()
    fired: list[datetime] = []
    start = clock.now()
    call_at(clock, clock.now() + timedelta(seconds=2), lambda: fired.append(clock.now()))
    off = call_at(clock, clock.now() + timedelta(seconds=1), lambda: fired.append(clock.now()))
    await asyncio.sleep(0)  # the sleeping tasks register their sleeps
    off.cancel()
    await clock.advance(3)
    assert fired == [start + timedelta(seconds=2)]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_system_clock_timer_wakes_about_once_per_instant(loop: str) -> None:
    # uvloop keeps timers in whole milliseconds, rounded to the nearest, so an
    # exact sub-millisecond delay fired early, and a caller that re-checks the
    # clock and re-arms (the ticker) spun until the instant came: about 80
    # wake-ups each. A timer may still fire a hair early now and then (uvloop's
    # cached loop time), which costs one more wake-up, not a spin.
    clock = SystemClock()
    instants = 200
    wakes = 0

    async def main() -> None:
        nonlocal wakes
        for i in range(instants):
            when = clock.now() + timedelta(microseconds=100 + 37 * (i % 60))
            while clock.now() < when:
                fired = asyncio.Event()
                call_at(clock, when, fired.set)
                await fired.wait()
                wakes += 1

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
    assert wakes <= instants * 1.2
