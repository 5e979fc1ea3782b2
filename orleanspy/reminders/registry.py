"""The reminder registry: what grains' ``register_or_update_reminder`` & co. call.

Registrations go straight to the shared table (every silo's service sees the
write on the change feed; the local service is told at once as well). The
registry validates input (``ReminderError``) and refuses grains that are not
``Remindable``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from orleanspy.clock import Clock
from orleanspy.errors import ReminderError
from orleanspy.grain import GrainDefinition
from orleanspy.identity import GrainId
from orleanspy.options import ReminderOptions
from orleanspy.reminders.model import (
    MissedReminderAction,
    ReminderChange,
    ReminderEntry,
    ReminderPriority,
)
from orleanspy.reminders.spec import new_entry
from orleanspy.reminders.table import ReminderTable

__all__ = ["ReminderRegistry"]

_REMOVE_ATTEMPTS = 5


class ReminderRegistry:
    """Register, read and remove reminder rows on behalf of grains."""

    def __init__(
        self,
        table: ReminderTable,
        *,
        service_id: str,
        clock: Clock,
        options: ReminderOptions,
        definitions: Callable[[str], GrainDefinition | None],
    ) -> None:
        self.table = table
        self.service_id = service_id
        self.clock = clock
        self.options = options
        self._definitions = definitions
        self._listeners: list[Callable[[ReminderChange], None]] = []

    def add_listener(self, listener: Callable[[ReminderChange], None]) -> None:
        """``listener`` hears of every write made through this registry."""
        self._listeners.append(listener)

    def _changed(self, grain_id: GrainId, name: str, entry: ReminderEntry | None) -> None:
        # A paused row left the schedule: told as a removal, as the tables do.
        due = entry.next_due if entry is not None and not entry.paused else None
        change = ReminderChange(grain_id, name, due)
        for listener in self._listeners:
            listener(change)

    def _check_remindable(self, grain_id: GrainId) -> None:
        defn = self._definitions(grain_id.type_name)
        if defn is None or not defn.remindable:
            raise ReminderError(
                f"{grain_id.type_name} cannot have reminders: derive the grain class from "
                "orleanspy.Remindable and implement receive_reminder"
            )

    async def register(
        self,
        grain_id: GrainId,
        name: str,
        *,
        due: timedelta | float | None = None,
        period: timedelta | float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        priority: int | None = None,
        action: MissedReminderAction | None = None,
    ) -> ReminderEntry:
        """Validate and upsert (last writer wins; the schedule re-anchors at now)."""
        self._check_remindable(grain_id)
        entry = new_entry(
            service_id=self.service_id,
            grain_id=grain_id,
            name=name,
            now=self.clock.now(),
            options=self.options,
            due=due,
            period=period,
            cron=cron,
            tz=tz,
            priority=ReminderPriority.NORMAL if priority is None else priority,
            action=MissedReminderAction.SKIP if action is None else action,
        )
        entry = entry.with_etag(await self.table.upsert(entry))
        self._changed(grain_id, name, entry)
        return entry

    async def store(self, entry: ReminderEntry) -> ReminderEntry:
        """Upsert a fully built row (management operations)."""
        entry = entry.with_etag(await self.table.upsert(entry))
        self._changed(entry.grain_id, entry.name, entry)
        return entry

    async def unregister(self, grain_id: GrainId, name: str) -> bool:
        """Remove the row; ``False`` if it did not exist. Retries lost etag races
        (the service may move ``next_due`` between our read and our remove)."""
        for _ in range(_REMOVE_ATTEMPTS):
            row = await self.table.read(grain_id, name)
            if row is None or row.etag is None:
                return False
            if await self.table.remove(grain_id, name, row.etag):
                self._changed(grain_id, name, None)
                return True
        raise ReminderError(
            f"could not remove reminder {name!r} of {grain_id}: it kept changing "
            f"({_REMOVE_ATTEMPTS} attempts)"
        )

    async def get(self, grain_id: GrainId, name: str) -> ReminderEntry | None:
        return await self.table.read(grain_id, name)

    async def list(self, grain_id: GrainId) -> list[ReminderEntry]:
        return await self.table.read_grain(grain_id)
