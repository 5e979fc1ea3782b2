"""``ReminderManagementGrain``: operate the reminder table from any client.

Reachable as ``client.reminders`` (key ``""``). Every operation but ``trigger``
is ``ReminderOperations`` (``operations``), the same code the CLI runs on the
table when no silo is up; this grain adds only what needs a silo (delivering
a tick: ``trigger``, and ``replay`` of a dead letter) and the types the cluster
hosts (for orphans). Every management action goes through this grain, so one
hook here sees them all. Each method names its
grain in any form ``grain_target`` reads: a ``GrainId``, a grain proxy,
``"Type/key"``, or a ``(type name, key)`` pair; ``ReminderManagement`` (what
``client.reminders`` returns) also takes a ``(grain class, key)`` pair.

Reads use the due index (``upcoming``), one grain's rows, the grain index a
page at a time (``page``, ``count``, ``delete_where``, ``export_page``), the
label index (the same with ``labels=``, and ``pause_where``/``resume_where``),
or the per-type counts (``count_types``, ``orphans``); nothing reads the whole
table at once. Calendars (``set_calendar``, ``get_calendar``, ``calendars``,
``delete_calendar``) and backfills (``backfill``, ``backfills``,
``cancel_backfill``) are ``ReminderOperations``' too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, cast

from orleanspy.errors import ReminderError
from orleanspy.grain import Grain, reentrant
from orleanspy.identity import GrainId
from orleanspy.remindable.backfills import overlap_name
from orleanspy.remindable.calendars import CalendarChange
from orleanspy.remindable.operations import (
    ImportResult,
    ReminderOperations,
    ReminderPage,
    grain_target,
)
from orleanspy.remindable.registry import ReminderRegistry
from orleanspy.reminders.audit import AuditAction, AuditQuery, AuditRecord
from orleanspy.reminders.backfill import BackfillJob
from orleanspy.reminders.calendars import Calendar, StoredCalendar
from orleanspy.reminders.counters import ReminderCounters
from orleanspy.reminders.describe import ReminderDescription
from orleanspy.reminders.letters import DeadLetter, DeadLetterPage
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

    async def count(
        self,
        type_name: str | None = None,
        key_prefix: str | None = None,
        labels: Any = None,
    ) -> int:
        """Rows of one grain type (and string-key prefix), or of a label selector
        (``{"tenant": "acme"}`` or ``"tenant=acme"``); all rows without either."""
        return await self._ops.count(type_name=type_name, key_prefix=key_prefix, labels=labels)

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
        labels: Any = None,
    ) -> ReminderPage:
        """One page of rows (``ReminderTable.read_page``; with ``labels``, of the
        label selector), orphaned ones flagged; pass the returned cursor for the next."""
        return await self._ops.page(
            cursor, limit, type_name=type_name, key_prefix=key_prefix, labels=labels
        )

    async def delete_where(
        self,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
        labels: Any = None,
    ) -> int:
        """Remove every row of a grain type (and key prefix) or label selector; how many."""
        return await self._ops.delete_where(
            type_name=type_name, key_prefix=key_prefix, dry_run=dry_run, labels=labels
        )

    async def pause_where(
        self,
        labels: Any = None,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Pause every row of a label selector (or grain type); how many were paused."""
        return await self._ops.pause_where(labels, type_name, key_prefix, dry_run)

    async def resume_where(
        self,
        labels: Any = None,
        type_name: str | None = None,
        key_prefix: str | None = None,
        dry_run: bool = False,
    ) -> int:
        """Resume every paused row of a label selector (or grain type); how many."""
        return await self._ops.resume_where(labels, type_name, key_prefix, dry_run)

    async def set_calendar(self, name: str, calendar: Calendar) -> CalendarChange:
        """Store calendar ``name`` and move every reminder that uses it to it, live
        (``remindable.calendars``)."""
        return await self._ops.set_calendar(name, calendar)

    async def get_calendar(self, name: str) -> Calendar:
        """The calendar ``name``, or ``ReminderError``."""
        return await self._ops.get_calendar(name)

    async def calendars(self) -> list[StoredCalendar]:
        """Every calendar, by name, with its version."""
        return await self._ops.calendars()

    async def delete_calendar(self, name: str, force: bool = False) -> int:
        """Remove calendar ``name``: refused while a reminder uses it, unless
        ``force`` (which detaches them); how many were detached."""
        return await self._ops.delete_calendar(name, force=force)

    async def backfill(
        self, grain: Any, name: str, start: datetime, end: datetime, overlap: Any = None
    ) -> BackfillJob:
        """Deliver every slot of the reminder in ``[start, end)`` again, in order,
        as ``TickStatus.backfill`` ticks (``remindable.backfills``); the job."""
        return await self._ops.backfill(grain_target(grain), name, start, end, overlap)

    async def cancel_backfill(self, grain: Any, name: str) -> bool:
        """Cancel the reminder's backfill; ``False`` if none runs."""
        return await self._ops.cancel_backfill(grain_target(grain), name)

    async def backfills(self) -> list[BackfillJob]:
        """Every running backfill with its progress."""
        return await self._ops.backfills()

    async def import_rows(
        self, rows: list[ReminderEntry], replace_existing: bool = False, dry_run: bool = False
    ) -> ImportResult:
        """Write exported rows as they were (``ReminderOperations.import_rows``)."""
        return await self._ops.import_rows(rows, replace_existing=replace_existing, dry_run=dry_run)

    async def import_dead_letters(self, letters: list[DeadLetter], dry_run: bool = False) -> int:
        """Write exported dead letters as they were
        (``ReminderOperations.import_dead_letters``); how many."""
        return await self._ops.import_dead_letters(letters, dry_run=dry_run)

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
        ops = self._ops
        row = await ops.get(grain_id, name)
        deliver = self._registry.deliver_tick
        if deliver is None:
            raise ReminderError("this silo delivers no reminder ticks")
        # Recorded before the tick is delivered (it cannot be undone), settled after.
        async with ops.audit.pending(AuditAction.TRIGGER, grain_id, name, before=row):
            return await self._trigger(grain_id, name, row, deliver)

    async def _trigger(
        self,
        grain_id: GrainId,
        name: str,
        row: ReminderEntry,
        deliver: Callable[[GrainId, str, TickStatus], Awaitable[None]],
    ) -> TickStatus:
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

    async def audit(self, query: AuditQuery | None = None) -> list[AuditRecord]:
        """The operator audit log, newest first: the records ``query`` selects
        (default: the newest 100); empty where the table keeps none."""
        if query is not None and not isinstance(query, AuditQuery):
            raise ReminderError(f"not an audit query: {type(query).__name__}")
        return await self._ops.audit_log(query or AuditQuery())

    async def counters(self, grain: Any, name: str) -> ReminderCounters:
        """The row's counters since it was made: delivered, failed, dead-lettered,
        deduplicated, skipped by reason, the last error (``ReminderError`` if
        there is no row)."""
        return await self._ops.counters(grain_target(grain), name)

    async def describe(
        self, grain: Any, name: str, count: int = 10, after: datetime | None = None
    ) -> ReminderDescription:
        """Everything about one reminder: the row, its next ``count`` fire times
        after ``after`` (default now; calendar, jitter, bounds and pause
        honoured), its counters since registration (delivered, failed,
        dead-lettered, skipped by reason, deduplicated, the last error), its
        latest deliveries, its backfill and its dead letters
        (``ReminderError`` if there is no row)."""
        return await self._ops.describe(grain_target(grain), name, count, after)

    async def dead_letters(
        self,
        grain: Any = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> DeadLetterPage:
        """A page of dead letters (ticks that failed their last attempt), newest
        first; only ``grain``'s and/or reminder ``name``'s when given. Pass the
        page's cursor for the next."""
        target = None if grain is None else grain_target(grain)
        return await self._ops.dead_letters(target, name, cursor, limit)

    async def count_dead_letters(self) -> int:
        """How many dead letters are kept."""
        return await self._ops.count_dead_letters()

    async def dead_letter(self, letter_id: str) -> DeadLetter:
        """One dead letter by id (its occurrence id); ``ReminderError`` if none."""
        return await self._ops.dead_letter(letter_id)

    async def replay(self, letter_id: str) -> TickStatus:
        """Deliver a dead letter again as its slot (same occurrence id) and remove
        it once that succeeds; returns the status delivered. If the grain raises
        again the letter is kept with the new failure and the exception reaches
        the caller. ``ReminderError`` for an unknown id."""
        silo = str(self._activation.silo_address)
        return await self._ops.replay_letter(letter_id, self._registry.deliver_tick, silo)

    async def discard(self, letter_id: str) -> DeadLetter:
        """Remove a dead letter without delivering it; returns it. ``ReminderError``
        for an unknown id (nothing changes)."""
        return await self._ops.discard(letter_id)


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
            "counters",
            "describe",
            "backfill",
            "cancel_backfill",
        }
    )

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._proxy, name)
        if name == "dead_letters":

            async def letters(grain: Any = None, *args: Any, **kwargs: Any) -> Any:
                target = None if grain is None else grain_target(grain)
                return await method(target, *args, **kwargs)

            return letters
        if name not in self._ONE_GRAIN:
            return method

        async def call(grain: Any, *args: Any, **kwargs: Any) -> Any:
            if name == "backfill":
                # An overlap policy travels by name (the enum's own type need not).
                if "overlap" in kwargs:
                    kwargs["overlap"] = overlap_name(kwargs["overlap"])
                elif len(args) > 3:
                    args = (*args[:3], overlap_name(args[3]), *args[4:])
            return await method(grain_target(grain), *args, **kwargs)

        return call


def management(proxy: Any) -> ReminderManagementGrain:
    """``ReminderManagement`` over ``proxy``, typed as the grain it speaks to
    (its methods take the grain as ``Any``, so every form type-checks)."""
    return cast(ReminderManagementGrain, ReminderManagement(proxy))
