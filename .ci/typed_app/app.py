"""A tiny application that CI type-checks with ``mypy --strict`` against the
*installed* orleanspy (an editable install in a fresh venv), to prove the package
ships its types (PEP 561) the way an adopting team consumes it."""

from __future__ import annotations

from datetime import timedelta

from orleanspy import (
    Grain,
    Remindable,
    ReminderOptions,
    ReminderPriority,
    Silo,
    SiloOptions,
    TickStatus,
    register_reminder,
    run,
)


@register_reminder("hourly", period=3600)
class CounterGrain(Grain, Remindable):
    async def add(self, n: int) -> int:
        self._total = getattr(self, "_total", 0) + n
        return self._total

    async def remind_once(self) -> None:
        # The reminder options are typed keywords: a misspelt one fails the check.
        await self.register_or_update_reminder(
            "once", due=timedelta(minutes=1), priority=ReminderPriority.CRITICAL
        )

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        await self.add(1)


async def main() -> int:
    # Durations take a timedelta or a number of seconds, as the reminder API does.
    options = SiloOptions(
        collection_age=timedelta(minutes=5),
        reminders=ReminderOptions(poll_interval=10, look_ahead=60),
    )
    async with Silo.local(options) as silo:
        counter = silo.client.get_grain(CounterGrain, "a")
        total: int = await counter.add(2)
        return total


if __name__ == "__main__":
    print(run(main()))
