"""The grains behind the Operations page's command lines (docs/operations.md).

Run from the repository root, every line there works as written::

    export ORLEANSPY_REDIS_URL=redis://127.0.0.1:6379/0
    orleanspy silo --import samples.operations --name silo-a --gateway-port 30000 ...
    orleanspy reminders get ReportGrain/daily ping

``ReportGrain`` declares two reminders for its key ``daily``: ``ping`` every 30 s
and ``monthly`` at midnight on the first of the month, critical. The silo writes
both rows at start-up, without activating the grain.
"""

from __future__ import annotations

import logging

from orleanspy import Grain, Remindable, ReminderPriority, TickStatus, register_reminder

log = logging.getLogger(__name__)


class CounterGrain(Grain):
    """A counter kept in memory while the grain is active."""

    async def on_activate(self) -> None:
        self.total = 0

    async def add(self, k: int) -> int:
        self.total += k
        return self.total


@register_reminder("monthly", cron="0 0 0 1 * *", priority=ReminderPriority.CRITICAL)
@register_reminder("ping", due=30, period=30)
class ReportGrain(Grain, Remindable, reminder_keys=("daily",)):
    """Logs each tick it receives."""

    async def receive_reminder(self, name: str, status: TickStatus) -> None:
        log.info(
            "tick name=%s slot=%s missed=%d triggered=%s",
            name,
            status.current_tick_time.isoformat(),
            status.missed_ticks,
            status.triggered,
        )
