"""``ReminderManagementGrain``: operate the reminder table from any client.

Reachable as ``client.reminders`` (key ``""``). Every operation but ``trigger``
is ``ReminderOperations`` (``operations``), the same code the CLI runs on the
table when no silo is up; this grain adds only what needs a silo (delivering
a tick) and the types the cluster hosts (for orphans). Each method names its
grain in any form ``grain_target`` reads: a ``GrainId``, a grain proxy,
``"Type/key"``, or a ``(type name, key)`` pair; ``ReminderManagement`` (what
``client.reminders`` returns) also takes a ``(grain class, key)`` pair.

Reads use the due index (``upcoming``), one grain's rows, the grain index a
page at a time (``page``, ``count``, ``delete_where``, ``export_page``), or the
per-type counts (``count_types``, ``orphans``); nothing reads the whole table
at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, reentrant
from orleanspy.remindable.operations import (
    ImportResult,
    ReminderOperations,
    ReminderPage,
    grain_target,
)
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.model import (
    FireOutcome,
    FireRecord,
    MissedReminderAction,
    ReminderEntry,
    TickStatus,
    error_text,
)
from orleanspy.reminders.table import PausableReminderTable

__all__ = ["MANAGEMENT_TYPE", "ReminderManagement", "ReminderManagementGrain", "management"]

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

    @property
    def _ops(self) -> ReminderOperations:
        return self._registry.operations

    async def upcoming(self, horizon: timedelta, limit: int = 1000) -> list[ReminderEntry]:
        """Rows due within ``horizon`` from now, in the due order (priority first)."""
        return await self._ops.upcoming(horizon, limit)

    async def list_for_grain(self, grain: Any) -> list[ReminderEntry]:
        return await self._ops.list_for_grain(grain_target(grain))

    async def get(self, grain: Any, name: str) -> ReminderEntry:
        """The row, or ``ReminderError``."""
        return await self._ops.get(grain_target(grain), name)

    async def count_all(self) -> int:
        return await self._ops.count_all()

    async def count(self, type_name: str | None = None, key_prefix: str | None = None) -> int:
        """Rows of one grain type (and string-key prefix); all rows without a type."""
        return await self._ops.count(type_name=type_name, key_prefix=key_prefix)

    async def count_types(self) -> dict[str, int]:
        """Rows per grain type."""
        return await self._ops.table.count_types()

    async def orphans(self) -> dict[str, int]:
        """Rows per grain type that no silo of the cluster hosts."""
        return await self._ops.orphans()

    async def page(
        self,
        cursor: str | None = None,
        limit: int = 500,
        type_name: str | None = None,
        key_prefix: str | None = None,
    ) -> ReminderPage:
        """One page of rows (``ReminderTable.read_page``), orphaned ones flagged;
        pass the returned cursor for the next."""
        return await self._ops.page(cursor, limit, type_name=type_name, key_prefix=key_prefix)

    async def delete_where(
        self, type_name: str, key_prefix: str | None = None, dry_run: bool = False
    ) -> int:
        """Remove every row of a grain type (and key prefix); how many."""
        return await self._ops.delete_where(
            type_name=type_name, key_prefix=key_prefix, dry_run=dry_run
        )

    async def import_rows(
        self, rows: list[ReminderEntry], replace_existing: bool = False, dry_run: bool = False
    ) -> ImportResult:
        """Write exported rows as they were (``ReminderOperations.import_rows``)."""
        return await self._ops.import_rows(rows, replace_existing=replace_existing, dry_run=dry_run)

    async def set_priority(self, grain: Any, name: str, priority: int) -> ReminderEntry:
        """Change a row's priority (validated like a registration)."""
        return await self._ops.set_priority(grain_target(grain), name, priority)

    async def set_action(
        self, grain: Any, name: str, action: MissedReminderAction
    ) -> ReminderEntry:
        """Change what happens to the row's missed ticks."""
        return await self._ops.set_action(grain_target(grain), name, action)

    async def set_grace(
        self, grain: Any, name: str, grace: timedelta | float | None
    ) -> ReminderEntry:
        """Change how late the row's ticks may be and still count as on time
        (``None``: back to ``ReminderOptions.missed_tick_grace``). Takes effect
        on the held row at once; the schedule does not move."""
        return await self._ops.set_grace(grain_target(grain), name, grace)

    async def repair(self, grain: Any, name: str) -> ReminderEntry:
        """Move a row's ``next_due`` to its first slot after now (skipping missed ones)."""
        return await self._ops.repair(grain_target(grain), name)

    async def pause(self, grain: Any, name: str) -> ReminderEntry:
        """Keep the row but deliver nothing until ``resume`` (held across restarts:
        the flag is stored). A tick already running finishes."""
        return await self._ops.pause(grain_target(grain), name)

    async def resume(self, grain: Any, name: str) -> ReminderEntry:
        """Deliver again from the slot the row stopped at: slots that passed while
        paused are missed ticks, and the row's ``MissedReminderAction`` applies."""
        return await self._ops.resume(grain_target(grain), name)

    async def trigger(self, grain: Any, name: str) -> TickStatus:
        """Deliver one tick now, off the schedule (paused or not); the schedule
        does not move (a one-shot stays due: a triggered tick is not its slot).
        Returns the status delivered (``triggered=True``, the row's payload); an
        exception of the grain's ``receive_reminder`` reaches the caller."""
        grain_id = grain_target(grain)
        row = await self._ops.get(grain_id, name)
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

    async def history(self, grain: Any, name: str) -> list[FireRecord]:
        """The row's last deliveries, newest first (``ReminderOptions.history_size``
        of them): slot, when, outcome, silo, whether triggered."""
        return await self._ops.history(grain_target(grain), name)

    async def delete(self, grain: Any, name: str) -> bool:
        """Remove a row; ``False`` if it did not exist."""
        return await self._ops.delete(grain_target(grain), name)


class ReminderManagement:
    """What ``client.reminders`` returns: the management grain's proxy, whose
    one-grain methods also take a ``(grain class, key)`` pair for the grain
    (``set_priority((StatsGrain, "k"), "tick", 100)``). A class cannot travel
    in a call, so the grain is resolved here (``grain_target``, with a clear
    ``ReminderError`` before anything is sent) and sent as a ``GrainId``. Every
    other attribute is the proxy's."""

    __slots__ = ("_proxy",)

    _ONE_GRAIN = frozenset(
        {
            "list_for_grain",
            "get",
            "set_priority",
            "set_action",
            "set_grace",
            "repair",
            "pause",
            "resume",
            "trigger",
            "history",
            "delete",
        }
    )

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._proxy, name)
        if name not in self._ONE_GRAIN:
            return method

        async def call(grain: Any, *args: Any, **kwargs: Any) -> Any:
            return await method(grain_target(grain), *args, **kwargs)

        return call


def management(proxy: Any) -> ReminderManagementGrain:
    """``ReminderManagement`` over ``proxy``, typed as the grain it speaks to
    (its methods take the grain as ``Any``, so every form type-checks)."""
    return cast(ReminderManagementGrain, ReminderManagement(proxy))
