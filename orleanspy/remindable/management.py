"""``ReminderManagementGrain``: operate the reminder table from any client.

Reachable as ``client.reminders`` (key ``""``). Reads use the due index
(``upcoming``) or one grain's rows; nothing here scans the table except
``count_all``, which counts per shard.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, reentrant
from orleanspy.identity import GrainId
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    ReminderEntry,
    TickStatus,
    error_text,
)
from orleanspy.reminders.schedule import next_slot
from orleanspy.reminders.spec import check_grace, new_entry
from orleanspy.reminders.table import PausableReminderTable

__all__ = ["MANAGEMENT_TYPE", "ReminderManagementGrain"]

MANAGEMENT_TYPE = "orleanspy.ReminderManagement"


@reentrant
class ReminderManagementGrain(Grain, type_name=MANAGEMENT_TYPE):
    """Inspect and adjust reminder rows (stateless; calls interleave)."""

    @property
    def _registry(self) -> ReminderRegistry:
        # The silo serves grains' reminder calls with its registry; this grain,
        # part of the reminder service, uses the registry's table directly.
        registry = self._activation.reminders
        if not isinstance(registry, ReminderRegistry):
            raise RuntimeError(f"the silo serves reminders with {registry!r}, not a registry")
        return registry

    async def upcoming(self, horizon: timedelta, limit: int = 1000) -> list[ReminderEntry]:
        """Rows due within ``horizon`` from now, earliest first (at most ``limit``)."""
        return await self._registry.table.upcoming(self.now() + horizon, limit)

    async def list_for_grain(self, grain_id: GrainId) -> list[ReminderEntry]:
        return await self._registry.table.read_grain(grain_id)

    async def count_all(self) -> int:
        return await self._registry.table.count()

    async def _row(self, grain_id: GrainId, name: str) -> ReminderEntry:
        row = await self._registry.table.read(grain_id, name)
        if row is None:
            raise ReminderError(f"{grain_id} has no reminder {name!r}")
        return row

    async def set_priority(self, grain_id: GrainId, name: str, priority: int) -> ReminderEntry:
        """Change a row's priority (validated like a registration)."""
        row = await self._row(grain_id, name)
        new_entry(  # validation only
            service_id=row.service_id,
            grain_id=grain_id,
            name=name,
            now=self.now(),
            options=self._registry.options,
            period=timedelta(days=1),
            priority=priority,
        )
        return await self._registry.store(replace(row, priority=int(priority)))

    async def set_action(
        self, grain_id: GrainId, name: str, action: MissedReminderAction
    ) -> ReminderEntry:
        """Change what happens to the row's missed ticks."""
        row = await self._row(grain_id, name)
        return await self._registry.store(replace(row, action=MissedReminderAction(action)))

    async def set_grace(
        self, grain_id: GrainId, name: str, grace: timedelta | float | None
    ) -> ReminderEntry:
        """Change how late the row's ticks may be and still count as on time
        (``None``: back to ``ReminderOptions.missed_tick_grace``). Takes effect
        on the held row at once; the schedule does not move."""
        row = await self._row(grain_id, name)
        return await self._registry.store(replace(row, grace=check_grace(grace)))

    async def repair(self, grain_id: GrainId, name: str) -> ReminderEntry:
        """Move a row's ``next_due`` to its first slot after now (skipping missed ones)."""
        row = await self._row(grain_id, name)
        return await self._registry.store(replace(row, next_due=next_slot(row, self.now())))

    async def pause(self, grain_id: GrainId, name: str) -> ReminderEntry:
        """Keep the row but deliver nothing until ``resume`` (held across restarts:
        the flag is stored). A tick already running finishes."""
        row = await self._row(grain_id, name)
        self._check_pausable("pause", grain_id, name)
        if row.paused:
            return row
        return await self._registry.store(replace(row, paused=True))

    async def resume(self, grain_id: GrainId, name: str) -> ReminderEntry:
        """Deliver again from the slot the row stopped at: slots that passed while
        paused are missed ticks, and the row's ``MissedReminderAction`` applies."""
        row = await self._row(grain_id, name)
        self._check_pausable("resume", grain_id, name)
        if not row.paused:
            return row
        return await self._registry.store(replace(row, paused=False))

    def _check_pausable(self, what: str, grain_id: GrainId, name: str) -> None:
        if not isinstance(self._registry.table, PausableReminderTable):
            raise ReminderError(
                f"cannot {what} {grain_id} {name!r}: the reminder table "
                f"({type(self._registry.table).__name__}) does not support pausing rows"
            )

    async def trigger(self, grain_id: GrainId, name: str) -> TickStatus:
        """Deliver one tick now, off the schedule (paused or not); the schedule
        does not move (a one-shot stays due: a triggered tick is not its slot).
        Returns the status delivered (``triggered=True``, the row's payload); an
        exception of the grain's ``receive_reminder`` reaches the caller."""
        row = await self._row(grain_id, name)
        now = self.now()
        status = TickStatus(
            first_tick_time=row.start_at,
            period=row.period,
            cron=row.cron,
            current_tick_time=now,
            delivered_at=now,
            priority=int(row.priority),
            triggered=True,
            payload=row.payload,
        )
        deliver = self._registry.deliver_tick
        if deliver is None:
            raise ReminderError("this silo delivers no reminder ticks")
        outcome, error = FireOutcome.GRAIN_ERROR, None
        try:
            await deliver(grain_id, name, status)
            outcome = FireOutcome.OK
        except Exception as exc:
            error = error_text(exc)
            raise
        finally:
            keep = self._registry.options.history_size
            table = self._registry.table
            if keep and isinstance(table, PausableReminderTable):
                silo = str(self._activation.silo_address)
                record = FireRecord(
                    grain_id, name, now, now, outcome, silo, triggered=True, error=error
                )
                await table.append_history([record], keep)
        return status

    async def history(self, grain_id: GrainId, name: str) -> list[FireRecord]:
        """The row's last deliveries, newest first (``ReminderOptions.history_size``
        of them): slot, when, outcome, silo, whether triggered."""
        table = self._registry.table
        if not isinstance(table, PausableReminderTable):
            return []
        return await table.read_history(grain_id, name)

    async def delete(self, grain_id: GrainId, name: str) -> bool:
        """Remove a row; ``False`` if it did not exist."""
        return await self._registry.unregister(grain_id, name)
