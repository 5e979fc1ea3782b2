"""``@register_reminder`` at silo start-up: create declared rows that are missing."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from orleanspy.grain import GrainDefinition
from orleanspy.reminders.model import MissedReminderAction
from orleanspy.reminders.registry import ReminderRegistry

__all__ = ["register_declared_reminders"]

log = logging.getLogger(__name__)


async def register_declared_reminders(
    registry: ReminderRegistry, definitions: Iterable[GrainDefinition]
) -> int:
    """For every declared reminder and every declared key, create the row if it
    does not exist (existing rows, and their schedules, are left alone). No grain
    is activated. Returns how many rows were created. Invalid declarations raise
    ``ReminderError`` (the silo does not start)."""
    created = 0
    for defn in definitions:
        for declared in defn.reminders:
            for key in defn.reminder_keys:
                gid = defn.grain_id(key)
                if await registry.get(gid, declared.name) is not None:
                    continue
                await registry.register(
                    gid,
                    declared.name,
                    due=declared.due,
                    period=declared.period,
                    cron=declared.cron,
                    tz=declared.tz,
                    priority=declared.priority,
                    action=MissedReminderAction(declared.action),
                )
                created += 1
    if created:
        log.info("declared reminders created count=%d", created)
    return created
