"""Idle collection, explicit deactivation, timers, and silo stop — on a manual clock."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from orleanspy import Grain, Silo, SiloOptions
from orleanspy.testing.clock import ManualClock
from orleanspy.testing.cluster import wait_for

events: list[str] = []


class LifecycleGrain(Grain):
    async def on_activate(self) -> None:
        events.append(f"activate {self.grain_key}")

    async def on_deactivate(self) -> None:
        events.append(f"deactivate {self.grain_key}")

    async def touch(self) -> str:
        return "ok"

    async def leave(self) -> None:
        self.deactivate_on_idle()


class ShortLivedGrain(Grain, collection_age=timedelta(seconds=10)):
    async def touch(self) -> str:
        return "ok"


class TimerGrain(Grain):
    async def on_activate(self) -> None:
        self.ticks = 0
        self.inside = 0
        self.overlap = False
        self.handle = None

    async def start_timer(self, due: float, period: float) -> None:
        self.handle = self.register_timer(self._tick, due, period)

    async def _tick(self) -> None:
        self.inside += 1
        self.overlap |= self.inside > 1
        await asyncio.sleep(0)
        self.ticks += 1
        self.inside -= 1

    async def work(self) -> bool:
        self.inside += 1
        self.overlap |= self.inside > 1
        for _ in range(5):
            await asyncio.sleep(0)
        self.inside -= 1
        return self.overlap

    async def ticks_so_far(self) -> int:
        return self.ticks

    async def stop_timer(self) -> None:
        assert self.handle is not None
        self.handle.dispose()

    async def leave(self) -> None:
        self.deactivate_on_idle()


def _options(**kw: object) -> SiloOptions:
    return SiloOptions(
        collection_age=timedelta(minutes=15),
        collection_check_interval=timedelta(minutes=1),
        **kw,  # type: ignore[arg-type]
    )


async def test_idle_activation_is_collected_after_collection_age() -> None:
    events.clear()
    clock = ManualClock()
    async with Silo.local(_options(), clock=clock) as silo:
        await silo.client.get_grain(LifecycleGrain, "idle").touch()
        assert silo.activation_count == 1
        await clock.advance(timedelta(minutes=14))
        assert silo.activation_count == 1, "collected before collection_age"
        await clock.advance(timedelta(minutes=2))
        await wait_for(lambda: silo.activation_count == 0, 5.0, what="not collected")
        assert events == ["activate idle", "deactivate idle"]


async def test_recently_used_activation_survives_collection() -> None:
    clock = ManualClock()
    async with Silo.local(_options(), clock=clock) as silo:
        ref = silo.client.get_grain(LifecycleGrain, "busy")
        for _ in range(5):
            await ref.touch()
            await clock.advance(timedelta(minutes=10))
        assert silo.activation_count == 1


async def test_per_class_collection_age() -> None:
    clock = ManualClock()
    opts = SiloOptions(collection_check_interval=timedelta(seconds=5))
    async with Silo.local(opts, clock=clock) as silo:
        await silo.client.get_grain(ShortLivedGrain, "s").touch()
        await silo.client.get_grain(LifecycleGrain, "l").touch()
        await clock.advance(timedelta(seconds=20))
        await wait_for(
            lambda: silo.activation_count == 1, 5.0, what="short-lived grain not collected"
        )


async def test_deactivate_on_idle_then_reactivates_on_next_call() -> None:
    events.clear()
    async with Silo.local() as silo:
        ref = silo.client.get_grain(LifecycleGrain, "d")
        await ref.leave()
        await wait_for(lambda: silo.activation_count == 0, 5.0, what="not deactivated")
        assert await ref.touch() == "ok"
        assert events == ["activate d", "deactivate d", "activate d"]


async def test_silo_stop_deactivates_everything() -> None:
    events.clear()
    async with Silo.local() as silo:
        for key in "abc":
            await silo.client.get_grain(LifecycleGrain, key).touch()
    assert sorted(e for e in events if e.startswith("deactivate")) == [
        "deactivate a",
        "deactivate b",
        "deactivate c",
    ]


async def test_timer_ticks_on_period_and_stops_on_deactivation() -> None:
    clock = ManualClock()
    async with Silo.local(clock=clock) as silo:
        ref = silo.client.get_grain(TimerGrain, "t")
        await ref.start_timer(5, 10)
        assert await ref.ticks_so_far() == 0
        await clock.advance(4)
        assert await ref.ticks_so_far() == 0
        await clock.advance(1)
        assert await ref.ticks_so_far() == 1
        await clock.advance(30)
        assert await ref.ticks_so_far() == 4
        act = next(a for a in silo.dispatcher.catalog.activations() if a.grain_id.key == "t")
        grain = act.grain
        await ref.leave()
        await wait_for(lambda: silo.activation_count == 0, 5.0, what="not deactivated")
        assert not act._timers
        assert grain.handle.disposed
        ticks = grain.ticks
        await clock.advance(60)
        assert grain.ticks == ticks


async def test_timer_dispose_stops_ticks() -> None:
    clock = ManualClock()
    async with Silo.local(clock=clock) as silo:
        ref = silo.client.get_grain(TimerGrain, "d")
        await ref.start_timer(1, 1)
        await clock.advance(3)
        assert await ref.ticks_so_far() == 3
        await ref.stop_timer()
        await clock.advance(10)
        assert await ref.ticks_so_far() == 3


async def test_timer_ticks_obey_turns() -> None:
    clock = ManualClock()
    async with Silo.local(clock=clock) as silo:
        ref = silo.client.get_grain(TimerGrain, "turns")
        await ref.start_timer(0.001, 0.001)
        calls = [ref.work() for _ in range(20)]
        advancing = asyncio.ensure_future(clock.advance(0.05))
        overlaps = await asyncio.gather(*calls)
        await advancing
        assert await ref.ticks_so_far() > 0
        assert not any(overlaps)


async def test_timer_rejects_bad_period() -> None:
    async with Silo.local() as silo:
        ref = silo.client.get_grain(TimerGrain, "bad")
        with pytest.raises(ValueError, match="period"):
            await ref.start_timer(1, 0)
