"""Grains the silos of the network fault suite run (``orleanspy silo --import
netns_grains``, from this directory).

Every reminder tick is appended, one line each, to the file named by
``NETNS_TICKS`` (each silo its own file; the namespaces share the file system,
so a silo cut off from every network still reports)::

    <delivered unix time> <pid> <grain key> <reminder name> <slot unix time> <missed>

``NetTickGrain`` also commits each tick with its state (on the silos' Redis), so
the suite can check that no partition applies a slot twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta

from orleanspy import (
    Grain,
    MissedReminderAction,
    Remindable,
    TickStatus,
    persistent_state,
    register_reminder,
)

MS = timedelta(milliseconds=1)
_ticks = open(os.environ["NETNS_TICKS"], "a", buffering=1)  # noqa: SIM115 - the process's life


def _record(key: str, name: str, status: TickStatus) -> None:
    _ticks.write(
        f"{time.time():.6f} {os.getpid()} {key} {name} "
        f"{status.current_tick_time.timestamp():.6f} {status.missed_ticks}\n"
    )


@dataclass
class Applied:
    """The slots (unix time) whose ticks a ``NetTickGrain`` committed, newest last."""

    slots: list[float] = field(default_factory=list)


class NetTickGrain(Grain, Remindable):
    """A grain with reminders registered by the client; answers where it runs.
    Each tick is recorded, then its slot committed with the grain's state
    (``write(tick=...)``): a slot in the state twice is an effect applied twice."""

    applied = persistent_state(Applied)

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        _record(str(self.grain_key), name, status)
        self.applied.state.slots.append(status.current_tick_time.timestamp())
        del self.applied.state.slots[:-400]  # a scenario lasts less than 400 periods
        await self.applied.write(tick=status)

    async def start(self, period_ms: int, skip: bool) -> None:
        action = MissedReminderAction.SKIP if skip else MissedReminderAction.FIRE_IMMEDIATELY
        await self.register_or_update_reminder(
            "tick", due=period_ms * MS, period=period_ms * MS, action=action
        )

    async def where(self) -> int:
        return os.getpid()


@register_reminder("declared", period=1.0, keys=[f"d{i}" for i in range(4)])
class NetDeclaredGrain(Grain, Remindable):
    """Reminders the silos declare: a store that lost its rows gets them back."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        _record(str(self.grain_key), name, status)
