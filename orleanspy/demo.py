"""The orleanspy demo, on the embedded default (one process, in-memory providers).

A tiny shop: carts reserve stock from inventory grains (grains calling grains,
one turn at a time), a customer grain keeps loyalty points in persistent state
across a deactivation, a stats grain keeps a grain timer ticking, and a report
grain gets durable reminders — an interval one declared on the class and a
6-field cron one (seconds first) registered at run time. It runs for a few
seconds, prints what happens, and stops cleanly (Ctrl-C stops it early).

Run: ``orleanspy demo``, ``make demo`` or ``python -m samples.demo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from datetime import timedelta

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
    persistent_state,
    register_reminder,
    run,
)

T0 = time.monotonic()


def say(what: str) -> None:
    print(f"[{time.monotonic() - T0:5.2f}s] {what}", flush=True)


class InventoryGrain(Grain):
    """Stock of one product; reservations never interleave, so stock never goes negative."""

    async def on_activate(self) -> None:
        self.stock = 3
        say(f"activated inventory {self.grain_key} with stock {self.stock}")

    async def reserve(self, n: int) -> bool:
        if self.stock < n:
            return False
        await asyncio.sleep(0.01)  # a slow check elsewhere: another turn cannot sneak in
        self.stock -= n
        return True

    async def remaining(self) -> int:
        return self.stock


class CartGrain(Grain):
    async def on_activate(self) -> None:
        self.items: list[str] = []

    async def add(self, product: str) -> str:
        ok = await self.get_grain(InventoryGrain, product).reserve(1)
        if ok:
            self.items.append(product)
            await self.get_grain(StatsGrain, "shop").record(product)
        return f"cart {self.grain_key}: {product} {'reserved' if ok else 'SOLD OUT'}"


@dataclass
class Loyalty:
    points: int = 0


class CustomerGrain(Grain):
    """Loyalty points in persistent state: loaded before on_activate, kept by write()."""

    loyalty = persistent_state(Loyalty)  # the silo's "default" storage (memory here)

    async def on_activate(self) -> None:
        say(f"activated customer {self.grain_key}: {self.loyalty.state.points} points loaded")

    async def earn(self, points: int) -> int:
        self.loyalty.state.points += points
        await self.loyalty.write()
        return self.loyalty.state.points

    async def leave(self) -> None:
        self.deactivate_on_idle()


class StatsGrain(Grain):
    """Counts sales; a grain timer prints a summary every second."""

    async def on_activate(self) -> None:
        self.sold: dict[str, int] = {}
        self.register_timer(self._summary, due=1.0, period=1.0)

    async def record(self, product: str) -> None:
        self.sold[product] = self.sold.get(product, 0) + 1

    async def _summary(self) -> None:
        say(f"timer: sold so far {self.sold}")


@register_reminder("heartbeat", due=1, period=1.5, priority=ReminderPriority.BACKGROUND)
class ReportGrain(Grain, Remindable):
    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        say(
            f"reminder {name!r} for {self.grain_id}: slot "
            f"{status.current_tick_time:%H:%M:%S}, priority {status.priority}"
        )

    async def schedule_cron(self) -> None:
        await self.register_or_update_reminder(
            "every-2s",
            cron="*/2 * * * * *",
            priority=ReminderPriority.CRITICAL,
            action=MissedReminderAction.FIRE_IMMEDIATELY,
        )


async def main(seconds: float = 5.0) -> None:
    options = SiloOptions(name="demo")
    async with Silo.local(options) as silo:
        say(f"silo {silo.name} started on the embedded default")
        carts = [silo.client.get_grain(CartGrain, f"c{i}") for i in range(5)]
        results = await asyncio.gather(*(cart.add("lamp") for cart in carts))
        for line in results:
            say(line)
        say(f"lamps left: {await silo.client.get_grain(InventoryGrain, 'lamp').remaining()}")
        await carts[0].add("chair")

        ann = silo.client.get_grain(CustomerGrain, "ann")
        say(f"ann has {await ann.earn(10)} points")
        active = silo.activation_count
        await ann.leave()
        while silo.activation_count == active:  # wait for the deactivation to finish
            await asyncio.sleep(0.01)
        say("ann deactivated")
        say(f"ann has {await ann.earn(5)} points: her state outlived the activation")

        await silo.client.get_grain(ReportGrain, "daily").schedule_cron()
        upcoming = await silo.client.reminders.upcoming(timedelta(minutes=1))
        for row in upcoming:
            what = f"cron {row.cron!r}" if row.cron else f"every {row.period}"
            say(f"registered reminder {row.grain_id}/{row.name}: {what}, next {row.next_due:%X}")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            say("interrupted")
        say(f"stopping: {silo.activation_count} activations will be deactivated")
    say("silo stopped cleanly")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run(main())
