"""Grains imported by the ``orleanspy silo --import`` test."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orleanspy import Grain, Remindable, TickStatus, persistent_state


class CliEchoGrain(Grain, Remindable):
    async def pid(self) -> int:
        return os.getpid()

    async def remind_me(self) -> None:
        await self.register_or_update_reminder("hourly", cron="0 0 * * * *")

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        return None


@dataclass
class CliNote:
    text: str = ""


class CliStateGrain(Grain):
    note = persistent_state(CliNote)

    async def save(self, text: str) -> None:
        self.note.state.text = text
        await self.note.write()


class CliTickGrain(Grain, Remindable):
    """Counts the reminder ticks it receives (for the metrics test)."""

    async def on_activate(self) -> None:
        self.received = 0

    async def start_ticking(self) -> None:
        await self.register_or_update_reminder("tick", due=1, period=1)

    async def stop_ticking(self) -> None:
        await self.unregister_reminder("tick")

    async def ticks(self) -> int:
        return self.received

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        self.received += 1
